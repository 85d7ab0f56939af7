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
verifies that they agree. Runs of layout 1 (one bare array at runs/<uuid>, before 2026-11-23) are
refused where a run's arrays are reached (`RunInfo.array_path`, store/records.py) until
`attnstore db upgrade-arrays` (store/layout.py) converts them; everything here assumes layout 2.

Blocks are appended through store/block_writer.py's `BlockWriter`, which never rewrites a chunk that
holds committed data. Index arrays are small and derived from SQL; entries are added every few
commits and at the end (`INDEX_PENDING` while they lag; writes are atomic per chunk on local
folders and object stores).

Longer than ~500 lines on purpose: the run's array, its index and the read path share the layout's constants and
chunk arithmetic; split, each part would import the others' privates. Appending blocks is store/block_writer.py; the
kept summaries' format store/summaries.py.
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
from dataclasses import dataclass
from typing import Literal

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, FixedScaleOffset
from zarr.core.array_spec import ArrayConfigParams
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

from . import remote
from . import row_stats as rows
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
DTYPES = ("float16", "float32")
LAYOUT = 2
CELLS = "cells"
INDEX_DTYPES = {"example": "int64", "offset": "int64", "length": "int32", "token_start": "int64"}
TOKEN_IDS = "token_id"
INDEX_CHUNK = 1 << 16  # entries per chunk of the index arrays
TOKEN_CHUNK = 1 << 18
INDEX_CODEC = {"name": "blosc", "cname": "zstd", "clevel": 3, "shuffle": "shuffle", "checksum": "crc32c"}
# Per (token, layer, head): the norm of that token's value vector through the head's slice of the output projection
# (Kobayashi et al. 2020), float16, the tokens back to back in storage order like token_id. Small chunks: the part
# a commit writes is rewritten whole, and a commit adds a batch's tokens (~1k).
VALUE_NORMS = "value_norm"
NORM_CHUNK_TOKENS = 1 << 12
# Per token: gradient x input saliency of a fine-tuned classifier's prediction (ingest/saliency.py), float32; what it
# holds is the run group's attribute "saliency".
SALIENCY = "saliency"
SALIENCY_CHUNK_TOKENS = 1 << 16
# Per token, for a causal LM: its next-token loss -log p(token[i+1] | tokens[..i]) in nats, float32, from the pass that
# made the maps (ingest/passes.py); NaN at each example's last token (no next token). Written like value_norm.
TOKEN_LOSS = "token_loss"
LOSS_CHUNK_TOKENS = 1 << 16
# Per (token, layer), for a causal LM: the layer's output hidden state's largest-magnitude entry (its signed value and its
# dimension) and the median magnitude over the dimensions, float32 (ingest/activations.py; Sun et al. 2024's massive
# activations). Written like token_loss.
HIDDEN_PEAKS = "hidden_peak"
PEAK_FIELDS = ("value", "dim", "median_abs")
PEAK_CHUNK_TOKENS = 1 << 12
HIDDEN_PEAKS_ATTRIBUTES = {
    "description": "per token and layer, the layer's output hidden state (the residual stream after the layer): the "
    "entry of largest magnitude (its signed value, its dimension) and the median magnitude over the dimensions (torch's "
    "median: the lower middle value); tokens in storage order, as token_id",
    "fields": list(PEAK_FIELDS),
}
# What the array says of itself to a plain zarr reader (its attributes), as the run's manifest records it.
TOKEN_LOSS_ATTRIBUTES = {
    "description": "next-token loss of each token: -log p(token[i+1] | tokens[..i]) under the run's causal LM, "
    "from the forward pass that made the maps; NaN at each example's last token (no next token); tokens in storage "
    "order, as token_id",
    "unit": "nats",
    "fill": "NaN at each example's last token",
}


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
    """The layout version a root group's attributes declare (None where they declare none)."""
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


def group_path_of(array_path: str) -> str:
    """The run group holding a cells array (runs/<slug>/cells -> runs/<slug>): everything of the run lives under it."""
    group, _, name = array_path.strip("/").rpartition("/")
    if name != CELLS or not group:
        raise InvalidArgumentError(f"{array_path!r} is not a run's cells array (<run group>/{CELLS})")
    return group


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
    root: str,
    run_name: str,
    *,
    dtype: str,
    chunk_cells: int,
    codec: dict,
    attributes: dict,
    value_norms: bool = False,
    token_loss: bool = False,
    hidden_peaks: bool = False,
    row_stats: bool = False,
) -> str:
    """Create (or replace an orphan of) a run's group with empty cells and index arrays (and an empty `value_norm`
    array where `value_norms`, an empty `token_loss` array where `token_loss`, an empty `hidden_peak` array where
    `hidden_peaks`, empty `row_stats` and `row_top` arrays where `row_stats`); returns the cells path.

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
    if token_loss:
        create_token_array(root, cells.path, TOKEN_LOSS, (), "float32", LOSS_CHUNK_TOKENS, TOKEN_LOSS_ATTRIBUTES)
    if hidden_peaks:
        trailing = (attributes["n_layers"], len(PEAK_FIELDS))
        create_token_array(
            root, cells.path, HIDDEN_PEAKS, trailing, "float32", PEAK_CHUNK_TOKENS, HIDDEN_PEAKS_ATTRIBUTES, ("token", "layer", "field")
        )
    if row_stats:
        layers, heads = attributes["n_layers"], attributes["n_heads"]
        axes = ("token", "layer", "head", "field")
        stats_shape, top_shape = (layers, heads, len(rows.FIELDS)), (layers, heads, rows.TOP_K)
        by_field = (layers, heads, 1)  # a query reads the few fields it needs
        create_token_array(root, cells.path, rows.STATS, stats_shape, "float16", rows.CHUNK_TOKENS, rows.ATTRIBUTES, axes, by_field)
        create_token_array(root, cells.path, rows.TOP, top_shape, "int32", rows.CHUNK_TOKENS, rows.TOP_ATTRIBUTES, (*axes[:3], "rank"))
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
    """The index arrays of a run: one entry per stored example, in storage (offset) order.

    `start` entries and `token_count` tokens are already committed (from SQL); `write` replaces
    everything after them, so entries written before a crash and never committed are overwritten.
    """

    def __init__(self, root: str, array_path: str, start: int, token_count: int, read_only: bool = False):
        group = group_path_of(array_path)
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
    """A run's per-token array `name` (value_norm, saliency, token_loss): its first axis the run's tokens in storage
    order, as token_id's. `write(start, values)` replaces everything from `start`, so values written past the committed
    tokens (before a crash) are overwritten by the resumed writer."""

    def __init__(self, root: str, array_path: str, name: str, read_only: bool = True):
        mode: Literal["r", "r+"] = "r" if read_only else "r+"
        path = f"{group_path_of(array_path)}/{name}"
        self.array = _open_node(zarr.open_array, root, open_root(root, read_only=read_only), path, mode)

    def write(self, start: int, values: np.ndarray) -> None:
        stop = start + len(values)
        if self.array.shape[0] != stop:
            self.array.resize((stop, *self.array.shape[1:]))
        if len(values):
            self.array[start:stop] = values.astype(self.array.dtype, copy=False)

    def read(self, start: int, stop: int, last: list[int] | None = None) -> np.ndarray:
        """Tokens [start, stop), as stored; `last`: only these entries of the last axis (row_stats' fields)."""
        if last is None:
            return np.asarray(self.array[start:stop])
        return np.asarray(self.array.oindex[start:stop, ..., last])

    def length(self) -> int:
        return int(self.array.shape[0])


class ValueNorms(TokenArray):
    """A run's `value_norm` array: (token, layer, head) float16. Written like the index arrays, but before the rows of
    its examples commit (it cannot be rebuilt from SQL), from the committed token count on."""

    def __init__(self, root: str, array_path: str, read_only: bool = True):
        super().__init__(root, array_path, VALUE_NORMS, read_only)


def run_group_attribute(root: str, array_path: str, name: str):
    """Attribute `name` of a run's group (None if absent)."""
    return zarr.open_group(store=open_root(root, read_only=True), path=group_path_of(array_path), mode="r").attrs.get(name)


def set_run_group_attribute(root: str, array_path: str, name: str, value) -> None:
    zarr.open_group(store=open_root(root, read_only=False), path=group_path_of(array_path), mode="r+").attrs.update({name: value})


def create_token_array(
    root: str,
    array_path: str,
    name: str,
    trailing: tuple[int, ...],
    dtype: str,
    chunk_tokens: int,
    attributes: dict,
    dimension_names: tuple[str, ...] | None = None,
    trailing_chunks: tuple[int, ...] | None = None,
):
    """An empty per-token array `name` in a run's group (replacing one there), checksummed like the index; its axes
    token, then `dimension_names`' or the maps' (layer, head); chunks of `chunk_tokens` tokens by `trailing_chunks`
    (default: whole trailing axes)."""
    return zarr.create_array(
        store=open_root(root, read_only=False),
        name=f"{group_path_of(array_path)}/{name}",
        shape=(0, *trailing),
        chunks=(chunk_tokens, *(trailing_chunks or trailing)),
        dtype=dtype,
        compressors=make_codec(INDEX_CODEC, dtype),
        fill_value=0,
        config=ARRAY_CONFIG,
        dimension_names=dimension_names or ("token", *AXES[: len(trailing)]),
        attributes=attributes,
        overwrite=True,
    )


INDEX_PENDING = "index_pending"  # group attribute: a distributed ingest writes the index arrays when the run completes


def index_pending(root: str, array_path: str) -> bool:
    """Whether a run's index arrays are left to be written when it completes (a distributed ingest)."""
    group = zarr.open_group(store=open_root(root, read_only=True), path=group_path_of(array_path), mode="r")
    return bool(group.attrs.get(INDEX_PENDING))


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
