"""Attention maps in Zarr v3: one group per run, each example's block at an offset in its `cells` array.

Layout 2 (self-describing; docs/SHARING.md shows how to read it with plain zarr or xarray):

    attention.zarr/                 root group, attributes {"attnstore": {"layout": 2}}
      runs/<slug>/                  one group per run (slug: the run name, see `run_slug`), attributes
                                    describing it (model, tokenizer, dataset, dtype, codec, axes, ...)
        cells        [cell]         every example's dense (layer, head, query, key) block, back to back
        example      [example]      each stored example's position in its dataset (0-based)
        offset       [example]      first cell of its block
        length       [example]      its number of tokens L (the block holds layers*heads*L*L cells)
        token_start  [example]      first entry of its tokens in token_id
        token_id     [token]        the tokenizer's ids of every stored example's tokens, back to back

All arrays have their real length, grown as ingestion goes. SQL (`sequences`) is the index
attnstore reads; the index arrays mirror it for readers without SQL and `attnstore check`
verifies that they agree. Layout 1 (before this module wrote groups) kept one 1-D array per
run at runs/<uuid> with a nominal length of 2**46 cells and no index; it is still read, and
`attnstore db upgrade-arrays` converts it.

Blocks are appended through `BlockWriter`, which only ever writes whole chunks (plus the last
partial chunk when a run finishes), so a chunk that holds committed data is never rewritten:
a crash cannot damage stored examples. Index arrays are small and derived from SQL; entries are
added every few commits and at the end (`INDEX_PENDING` while they lag; writes are atomic per chunk
on local folders and object stores).

Longer than ~500 lines on purpose: the run's array, its index, its summaries and the read path share the layout's
constants and chunk arithmetic; split, each part would import the others' privates.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import json
import os
import re
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Sequence as Seq
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, FixedScaleOffset
from zarr.core.array_spec import ArrayConfigParams
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

from . import direct, remote, sharded
from .errors import DamagedDataError, InvalidArgumentError, NotFoundError

AXES = ("layer", "head", "query", "key")
# Chosen by measurement (benchmarks/choose_codec.py, docs/ARCHITECTURE.md): on MRPC dev
# float16 maps, byte-shuffle + zstd level 1 gives ~1.66 bytes/cell at ~300 M cells/s;
# bit-shuffle or higher zstd levels gain < 1 % for 3-10x the time.
# "checksum": every chunk ends with a CRC32C of its compressed bytes (Zarr v3's crc32c codec),
# checked before decompression: flipped or truncated bytes fail loudly, never decode.
DEFAULT_CODEC = {"name": "blosc", "cname": "zstd", "clevel": 1, "shuffle": "shuffle", "blocksize": 1 << 18, "checksum": "crc32c"}
# Opt-in lossy encoding (`attnstore ingest --codec u8`): each value v in [0, 1] is stored as the byte
# round(255 v) (numcodecs' FixedScaleOffset, readable by any zarr-python), then zstd without shuffle:
# 0.40 bytes/cell on MRPC dev against 1.66, at most 0.0025 absolute error per value: half a step of 1/255
# plus float16 rounding of 255 v on the way in and of q/255 on the way out (docs/PERFORMANCE.md).
LOSSY_U8_CODEC = {
    "name": "blosc",
    "cname": "zstd",
    "clevel": 1,
    "shuffle": "noshuffle",
    "blocksize": 1 << 18,
    "checksum": "crc32c",
    "quantize": {"kind": "fixed-u8", "scale": 255},
}
CODECS = {"lossless": DEFAULT_CODEC, "u8": LOSSY_U8_CODEC}
# Chunks equal to the fill value are written too, so a missing chunk always means damage.
ARRAY_CONFIG: ArrayConfigParams = {"write_empty_chunks": True}
DEFAULT_CHUNK_CELLS = 1 << 20  # 2 MiB of float16: about 5 MRPC examples, ~3 ms to decode
# Layout 1 created each run's array with this nominal length (unwritten chunks take no space).
LEGACY_CAPACITY_CELLS = 1 << 46
DTYPES = ("float16", "float32")
LAYOUT = 2
CELLS = "cells"
INDEX_DTYPES = {"example": "int64", "offset": "int64", "length": "int32", "token_start": "int64"}
TOKEN_IDS = "token_id"
INDEX_CHUNK = 1 << 16  # entries per chunk of the index arrays
TOKEN_CHUNK = 1 << 18
INDEX_CODEC = {"name": "blosc", "cname": "zstd", "clevel": 3, "shuffle": "shuffle", "checksum": "crc32c"}
# A kept summary's sharded fields (`summary_layout`): a sample reads one inner chunk per row it wants, so decoding
# speed rules. `pattern_scores`' float64 scores, inner chunks of 64 rows: lz4 5.1x faster to decode than zstd-3
# (9 against 47 us) for 4.8 % more bytes (0.882 against 0.842 of raw; docs/PERFORMANCE.md, 2026-11-27, 8571697).
SHARD_CODEC = {"name": "blosc", "cname": "lz4", "clevel": 5, "shuffle": "shuffle", "checksum": "crc32c"}
# Per (token, layer, head): the norm of that token's value vector through the head's slice of the output projection
# (Kobayashi et al. 2020), float16, the tokens back to back in storage order like token_id. Small chunks: the part
# a commit writes is rewritten whole, and a commit adds a batch's tokens (~1k).
VALUE_NORMS = "value_norm"
NORM_CHUNK_TOKENS = 1 << 12
# Per token: gradient x input saliency of a fine-tuned classifier's prediction (ingest/saliency.py), float32; what it
# holds is the run group's attribute "saliency".
SALIENCY = "saliency"
SALIENCY_CHUNK_TOKENS = 1 << 16


DRAIN_TIMEOUT_S = 2.0


def drain_io_loop(timeout: float = DRAIN_TIMEOUT_S) -> None:
    """Cancel what is still running on zarr's I/O event loop and wait (bounded) for it to end.

    When one read or write of a batch fails (a full disk, an object store that does not answer), zarr raises its
    error at once and leaves the batch's other requests running. At exit zarr closes its loop with them pending:
    Python then prints "Task was destroyed but it is pending!" and "Exception ignored in: <coroutine ...>"
    tracebacks after attnstore's one-line error. Cancelled here first (atexit runs this before zarr's own
    cleanup, registered earlier), they end inside their tasks and print nothing."""
    from zarr.core import sync as zsync

    loop = zsync.loop[0]
    if loop is None or loop.is_closed() or not loop.is_running():
        return

    async def cancel_pending() -> None:
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current and not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        for task in pending:  # retrieve every outcome, so none is logged as "never retrieved"
            if task.done() and not task.cancelled():
                task.exception()

    try:
        asyncio.run_coroutine_threadsafe(cancel_pending(), loop).result(timeout + 1.0)
    except BaseException:  # never let the exit itself fail
        pass


atexit.register(drain_io_loop)


def open_root(root: str, read_only: bool):
    """A Zarr store for a local directory or any fsspec URL (s3://, gs://, ...)."""
    if remote.is_remote(root):
        return remote.fsspec_store(root, read_only)  # s3://: bounded timeouts, no listing cache (store/remote.py)
    path = root[len("file://") :] if root.startswith("file://") else root
    return LocalStore(path, read_only=read_only)


def quantize_step(spec: dict | None) -> float:
    """The largest absolute change a codec makes to a value (0 for lossless codecs); see LOSSY_U8_CODEC."""
    quantize = (spec or {}).get("quantize")
    return 0.5625 / quantize["scale"] + 2**-12 if quantize else 0.0


def make_codec(spec: dict, dtype: str) -> list:
    """The bytes-to-bytes codecs of a codec spec: blosc, then an optional CRC32C checksum."""
    if spec.get("name") != "blosc":
        raise InvalidArgumentError(f"unsupported codec {spec!r}; only blosc codecs are supported")
    if spec.get("checksum") not in (None, "crc32c"):
        raise InvalidArgumentError(f"unsupported checksum {spec['checksum']!r}; use 'crc32c' or none")
    make_filters(spec, dtype)  # validates the quantize part
    blosc = BloscCodec(
        typesize=1 if spec.get("quantize") else np.dtype(dtype).itemsize,
        cname=spec["cname"],
        clevel=spec["clevel"],
        shuffle=spec["shuffle"],
        blocksize=spec.get("blocksize", 0),
    )
    return [blosc, Crc32cCodec()] if spec.get("checksum") == "crc32c" else [blosc]


def make_filters(spec: dict, dtype: str) -> list:
    """The array-to-array codecs of a codec spec: none, or the 8-bit quantisation of `LOSSY_U8_CODEC`."""
    quantize = spec.get("quantize")
    if not quantize:
        return []
    if quantize.get("kind") != "fixed-u8" or not 1 <= int(quantize.get("scale", 0)) <= 255:
        raise InvalidArgumentError(f"unsupported quantisation {quantize!r}; use {LOSSY_U8_CODEC['quantize']}")
    with warnings.catch_warnings():  # numcodecs codecs are outside the Zarr v3 spec; zarr-python reads them
        warnings.simplefilter("ignore")
        return [FixedScaleOffset(offset=0, scale=int(quantize["scale"]), dtype=np.dtype(dtype).str, astype="u1")]


def root_layout(attributes: dict) -> int | None:
    """The layout version a root group's attributes declare (None: layout 1, which declared none)."""
    meta = attributes.get("attnstore")
    return meta.get("layout") if isinstance(meta, dict) else None


def run_slug(run_name: str) -> str:
    """The run's group name under runs/: the name itself when it is a safe path component, else a
    sanitised name plus 8 hex digits of its SHA-1 (so distinct names never share a group)."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", run_name):
        return run_name
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", run_name).strip("._-")[:80] or "run"
    return f"{clean}-{hashlib.sha1(run_name.encode()).hexdigest()[:8]}"


def run_group_path(run_name: str) -> str:
    return f"runs/{run_slug(run_name)}"


def group_path_of(array_path: str) -> str | None:
    """The run group holding a cells array (layout 2), or None for a layout-1 array."""
    return array_path[: -len(CELLS) - 1] if array_path.endswith(f"/{CELLS}") else None


def run_node_path(array_path: str) -> str:
    """Everything of a run lives under this key prefix: its group (layout 2) or its array (layout 1)."""
    return group_path_of(array_path) or array_path


def create_run_array(root: str, path: str, *, dtype: str, chunk_cells: int, codec: dict, attributes: dict, shape: int = 0):
    """A growable 1-D cells array (length `shape`, grown by `BlockWriter`)."""
    if dtype not in DTYPES:
        raise InvalidArgumentError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    return zarr.create_array(
        store=open_root(root, read_only=False),
        name=path,
        shape=(shape,),
        chunks=(chunk_cells,),
        dtype=dtype,
        compressors=make_codec(codec, dtype),
        filters=make_filters(codec, dtype),
        config=ARRAY_CONFIG,
        fill_value=0,
        dimension_names=("cell",),
        attributes={"block_axes": list(AXES), **attributes},
        overwrite=True,
    )


def create_run_group(
    root: str, run_name: str, *, dtype: str, chunk_cells: int, codec: dict, attributes: dict, value_norms: bool = False
) -> str:
    """Create (or replace an orphan of) a run's group with empty cells and index arrays (and an empty `value_norm`
    array where `value_norms`); returns the cells path.

    Called only while holding the run's name in SQL, so any group already at this path is
    left over from an attempt whose row was never committed.
    """
    store = open_root(root, read_only=False)
    top = zarr.open_group(store=store, path="", mode="a")
    if root_layout(top.attrs.asdict()) != LAYOUT:
        top.attrs.update({"attnstore": {"layout": LAYOUT, "doc": "one group per run under runs/; see attnstore's docs/SHARING.md"}})
    path = run_group_path(run_name)
    zarr.create_group(store=store, path=path, overwrite=True, attributes={"attnstore": {"layout": LAYOUT}, **attributes})
    cells = create_run_array(root, f"{path}/{CELLS}", dtype=dtype, chunk_cells=chunk_cells, codec=codec, attributes={})
    for name, index_dtype in INDEX_DTYPES.items():
        _create_index(store, f"{path}/{name}", index_dtype, INDEX_CHUNK, "example")
    _create_index(store, f"{path}/{TOKEN_IDS}", "int32", TOKEN_CHUNK, "token")
    if value_norms:
        trailing = (attributes["n_layers"], attributes["n_heads"])
        create_token_array(root, cells.path, VALUE_NORMS, trailing, "float16", NORM_CHUNK_TOKENS, {})
    return cells.path


def _create_index(store, path: str, dtype: str, chunk: int, dim: str):
    return zarr.create_array(
        store=store,
        name=path,
        shape=(0,),
        chunks=(chunk,),
        dtype=dtype,
        compressors=make_codec(INDEX_CODEC, dtype),
        fill_value=0,
        dimension_names=(dim,),
        overwrite=True,
    )


# Written with the stamp, in the same metadata write: each field's rows when the summary was finished. A summary is read
# back only where its arrays still hold those rows, so one that two builders overwrote at once, or that lost a field, is
# rebuilt instead of read (a summary kept without this record, before it existed, is rebuilt once).
SUMMARY_ROWS = "rows"


def _open_summary(root: str, array_path: str, name: str, stamp: dict):
    """The zarr group of a run's saved summary `name` if its stamp matches, else None."""
    group = group_path_of(array_path)
    if group is None:
        return None
    try:
        node = zarr.open_group(store=open_root(root, read_only=True), path=f"{group}/summary/{name}", mode="r")
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
    group = group_path_of(array_path)
    if group is None:
        return []
    try:
        folder = zarr.open_group(store=open_root(root, read_only=True), path=f"{group}/summary", mode="r")
        return sorted((name, node) for name, node in folder.groups() if node.attrs.get("stamp") is not None)
    except (FileNotFoundError, KeyError, ValueError, zarr.errors.NodeNotFoundError):
        return []


def remove_summary(root: str, array_path: str, name: str) -> str:
    """Delete a run's kept summary `name` (its whole group); the store key of the group removed."""
    group = group_path_of(array_path)
    assert group is not None
    key = f"{group}/summary/{name}"
    sync(open_root(root, read_only=False).delete_dir(key))
    return key


def read_summary(root: str, array_path: str, name: str, stamp: dict) -> dict[str, np.ndarray] | None:
    """A run's saved per-example summary `name` (layout 2: <run group>/summary/<name>/), whole, if its stamp matches."""
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

    def __init__(self, node, held: dict | None = None) -> None:
        self.arrays = dict(node.arrays()) if held is None else held
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
        got = None if reader is None else reader.read_rows(rows, keep=True)
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


def summary_parts(root: str, array_path: str, name: str, stamp: dict) -> SummaryParts | None:
    """A run's saved summary `name` for reading in parts, if its stamp matches."""
    found = _complete_summary(root, array_path, name, stamp)
    return None if found is None else SummaryParts(*found)


# A kept summary's range reductions: `summary/<name>/ranges/`, one row per range of examples (the parts the summary was
# written in, SUMMARY_CHUNK_ROWS examples each when built), each field the reduction the kind declares (its `totals`)
# of that range's per-example fields, and `range_examples` (how many the range holds). A whole-run query adds these
# rows instead of reading every example's (queries/summary.py). Stamped like the summary, before it.
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
        group = group_path_of(array_path)
        if group is None:
            raise InvalidArgumentError(f"{array_path} is a layout-1 array: run `attnstore db upgrade-arrays` to keep summaries")
        self.node = zarr.create_group(
            store=open_root(root, read_only=False),
            path=f"{group}/summary/{name}/{SUMMARY_RANGES}",
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
        group = group_path_of(array_path)
        if group is None:
            raise InvalidArgumentError(f"{array_path} is a layout-1 array: run `attnstore db upgrade-arrays` to keep summaries")
        self.node = zarr.create_group(
            store=open_root(root, read_only=False), path=f"{group}/summary/{name}", overwrite=True, attributes={"stamp": None}
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


METADATA_FIX = "restore it from a bundle or backup, or re-ingest the run"


def metadata_file(root: str, node: str) -> str:
    """Where a node's metadata lives, for messages: <root>/<node>/zarr.json (a path, or a URL for remote roots)."""
    return f"{root.rstrip('/')}/{node.strip('/')}/zarr.json" if node.strip("/") else f"{root.rstrip('/')}/zarr.json"


def damaged_metadata(root: str, node: str, exc: BaseException | str) -> DamagedDataError:
    """The one-line error for a node whose zarr.json is not valid (not JSON, or not what attnstore wrote)."""
    reason = exc if isinstance(exc, str) else _reason(exc)
    return DamagedDataError(f"{metadata_file(root, node)} is damaged ({reason}); {METADATA_FIX}")


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:160] if first else type(exc).__name__


def group_metadata_damage(root: str, node: str) -> DamagedDataError | None:
    """The error for a group's zarr.json that is there but is not a Zarr v3 group's metadata (None: absent or valid)."""
    key = f"{node.strip('/')}/zarr.json" if node.strip("/") else "zarr.json"
    if not remote.is_remote(root) and not os.path.isdir(root[len("file://") :] if root.startswith("file://") else root):
        return None
    raw = sync(open_root(root, read_only=True).get(key, prototype=default_buffer_prototype()))
    if raw is None:
        return None
    try:
        meta = json.loads(raw.to_bytes())
    except ValueError as exc:  # also UnicodeDecodeError
        return damaged_metadata(root, node, exc)
    if not isinstance(meta, dict) or meta.get("zarr_format") != 3 or meta.get("node_type") != "group":
        return damaged_metadata(root, node, "not the metadata of a Zarr v3 group")
    return None


def _metadata_problem(array) -> str | None:
    """Why an opened run array's metadata cannot be what attnstore wrote (None: it can). A changed data type is
    caught here, before a chunk is decoded as the wrong type: the codecs name the item size the chunks were
    written with (blosc's typesize; the 8-bit quantisation's source dtype)."""
    if array.ndim != 1:
        return f"shape {list(array.shape)}: a run's cells array is 1-D"
    dtype = str(array.dtype)
    if dtype not in DTYPES:
        return f"data type {dtype}: attnstore writes {' or '.join(DTYPES)}"
    for codec in array.compressors:
        typesize = getattr(codec, "typesize", None)
        if isinstance(codec, BloscCodec) and typesize not in (None, 1, array.dtype.itemsize):
            return f"data type {dtype} ({array.dtype.itemsize}-byte items), but its chunks were written with {typesize}-byte items"
    for codec in array.filters:
        source = getattr(codec, "codec_config", {}).get("dtype") if hasattr(codec, "codec_config") else None
        if source is not None and np.dtype(source) != array.dtype:
            return f"data type {dtype}, but its chunks hold {np.dtype(source)} values quantised to 8 bits"
    return None


def _storage_failure(root: str, exc: BaseException) -> bool:
    return remote.is_remote(root) and remote.is_storage_failure(exc)


def open_run_array(root: str, path: str, *, read_only: bool = True):
    """A run's cells array. NotFoundError when it is absent; DamagedDataError naming its zarr.json when that is not
    valid JSON or not the metadata attnstore writes (another data type, shape or codec)."""
    try:
        with warnings.catch_warnings():  # a lossy run's numcodecs filter warns on every open
            warnings.simplefilter("ignore")
            array = zarr.open_array(store=open_root(root, read_only=read_only), path=path, mode="r" if read_only else "r+")
    except (FileNotFoundError, KeyError) as exc:
        if isinstance(exc, OSError) and _storage_failure(root, exc):
            raise
        raise NotFoundError(f"attention array {path!r} not found under {root}; is --root the store's array root? ({exc})") from None
    except (ValueError, TypeError, AttributeError, NotImplementedError, UnicodeDecodeError) as exc:  # not JSON, unknown dtype
        raise damaged_metadata(root, path, exc) from None
    why = _metadata_problem(array)
    if why:
        raise damaged_metadata(root, path, why)
    # open_array applies `config` only when it creates an array: set it here, so an opened run also writes
    # chunks equal to the fill value (a missing chunk then always means damage) and skips that comparison.
    return array if read_only else array.with_config(ARRAY_CONFIG)


def _open_node(opener, root: str, store, path: str, mode):
    """zarr.open_group / open_array, with a zarr.json that cannot be parsed as DamagedDataError naming it."""
    try:
        return opener(store=store, path=path, mode=mode)
    except (FileNotFoundError, KeyError):
        raise
    except (ValueError, TypeError, AttributeError, NotImplementedError, UnicodeDecodeError) as exc:
        raise damaged_metadata(root, path, exc) from None


class RunIndex:
    """The index arrays of a layout-2 run: one entry per stored example, in storage (offset) order.

    `start` entries and `token_count` tokens are already committed (from SQL); `write` replaces
    everything after them, so entries written before a crash and never committed are overwritten.
    """

    def __init__(self, root: str, array_path: str, start: int, token_count: int, read_only: bool = False):
        group = group_path_of(array_path)
        if group is None:
            raise InvalidArgumentError(f"{array_path} is a layout-1 array: it has no index arrays")
        store = open_root(root, read_only=read_only)
        mode: Literal["r", "r+"] = "r" if read_only else "r+"
        self.group = _open_node(zarr.open_group, root, store, group, mode)
        self.arrays = {name: _open_node(zarr.open_array, root, store, f"{group}/{name}", mode) for name in (*INDEX_DTYPES, TOKEN_IDS)}
        self.n = start
        self.n_tokens = token_count

    def write(self, examples: Seq[int], offsets: Seq[int], lengths: Seq[int], token_ids: Seq[np.ndarray]) -> None:
        if not len(examples):
            return
        n, t = self.n + len(examples), self.n_tokens + int(sum(len(ids) for ids in token_ids))
        starts = self.n_tokens + np.concatenate([[0], np.cumsum([len(ids) for ids in token_ids])[:-1]])
        values = {"example": examples, "offset": offsets, "length": lengths, "token_start": starts}
        for name, dtype in INDEX_DTYPES.items():
            self._put(self.arrays[name], self.n, n, np.asarray(values[name], dtype=dtype))
        self._put(self.arrays[TOKEN_IDS], self.n_tokens, t, np.concatenate(token_ids).astype("int32"))
        self.n, self.n_tokens = n, t

    @staticmethod
    def _put(array, start: int, stop: int, values: np.ndarray) -> None:
        if array.shape[0] != stop:
            array.resize((stop,))
        array[start:stop] = values

    def read(self) -> dict[str, np.ndarray]:
        return {name: np.asarray(array[:]) for name, array in self.arrays.items()}

    def read_range(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Entries [start, stop) (clipped to what the arrays hold), with their token ids under "token_id":
        the tokens of each entry, back to back."""
        entries = {name: np.asarray(self.arrays[name][start:stop]) for name in INDEX_DTYPES}
        token_ids = self.arrays[TOKEN_IDS]
        starts, lengths = entries["token_start"], entries["length"]
        if len(starts) and (np.diff(starts) == lengths[:-1]).all():  # contiguous, as written: one read
            entries[TOKEN_IDS] = np.asarray(token_ids[int(starts[0]) : int(starts[-1]) + int(lengths[-1])])
        else:
            parts = [np.asarray(token_ids[int(a) : int(a) + int(b)]) for a, b in zip(starts, lengths)]
            entries[TOKEN_IDS] = np.concatenate(parts) if parts else np.empty(0, np.int32)
        return entries

    def length(self) -> int:
        """Entries the arrays hold now (more than `n` after a crash between writing and committing)."""
        return int(self.arrays["example"].shape[0])

    def truncate(self) -> None:
        """Cut every array back to the entries written through this object (`n`, `n_tokens`): the index mirrors SQL."""
        for name, array in self.arrays.items():
            wanted = self.n_tokens if name == TOKEN_IDS else self.n
            if array.shape[0] != wanted:
                array.resize((wanted,))
        if self.group.attrs.get(INDEX_PENDING):
            self.group.attrs.update({INDEX_PENDING: False})


class TokenArray:
    """A layout-2 run's per-token array `name` (value_norm, saliency): its first axis the run's tokens in storage
    order, as token_id's. `write(start, values)` replaces everything from `start`, so values written past the committed
    tokens (before a crash) are overwritten by the resumed writer."""

    def __init__(self, root: str, array_path: str, name: str, read_only: bool = True):
        group = group_path_of(array_path)
        if group is None:
            raise InvalidArgumentError(f"{array_path} is a layout-1 array: it has no per-token arrays ({name})")
        mode: Literal["r", "r+"] = "r" if read_only else "r+"
        self.array = _open_node(zarr.open_array, root, open_root(root, read_only=read_only), f"{group}/{name}", mode)

    def write(self, start: int, values: np.ndarray) -> None:
        stop = start + len(values)
        if self.array.shape[0] != stop:
            self.array.resize((stop, *self.array.shape[1:]))
        if len(values):
            self.array[start:stop] = values.astype(self.array.dtype, copy=False)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop), as stored."""
        return np.asarray(self.array[start:stop])

    def length(self) -> int:
        return int(self.array.shape[0])


class ValueNorms(TokenArray):
    """A run's `value_norm` array: (token, layer, head) float16. Written like the index arrays, but before the rows of
    its examples commit (it cannot be rebuilt from SQL), from the committed token count on."""

    def __init__(self, root: str, array_path: str, read_only: bool = True):
        super().__init__(root, array_path, VALUE_NORMS, read_only)


def run_group_attribute(root: str, array_path: str, name: str):
    """Attribute `name` of a layout-2 run's group (None if absent)."""
    group = group_path_of(array_path)
    if group is None:
        return None
    return zarr.open_group(store=open_root(root, read_only=True), path=group, mode="r").attrs.get(name)


def set_run_group_attribute(root: str, array_path: str, name: str, value) -> None:
    group = group_path_of(array_path)
    if group is None:
        raise InvalidArgumentError(f"{array_path} is a layout-1 array: it has no group attributes")
    zarr.open_group(store=open_root(root, read_only=False), path=group, mode="r+").attrs.update({name: value})


def create_token_array(root: str, array_path: str, name: str, trailing: tuple[int, ...], dtype: str, chunk_tokens: int, attributes: dict):
    """An empty per-token array `name` in a layout-2 run's group (replacing one there), checksummed like the index."""
    group = group_path_of(array_path)
    if group is None:
        raise InvalidArgumentError(f"{array_path} is a layout-1 array: it cannot hold per-token arrays ({name})")
    return zarr.create_array(
        store=open_root(root, read_only=False),
        name=f"{group}/{name}",
        shape=(0, *trailing),
        chunks=(chunk_tokens, *trailing),
        dtype=dtype,
        compressors=make_codec(INDEX_CODEC, dtype),
        fill_value=0,
        config=ARRAY_CONFIG,
        dimension_names=("token", *AXES[: len(trailing)]),
        attributes=attributes,
        overwrite=True,
    )


INDEX_PENDING = "index_pending"  # group attribute: a distributed ingest writes the index arrays when the run completes


def index_pending(root: str, array_path: str) -> bool:
    """Whether a layout-2 run's index arrays are left to be written when it completes (a distributed ingest)."""
    group = group_path_of(array_path)
    return bool(group and zarr.open_group(store=open_root(root, read_only=True), path=group, mode="r").attrs.get(INDEX_PENDING))


# zarr's LocalStore writes each key to `<key>.<32 hex digits>.partial`, then renames it: a writer killed in between
# leaves that file behind. It holds no committed data (the key it was meant to replace is untouched).
PARTIAL_FILE = re.compile(r"\.[0-9a-f]{32}\.partial$")
# Queries keep summaries under <run group>/summary/ without the run's write lease, even while it is written: a
# temporary file there is taken for a leftover only once it is this old (a summary chunk is written in well under).
SUMMARY_PARTIAL_AGE_S = 600.0


def _local_path(root: str) -> str | None:
    if remote.is_remote(root):
        return None  # object stores write whole objects: nothing is left half-written
    return root[len("file://") :] if root.startswith("file://") else root


def partial_files(root: str, node: str, recursive: bool = True, min_age_s: float = 0.0) -> list[tuple[str, int]]:
    """(store key, bytes) of the temporary files killed writers left under `node` (a local root; [] for others), at
    least `min_age_s` old. Under a run's summary/ folder only files older than SUMMARY_PARTIAL_AGE_S count (queries
    keep summaries there without the run's lease: younger ones may be writes in flight)."""
    base = _local_path(root)
    if base is None:
        return []
    top = os.path.join(base, node) if node else base
    now = time.time()
    found = []
    for folder, subfolders, files in os.walk(top):
        for name in files:
            if PARTIAL_FILE.search(name):
                path = os.path.join(folder, name)
                key = os.path.relpath(path, base).replace(os.sep, "/")
                try:
                    stat = os.stat(path)
                except OSError:  # renamed meanwhile: its writer finished
                    continue
                age = now - stat.st_mtime
                if age < min_age_s or ("/summary/" in f"/{key[len(node) :]}" and age < SUMMARY_PARTIAL_AGE_S):
                    continue
                found.append((key, stat.st_size))
        if not recursive:
            subfolders.clear()
    return sorted(found)


def remove_partial_files(root: str, node: str, recursive: bool = True, min_age_s: float = 0.0) -> list[str]:
    """Delete what `partial_files` finds; only while no process writes `node` (its write lease held). Returns the keys."""
    base = _local_path(root)
    removed = []
    for key, _ in partial_files(root, node, recursive, min_age_s):
        try:
            os.remove(os.path.join(base or "", key))
        except FileNotFoundError:
            continue
        removed.append(key)
    return removed


def block_cells(array) -> int | None:
    """Cells in one blosc block of a cells array whose chunks hold several blocks and which store/direct.py reads
    block by block (a first read of an example decodes the blocks it lies in), else None: a filtered array (the lossy
    u8 codec) is read through zarr, a whole chunk at a time."""
    if array.filters:
        return None
    for codec in getattr(array.metadata, "codecs", None) or ():
        if isinstance(codec, BloscCodec):
            cells = int(codec.blocksize or 0) // int(codec.typesize or array.dtype.itemsize)
            return cells if cells and int(array.chunks[0]) >= 2 * cells else None
    return None


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
    """Cut a layout-2 cells array to its committed end; chunks wholly past it (cells written, never committed) go."""
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
        if self.array.shape[0] < end:  # layout 2 arrays have their real length
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
        if remote.failed(array, exc):
            raise  # the object store failed (network, credentials), the data is not damaged
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
    ordered: bool = False,
    direct: Callable[[int, int], np.ndarray | None] | None = None,
) -> Iterator[tuple[object, np.ndarray]]:
    """Stream blocks in offset order, reading contiguous slabs of ~16 chunks at a time (bounded memory).

    Chunks are checked against one listing of the array; `describe(keys)` names examples in errors.
    `ordered`: `refs` already come in offset order, and are then taken one at a time (a lazy iterable is never
    held whole). `direct(start, stop)`: a reader of cells tried first (store/direct.py; None: read through zarr, which
    names what is damaged).
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

        data = direct(start, end) if direct is not None else None
        if data is None:
            data = read_cells(array, start, end, where, present)
        for r in group:
            yield r.key, data[r.offset - start : r.offset - start + size(r)].reshape(block_shape(n_layers, n_heads, r.length))

    chunk = array.chunks[0]
    last_chunk = -1  # the last chunk the group needs
    for ref in refs if ordered else sorted(refs, key=lambda r: r.offset):
        # A slab never spans a whole chunk no block needs: cells allotted to a writer that was cut off
        # (ingest/distributed.py) may have no chunks.
        if group and (ref.offset + size(ref) - group[0].offset > slab_cells or ref.offset // chunk > last_chunk + 1):
            yield from emit(group)
            group = []
        group.append(ref)
        last_chunk = max(last_chunk, (ref.offset + size(ref) - 1) // chunk)
    if group:
        yield from emit(group)
