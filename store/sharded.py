"""Rows of a sharded kept-summary field read straight from its shard files (issue 29: a sample of a large run).

A kept summary's large per-example fields (store/arrays.py `summary_layout`) are zarr v3 shards: one file per range
of up to 4,096 examples, holding inner chunks of at most 64 KiB, each blosc-compressed with its own CRC32C, and at its
end the shard's index (zarr v3's sharding_indexed codec, index_location "end": per inner chunk its offset and length,
uint64 little-endian, 2**64-1 for one not written, then the index's own CRC32C). A sample's rows read each touched
shard's index and only the inner chunks holding them, each checked as zarr checks it: a fraction of the bytes a whole
chunk's checksum would read (`pattern_scores`: 64 of 4,096 rows; a sample of 1,000 of 8 M examples touches ~780
shards per field).

Anything else (a remote root, other codecs, a shard or inner chunk not written: zarr fills those with the fill value;
a checksum or length that does not match: zarr names the damage) returns None, and the caller reads through zarr.
"""

from __future__ import annotations

import os

import google_crc32c
import numpy as np
from numcodecs import blosc
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec
from zarr.codecs.sharding import ShardingCodecIndexLocation
from zarr.storage import LocalStore

NOT_WRITTEN = 2**64 - 1
WHOLE_FILE_AT = 4  # inner chunks of one shard wanted at once from which its whole file is read with one call


def _little(codec) -> bool:
    return isinstance(codec, BytesCodec) and getattr(codec.endian, "value", "little") == "little"


def sharded_reader(array) -> ShardedRows | None:
    """A direct reader of a sharded field whose shards and inner chunks hold whole rows, or None where zarr must."""
    store = array.store_path.store
    codecs = getattr(array.metadata, "codecs", None)  # None: a zarr v2 array
    if not isinstance(store, LocalStore) or codecs is None or len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        return None
    sharding = codecs[0]
    inner, index = sharding.codecs, sharding.index_codecs
    if not (
        len(inner) == 3
        and _little(inner[0])
        and isinstance(inner[1], BloscCodec)
        and isinstance(inner[2], Crc32cCodec)
        and len(index) == 2
        and _little(index[0])
        and isinstance(index[1], Crc32cCodec)
        and sharding.index_location == ShardingCodecIndexLocation.end
    ):
        return None
    trailing = tuple(int(n) for n in array.shape[1:])
    if array.ndim < 1 or 0 in trailing or array.dtype.byteorder == ">" or array.filters:
        return None
    if tuple(array.shards[1:]) != trailing or tuple(array.chunks[1:]) != trailing or array.shards[0] % array.chunks[0]:
        return None
    return ShardedRows(array, str(store.root))


class ShardedRows:
    """Rows of one sharded field (`read_rows`), or its flat cells [start, stop) of whole rows (`read`), as
    store/direct.py's DirectCells reads an unsharded one; None where zarr must read them."""

    def __init__(self, array, root: str) -> None:
        self.trailing = tuple(int(n) for n in array.shape[1:])
        self.width = int(np.prod(self.trailing, dtype=np.int64))  # cells per row
        self.dtype = np.dtype(array.dtype)
        self.inner_rows = int(array.chunks[0])
        self.per_shard = int(array.shards[0]) // self.inner_rows  # inner chunks per shard
        self.inner_bytes = self.inner_rows * self.width * self.dtype.itemsize
        self.index_bytes = 16 * self.per_shard + 4
        self.folder = os.path.join(root, *array.path.split("/"))
        self.encode_key = array.metadata.encode_chunk_key  # (3, 0, 0) -> "c/3/0/0"
        self.key_tail = (0,) * len(self.trailing)

    def shard_file(self, shard: int) -> str:
        return os.path.join(self.folder, *self.encode_key((shard, *self.key_tail)).split("/"))

    def read(self, start: int, stop: int, keep: bool = False) -> np.ndarray | None:
        """Cells [start, stop), whole rows only (a range of examples), flat."""
        if start % self.width or stop % self.width:
            return None
        got = self.read_rows(np.arange(start // self.width, stop // self.width), keep)
        return None if got is None else got.reshape(-1)

    def read_rows(self, rows: np.ndarray, keep: bool = False) -> np.ndarray | None:
        """Rows `rows` (ascending, distinct), shaped (len(rows), *trailing). `keep` is DirectCells' (a cache of decoded
        blocks), unused: an inner chunk is one small read and decode."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.width), dtype=self.dtype)
        inner = rows // self.inner_rows
        cut = np.flatnonzero(np.diff(inner)) + 1
        first, last = np.r_[0, cut], np.r_[cut, len(rows)]  # rows first[i]..last[i]-1 lie in inner chunk inner[first[i]]
        by_shard = np.flatnonzero(np.diff(inner[first] // self.per_shard)) + 1
        for group in np.split(np.arange(len(first)), by_shard) if len(rows) else []:
            chunks = inner[first[group]]
            decoded = self._shard(int(chunks[0]) // self.per_shard, chunks % self.per_shard)
            if decoded is None:
                return None
            for g, values in zip(group, decoded, strict=True):
                lo, hi = first[g], last[g]
                out[lo:hi] = values[rows[lo:hi] - int(inner[lo]) * self.inner_rows]
        return out.reshape(len(rows), *self.trailing)

    def _shard(self, shard: int, wanted: np.ndarray) -> list[np.ndarray] | None:
        """Inner chunks `wanted` (ascending, within the shard) of shard `shard`, decoded as (inner_rows, width)."""
        try:
            with open(self.shard_file(shard), "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.index_bytes:
                    return None
                whole = np.frombuffer(f.read(), np.uint8) if len(wanted) >= WHOLE_FILE_AT else None
                at = size - self.index_bytes
                table = _checked(whole[at:] if whole is not None else os.pread(f.fileno(), self.index_bytes, at))
                if table is None:
                    return None
                table = table.view("<u8").reshape(self.per_shard, 2)
                spans = table[wanted]
                if (spans[:, 0] == NOT_WRITTEN).any() or (spans[:, 0] + spans[:, 1] > at).any():
                    return None
                out = []
                for offset, length in spans.tolist():
                    raw = whole[offset : offset + length] if whole is not None else os.pread(f.fileno(), length, offset)
                    values = self._decode(raw)
                    if values is None:
                        return None
                    out.append(values)
                return out
        except OSError:
            return None

    def _decode(self, raw: bytes | np.ndarray) -> np.ndarray | None:
        """One inner chunk's bytes, checked (CRC32C) and decompressed, or None if anything is off."""
        body = _checked(raw)
        # a blosc 1 header's bytes 4..7: the decompressed size, checked before blosc allocates it
        if body is None or len(body) < 16 or int.from_bytes(body[4:8].tobytes(), "little") != self.inner_bytes:
            return None
        try:
            values = np.frombuffer(blosc.decompress(body), dtype=self.dtype)
        except Exception:  # numcodecs raises RuntimeError (or ValueError) for a frame it cannot decode
            return None
        return values.reshape(self.inner_rows, self.width)


def _checked(raw: bytes | np.ndarray) -> np.ndarray | None:
    """Bytes ending in their CRC32C (little-endian, zarr's crc32c codec), without it (a view), or None if it does not
    match. (A numpy view: google_crc32c takes no memoryview.)"""
    view = np.frombuffer(raw, dtype=np.uint8)
    if len(view) < 4 or google_crc32c.value(view[:-4]) != int.from_bytes(view[-4:].tobytes(), "little"):
        return None
    return view[:-4]
