"""Attention maps in Zarr v3: one flat array per run, each example's block at an offset.

Each example's maps are a dense (layer, head, query, key) block of
n_layers * n_heads * L * L cells, written back to back into a 1-D array, so
ragged lengths cost no padding. SQL (`sequences`) records each block's offset
and L. Blocks are appended through `BlockWriter`, which only ever writes whole
chunks (plus the last partial chunk when a run finishes), so a chunk that holds
committed data is never rewritten: a crash cannot damage stored examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
import zarr
from zarr.codecs import BloscCodec
from zarr.storage import FsspecStore, LocalStore

from .errors import CorruptInputError, InvalidArgumentError, NotFoundError

AXES = ("layer", "head", "query", "key")
# Chosen by measurement (benchmarks/choose_codec.py, docs/ARCHITECTURE.md): on MRPC dev
# float16 maps, byte-shuffle + zstd level 1 gives ~1.66 bytes/cell at ~300 M cells/s;
# bit-shuffle or higher zstd levels gain < 1 % for 3-10x the time.
DEFAULT_CODEC = {"name": "blosc", "cname": "zstd", "clevel": 1, "shuffle": "shuffle", "blocksize": 1 << 18}
DEFAULT_CHUNK_CELLS = 1 << 20  # 2 MiB of float16: about 5 MRPC examples, ~3 ms to decode
# The array is created with a large nominal length: chunks never written take no space,
# and not resizing while ingesting means the array metadata is written once.
CAPACITY_CELLS = 1 << 46
DTYPES = ("float16", "float32")


def open_root(root: str, read_only: bool):
    """A Zarr store for a local directory or any fsspec URL (s3://, gs://, ...)."""
    if "://" in root and not root.startswith("file://"):
        return FsspecStore.from_url(root, read_only=read_only)
    path = root[len("file://"):] if root.startswith("file://") else root
    return LocalStore(path, read_only=read_only)


def make_codec(spec: dict, dtype: str) -> BloscCodec:
    if spec.get("name") != "blosc":
        raise InvalidArgumentError(f"unsupported codec {spec!r}; only blosc codecs are supported")
    return BloscCodec(
        typesize=np.dtype(dtype).itemsize,
        cname=spec["cname"],
        clevel=spec["clevel"],
        shuffle=spec["shuffle"],
        blocksize=spec.get("blocksize", 0),
    )


def create_run_array(root: str, path: str, *, dtype: str, chunk_cells: int, codec: dict, attributes: dict):
    if dtype not in DTYPES:
        raise InvalidArgumentError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    return zarr.create_array(
        store=open_root(root, read_only=False),
        name=path,
        shape=(CAPACITY_CELLS,),
        chunks=(chunk_cells,),
        dtype=dtype,
        compressors=[make_codec(codec, dtype)],
        fill_value=0,
        dimension_names=("cell",),
        attributes={"block_axes": list(AXES), **attributes},
    )


def open_run_array(root: str, path: str, *, read_only: bool = True):
    try:
        return zarr.open_array(store=open_root(root, read_only=read_only), path=path, mode="r" if read_only else "r+")
    except (FileNotFoundError, KeyError) as exc:
        raise NotFoundError(f"attention array {path!r} not found under {root}; is --root the store's array root? ({exc})") from None


def resume_offset(stored_end: int, chunk_cells: int) -> int:
    """First offset a resumed run may write at: the next chunk boundary, never inside a written chunk."""
    return -(-stored_end // chunk_cells) * chunk_cells


class BlockWriter:
    """Append blocks at increasing offsets; write whole chunks only, until `flush(final=True)`.

    Blocks are copied once, straight into a growing buffer (a block may be a strided
    view of a padded batch); whole chunks are written from the buffer.
    """

    def __init__(self, array, start_offset: int):
        self.array = array
        self.chunk = array.chunks[0]
        if start_offset % self.chunk:
            raise InvalidArgumentError(f"start offset {start_offset} is not a multiple of the chunk size {self.chunk}")
        self._base = start_offset  # everything before this offset is on disk
        self._buf = np.empty(4 * self.chunk, dtype=array.dtype)
        self._buffered = 0

    @property
    def next_offset(self) -> int:
        return self._base + self._buffered

    @property
    def durable_offset(self) -> int:
        return self._base

    def append(self, block: np.ndarray) -> int:
        offset = self.next_offset
        n = block.size
        if self._buffered + n > self._buf.size:
            grown = np.empty(max(2 * self._buf.size, self._buffered + n), dtype=self._buf.dtype)
            grown[: self._buffered] = self._buf[: self._buffered]
            self._buf = grown
        self._buf[self._buffered : self._buffered + n].reshape(block.shape)[...] = block
        self._buffered += n
        return offset

    def flush(self, final: bool = False) -> int:
        """Write every whole buffered chunk (and the tail if `final`); return the durable offset."""
        n_write = self._buffered if final else (self._buffered // self.chunk) * self.chunk
        if n_write == 0:
            return self._base
        self.array[self._base : self._base + n_write] = self._buf[:n_write]
        rest = self._buffered - n_write
        self._buf[:rest] = self._buf[n_write : self._buffered].copy()
        self._buffered = rest
        self._base += n_write
        if final:  # the next write would start inside a chunk now on disk
            self._base = resume_offset(self._base, self.chunk)
        return self._base


@dataclass(frozen=True)
class BlockRef:
    key: object
    offset: int
    length: int


def block_shape(n_layers: int, n_heads: int, length: int) -> tuple[int, int, int, int]:
    return (n_layers, n_heads, length, length)


def read_block(array, offset: int, shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape))
    data = array[offset : offset + n]
    if data.size != n:
        raise CorruptInputError(f"attention array is shorter than expected at offset {offset}: store is damaged")
    return data.reshape(shape)


def iter_blocks(array, refs: Iterable[BlockRef], n_layers: int, n_heads: int, slab_cells: int | None = None) -> Iterator[tuple[object, np.ndarray]]:
    """Stream blocks in offset order, reading contiguous slabs of ~16 chunks at a time (bounded memory)."""
    slab_cells = slab_cells or 16 * array.chunks[0]
    group: list[BlockRef] = []

    def emit(group):
        start = group[0].offset
        end = max(r.offset + n_layers * n_heads * r.length**2 for r in group)
        data = array[start:end]
        for r in group:
            n = n_layers * n_heads * r.length**2
            yield r.key, data[r.offset - start : r.offset - start + n].reshape(block_shape(n_layers, n_heads, r.length))

    for ref in sorted(refs, key=lambda r: r.offset):
        if group and ref.offset + n_layers * n_heads * ref.length**2 - group[0].offset > slab_cells:
            yield from emit(group)
            group = []
        group.append(ref)
    if group:
        yield from emit(group)
