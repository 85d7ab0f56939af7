"""One example's cells read straight from the bytes of its chunks (issue 29: `store.attention` near an HDF5 read).

Through zarr, one example's maps cost event-loop hops (zarr's I/O runs on its own thread: each call, and each chunk's
existence check, is a thread wake-up, milliseconds on a busy machine), the array's zarr.json read and parsed, and the
decode of the whole 2 MiB chunk (~1 ms) for the ~0.4 MiB an MRPC example holds. Here, for a local root and a blosc +
CRC32C codec (what attnstore writes, lossless): each chunk file the cells lie in is mapped in the calling thread
(`mmap`, private: since 1d2ff9b, 2026-11-27; a read into a buffer copied 2 MiB, 3x the cost of the checksum over the mapped
pages), its CRC32C checked over all its bytes (as zarr's crc32c codec does, google_crc32c), and only the blosc blocks
(256 KiB) holding the wanted cells are decompressed: a blosc frame of just those blocks is written over the bytes
before the first one (the checksum is already checked; the mapping is private to this read, so the write copies one
page and never reaches the file) and handed to blosc, which decompresses and unshuffles them. Blosc 1's frame
(c-blosc's README_HEADER.rst): a 16-byte header (version, flags, type size, decompressed size, block size, compressed
size), the start of each block, then the blocks' streams.

Reads for one example (`store.attention`, given the store's `block_cache`) keep the blocks they decode a second time
in that store's cache of decoded blocks (`BlockCache`, least recently used first out, `ATTNSTORE_READ_CACHE_MB`
megabytes, default 256; 0 turns it off; one per open `Store`, so two stores in a process never share or evict each
other's), so the viewer's and the HTTP API's repeated reads of one example (head by head, layer by layer)
cost a copy, while a first read costs what it did (a block is copied into the cache only when read again). A
kept block is used only while its chunk file has the same inode, size and modification time (one `stat` per chunk
and read), and only chunks unchanged for `SETTLED_SECONDS` are kept: a file rewritten within the same timestamp tick
cannot be mistaken for the one kept. Whole-run passes (`iter_attention`) do not fill it. The cache also remembers
which settled chunk files had their checksum checked over all their bytes, by the same stamp: a later read of other
cells of such a file reads its header, its block starts and the wanted blocks' bytes only (two `pread`s and one
`preadv`), without reading and checking the whole chunk again. So a chunk is checked once per store and file
version, not once per read; `attnstore check` checks every chunk whenever it is run.

Anything else (a remote root, the lossy u8 filter, no checksum, a chunk that is missing, fails its checksum, or whose
header is not a whole blosc frame of the chunk) returns None: the caller then reads through zarr (`arrays.read_cells`),
which names the damage (DamagedDataError with run, example and chunk) exactly as before.

A read that spans many chunk files (a kept example column: ~2,000 files at 8 M examples; a range of maps) first
announces the next window of them to the kernel (`will_need`: POSIX_FADV_WILLNEED, which returns at once), so a cold
read has their disk reads in flight together; one example's read (one or two chunks) announces nothing. Such a read
also checks and decodes its chunks on a pool of threads (`decode_pool`, one per core, `ATTNSTORE_DECODE_THREADS`),
each into its own part of the result: blosc and google_crc32c release the GIL, and a whole-run pass read on one thread
decoded at 0.21-0.24 s for MRPC dev's 88 M cells against 0.15-0.20 s on two (docs/PERFORMANCE.md, 2026-11-28 "chunks
decoded on every core").

Kept summaries (store/arrays.py `SummaryParts`) are read the same way: their fields are N-D arrays whose chunks hold
whole rows, read as flat cells, and `read_rows` reads a sample's rows, each chunk's file checked once and each run of
blocks decompressed once.

Longer than ~500 lines on purpose: one reader of one on-disk format; its paths (a chunk mapped and checked, a checked
file read block by block, several ranges of one chunk, the cache of decoded blocks) share the blosc frame arithmetic,
which split across modules would be harder to check against c-blosc's header layout.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import google_crc32c
import numpy as np
from numcodecs import blosc
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec
from zarr.storage import LocalStore

from .errors import InvalidArgumentError
from .lru import LRU
from .pools import SizedPool

HEADER = 16
# A read of many chunks announces the chunk files it will read (`will_need`) a window ahead: up to PREFETCH_BYTES of
# decoded cells, at most PREFETCH_FILES files (a kept example column: 256 files of 32 KiB; maps: 32 of 2 MiB).
PREFETCH_BYTES = 64 << 20
PREFETCH_FILES = 256
ANNOUNCE_FROM = 4  # chunks a read spans from which it announces them
BYTE_SHUFFLE, MEMCPYED, BIT_SHUFFLE, DONT_SPLIT = 0x01, 0x02, 0x04, 0x10


class Buffers:
    """Some blocks' bytes, compressed (a frame of them) and decompressed, reused from one read to the next (fresh
    megabytes per read cost page faults: ~0.1 ms)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def get(self, name: str, size: int) -> np.ndarray:
        buf = self.arrays.get(name)
        if buf is None or buf.size < size:
            buf = self.arrays[name] = np.empty(max(size, 1 << 16), dtype=np.uint8)
        return buf[:size]


# Sets of buffers kept between reads, for all readers of the process: a few (reads at once beyond them allocate their
# own), so a server's many threads do not each keep megabytes.
KEPT_BUFFERS = 4
_FREE: list[Buffers] = []
_FREE_LOCK = threading.Lock()


def _take_buffers() -> Buffers:
    with _FREE_LOCK:
        return _FREE.pop() if _FREE else Buffers()


def _give_buffers(buffers: Buffers) -> None:
    with _FREE_LOCK:
        if len(_FREE) < KEPT_BUFFERS:
            _FREE.append(buffers)


READ_CACHE_ENV = "ATTNSTORE_READ_CACHE_MB"
DEFAULT_READ_CACHE_MB = 256
SETTLED_SECONDS = 2.0  # a chunk file modified more recently than this is read but not kept
SEEN_KEPT = 1 << 16  # blocks remembered as decoded once (~100 bytes each)
VERIFIED_KEPT = 1 << 16  # chunk files remembered as checked whole (~150 bytes each)

Stamp = tuple[int, int, int]  # a chunk file's (inode, size, modification time in ns)
BlockKey = tuple[str, int, int, int]  # (cells folder, chunk, block, cells per block)


class BlockCache:
    """Decoded blosc blocks, least recently used out first, within a byte budget; safe across threads."""

    def __init__(self, budget: int):
        self.budget = budget
        self.hits = self.misses = 0
        self.blocks: LRU[BlockKey, tuple[Stamp, np.ndarray]] = LRU(max_weight=budget, weigh=lambda kept: kept[1].nbytes)
        self.seen: LRU[BlockKey, Stamp] = LRU(max_entries=SEEN_KEPT)  # blocks decoded once, not kept (yet)
        self.verified: LRU[str, Stamp] = LRU(max_entries=VERIFIED_KEPT)  # chunk files whose whole checksum was checked
        self.lock = threading.Lock()  # the counts, and admit's look-then-remember

    @property
    def used(self) -> int:
        return self.blocks.weight

    def get(self, key: BlockKey, stamp: Stamp) -> np.ndarray | None:
        kept = self.blocks.get(key)  # one look-up on the read path (a stale block made recent is replaced by `put`)
        with self.lock:
            if kept is None or kept[0] != stamp:
                self.misses += 1
                return None
            self.hits += 1
        return kept[1]

    def admit(self, key: BlockKey, stamp: Stamp) -> bool:
        """Whether a block just decoded is kept: only one decoded before (as the same file). A block read once is
        remembered (a key, not its bytes), so a first read costs no copy and a pass of one-off reads evicts nothing."""
        with self.lock:
            if self.seen.pop(key) == stamp:
                return True
            self.seen.put(key, stamp)
            return False

    def is_verified(self, path: str, stamp: Stamp) -> bool:
        """Whether this chunk file, as `stamp` says it is now, had its checksum checked over all its bytes here."""
        return self.verified.get(path, touch=False) == stamp

    def mark_verified(self, path: str, stamp: Stamp) -> None:
        self.verified.put(path, stamp)

    def put(self, key: BlockKey, stamp: Stamp, values: np.ndarray) -> None:
        if values.nbytes <= self.budget:  # a block over the whole budget is never kept
            self.blocks.put(key, (stamp, values))

    def clear(self) -> None:
        with self.lock:
            self.blocks.clear()
            self.seen.clear()
            self.verified.clear()
            self.hits = self.misses = 0


def new_block_cache(megabytes: float | None = None) -> BlockCache:
    """An empty cache of decoded blocks of `megabytes` (None: ATTNSTORE_READ_CACHE_MB, else DEFAULT_READ_CACHE_MB)."""
    if megabytes is None:
        text = os.environ.get(READ_CACHE_ENV, "").strip()
        try:
            megabytes = float(text) if text else DEFAULT_READ_CACHE_MB
        except ValueError:
            raise InvalidArgumentError(f"{READ_CACHE_ENV}={text!r}: give a number of megabytes (0 turns the read cache off)") from None
    return BlockCache(max(0, int(megabytes * (1 << 20))))


def _forget_after_fork() -> None:
    """In a forked child: a lock another thread of the parent held would stay held; start with a fresh one."""
    global _FREE_LOCK
    _FREE_LOCK = threading.Lock()
    _FREE.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def direct_reader(array) -> DirectCells | None:
    """A direct reader of a run's cells array, or None where zarr must read it (see the module's docstring)."""
    store = array.store_path.store
    codecs = getattr(array.metadata, "codecs", None)  # None: a zarr v2 array
    if not isinstance(store, LocalStore) or codecs is None or array.filters or len(codecs) != 3 or array.ndim < 1:
        return None
    trailing = tuple(int(n) for n in array.shape[1:])
    if tuple(int(n) for n in array.chunks[1:]) != trailing or 0 in trailing:  # each chunk must hold whole rows
        return None
    serializer, compressor, checksum = codecs
    if not (isinstance(serializer, BytesCodec) and isinstance(compressor, BloscCodec) and isinstance(checksum, Crc32cCodec)):
        return None
    # the bytes' order on disk is the serializer's, whatever the dtype says: only little-endian ones are read here
    if array.dtype.itemsize > 1 and (array.dtype.byteorder == ">" or getattr(serializer.endian, "value", "little") != "little"):
        return None
    return DirectCells(array, str(store.root))


class DirectCells:
    """Cells [start, stop) of one cells array, read from its chunk files and checked, or None (the caller reads
    through zarr). An N-D array whose chunks hold whole rows (a kept summary's field: chunks (rows, *trailing)) is
    read as its flat cells (`read`) or by rows (`read_rows`): a C-order chunk holds its rows back to back."""

    def __init__(self, array, root: str):
        self.trailing = tuple(int(n) for n in array.shape[1:])
        self.width = int(np.prod(self.trailing, dtype=np.int64))  # cells per row (1: a 1-D array)
        self.chunk = int(array.chunks[0]) * self.width  # cells per chunk
        self.dtype = np.dtype(array.dtype)
        self.itemsize = self.dtype.itemsize
        self.folder = os.path.join(root, *array.path.split("/"))
        self.encode_key = array.metadata.encode_chunk_key  # (12,) -> "c/12"; (12, 0, 0) -> "c/12/0/0"
        self.key_tail = (0,) * len(self.trailing)
        self.block_cells = 0  # cells per blosc block, learned from the first chunk decoded (0: not yet)

    def chunk_file(self, index: int) -> str:
        return os.path.join(self.folder, *self.encode_key((index, *self.key_tail)).split("/"))

    def read_rows(self, rows: np.ndarray, cache: BlockCache | None = None) -> np.ndarray | None:
        """Rows `rows` (ascending, distinct), shaped (len(rows), *trailing), or None where zarr must read them. Only the
        blosc blocks holding them are decompressed; each chunk's file is checked once per call (several runs of rows
        in one chunk: `_runs`), or once per store where its cache of decoded blocks (`cache`) knows it (`read`)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.width), dtype=self.dtype)
        chunk_of = rows // (self.chunk // self.width)
        cut = np.flatnonzero((np.diff(rows) != 1) | (np.diff(chunk_of) != 0)) + 1  # runs of consecutive rows in one chunk
        lo, hi = np.r_[0, cut], np.r_[cut, len(rows)]
        by_chunk = np.flatnonzero(np.diff(chunk_of[lo])) + 1 if len(rows) else np.zeros(0, np.int64)
        w = self.width
        for group in np.split(np.arange(len(lo)), by_chunk) if len(rows) else []:
            pieces = [(int(rows[lo[g]]) * w, (int(rows[hi[g] - 1]) + 1) * w, out[lo[g] : hi[g]].reshape(-1)) for g in group]
            if len(pieces) == 1:
                got = self.read(pieces[0][0], pieces[0][1], cache)
                if got is None:
                    return None
                pieces[0][2][:] = got
            elif not self._runs(int(chunk_of[lo[group[0]]]), pieces, cache):
                return None
        return out.reshape(len(rows), *self.trailing)

    def _runs(self, index: int, pieces: list[tuple[int, int, np.ndarray]], cache: BlockCache | None) -> bool:
        """Several ranges of cells (first, last, out) of chunk `index`: its file mapped and its checksum checked once,
        then each run of the blocks they lie in decompressed once, from a frame of its own (a copy of their bytes: the
        mapping is read only). False when anything is off (the caller then reads through zarr, which names it)."""
        path = self.chunk_file(index)
        offset = index * self.chunk
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                if st.st_size < HEADER + 4:
                    return False
                mapped = mmap.mmap(f.fileno(), st.st_size, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return False
        buffers = _take_buffers()
        try:
            checked = self._checked(np.frombuffer(mapped, dtype=np.uint8))
            if checked is None:
                return False
            body, header, starts = checked
            blocksize = header[5]
            if starts is None:  # stored as it is after the header
                for first, last, out in pieces:
                    out[:] = np.frombuffer(body, dtype=self.dtype, count=last - first, offset=HEADER + (first - offset) * self.itemsize)
                return True
            n_blocks = len(starts)
            per_block = blocksize // self.itemsize
            spans: list[list] = []  # [first block, last block, its pieces]: pieces sharing or next to a block decode together
            for first, last, out in pieces:
                first, last = first - offset, last - offset
                b0, b1 = first // per_block, (last - 1) // per_block
                if spans and b0 <= spans[-1][1] + 1:
                    spans[-1][1] = max(spans[-1][1], b1)
                    spans[-1][2].append((first, last, out))
                else:
                    spans.append([b0, b1, [(first, last, out)]])
            for b0, b1, members in spans:
                k = b1 - b0 + 1
                end = starts[b1 + 1] if b1 + 1 < n_blocks else len(body)
                prefix = HEADER + 4 * k
                frame = buffers.get("frame", prefix + end - starts[b0])
                frame[prefix:] = body[starts[b0] : end]
                decoded = _frame_header(frame, header, starts, b0, b1)
                dest = buffers.get("blocks", decoded).view(self.dtype)
                try:
                    blosc.decompress(frame, dest)
                except Exception:
                    return False
                for first, last, out in members:
                    out[:] = dest[first - b0 * per_block : last - b0 * per_block]
            self.block_cells = per_block
            if cache is not None and cache.budget and st.st_mtime_ns < (time.time() - SETTLED_SECONDS) * 1e9:
                cache.mark_verified(path, _stamp(st))
            return True
        finally:
            _give_buffers(buffers)
            try:
                mapped.close()
            except BufferError:  # a view of it still alive: unmapped when that goes
                pass

    def read(self, start: int, stop: int, cache: BlockCache | None = None) -> np.ndarray | None:
        """Cells [start, stop), or None where zarr must read them. `cache`: the store's cache of decoded blocks, to use
        and fill (one example's read; not a whole-run pass, which would only push out what readers come back to)."""
        if cache is not None and cache.budget == 0:
            cache = None
        buffers = _take_buffers()
        try:
            return self._read(start, stop, buffers, cache)
        finally:
            _give_buffers(buffers)

    def _read(self, start: int, stop: int, buffers: Buffers, cache: BlockCache | None = None) -> np.ndarray | None:
        out = np.empty(stop - start, dtype=self.dtype)
        parts = []  # (chunk, its cells [first, last), where they go in `out`)
        at = start
        while at < stop:
            index = at // self.chunk
            end = min(stop, (index + 1) * self.chunk)
            parts.append((index, at - index * self.chunk, end - index * self.chunk, out[at - start : end - start], buffers, cache))
            at = end
        if len(parts) < ANNOUNCE_FROM:  # one example's read (one or two chunks, of which it may want a few blocks)
            return out if all(self._chunk(*part) for part in parts) else None
        window = max(1, min(PREFETCH_FILES, PREFETCH_BYTES // (self.chunk * self.itemsize)))
        pool = decode_pool()
        if pool is None:
            for i, part in enumerate(parts):  # many chunk files (a kept example column: ~2,000 at 8 M examples)
                if i % window == 0:  # announced a window ahead, so cold reads are in flight together
                    self._announce([p[0] for p in parts[i : i + window]])
                if not self._chunk(*part):
                    return None
            return out
        # Each chunk checked and decoded on the pool (blosc and the checksum release the GIL), each into its own part
        # of `out`: the reading thread of a whole-run pass was its bottleneck (py-spy, docs/PERFORMANCE.md, 2026-11-28).
        for i in range(0, len(parts), window):
            self._announce([p[0] for p in parts[i : i + window]])
            futures = [
                pool.submit(self._chunk_own_buffers, index, first, last, into, cache)
                for index, first, last, into, _, cache in parts[i : i + window]  # each task takes buffers of its own
            ]
            if not all([f.result() for f in futures]):  # a list: every task done before any None is returned
                return None
        return out

    def _chunk_own_buffers(self, index: int, first: int, last: int, out: np.ndarray, cache: BlockCache | None) -> bool:
        """`_chunk` on a pool thread, with buffers of its own."""
        buffers = _take_buffers()
        try:
            return self._chunk(index, first, last, out, buffers, cache)
        finally:
            _give_buffers(buffers)

    def _announce(self, indices: list[int]) -> None:
        """Tell the kernel these chunk files will be read whole soon (`will_need`); a missing one is left to the read."""
        for index in indices:
            try:
                fd = os.open(self.chunk_file(index), os.O_RDONLY)
            except OSError:
                continue
            try:
                will_need(fd, 0, 0)
            finally:
                os.close(fd)

    def _chunk(self, index: int, first: int, last: int, out: np.ndarray, buffers: Buffers, cache: BlockCache | None) -> bool:
        path = self.chunk_file(index)
        if cache is not None and self.block_cells:
            try:
                st = os.stat(path)
            except OSError:
                return False
            stamp = _stamp(st)
            if self._from_cache(cache, index, first, last, out, stamp):
                return True
            if cache.is_verified(path, stamp):  # checked whole before, unchanged since: read only the wanted blocks
                done = self._verified_blocks(path, st.st_size, first, last, out, buffers, (cache, path, index, stamp))
                if done is not None:
                    return done
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                size = st.st_size
                if size < HEADER + 4:
                    return False
                # Mapped, not copied: the checksum and the decode read the page cache's pages (a 2 MiB read into a
                # buffer cost 3x the whole check). Private: the frame written over the bytes before the first block
                # copies one page, never the file. zarr replaces a chunk by renaming a new file over it, so the
                # mapped file is never cut short under this read (another program truncating a chunk file in place
                # during the read would stop the process with SIGBUS; attnstore never writes chunks in place).
                mapped = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError):
            return False  # missing or unreadable: zarr's read names it
        settled = st.st_mtime_ns < (time.time() - SETTLED_SECONDS) * 1e9
        keep = (cache, path, index, _stamp(st)) if cache is not None and settled else None
        try:
            return self._cells(np.frombuffer(mapped, dtype=np.uint8), first, last, out, buffers, keep)
        finally:
            try:
                mapped.close()
            except BufferError:  # a view of it still alive: unmapped when that goes
                pass

    def _from_cache(self, cache: BlockCache, index: int, first: int, last: int, out: np.ndarray, stamp: Stamp) -> bool:
        """Cells [first, last) of chunk `index` copied from kept blocks, if every block they lie in is kept for the
        chunk file as it is now (`stamp`)."""
        per_block = self.block_cells
        b0, b1 = first // per_block, (last - 1) // per_block
        blocks = []
        for b in range(b0, b1 + 1):
            values = cache.get((self.folder, index, b, per_block), stamp)
            if values is None:
                return False
            blocks.append(values)
        for b, values in zip(range(b0, b1 + 1), blocks):
            lo, hi = max(first, b * per_block), min(last, b * per_block + len(values))
            out[lo - first : hi - first] = values[lo - b * per_block : hi - b * per_block]
        return True

    def _header(self, view) -> tuple | None:
        """A chunk's blosc header (version, version_lz, flags, typesize, nbytes, blocksize, cbytes), None if it is not
        one of this array's whole chunks."""
        header = struct.unpack_from("<BBBBiii", view)
        nbytes, blocksize = header[4], header[5]
        if nbytes != self.chunk * self.itemsize or blocksize <= 0 or blocksize % self.itemsize:
            return None
        return header

    def _checked(self, raw: np.ndarray) -> tuple[np.ndarray, tuple, tuple[int, ...] | None] | None:
        """A chunk's bytes checked (CRC32C over all of them) and parsed: (its blosc frame, the frame's header, its
        blocks' starts; None for a frame stored as it is), or None when anything is off."""
        if len(raw) < HEADER + 4 or google_crc32c.value(raw[:-4]) != int.from_bytes(raw[-4:].tobytes(), "little"):
            return None
        body = raw[:-4]
        header = self._header(body.data)
        if header is None or header[6] != len(body):
            return None
        flags, nbytes, blocksize = header[2], header[4], header[5]
        if flags & MEMCPYED:
            return (body, header, None) if len(body) == HEADER + nbytes else None
        n_blocks = -(-nbytes // blocksize)
        starts = struct.unpack_from(f"<{n_blocks}i", body.data, HEADER)
        return (body, header, starts) if _valid_starts(starts, n_blocks, len(body)) else None

    def _cells(self, raw: np.ndarray, first: int, last: int, out: np.ndarray, buffers: Buffers, keep: tuple | None = None) -> bool:
        """Decode cells [first, last) of one chunk's bytes into `out`; False when anything is off.

        Only the blosc blocks holding them are decompressed: a blosc frame of just those blocks is written over the
        bytes before the first one (this read's buffer, its checksum already checked) and handed to blosc, which
        decompresses and unshuffles them (its SIMD code, its threads)."""
        checked = self._checked(raw)
        if checked is None:
            return False
        if keep is not None:
            keep[0].mark_verified(keep[1], keep[3])
        body, header, starts = checked
        view = body.data  # for struct: a writable memoryview of the same bytes
        version, version_lz, flags, typesize, nbytes, blocksize, _ = header
        isz = self.itemsize
        if starts is None:  # stored as it is after the header
            out[:] = np.frombuffer(body, dtype=self.dtype, count=last - first, offset=HEADER + first * isz)
            return True
        n_blocks = len(starts)
        per_block = blocksize // isz
        b0, b1 = first // per_block, (last - 1) // per_block
        k = b1 - b0 + 1
        end = starts[b1 + 1] if b1 + 1 < n_blocks else len(body)
        at = starts[b0] - HEADER - 4 * k  # the frame's start: room for its header and block starts
        size = min(nbytes, (b1 + 1) * blocksize) - b0 * blocksize  # its decompressed bytes
        if (b0, b1) != (0, n_blocks - 1):
            struct.pack_into("<BBBBiii", view, at, version, version_lz, flags, typesize, size, blocksize, end - at)
            struct.pack_into(f"<{k}i", view, at + HEADER, *(start - at for start in starts[b0 : b1 + 1]))
        else:
            at = 0
        return self._decode(body[at:end], size, b0, b1, per_block, first, last, out, buffers, keep)

    def _verified_blocks(self, path: str, size: int, first: int, last: int, out: np.ndarray, buffers: Buffers, keep: tuple) -> bool | None:
        """Cells [first, last) of a chunk whose file was checked whole in this process and is unchanged since: its
        header and block starts, then only the wanted blocks' bytes, read (`os.preadv`) into a frame of their own.
        None where the file is not what was checked (the caller then reads and checks it whole)."""
        try:
            with open(path, "rb", buffering=0) as f:
                fd = f.fileno()
                if _stamp(os.fstat(fd)) != keep[3]:  # replaced between the stat and the open: not the file checked
                    return None
                head = os.pread(fd, HEADER, 0)
                if len(head) != HEADER:
                    return None
                header = self._header(head)
                if header is None or header[6] != size - 4 or header[2] & MEMCPYED:
                    return None
                version, version_lz, flags, typesize, nbytes, blocksize, cbytes = header
                n_blocks = -(-nbytes // blocksize)
                table = os.pread(fd, 4 * n_blocks, HEADER)
                if len(table) != 4 * n_blocks:
                    return None
                starts = struct.unpack(f"<{n_blocks}i", table)
                if not _valid_starts(starts, n_blocks, cbytes):
                    return None
                per_block = blocksize // self.itemsize
                b0, b1 = first // per_block, (last - 1) // per_block
                k = b1 - b0 + 1
                end = starts[b1 + 1] if b1 + 1 < n_blocks else cbytes
                prefix = HEADER + 4 * k
                frame = buffers.get("frame", prefix + end - starts[b0])
                if os.preadv(fd, [frame[prefix:].data], starts[b0]) != end - starts[b0]:
                    return None
        except OSError:
            return None
        decoded = _frame_header(frame, header, starts, b0, b1)
        return self._decode(frame, decoded, b0, b1, per_block, first, last, out, buffers, keep)

    def _decode(
        self, frame: np.ndarray, size: int, b0: int, b1: int, per_block: int, first: int, last: int, out: np.ndarray, buffers: Buffers, keep
    ) -> bool:
        """Decompress a blosc frame of blocks b0..b1 (`size` bytes decoded) and put cells [first, last) in `out`."""
        isz = self.itemsize
        aligned = first == b0 * per_block and last == b0 * per_block + size // isz
        dest = out if aligned else buffers.get("blocks", size).view(self.dtype)
        try:
            blosc.decompress(frame, dest)
        except Exception:
            return False
        if not aligned:
            out[:] = dest[first - b0 * per_block : last - b0 * per_block]
        self.block_cells = per_block
        if keep is not None:  # blocks read before are kept now, each a copy (`dest` is reused, `out` the caller's)
            cache, path, index, stamp = keep
            for i, b in enumerate(range(b0, b1 + 1)):
                key = (self.folder, index, b, per_block)
                if cache.admit(key, stamp):
                    cache.put(key, stamp, dest[i * per_block : (i + 1) * per_block].copy())
        return True


def _frame_header(frame: np.ndarray, header: tuple, starts: tuple[int, ...], b0: int, b1: int) -> int:
    """Write the header and block starts of a blosc frame of blocks b0..b1 (their bytes already after them in `frame`)
    from the chunk's `header` and `starts`; returns the bytes it decompresses to."""
    version, version_lz, flags, typesize, nbytes, blocksize, _ = header
    k = b1 - b0 + 1
    prefix = HEADER + 4 * k
    decoded = min(nbytes, (b1 + 1) * blocksize) - b0 * blocksize
    struct.pack_into("<BBBBiii", frame.data, 0, version, version_lz, flags, typesize, decoded, blocksize, len(frame))
    struct.pack_into(f"<{k}i", frame.data, HEADER, *(prefix + start - starts[b0] for start in starts[b0 : b1 + 1]))
    return decoded


def _valid_starts(starts: tuple[int, ...], n_blocks: int, body: int) -> bool:
    """Block starts that lie after the header and its table, in order, inside the body."""
    return starts[0] >= HEADER + 4 * n_blocks and starts[-1] < body and all(a < b for a, b in zip(starts, starts[1:]))


def will_need(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start reading bytes [offset, offset + length) of an open file (length 0: to its end) into the
    page cache now (POSIX_FADV_WILLNEED returns at once): a cold read of many small pieces then waits on reads in
    flight together instead of one after another. Nothing where the platform has no posix_fadvise; errors ignored
    (it is a hint)."""
    if _FADVISE is not None:
        try:
            _FADVISE(fd, offset, length, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass


_FADVISE = getattr(os, "posix_fadvise", None)

DECODE_THREADS_ENV = "ATTNSTORE_DECODE_THREADS"
DECODE_POOL = SizedPool(DECODE_THREADS_ENV, "attnstore-decode")


def decode_threads() -> int:
    """Threads a read of many chunks decodes them on: ATTNSTORE_DECODE_THREADS, else the cores this process may use
    (at most 8); 1 decodes on the reading thread."""
    return DECODE_POOL.threads()


def decode_pool() -> ThreadPoolExecutor | None:
    """The process's pool of `decode_threads()` threads (None for one)."""
    return DECODE_POOL.get()
