"""Rows of a sharded kept-summary field read straight from its shard files (issue 29: a sample of a large run).

A kept summary's large per-example fields (store/arrays.py `summary_layout`) are zarr v3 shards: one file per range
of up to 4,096 examples, holding inner chunks of at most 64 KiB, each blosc-compressed with its own CRC32C, and at its
end the shard's index (zarr v3's sharding_indexed codec, index_location "end": per inner chunk its offset and length,
uint64 little-endian, 2**64-1 for one not written, then the index's own CRC32C). A sample's rows read each touched
shard's index and only the inner chunks holding them, each checked as zarr checks it: a fraction of the bytes a whole
chunk's checksum would read (`pattern_scores`: 64 of 4,096 rows; a sample of 1,000 of 8 M examples touches ~780
shards per field).

A read of many shards goes in three steps over up to SHARDS_AT_ONCE of them, each step's reads announced to the
kernel before any is made (store/direct.py `will_need`): open them and announce their indexes; read the indexes and
announce the wanted inner chunks; read and decode those. Cold, a sample's ~4,000 small reads are then in flight
together (1.7x faster than one after another: `python benchmarks/sampled_summaries.py --home H --run MRPC-dev
--samples 1000 --repeats 2 --cold`, docs/PERFORMANCE.md, 2026-11-27). Inner chunks written since 8571697 (2026-11-27)
are lz4 (store/arrays.py `SHARD_CODEC`); any blosc frame is read.

Anything else (a remote root, other codecs, a shard or inner chunk not written: zarr fills those with the fill value;
a checksum or length that does not match: zarr names the damage) returns None, and the caller reads through zarr.
"""

from __future__ import annotations

import os

import google_crc32c
import numpy as np
from numcodecs import Blosc, blosc
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec
from zarr.codecs.sharding import ShardingCodecIndexLocation
from zarr.storage import LocalStore

from .direct import will_need

NOT_WRITTEN = 2**64 - 1
WHOLE_FILE_AT = 4  # inner chunks of one shard wanted at once from which its whole file is read with one call
SHARDS_AT_ONCE = 256  # shards open at once in one read (each step's reads announced together, `ShardedRows._shards`)


def _little(codec) -> bool:
    return isinstance(codec, BytesCodec) and getattr(codec.endian, "value", "little") == "little"


def _blosc_of(array) -> BloscCodec | None:
    """The blosc codec of a field sharded as the summary writer shards them (whole rows per shard and inner chunk;
    inner chunks [bytes little-endian, blosc, crc32c]; index [bytes little-endian, crc32c] at the end), else None."""
    codecs = getattr(array.metadata, "codecs", None)  # None: a zarr v2 array
    if codecs is None or len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
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
    return inner[1]


def sharded_reader(array) -> ShardedRows | None:
    """A direct reader of a sharded field whose shards and inner chunks hold whole rows, or None where zarr must."""
    store = array.store_path.store
    if not isinstance(store, LocalStore) or _blosc_of(array) is None:
        return None
    return ShardedRows(array, str(store.root))


def shard_encoder(array) -> ShardEncoder | None:
    """An encoder of whole shards of a field sharded as the summary writer shards them, or None (zarr writes it)."""
    codec = _blosc_of(array)
    if codec is None or array.fill_value is None or np.asarray(array.fill_value) != 0:
        return None
    return ShardEncoder(array, codec)


class ShardEncoder:
    """A shard's bytes as zarr's sharding codec writes them for these codecs: each inner chunk blosc-compressed then its
    CRC32C, back to back, then the index and its CRC32C. Zarr hands each inner chunk's compression to a thread of its
    own (~1 ms each: a part of `pattern_scores`, 10 fields x 64 inner chunks, took 0.75 s against 0.15 s unsharded);
    here they are compressed in turn. As zarr does by default: an inner chunk cut by the array's end is padded with
    the fill value (zero); one that holds only the fill value is not written (nor a shard of only such chunks: None);
    inner chunks wholly past the end are not written."""

    def __init__(self, array, codec: BloscCodec) -> None:
        self.inner_rows = int(array.chunks[0])
        self.shard_rows = int(array.shards[0])
        self.per_shard = self.shard_rows // self.inner_rows
        self.dtype = np.dtype(array.dtype).newbyteorder("<")
        self.blosc = Blosc(cname=codec.cname.value, clevel=codec.clevel, shuffle=SHUFFLES[codec.shuffle.value], blocksize=codec.blocksize)

    def encode(self, rows: np.ndarray) -> bytes | None:
        """Shard bytes of `rows` (at most a shard's rows, the first of them the shard's first), None: nothing to write."""
        table = np.full((self.per_shard, 2), NOT_WRITTEN, dtype="<u8")
        pieces: list[bytes] = []
        at = 0
        for i in range(-(-len(rows) // self.inner_rows)):
            values = np.ascontiguousarray(rows[i * self.inner_rows : (i + 1) * self.inner_rows], dtype=self.dtype)
            if not np.any(values != 0):  # zarr's test of a chunk of the fill value (so -0.0 counts as 0, NaN not)
                continue
            if len(values) < self.inner_rows:
                values = np.concatenate([values, np.zeros((self.inner_rows - len(values), *values.shape[1:]), self.dtype)])
            body = bytes(self.blosc.encode(values))
            pieces += [body, google_crc32c.value(body).to_bytes(4, "little")]
            table[i] = (at, len(body) + 4)
            at += len(body) + 4
        if not pieces:
            return None
        index = table.tobytes()
        return b"".join([*pieces, index, google_crc32c.value(index).to_bytes(4, "little")])


SHUFFLES = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE}


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
        # a shard's file name is `head + str(shard) + tail`, found once: the key's encoder costs ~10 us a call, and a
        # sample visits ~800 shards per field
        marker = "987654321"
        template = self._path(int(marker))
        self._parts = template.split(marker) if template.count(marker) == 1 else None

    def _path(self, shard: int) -> str:
        return os.path.join(self.folder, *self.encode_key((shard, *(0,) * len(self.trailing))).split("/"))

    def shard_file(self, shard: int) -> str:
        return f"{self._parts[0]}{shard}{self._parts[1]}" if self._parts is not None else self._path(shard)

    def read(self, start: int, stop: int, cache=None) -> np.ndarray | None:
        """Cells [start, stop), whole rows only (a range of examples), flat."""
        if start % self.width or stop % self.width:
            return None
        got = self.read_rows(np.arange(start // self.width, stop // self.width))
        return None if got is None else got.reshape(-1)

    def read_rows(self, rows: np.ndarray, cache=None) -> np.ndarray | None:
        """Rows `rows` (ascending, distinct), shaped (len(rows), *trailing). `cache` is DirectCells' (the store's cache
        of decoded blocks), unused: an inner chunk is one small read and decode."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.width), dtype=self.dtype)
        inner = rows // self.inner_rows
        cut = np.flatnonzero(np.diff(inner)) + 1
        # rows firsts[i]..lasts[i]-1 lie in inner chunk chunks[i]; plain lists: a sample visits ~800 shards per call
        firsts, lasts = np.r_[0, cut].tolist(), np.r_[cut, len(rows)].tolist()
        chunks = inner[firsts].tolist() if len(rows) else []
        at = rows.tolist()
        scratch = np.empty((self.inner_rows, self.width), dtype=self.dtype)  # each inner chunk decoded here in turn

        def put(k: int, values: np.ndarray) -> None:  # inner chunk chunks[k]'s wanted rows into `out`
            lo, hi, base = firsts[k], lasts[k], chunks[k] * self.inner_rows
            if hi == lo + 1:  # the usual case in a sample: one row of the chunk
                out[lo] = values[at[lo] - base]
            elif at[hi - 1] - at[lo] == hi - lo - 1:  # consecutive rows (a range of examples): a slice
                out[lo:hi] = values[at[lo] - base : at[hi - 1] - base + 1]
            else:
                out[lo:hi] = values[rows[lo:hi] - base]

        visits = []  # (shard, its wanted inner chunks, their entries of `chunks`)
        i = 0
        while i < len(chunks):
            shard = chunks[i] // self.per_shard
            j = i + 1
            while j < len(chunks) and chunks[j] // self.per_shard == shard:
                j += 1
            visits.append((shard, [c % self.per_shard for c in chunks[i:j]], range(i, j)))
            i = j
        for start in range(0, len(visits), SHARDS_AT_ONCE):
            if not self._shards(visits[start : start + SHARDS_AT_ONCE], put, scratch):
                return None
        return out.reshape(len(rows), *self.trailing)

    def _shards(self, visits: list, put, scratch: np.ndarray) -> bool:
        """Each visit's inner chunks (shard, wanted inner chunks ascending, their keys), each decoded into `scratch` and
        handed to `put(key, values)`; False where anything is off. In three steps over all the visits, each step's reads
        announced to the kernel before any is made (`will_need`), so a cold sample's thousands of small reads are
        in flight together rather than one after another: open and announce the indexes; read them and announce the
        inner chunks; read and decode those. A shard wanted for WHOLE_FILE_AT inner chunks or more is read whole."""
        opened: list[int] = []
        try:
            found = []  # (fd, where its index starts, read whole, wanted, keys)
            for shard, wanted, keys in visits:
                try:
                    fd = os.open(self.shard_file(shard), os.O_RDONLY)
                except OSError:
                    return False
                opened.append(fd)
                at = os.fstat(fd).st_size - self.index_bytes
                if at < 0:
                    return False
                entire = len(wanted) >= WHOLE_FILE_AT
                will_need(fd, 0 if entire else at, at + self.index_bytes if entire else self.index_bytes)
                found.append((fd, at, entire, wanted, keys))
            later: list[tuple[int, list, range]] = []  # (fd, spans, keys): inner chunks announced, read in the last step
            for fd, at, entire, wanted, keys in found:
                whole = np.frombuffer(os.pread(fd, at + self.index_bytes, 0), np.uint8) if entire else None
                table = _checked(whole[at:] if whole is not None else os.pread(fd, self.index_bytes, at))
                if table is None:
                    return False
                spans = table.view("<u8").reshape(self.per_shard, 2)[wanted].tolist()
                if any(offset == NOT_WRITTEN or offset + length > at for offset, length in spans):
                    return False
                if whole is not None:  # decoded now: the file is in memory
                    for key, (offset, length) in zip(keys, spans, strict=True):
                        if not self._decode(whole[offset : offset + length], scratch):
                            return False
                        put(key, scratch)
                    continue
                for offset, length in spans:
                    will_need(fd, offset, length)
                later.append((fd, spans, keys))
            for fd, spans, keys in later:
                for key, (offset, length) in zip(keys, spans, strict=True):
                    if not self._decode(os.pread(fd, length, offset), scratch):
                        return False
                    put(key, scratch)
            return True
        except OSError:
            return False
        finally:
            for fd in opened:
                os.close(fd)

    def _decode(self, raw: bytes | np.ndarray, into: np.ndarray) -> bool:
        """One inner chunk's bytes, checked (CRC32C) and decompressed into `into`; False if anything is off."""
        body = _checked(raw)
        # a blosc 1 header's bytes 4..7: the decompressed size, checked before blosc writes it
        if body is None or len(body) < 16 or int.from_bytes(body[4:8].tobytes(), "little") != self.inner_bytes:
            return False
        try:
            blosc.decompress(body, into)
        except Exception:  # numcodecs raises RuntimeError (or ValueError) for a frame it cannot decode
            return False
        return True


def _checked(raw: bytes | np.ndarray) -> np.ndarray | None:
    """Bytes ending in their CRC32C (little-endian, zarr's crc32c codec), without it (a view), or None if it does not
    match. (A numpy view: google_crc32c takes no memoryview.)"""
    view = np.frombuffer(raw, dtype=np.uint8)
    if len(view) < 4 or google_crc32c.value(view[:-4]) != int.from_bytes(view[-4:].tobytes(), "little"):
        return None
    return view[:-4]
