"""The kept-summary format, in one place: a run's per-example summaries (`summary/<key>/`) and their range
reductions (`summary/<key>/ranges/`), written part by part, stamped last, read back whole, in ranges of examples or
row by row, checked, and removed; and `RunSummaries`, the one handle the rest of attnstore reaches them through
(`store.summaries(run)`).

Longer than ~500 lines on purpose: the summary groups' writers and readers are one format, read and changed as one
(a field's chunking decides how a sample reads it back).

A query's framework (queries/engine/) decides what is kept and when; this module decides how it is laid out, in the
run's group (store/arrays.py). Two builders of one summary never write at once:
`RunSummaries.keep` holds the summary's lease (`summary:RUN_ID:KEY`) and looks for it again before writing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from . import direct, sharded
from .arrays import INDEX_CODEC, group_path_of, make_codec, open_root
from .errors import StorageIOError

if TYPE_CHECKING:
    from .records import RunInfo
    from .store import Store


# A kept summary's sharded fields (`summary_layout`): a sample reads one inner chunk per row it wants, so decoding
# speed rules. `pattern_scores`' float64 scores, inner chunks of 64 rows: lz4 5.1x faster to decode than zstd-3
# (9 against 47 us) for 4.8 % more bytes (0.882 against 0.842 of raw; docs/PERFORMANCE.md, 2026-11-27, 8571697).
SHARD_CODEC = {"name": "blosc", "cname": "lz4", "clevel": 5, "shuffle": "shuffle", "checksum": "crc32c"}


# Written with the stamp, in the same metadata write: each field's rows when the summary was finished. A summary is read
# back only where its arrays still hold those rows, so one that two builders overwrote at once, or that lost a field, is
# rebuilt instead of read (a summary kept without this record, before it existed, is rebuilt once).
SUMMARY_ROWS = "rows"


def _open_summary(root: str, array_path: str, name: str, stamp: dict):
    """The zarr group of a run's saved summary `name` if its stamp matches, else None."""
    path = f"{group_path_of(array_path)}/summary/{name}"
    try:
        node = zarr.open_group(store=open_root(root, read_only=True), path=path, mode="r")
        return node if node.attrs.get("stamp") == stamp else None
    except (FileNotFoundError, KeyError, ValueError, zarr.errors.NodeNotFoundError):
        return None


def summary_damage(node, arrays_of_node: dict | None = None) -> str | None:
    """What is wrong with a stamped summary group's arrays against the rows recorded when it was finished (None: they
    match): a field missing or extra, or a field's rows not those recorded. `arrays_of_node`: its arrays, if read."""
    recorded = node.attrs.get(SUMMARY_ROWS)
    if not isinstance(recorded, dict):
        return "it was kept without a record of its rows (by an older attnstore)"
    try:
        held = dict(node.arrays()) if arrays_of_node is None else arrays_of_node
    except (FileNotFoundError, KeyError, ValueError, zarr.errors.NodeNotFoundError) as exc:
        return f"its arrays cannot be opened ({type(exc).__name__})"
    missing, extra = sorted(set(recorded) - set(held)), sorted(set(held) - set(recorded))
    if missing:
        return f"field(s) {missing} missing"
    if extra:
        return f"field(s) {extra} not recorded when it was finished"
    short = [key for key, rows in recorded.items() if _rows(held[key].shape) != int(rows)]
    if short:
        key = short[0]
        return f"field {key!r} holds {_rows(held[key].shape)} rows, {recorded[key]} were written"
    return None


def _rows(shape: tuple[int, ...]) -> int:
    return int(shape[0]) if shape else 1


def _complete_summary(root: str, array_path: str, name: str, stamp: dict) -> tuple[Any, dict] | None:
    """(group, its arrays) of a run's saved summary `name` if its stamp matches and its arrays hold the rows recorded
    with the stamp, else None."""
    node = _open_summary(root, array_path, name, stamp)
    if node is None:
        return None
    try:
        held = dict(node.arrays())
    except (FileNotFoundError, KeyError, ValueError, zarr.errors.NodeNotFoundError):
        return None
    return None if summary_damage(node, held) is not None else (node, held)


def stamped_summaries(root: str, array_path: str) -> list[tuple[str, Any]]:
    """(name, group) of every summary kept beside a run that carries a stamp (finished), in name order."""
    path = f"{group_path_of(array_path)}/summary"
    try:
        folder = zarr.open_group(store=open_root(root, read_only=True), path=path, mode="r")
        return sorted((name, node) for name, node in folder.groups() if node.attrs.get("stamp") is not None)
    except (FileNotFoundError, KeyError, ValueError, zarr.errors.NodeNotFoundError):
        return []


def remove_summary(root: str, array_path: str, name: str) -> str:
    """Delete a run's kept summary `name` (its whole group); the store key of the group removed."""
    key = f"{group_path_of(array_path)}/summary/{name}"
    sync(open_root(root, read_only=False).delete_dir(key))
    return key


def read_summary(root: str, array_path: str, name: str, stamp: dict) -> dict[str, np.ndarray] | None:
    """A run's saved per-example summary `name` (<run group>/summary/<name>/), whole, if its stamp matches."""
    found = _complete_summary(root, array_path, name, stamp)
    if found is None:
        return None
    node = found[0]
    store = node.store_path.store

    async def read_all():  # every array at once: a summary has a dozen small ones, each a few reads
        group = await zarr.api.asynchronous.open_group(store=store, path=node.path, mode="r")
        members = [(key, array) async for key, array in group.arrays()]
        values = await asyncio.gather(*(array.getitem(...) for _, array in members))
        return {key: np.asarray(value) for (key, _), value in zip(members, values)}

    try:
        return sync(read_all())
    except (FileNotFoundError, KeyError, ValueError, zarr.errors.NodeNotFoundError):
        return None


def is_ragged_start(key: str, keys: Iterable[str]) -> bool:
    """Whether `key` is the offsets of a ragged field (`<field>_start`, n + 1 entries, beside `<field>`)."""
    return key.endswith("_start") and key[: -len("_start")] in keys


class SummaryParts:
    """A saved summary read back in consecutive ranges of examples (`part`) or some of its examples (`rows`), each with
    its own ragged rows (offsets from 0).

    A local root's fields are read straight from their chunk files (store/direct.py: the file's checksum, then only
    the blosc blocks holding the rows; store/sharded.py for a sharded field: the shard's index, then only the inner
    chunks holding the rows, each checked): through zarr each field's read is an event-loop hop and a whole chunk
    decoded (~3 ms per field and range of 4,096 examples, whether one example or all of them is wanted). Anything the
    direct read does not take (a remote root, a chunk not written because it held only zeros, damage) is read through
    zarr, which fills or names it."""

    def __init__(self, node, held: dict | None = None, cache: direct.BlockCache | None = None) -> None:
        self.arrays = dict(node.arrays()) if held is None else held
        self.cache = cache  # the store's cache of decoded blocks, for a sample's rows (`rows`)
        self.n = int(self.arrays["example"].shape[0])
        self._direct = {key: _direct_reader(array) for key, array in self.arrays.items()}

    def _slice(self, key: str, start: int, stop: int) -> np.ndarray:
        reader = self._direct[key]
        got = None if reader is None or stop <= start else reader.read(start * reader.width, stop * reader.width)
        if reader is None or got is None:
            return np.asarray(self.arrays[key][start:stop])
        return got.reshape(stop - start, *reader.trailing)

    def column(self, key: str) -> np.ndarray:
        """Field `key` of every example, whole (the example column: 8 bytes an example)."""
        return self._slice(key, 0, self.n)

    def _keys(self, fields: Iterable[str] | None) -> list[str]:
        """The arrays holding `fields` (None: all) and the example column, with a ragged field's offsets."""
        if fields is None:
            return list(self.arrays)
        wanted = {"example", *fields}
        wanted |= {f"{f}_start" for f in wanted}
        return [key for key in self.arrays if key in wanted]

    def part(self, start: int, stop: int, fields: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Examples start..stop-1 (in the summary's order), as `write_summary` was given them for those alone (only
        `fields` and the example column, if given)."""
        keys = set(self.arrays)
        out: dict[str, np.ndarray] = {}
        for key in self._keys(fields):
            if is_ragged_start(key, keys):
                offsets = self._slice(key, start, stop + 1).astype(np.int64, copy=False)
                out[key] = offsets - offsets[0]
                out[key[: -len("_start")]] = self._slice(key[: -len("_start")], int(offsets[0]), int(offsets[-1]))
            elif f"{key}_start" not in keys:
                out[key] = self._slice(key, start, stop)
        return out

    def _take(self, key: str, rows: np.ndarray) -> np.ndarray:
        """Rows `rows` (ascending, distinct) of array `key`: straight from its chunk files where it can, else zarr."""
        array, reader = self.arrays[key], self._direct[key]
        if not len(rows):
            return np.empty((0, *array.shape[1:]), dtype=array.dtype)
        got = None if reader is None else reader.read_rows(rows, self.cache)
        return got if got is not None else np.asarray(array.get_orthogonal_selection((rows,)))

    def rows(self, positions: np.ndarray, fields: Iterable[str] | None = None, examples: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The examples at `positions` (ascending, distinct, in the summary's order), as `write_summary` was given them
        for those alone (only `fields` and the example column, if given): a sample's rows, each decoding the blosc
        blocks (or inner chunks) they lie in rather than their chunks. A ragged field's rows are each example's, between
        its offsets. `examples`: those rows of the example column, where the caller has read it (not read again)."""
        positions = np.asarray(positions, dtype=np.int64)
        keys = set(self.arrays)
        out: dict[str, np.ndarray] = {}
        for key in self._keys(fields):
            if key == "example" and examples is not None:
                out[key] = np.array(examples, dtype=self.arrays[key].dtype)
            elif is_ragged_start(key, keys):
                bounds = np.union1d(positions, positions + 1)  # each example's first row and the next one's
                offsets = self._take(key, bounds).astype(np.int64, copy=False)
                first = offsets[np.searchsorted(bounds, positions)]
                sizes = offsets[np.searchsorted(bounds, positions + 1)] - first
                ends = np.cumsum(sizes)
                wanted = np.repeat(first - (ends - sizes), sizes) + np.arange(int(ends[-1]) if len(ends) else 0)
                out[key] = np.r_[0, ends].astype(np.int64)
                out[key[: -len("_start")]] = self._take(key[: -len("_start")], wanted)
            elif f"{key}_start" not in keys:
                out[key] = self._take(key, positions)
        return out

    def rows_in_parts(self, positions: np.ndarray, cuts: list[int], fields=None, examples=None) -> list[dict[str, np.ndarray]]:
        """`rows(positions, fields, examples)`, each field read once, handed back as consecutive parts cut before each
        index of `cuts` (each as `rows` gives its examples alone: a ragged field's offsets from 0)."""
        got = self.rows(positions, fields, examples)
        keys = set(got)
        bounds = [0, *cuts, len(positions)]
        parts = []
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            part: dict[str, np.ndarray] = {}
            for key, values in got.items():
                if is_ragged_start(key, keys):
                    offsets = values[lo : hi + 1]
                    part[key] = offsets - offsets[0]
                    part[key[: -len("_start")]] = got[key[: -len("_start")]][offsets[0] : offsets[-1]]
                elif f"{key}_start" not in keys:
                    part[key] = values[lo:hi]
            parts.append(part)
        return parts


def _direct_reader(array):
    """A summary field's reader straight from its files: of its shards' inner chunks, or of its chunks (None: zarr)."""
    return direct.direct_reader(array) if array.shards is None else sharded.sharded_reader(array)


def summary_parts(root: str, array_path: str, name: str, stamp: dict, cache: direct.BlockCache | None = None) -> SummaryParts | None:
    """A run's saved summary `name` for reading in parts, if its stamp matches (`cache`: the store's decoded blocks)."""
    found = _complete_summary(root, array_path, name, stamp)
    return None if found is None else SummaryParts(*found, cache=cache)


# A kept summary's range reductions: `summary/<name>/ranges/`, one row per range of examples (the parts the summary was
# written in, SUMMARY_CHUNK_ROWS examples each when built), each field the reduction the kind declares (its `totals`)
# of that range's per-example fields, and `range_examples` (how many the range holds). A whole-run query adds these
# rows instead of reading every example's (queries/engine/). Stamped like the summary, before it.
#
# The fields are packed, one 2-D array per dtype (`packed_<dtype>`: a row per range, each field's values flattened side
# by side), their names, dtypes, shapes and columns in the group's `fields` attribute: a kind's ~40 fields cost a
# first query two array creations instead of ~40 (about 7 ms each through zarr, 0.25 s of MRPC dev's first `entropy`).
# A group without `fields` (written before packing) is not read: its ranges are derived again from the summary.
# `labels`: for a kind whose totals count on an axis only the run names (its dependency relations), the names of that
# axis's entries, in order (None for every other kind).
SUMMARY_RANGES = "ranges"
RANGE_CHUNK_ROWS = 128  # ranges per chunk (~2.6 MB of float64 for `clark`): a query adds a block of them at a time
RANGE_EXAMPLES = "range_examples"  # how many examples each range holds
PACKED = "packed_"


@dataclass(frozen=True)
class PackedField:
    name: str
    dtype: str
    shape: tuple[int, ...]
    column: int  # its first column in `packed_<dtype>`

    @property
    def width(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def as_json(self) -> list:
        return [self.name, self.dtype, list(self.shape), self.column]


def _packing(rows: dict[str, np.ndarray]) -> list[PackedField]:
    """Where each field (one row per range: (ranges, *shape)) goes in the packed arrays of its dtype."""
    columns: dict[str, int] = {}
    out = []
    for name, values in rows.items():
        dtype = str(values.dtype)
        out.append(PackedField(name, dtype, tuple(int(n) for n in values.shape[1:]), columns.get(dtype, 0)))
        columns[dtype] = columns.get(dtype, 0) + out[-1].width
    return out


class SummaryRanges:
    """A kept summary's range reductions, read back a block of ranges at a time."""

    def __init__(self, node, fields: list[PackedField], labels: list[str] | None = None) -> None:
        self.fields = fields
        self.labels = labels
        self.arrays = {dtype: node[PACKED + dtype] for dtype in {f.dtype for f in fields}}
        self.n = int(next(iter(self.arrays.values())).shape[0]) if self.arrays else 0  # none: a run of no examples

    def n_examples(self) -> int:
        """The examples the ranges hold, all together."""
        return int(self.block(0, self.n, only=RANGE_EXAMPLES)[RANGE_EXAMPLES].sum()) if self.n else 0

    def block(self, start: int, stop: int, only: str | None = None) -> dict[str, np.ndarray]:
        """Ranges start..stop-1, every field (or `only` that one) with a leading axis of one row per range."""
        fields = [f for f in self.fields if only is None or f.name == only]
        dtypes = sorted({f.dtype for f in fields})

        async def read_all():
            return await asyncio.gather(*(self.arrays[d]._async_array.getitem(slice(start, stop)) for d in dtypes))

        packed = {d: np.asarray(v) for d, v in zip(dtypes, sync(read_all()))}
        rows = {d: len(v) for d, v in packed.items()}  # explicit: a field of no values (no relation) has width 0
        return {f.name: packed[f.dtype][:, f.column : f.column + f.width].reshape(rows[f.dtype], *f.shape) for f in fields}


def summary_ranges(root: str, array_path: str, name: str, stamp: dict) -> SummaryRanges | None:
    """A run's saved summary `name`'s range reductions, if both the summary's stamp and theirs match."""
    node = _open_summary(root, array_path, name, stamp)
    if node is None:
        return None
    try:
        ranges = zarr.open_group(store=node.store_path.store, path=f"{node.path}/{SUMMARY_RANGES}", mode="r")
    except (FileNotFoundError, KeyError, ValueError, zarr.errors.NodeNotFoundError):
        return None
    fields, labels = ranges.attrs.get("fields"), ranges.attrs.get("labels")
    if ranges.attrs.get("stamp") != stamp or not isinstance(fields, list) or not (labels is None or isinstance(labels, list)):
        return None
    try:
        return SummaryRanges(ranges, [PackedField(n, d, tuple(shape), int(c)) for n, d, shape, c in fields], labels)
    except (KeyError, ValueError, TypeError):  # a packed array missing, or fields not as written: derived again
        return None


class SummaryRangesWriter:
    """Saves range reductions under `summary/<name>/ranges/` one range at a time; `finish` stamps them, last. `labels`:
    the names of the totals' labelled axis, where the kind's totals have one."""

    def __init__(self, root: str, array_path: str, name: str, labels: list[str] | None = None) -> None:
        self.node = zarr.create_group(
            store=open_root(root, read_only=False),
            path=f"{group_path_of(array_path)}/summary/{name}/{SUMMARY_RANGES}",
            overwrite=True,
            attributes={"stamp": None, "labels": labels},
        )
        self.fields: list[PackedField] | None = None
        self.arrays: dict[str, zarr.Array] = {}

    def append(self, n_examples: int, totals: dict[str, np.ndarray]) -> None:
        """Add the next range's reduction (`totals`: fields of any fixed shape) of its `n_examples` examples."""
        if n_examples:
            self.extend(np.asarray([n_examples], np.int64), {key: np.asarray(value)[None] for key, value in totals.items()})

    def extend(self, n_examples: np.ndarray, totals: dict[str, np.ndarray]) -> None:
        """Add the next ranges' reductions at once: `n_examples` (one count per range), `totals` (one row per range)."""
        rows = {RANGE_EXAMPLES: np.asarray(n_examples, np.int64), **{key: np.asarray(value) for key, value in totals.items()}}
        if self.fields is None:
            self.fields = _packing(rows)
            for dtype in sorted({f.dtype for f in self.fields}):
                width = sum(f.width for f in self.fields if f.dtype == dtype)
                self.arrays[dtype] = self.node.create_array(
                    PACKED + dtype, shape=(0, width), dtype=dtype, chunks=(RANGE_CHUNK_ROWS, max(1, width)),
                    compressors=make_codec(INDEX_CODEC, dtype),
                )  # fmt: skip
            self.node.attrs["fields"] = [f.as_json() for f in self.fields]
        n = len(rows[RANGE_EXAMPLES])
        for dtype, target in self.arrays.items():
            fields = [f for f in self.fields if f.dtype == dtype]
            packed = np.concatenate([rows[f.name].astype(dtype, copy=False).reshape(n, f.width) for f in fields], axis=1)
            at = target.shape[0]
            target.resize((at + n, target.shape[1]))
            target[at:] = packed

    def finish(self, stamp: dict) -> None:
        self.node.attrs["stamp"] = stamp


SUMMARY_CHUNK_BYTES = 8 << 20
SUMMARY_CHUNK_ROWS = 4096  # examples per chunk at most: queries read a summary back 4,096 examples at a time
# A field's chunk larger than this is a shard of inner chunks of about SUMMARY_INNER_BYTES, each compressed and checked
# on its own (store/sharded.py), so one example's row is read and checked without its whole chunk.
SHARD_ABOVE_BYTES = 256 << 10
SUMMARY_INNER_BYTES = 64 << 10


def _summary_chunks(array: np.ndarray, ragged: bool, whole: bool) -> tuple[int, ...]:
    """Whole rows (examples, or units of ragged fields) per chunk, a power of two of at most about 8 MiB: a large
    run's summary is not one object of gigabytes, and a range of examples read back decodes its own chunks only.

    `array` is the first part written; `whole`: that part holds fewer than SUMMARY_CHUNK_ROWS examples, so it is the
    whole summary (parts are ranges of that many examples, the last one shorter), and its chunks are no larger than
    the next power of two of it.
    A small run's summary is then not padded to 4,096 rows, which zarr would encode and compare with its fill value
    per field (MRPC dev's 408 examples: ~2 ms per field, 0.1 s of a first query's 0.8 s)."""
    if array.ndim == 0:
        return (1,)
    row_bytes = max(1, int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize)
    rows = 1 << max(0, (SUMMARY_CHUNK_BYTES // row_bytes).bit_length() - 1)
    if not ragged:
        rows = min(rows, SUMMARY_CHUNK_ROWS)
    if whole:
        rows = min(rows, 1 << max(0, (len(array) - 1).bit_length()))
    return (rows, *(max(1, n) for n in array.shape[1:]))


def summary_layout(array: np.ndarray, ragged: bool, whole: bool) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """`create_array`'s chunks and shards (None: not sharded) for a summary field: `_summary_chunks`, and where such a chunk holds more
    than SHARD_ABOVE_BYTES of fixed-size rows, a shard of that many rows made of inner chunks of a power of two of
    rows, about SUMMARY_INNER_BYTES each (at least two per shard). A sample of a large run then reads and checks a
    row's inner chunk, not a chunk of 2 MiB (`pattern_scores`' fields: 4,096 rows of 576 bytes)."""
    chunks = _summary_chunks(array, ragged, whole)
    if ragged or array.ndim == 0:
        return chunks, None
    row_bytes = max(1, int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize)
    inner = 1 << max(0, (SUMMARY_INNER_BYTES // row_bytes).bit_length() - 1)
    if chunks[0] * row_bytes <= SHARD_ABOVE_BYTES or 2 * inner > chunks[0]:
        return chunks, None
    return (inner, *chunks[1:]), chunks


def summary_file_rows(array) -> int:
    """Rows per chunk file of a summary field: its shard's, else its chunk's."""
    return int((array.shards or array.chunks)[0])


class SummaryWriter:
    """Saves a per-example summary beside a run's maps part by part (consecutive ranges of examples, in order), so
    the whole summary is never held at once. The stamp is written by `finish`, last: a summary cut off part-way
    (an error, a killed process) has none and is never read."""

    def __init__(
        self,
        root: str,
        array_path: str,
        name: str,
        totals: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
        labels: list[str] | None = None,
    ) -> None:
        self.node = zarr.create_group(
            store=open_root(root, read_only=False),
            path=f"{group_path_of(array_path)}/summary/{name}",
            overwrite=True,
            attributes={"stamp": None},
        )
        self.arrays: dict[str, zarr.Array] = {}
        self.encoders: dict[str, sharded.ShardEncoder | None] = {}  # per sharded field: its shards' encoder
        self.ragged_rows: dict[str, int] = {}  # per `<field>_start`: the ragged field's rows saved so far
        self.rows: dict[str, int] = {}  # per field: its rows saved so far (recorded with the stamp)
        # totals: the kind's range reduction; each appended part (a range of examples) is then also kept reduced
        self.totals = totals
        self.ranges = SummaryRangesWriter(root, array_path, name, labels) if totals is not None else None

    def append(self, values: dict[str, np.ndarray]) -> None:
        """Add the next examples' fields; a ragged field's `<field>_start` is that part's own (n + 1, from 0)."""
        if not len(values["example"]) and self.arrays:
            return
        if self.ranges is not None and self.totals is not None and len(values["example"]):
            self.ranges.append(len(values["example"]), self.totals(values))
        parts = {}
        for key, array in values.items():
            array = np.asarray(array)
            if is_ragged_start(key, values):
                if key in self.arrays:  # continue the saved offsets: drop the part's leading 0, shift by the rows so far
                    array = array[1:] + self.ragged_rows[key]
                self.ragged_rows[key] = int(array[-1])
            parts[key] = array
            self.rows[key] = self.rows.get(key, 0) + _rows(array.shape)
        whole = len(values["example"]) < SUMMARY_CHUNK_ROWS

        async def write(key: str, array: np.ndarray) -> None:
            kept = self.arrays.get(key)
            if kept is None:  # created at the part's size: no resize, one metadata write
                chunks, shards = summary_layout(array, ragged=f"{key}_start" in values, whole=whole)
                target = await self.node._async_group.create_array(
                    key,
                    shape=array.shape,
                    dtype=array.dtype,
                    chunks=chunks,
                    shards=shards,
                    compressors=make_codec(INDEX_CODEC if shards is None else SHARD_CODEC, str(array.dtype)),
                )
                self.arrays[key] = zarr.Array(target)
                self.encoders[key] = None if shards is None else sharded.shard_encoder(self.arrays[key])
                at = 0
            else:
                target = kept._async_array
                at = target.shape[0]
                await target.resize((at + array.shape[0], *array.shape[1:]))
            encoder = self.encoders[key]
            if encoder is not None and at % encoder.shard_rows == 0:  # whole shards from their first row: encoded here
                await _write_shards(target, encoder, at, array)
            elif array.shape[0]:
                await target.setitem(slice(at, at + array.shape[0]), array)

        async def write_all() -> None:  # the fields' arrays at once: each is a few metadata and chunk writes through zarr
            await asyncio.gather(*(write(key, array) for key, array in parts.items()))

        sync(write_all())

    def finish(self, stamp: dict) -> None:
        if self.ranges is not None:
            self.ranges.finish(stamp)  # before the summary's own: a stamped summary's ranges are complete
        self.node.attrs.update({"stamp": stamp, SUMMARY_ROWS: dict(self.rows)})  # one metadata write: stamped means recorded


async def _write_shards(target, encoder: sharded.ShardEncoder, at: int, rows: np.ndarray) -> None:
    """Rows at..at+len-1 of a sharded field, `at` a shard's first row, written shard by shard (sharded.ShardEncoder:
    the bytes zarr's sharding codec writes, without a thread hop per inner chunk)."""
    per = encoder.shard_rows
    tail = (0,) * (rows.ndim - 1)
    for start in range(0, len(rows), per):
        data = await asyncio.to_thread(encoder.encode, rows[start : start + per])  # fields at once: blosc frees the GIL
        if data is not None:  # None: only the fill value (a new field's shard: no file there to remove)
            key = target.metadata.encode_chunk_key(((at + start) // per, *tail))
            await (target.store_path / key).set(default_buffer_prototype().buffer.from_bytes(data))


def write_summary(root: str, array_path: str, name: str, values: dict[str, np.ndarray], stamp: dict) -> None:
    """Save a whole per-example summary beside the run's maps (one part); the stamp is written last."""
    writer = SummaryWriter(root, array_path, name)
    writer.append(values)
    writer.finish(stamp)


class RunSummaries:
    """A run's kept summaries (`store.summaries(run)`): read them (`parts`, `ranges`, `whole`), keep them (`keep`,
    `keep_ranges`: writable stores), list the stamped ones (`stamped`) and remove one (`remove`)."""

    def __init__(self, store: Store, info: RunInfo):
        self.store = store
        self.info = info
        self.root = store.locations.array_root
        self.array_path = info.array_path  # a run still in Zarr layout 1 is refused here (store/records.py)

    def whole(self, name: str, stamp: dict) -> dict[str, np.ndarray] | None:
        """Summary `name`, whole, if it is kept with this stamp and complete."""
        return read_summary(self.root, self.array_path, name, stamp)

    def parts(self, name: str, stamp: dict) -> SummaryParts | None:
        """Summary `name` to read range by range (`.n` examples, `.part(start, stop)`), if kept with this stamp and complete."""
        return summary_parts(self.root, self.array_path, name, stamp, self.store.block_cache)

    def ranges(self, name: str, stamp: dict) -> SummaryRanges | None:
        """Summary `name`'s range reductions (`.n` ranges, `.block(start, stop)`), if they and it carry this stamp."""
        return summary_ranges(self.root, self.array_path, name, stamp)

    def stamped(self) -> list[tuple[str, Any]]:
        return stamped_summaries(self.root, self.array_path)

    def remove(self, name: str) -> str:
        return remove_summary(self.root, self.array_path, name)

    def _building(self, name: str):
        """The lease on building summary `name`, waited for: one process (or thread) builds and writes a summary at a
        time, and one that waited reads what the other kept instead of writing it again (two builders writing the same
        group at once left it stamped with fields missing). A killed builder's lease is taken over at once on its host,
        after the stale period elsewhere (store/leases.py)."""
        from .writer import summary_lease_name

        what = f"the summary {name!r} of run {self.info.name!r}"
        return self.store.writer.lease(summary_lease_name(self.info.id, name), what, wait=True)

    def keep(
        self,
        name: str,
        parts: Iterable[dict[str, np.ndarray]],
        stamp: dict,
        n_examples: int | None = None,
        totals: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
        labels: list[str] | None = None,
    ) -> bool:
        """Keep a summary given as consecutive parts (ranges of examples in order, each as one would be given whole),
        holding one part at a time. It is stamped, and so read back, unless the parts do not cover `n_examples`
        examples (a run that grew while it was read); returns whether it was. `totals`: the kind's range reduction;
        each part's is kept too (`ranges`), with `labels` (the names of its labelled axis, if it has one). Where
        another process kept it while this one waited for its lease, that one is read and `parts` is never built."""
        self.store.writer.require_writable()
        try:
            with self._building(name):
                if self.parts(name, stamp) is not None:
                    return True
                writer = SummaryWriter(self.root, self.array_path, name, totals, labels)
                n = 0
                for part in parts:
                    writer.append(part)
                    n += len(part["example"])
                if n_examples is not None and n != n_examples:
                    return False
                writer.finish(stamp)
                return True
        except OSError as exc:
            raise StorageIOError(f"cannot save the summary of run {self.info.name!r}: {exc.strerror or exc}") from None

    def keep_ranges(
        self,
        name: str,
        ranges: Iterable[tuple[int, dict[str, np.ndarray]]],
        stamp: dict,
        labels: list[str] | None = None,
        n_examples: int | None = None,
    ) -> None:
        """Keep the range reductions of a summary kept without them ((examples, totals) per range, in order), stamped
        with the summary's stamp; `labels` as in `keep`. Nothing is written where ranges of `n_examples` examples with
        that stamp are kept already (by another process, while this one waited)."""
        self.store.writer.require_writable()
        try:
            with self._building(name):
                kept = self.ranges(name, stamp)
                if kept is not None and n_examples is not None and kept.n_examples() == n_examples:
                    return
                writer = SummaryRangesWriter(self.root, self.array_path, name, labels)
                for n, totals in ranges:
                    writer.append(n, totals)
                writer.finish(stamp)
        except OSError as exc:
            raise StorageIOError(f"cannot save the summary of run {self.info.name!r}: {exc.strerror or exc}") from None
