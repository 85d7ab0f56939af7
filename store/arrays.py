"""Attention maps in Zarr v3: one flat array per run, each example's block at an offset.

Each example's maps are a dense (layer, head, query, key) block of
n_layers * n_heads * L * L cells, written back to back into a 1-D array, so
ragged lengths cost no padding. SQL (`sequences`) records each block's offset
and L. Blocks are appended through `BlockWriter`, which only ever writes whole
chunks (plus the last partial chunk when a run finishes), so a chunk that holds
committed data is never rewritten: a crash cannot damage stored examples.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec
from zarr.core.array_spec import ArrayConfigParams
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import FsspecStore, LocalStore

from .errors import DamagedDataError, InvalidArgumentError, NotFoundError

AXES = ("layer", "head", "query", "key")
# Chosen by measurement (benchmarks/choose_codec.py, docs/ARCHITECTURE.md): on MRPC dev
# float16 maps, byte-shuffle + zstd level 1 gives ~1.66 bytes/cell at ~300 M cells/s;
# bit-shuffle or higher zstd levels gain < 1 % for 3-10x the time.
# "checksum": every chunk ends with a CRC32C of its compressed bytes (Zarr v3's crc32c codec),
# checked before decompression: flipped or truncated bytes fail loudly, never decode.
DEFAULT_CODEC = {"name": "blosc", "cname": "zstd", "clevel": 1, "shuffle": "shuffle", "blocksize": 1 << 18, "checksum": "crc32c"}
# Chunks equal to the fill value are written too, so a missing chunk always means damage.
ARRAY_CONFIG: ArrayConfigParams = {"write_empty_chunks": True}
DEFAULT_CHUNK_CELLS = 1 << 20  # 2 MiB of float16: about 5 MRPC examples, ~3 ms to decode
# The array is created with a large nominal length: chunks never written take no space,
# and not resizing while ingesting means the array metadata is written once.
CAPACITY_CELLS = 1 << 46
DTYPES = ("float16", "float32")


def open_root(root: str, read_only: bool):
    """A Zarr store for a local directory or any fsspec URL (s3://, gs://, ...)."""
    if "://" in root and not root.startswith("file://"):
        return FsspecStore.from_url(root, read_only=read_only)
    path = root[len("file://") :] if root.startswith("file://") else root
    return LocalStore(path, read_only=read_only)


def root_writable(root: str) -> bool:
    """Whether a local array root can be written (its nearest existing folder); remote roots are assumed writable."""
    if "://" in root and not root.startswith("file://"):
        return True
    path = os.path.abspath(root[len("file://") :] if root.startswith("file://") else root)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return os.access(path, os.W_OK)


def make_codec(spec: dict, dtype: str) -> list:
    """The bytes-to-bytes codecs of a codec spec: blosc, then an optional CRC32C checksum."""
    if spec.get("name") != "blosc":
        raise InvalidArgumentError(f"unsupported codec {spec!r}; only blosc codecs are supported")
    if spec.get("checksum") not in (None, "crc32c"):
        raise InvalidArgumentError(f"unsupported checksum {spec['checksum']!r}; use 'crc32c' or none")
    blosc = BloscCodec(
        typesize=np.dtype(dtype).itemsize,
        cname=spec["cname"],
        clevel=spec["clevel"],
        shuffle=spec["shuffle"],
        blocksize=spec.get("blocksize", 0),
    )
    return [blosc, Crc32cCodec()] if spec.get("checksum") == "crc32c" else [blosc]


def create_run_array(root: str, path: str, *, dtype: str, chunk_cells: int, codec: dict, attributes: dict):
    if dtype not in DTYPES:
        raise InvalidArgumentError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    return zarr.create_array(
        store=open_root(root, read_only=False),
        name=path,
        shape=(CAPACITY_CELLS,),
        chunks=(chunk_cells,),
        dtype=dtype,
        compressors=make_codec(codec, dtype),
        config=ARRAY_CONFIG,
        fill_value=0,
        dimension_names=("cell",),
        attributes={"block_axes": list(AXES), **attributes},
    )


def open_run_array(root: str, path: str, *, read_only: bool = True):
    try:
        return zarr.open_array(store=open_root(root, read_only=read_only), path=path, mode="r" if read_only else "r+", config=ARRAY_CONFIG)
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


def chunk_key(array, index: int) -> str:
    """The store key of chunk `index`, e.g. runs/<id>/c/12."""
    return f"{array.path}/{array.metadata.encode_chunk_key((index,))}"


def present_chunks(array) -> set[int]:
    """Indices of the chunks that exist in the store (one listing)."""
    prefix = chunk_key(array, 0)[:-1]

    async def listing():
        return [key async for key in array.store_path.store.list_prefix(prefix)]

    return {int(k[len(prefix) :]) for k in sync(listing()) if k[len(prefix) :].isdigit()}


def chunk_range(array, start: int, stop: int) -> range:
    chunk = array.chunks[0]
    return range(start // chunk, (stop - 1) // chunk + 1) if stop > start else range(0)


def has_checksum(array) -> bool:
    return any(isinstance(c, Crc32cCodec) for c in array.metadata.codecs)


def legacy_chunk_problem(array, index: int) -> str | None:
    """For a chunk written without a checksum: does its blosc header agree with its stored size?

    Decoding a truncated blosc buffer can crash the process (segmentation fault), so arrays
    from before checksums are checked this way before any chunk is decoded.
    """
    raw = sync(array.store_path.store.get(chunk_key(array, index), prototype=default_buffer_prototype()))
    if raw is None:
        return "is missing"
    data = raw.to_bytes()
    if len(data) < 16:
        return f"is truncated ({len(data)} bytes)"
    cbytes = int.from_bytes(data[12:16], "little")
    if cbytes != len(data):
        return f"is truncated or padded (header says {cbytes} bytes, file has {len(data)})"
    return None


Describe = Callable[[int, int], str]  # (start, stop) cells -> "run 'x', example 3"


def _damaged(array, index: int, what: str, describe: Describe, reason: str) -> DamagedDataError:
    chunk = array.chunks[0]
    where = describe(index * chunk, (index + 1) * chunk)
    return DamagedDataError(f"{where}: chunk {chunk_key(array, index)} {reason}; run `attnstore check` to list the damage ({what})")


def read_cells(array, start: int, stop: int, describe: Describe, present: set[int] | None = None) -> np.ndarray:
    """Cells [start, stop), or DamagedDataError naming the chunk when one is missing or fails to decode.

    A chunk inside a run's written range is never legitimately absent (empty chunks are
    written too), so absence is damage, not zeros. `present` saves a lookup per chunk.
    """
    wanted = chunk_range(array, start, stop)
    if present is None:
        store = array.store_path.store
        missing = [i for i in wanted if not sync(store.exists(chunk_key(array, i)))]
    else:
        missing = [i for i in wanted if i not in present]
    if missing:
        raise _damaged(array, missing[0], f"{len(missing)} missing", describe, "is missing")
    if not has_checksum(array):
        for i in wanted:
            if why := legacy_chunk_problem(array, i):
                raise _damaged(array, i, "no checksums in this run", describe, why)
    try:
        data = array[start:stop]
    except Exception as exc:  # checksum mismatch, truncated or undecodable bytes
        for i in wanted:  # name the first chunk that fails on its own
            try:
                array[i * array.chunks[0] : (i + 1) * array.chunks[0]]
            except Exception as inner:
                raise _damaged(array, i, type(inner).__name__, describe, f"is damaged ({str(inner).splitlines()[0][:120]})") from None
        raise DamagedDataError(f"{describe(start, stop)}: cannot read cells {start}..{stop}: {exc}") from None
    if data.size != stop - start:
        raise DamagedDataError(f"{describe(start, stop)}: the array is shorter than its metadata says; run `attnstore check`")
    return data


def read_block(array, offset: int, shape: tuple[int, ...], describe: Describe | None = None) -> np.ndarray:
    n = int(np.prod(shape))
    describe = describe or (lambda a, b: f"array {array.path}")
    return read_cells(array, offset, offset + n, describe).reshape(shape)


def iter_blocks(
    array,
    refs: Iterable[BlockRef],
    n_layers: int,
    n_heads: int,
    slab_cells: int | None = None,
    describe: Callable[[list], str] | None = None,
) -> Iterator[tuple[object, np.ndarray]]:
    """Stream blocks in offset order, reading contiguous slabs of ~16 chunks at a time (bounded memory).

    Chunks are checked against one listing of the array; `describe(keys)` names examples in errors.
    """
    slab_cells = slab_cells or 16 * array.chunks[0]
    present = present_chunks(array)
    group: list[BlockRef] = []

    def size(r: BlockRef) -> int:
        return n_layers * n_heads * r.length**2

    def emit(group):
        start = group[0].offset
        end = max(r.offset + size(r) for r in group)

        def where(a: int, b: int) -> str:
            keys = [r.key for r in group if r.offset < b and r.offset + size(r) > a]
            return describe(keys) if describe else f"array {array.path}, blocks {keys}"

        data = read_cells(array, start, end, where, present)
        for r in group:
            yield r.key, data[r.offset - start : r.offset - start + size(r)].reshape(block_shape(n_layers, n_heads, r.length))

    for ref in sorted(refs, key=lambda r: r.offset):
        if group and ref.offset + size(ref) - group[0].offset > slab_cells:
            yield from emit(group)
            group = []
        group.append(ref)
    if group:
        yield from emit(group)
