"""Appending examples' blocks to a run's cells array (store/arrays.py): where each goes, and `BlockWriter`.

An example's block is placed so it lies in the fewest blosc blocks a first read decodes (`placed_offset`); a resumed
or distributed writer starts at a chunk boundary past everything already written (`resume_offset`). `BlockWriter`
only ever writes whole chunks (plus the last partial chunk when a run finishes), so a chunk that holds committed data
is never rewritten: a crash cannot damage stored examples.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from .arrays import block_cells
from .errors import InvalidArgumentError


def placed_offset(free: int, cells: int, block: int | None) -> int:
    """Where the next example's `cells` go, the first free offset being `free`: there, unless that would spread them
    over more blosc blocks of `block` cells than their size needs; then at the next block's start. The gap is zeros
    that no example owns (compressed to almost nothing). A first read then decodes the fewest blocks: MRPC dev's
    examples 2.0 blocks of 256 KiB each instead of 2.7, for 8.9 % more cells (zeros) and 0.06 % more bytes stored
    (docs/PERFORMANCE.md, 2026-11-28, 6063b8b). Never earlier for a later `free`, so a subset of some examples, placed in the
    same order from the same start, ends no later than all of them (a distributed part's bound)."""
    if not block or not cells:
        return free
    fewest = -(-cells // block)
    if (free + cells - 1) // block - free // block + 1 > fewest:
        return -(-free // block) * block
    return free


def placed_end(free: int, sizes: Iterable[int], block: int | None) -> int:
    """The first free offset once blocks of `sizes` cells are placed in order from `free` (`placed_offset`): the cells
    a distributed part's examples need (ingest/distributed.py)."""
    for cells in sizes:
        free = placed_offset(free, cells, block) + cells
    return free


def resume_offset(stored_end: int, chunk_cells: int) -> int:
    """First offset a resumed run may write at: the next chunk boundary, never inside a written chunk."""
    return -(-stored_end // chunk_cells) * chunk_cells


def trim(array, end: int) -> None:
    """Cut a cells array to its committed end; chunks wholly past it (cells written, never committed) go."""
    if array.shape[0] > end:
        array.resize((end,))


class BlockWriter:
    """Append blocks at increasing offsets; write whole chunks only, until `flush(final=True)`.

    Blocks are copied once, straight into a growing buffer (a block may be a strided
    view of a padded batch); whole chunks are written from the buffer.

    `flush(wait=False)` writes in a background thread while the caller goes on (commits the rows of
    earlier chunks, appends the next blocks): one write is in flight at a time, and the array is grown
    to its end before it starts, so a writer that takes the run over later starts past it.
    """

    def __init__(self, array, start_offset: int):
        self.array = array
        self.chunk = array.chunks[0]
        self.block_cells = block_cells(array)  # examples are placed so each lies in the fewest blosc blocks
        if start_offset % self.chunk:
            raise InvalidArgumentError(f"start offset {start_offset} is not a multiple of the chunk size {self.chunk}")
        self._base = start_offset  # start of the buffer: everything before it is on disk or being written
        self._durable = start_offset  # everything before this offset is on disk
        self._buf = np.empty(4 * self.chunk, dtype=array.dtype)
        self._buffered = 0
        self._in_flight: Future[None] | None = None
        self._in_flight_end = start_offset
        self._writer: ThreadPoolExecutor | None = None
        self._failed: BaseException | None = None
        self._spare: np.ndarray | None = None  # the buffer of the write in flight, or free again once it is done

    @property
    def next_offset(self) -> int:
        return self._base + self._buffered

    @property
    def durable_offset(self) -> int:
        return self._durable

    def offset_for(self, cells: int) -> int:
        """Where `append` would put a block of `cells` cells now (`placed_offset`)."""
        return placed_offset(self.next_offset, cells, self.block_cells)

    def append(self, block: np.ndarray) -> int:
        n = block.size
        offset = self.offset_for(n)
        start = self._buffered + offset - self.next_offset  # after the gap, if any
        if start + n > self._buf.size:
            grown = np.empty(max(2 * self._buf.size, start + n), dtype=self._buf.dtype)
            grown[: self._buffered] = self._buf[: self._buffered]
            self._buf = grown
        self._buf[self._buffered : start] = 0  # the gap: zeros no example owns
        self._buf[start : start + n].reshape(block.shape)[...] = block
        self._buffered = start + n
        return offset

    def flush(self, final: bool = False, wait: bool = True) -> int:
        """Write every whole buffered chunk (and the tail if `final`); return the durable offset.

        `wait=False` (not with `final`): start the write and return the offset made durable by the writes
        before it. A failed background write raises here, at the next flush, or in `settle()`."""
        self.settle()
        n_write = self._buffered if final else (self._buffered // self.chunk) * self.chunk
        if n_write == 0:
            return self._durable
        end = self._base + n_write
        if self.array.shape[0] < end:  # arrays have their real length: grown as blocks are written
            self.array.resize((end,))
        data, rest = self._buf[:n_write], self._buffered - n_write
        if wait or final:
            self.array[self._base : end] = data
            self._buf[:rest] = self._buf[n_write : self._buffered].copy()
        else:  # the write keeps this buffer; the rest moves to the other one (reused: no fresh pages per batch)
            old, spare = self._buf, self._spare
            self._buf = spare if spare is not None and spare.size >= max(old.size, rest) else np.empty(old.size, dtype=old.dtype)
            self._buf[:rest] = old[n_write : self._buffered]
            self._spare = old
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="attnstore-chunks")
            self._in_flight = self._writer.submit(self.array.__setitem__, slice(self._base, end), data)
            self._in_flight_end = end
        self._buffered = rest
        self._base = end
        if final:  # the next write would start inside a chunk now on disk
            self._base = resume_offset(self._base, self.chunk)
            self._stop_thread()
        if self._in_flight is None:
            self._durable = self._base if final else end
        return self._durable

    def settle(self) -> int:
        """Wait for the write in flight, if any (its error is raised here); return the durable offset.

        After a failed background write its cells are no longer buffered, so this writer stays failed:
        every later flush raises the same error, and no offset past the failure is ever called durable."""
        if self._failed is not None:
            raise self._failed
        if self._in_flight is not None:
            future, self._in_flight = self._in_flight, None
            try:
                future.result()
            except BaseException as exc:
                self._failed = exc
                raise
            self._durable = self._in_flight_end
        return self._durable

    def close(self) -> None:
        """Wait for the write in flight (its error is dropped: its cells are never committed) and stop the thread."""
        try:
            self.settle()
        except Exception:
            pass
        finally:
            self._stop_thread()

    def _stop_thread(self) -> None:
        if self._writer is not None:
            self._writer.shutdown()
            self._writer = None
