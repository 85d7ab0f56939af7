"""The query framework: a query is a per-example reduction (a `SummaryKind`) plus a combine step, with one code path.

Longer than ~500 lines on purpose: the one code path every query's values come through (kept, built and kept, or
computed for the call; per example or per range of examples) is read and changed as one; the Clark kind at its end
is the framework's own reference kind. Split it when a second framework-level concern joins it.

A query that reduces every example's maps to a few numbers per (layer, head) names those
numbers as a `SummaryKind`: `prepare(store, info, examples, **params)` builds the run-level
inputs once per range of examples, `reduce(context, example, maps)` gives one example's
fields. The query itself only combines the per-example fields, which `summary_parts` hands it
range by range, in storage order, whatever the store allows:

1. **kept** with the run (layout-2 Zarr group, `summary/<key>/`), when the stamp matches: the
   stamp is the result's fingerprint, (kind, its version, the parameters that change its values,
   the run's committed state: `n_examples`, plus what a kind adds, e.g. the other run's count for
   a pair of runs), compared whole, as HF datasets fingerprints its cache;
2. **built and kept** the first time on a writable store (in process range by range, or on the
   Dask workers of `--scheduler`; queries/scheduler.py), then read back as in 1;
3. **computed for this call alone** where nothing can be kept (a read-only store, a layout-1
   run, a run that grew while it was read, or a kind whose whole-run pass cannot be built), by
   the same `prepare`/`reduce` over only the asked-for examples, in process or on the workers.

There is no second implementation: 1-3 give the same per-example fields, so a query's result
does not depend on which was taken (the values are those of the same float64 arithmetic on the
same maps, combined in the same storage order). The key of a kind's summary is its name for its
default parameters (`clark`), else the name and a digest of the parameters (`clark.3f1c...`).

**Range reductions.** A kind may also declare `totals(part)`: a range's reduction, sums over the part's examples of
what its queries combine (sums of fields, sums of each example's means, counts), derived from the per-example fields
alone, so that adding consecutive ranges' totals gives the totals of them all. Where a kind declares one, each part of
its summary is kept reduced too when the summary is kept (`summary/<key>/ranges/`, a row per range of SUMMARY_RANGE
examples, stamped like the summary and before it; a summary kept without them gets them derived from its per-example
fields on the first whole-run query of a writable store). `summary_totals` is then what its queries read: for the
whole run it adds the kept ranges' rows (O(ranges), a block of RANGE_BLOCK ranges at a time), else (`examples=`, a
read-only store with nothing kept, no ranges) it adds `totals` of each part `summary_parts` hands over. Both add the
same per-range totals in the same storage order, so they agree to float64 rounding (tested at relative 1e-12; equal in
every test and benchmark so far). The query's combine is written once, over the totals.

Fields whose first axis is a per-example unit (words of a sentence) are `ragged`: concatenated
over the examples, with `<field>_start` (n + 1 offsets) to find each example's rows.

The Clark kind (`CLARK`) backs `relative_position`, `special_tokens` and `entropy`: attention
on the three diagonals, attention received by [CLS]-like / separator / punctuation / other
keys, separator-to-separator mass and row entropies, with each example's counts (L,
separators, [CLS]-like tokens); its parameter is the punctuation set. Its `totals` (`_clark_totals`) are what the
three queries divide: the pooled sums (average="token"), the sums of each example's means (average="example"), the
query-token counts and the uniform-entropy sums.
"""

from __future__ import annotations

import functools
import hashlib
import json
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from math import lgamma
from typing import TYPE_CHECKING, Any

import numpy as np

from ..store.float16 import plogp
from ..store.pools import SizedPool
from .clark_sums import example_sums
from .common import check_weights, iter_maps, iter_weighted_maps, token_flags
from .errors import InvalidArgumentError, NotFoundError
from .request import REQUESTED, current_request, requested_examples, requested_source

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo
    from ..store.summaries import SummaryParts, SummaryRanges


@dataclass(frozen=True, eq=False)
class SummaryKind:
    """A per-example reduction: `reduce(context, example, maps)` -> {field: array}, with
    `context = prepare(store, info, examples, **params)` built once per range of examples.

    Optional hooks, for kinds that are not one run's maps example by example (a pair of runs):
    `covers(store, info, params)` the examples it summarises, in storage order (default: the run's
    committed examples); `read(store, info, examples, context)` (example, maps) in that order
    (default: the run's maps); `state(store, info, params)` the committed state its values depend on
    (default: {"n_examples": the run's committed examples}).
    """

    name: str
    version: int
    prepare: Callable[..., Any]
    reduce: Callable[[Any, int, Any], dict[str, np.ndarray]]
    ragged: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)  # the parameters that change its values, with defaults
    covers: Callable[[Store, RunInfo, dict], np.ndarray] | None = None
    read: Callable[[Store, RunInfo, np.ndarray, Any], Iterator[tuple[int, Any]]] | None = None
    state: Callable[[Store, RunInfo, dict], dict] | None = None
    one_run: bool = True  # built for one run with its default parameters (`attnstore summarize`); False: a pair of runs
    # A range's reduction: `totals(part)` -> {field: array of a fixed shape}, sums over the part's examples of what the
    # kind's queries combine, derived from its per-example fields alone, so that adding the totals of consecutive
    # ranges gives those of all of them. Kept per range beside the summary; `summary_totals` adds them.
    totals: Callable[..., dict[str, np.ndarray]] | None = None
    # Where the totals count on an axis whose entries only the run names (its dependency relations, which differ from
    # range to range): `labels(store, info)` -> those names, sorted, read once before a pass; `totals(part, labels)`
    # then counts on that axis, and the labels are kept with the ranges and returned with the totals.
    labels: Callable[[Store, RunInfo], list[str]] | None = None
    # The per-example fields `totals` reads (None: all of them): the totals of a sample, or of `examples=`, read only
    # these from a kept summary (besides the example column).
    totals_fields: tuple[str, ...] | None = None
    # Its totals are integer counts, the same however its examples are grouped: a sample's totals are then taken over
    # batches of rows from several ranges (one `totals` call per batch, not one per range a sample touches).
    integer_totals: bool = False
    # `reduce` may run on several threads at once (numpy alone, its loops release the GIL, nothing shared is changed):
    # one pass then reads and decodes on its thread while the others reduce (`reduced`), every core busy.
    threads: bool = False

    def bind(self, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Its parameters with the defaults filled in; an unknown one is a programming error. `weights` (every kind that
        reads one run's maps): "attention" (the maps, left out of the bound parameters so keys stay as they were) or
        "norm" (the maps weighted by the value norms, rows renormalised: `queries.common.weighted_maps`)."""
        params = dict(params or {})
        weights = check_weights(params.pop("weights", "attention"))
        if weights != "attention" and self.read is not None:
            raise InvalidArgumentError(f"weights={weights!r} is for queries over one run's maps; {self.name!r} reads something else")
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise TypeError(f"summary kind {self.name!r} takes no parameter(s) {sorted(unknown)}; it takes {sorted(self.defaults)}")
        bound = {**self.defaults, **params}
        for name, default in self.defaults.items():  # 0 and 0.0 are one parameter value, with one key
            value = bound[name]
            if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
                bound[name] = float(value)
        if weights != "attention":
            bound["weights"] = weights
        return bound

    def key(self, params: Mapping[str, Any]) -> str:
        """Where its summary is kept in the run's group: its name, plus a digest of non-default parameters."""
        return self.bound_key(self.bind(params))

    def bound_key(self, params: Mapping[str, Any]) -> str:
        """`key` of parameters `bind` gave."""
        if params == dict(self.defaults):
            return self.name
        digest = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:12]
        return f"{self.name}.{digest}"

    def stamp(self, n_examples: int | dict, params: Mapping[str, Any] | None = None) -> dict:
        """The fingerprint a kept summary must carry to be read back: version, committed state, non-default parameters."""
        return self.bound_stamp(n_examples, self.bind(params))

    def bound_stamp(self, n_examples: int | dict, params: Mapping[str, Any]) -> dict:
        """`stamp` of parameters `bind` gave."""
        state = {"n_examples": int(n_examples)} if not isinstance(n_examples, dict) else n_examples
        extra = {} if params == dict(self.defaults) else {"params": json.loads(json.dumps(params, sort_keys=True, default=str))}
        return {"version": self.version, **state, **extra}


KINDS: dict[str, SummaryKind] = {}


def register_kind(kind: SummaryKind) -> SummaryKind:
    KINDS[kind.name] = kind
    return kind


def run_kinds() -> dict[str, SummaryKind]:
    """The kinds `attnstore summarize` can build for one run ahead of time (with their default parameters)."""
    from .registry import load_all

    load_all()
    return {name: kind for name, kind in sorted(KINDS.items()) if kind.one_run}


def kind_named(name: str) -> SummaryKind:
    from .registry import load_all

    load_all()  # kinds are registered by the query modules that use them
    return KINDS[name]


# ---------------------------------------------------------------- one pass


def _assemble(kind: SummaryKind, examples: list[int], rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-example field dicts -> stacked (fixed) and concatenated (ragged) arrays, in the given order."""
    out: dict[str, np.ndarray] = {"example": np.asarray(examples, dtype=np.int64)}
    if not rows:
        return out
    for name in rows[0]:
        values = [row[name] for row in rows]
        if name in kind.ragged:
            sizes = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
            out[name] = np.concatenate(values)
            out[f"{name}_start"] = np.r_[0, np.cumsum(sizes)].astype(np.int64)
        else:
            out[name] = np.stack([np.asarray(v) for v in values])
    return out


# Examples per range: one process builds a summary range by range (as each Dask worker does: `prepare` then reads
# only that range's token and word rows), keeps each range's part as it is built, and queries read a kept summary
# back range by range, so neither the build nor a query holds a whole run's summary.
SUMMARY_RANGE = 4096


def summarise_examples(
    store: Store, info: RunInfo, kind: SummaryKind, examples=None, params: Mapping[str, Any] | None = None
) -> dict[str, np.ndarray]:
    """One pass of the kind over `examples` (default: every example it covers), in storage order."""
    params = kind.bind(params)
    if examples is None:
        examples = covered(store, info, kind, params)
    weights = params.pop("weights", "attention")
    pool = _reduce_pool() if kind.threads and kind.read is None else None
    if pool is not None:  # the context (SQL) is read on the pool while this thread reads the first maps
        context: Any = pool.submit(kind.prepare, store, info, examples, **params)
        pairs = iter_weighted_maps(store, info, examples, weights)
    else:
        context = kind.prepare(store, info, examples, **params)
        pairs = kind.read(store, info, examples, context) if kind.read is not None else iter_weighted_maps(store, info, examples, weights)
    order: list[int] = []
    rows: list[dict[str, np.ndarray]] = []
    for example, row in reduced(kind, context, pairs, pool):
        order.append(example)
        rows.append(row)
    if pool is not None:
        context.result()  # its error, where no example's reduce raised it
    return _assemble(kind, order, rows)


REDUCE_THREADS_ENV = "ATTNSTORE_REDUCE_THREADS"


REDUCE_POOL = SizedPool(REDUCE_THREADS_ENV, "attnstore-reduce")


def reduce_threads() -> int:
    """Threads a kind with `threads` reduces on: ATTNSTORE_REDUCE_THREADS, else the cores this process may use (at
    most 8); 1 reduces on the reading thread."""
    return REDUCE_POOL.threads()


def _reduce_pool() -> ThreadPoolExecutor | None:
    """The process's pool of `reduce_threads()` threads (None on one core)."""
    return REDUCE_POOL.get()


READ_AHEAD_CELLS = 1 << 24  # maps read ahead while a kind's `prepare` runs: 32 MiB of float16 (~75 MRPC examples)


def _running(context: Any) -> bool:
    """Whether `context` is a kind's `prepare` still running on the pool."""
    return isinstance(context, Future) and not context.done()


def _reduce_later(kind: SummaryKind, context: Future, example: int, maps: Any) -> dict[str, np.ndarray]:
    return kind.reduce(context.result(), example, maps)


def reduced(
    kind: SummaryKind, context: Any, pairs: Iterable[tuple[int, Any]], pool: ThreadPoolExecutor | None = None
) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """(example, kind.reduce(context, example, maps)) for each pair, in order: on this thread, or on `pool` while this
    thread reads the next maps (at most two examples per thread in flight, so memory stays bounded; while the kind's
    `prepare` still runs, up to READ_AHEAD_CELLS cells more, so reading does not wait for it). On the pool, `context`
    is the future of the kind's `prepare`, submitted before any reduce (the pool runs tasks in order, so a reduce
    waiting for it never holds back the prepare itself)."""
    if pool is None:
        for example, maps in pairs:
            yield example, kind.reduce(context, example, maps)
        return
    in_flight = 2 * reduce_threads()
    pending: deque[tuple[int, Future, int]] = deque()
    cells = 0  # of the maps pending
    try:
        for example, maps in pairs:
            size = int(getattr(maps, "size", 0))
            pending.append((example, pool.submit(_reduce_later, kind, context, example, maps), size))
            cells += size
            while len(pending) >= in_flight and not (cells <= READ_AHEAD_CELLS and _running(context)):
                done, future, size = pending.popleft()
                cells -= size
                yield done, future.result()
        while pending:
            done, future, _ = pending.popleft()
            yield done, future.result()
    finally:
        for _, future, _ in pending:  # an error, or the caller stopped early: nothing left running on its behalf
            future.cancel()


def concatenate(kind: SummaryKind, parts: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Parts of one run's summary (consecutive example ranges) -> one, as if built in one pass."""
    parts = [p for p in parts if len(p["example"])]
    if not parts:
        return {"example": np.zeros(0, dtype=np.int64)}
    out: dict[str, np.ndarray] = {}
    for name in parts[0]:
        if name.endswith("_start") and name[: -len("_start")] in kind.ragged:
            shifts = np.cumsum([0] + [int(p[name][-1]) for p in parts[:-1]])
            out[name] = np.concatenate([parts[0][name][:1]] + [p[name][1:] + s for p, s in zip(parts, shifts)])
        else:
            out[name] = np.concatenate([p[name] for p in parts])
    return out


def ragged_rows(arrays: dict[str, np.ndarray], name: str, index: int) -> np.ndarray:
    """Example number `index` (0-based, in the summary's order)'s rows of ragged `name`."""
    start = arrays[f"{name}_start"]
    return arrays[name][start[index] : start[index + 1]]


def in_storage_order(store: Store, info: RunInfo) -> np.ndarray:
    """The run's committed (not skipped) examples in storage order (int64: 8 bytes per example)."""
    return store.storage_order(info.id)


def ranges(examples: np.ndarray, size: int | None = None) -> list[np.ndarray]:
    """Consecutive ranges of `size` (default SUMMARY_RANGE) examples."""
    size = size or SUMMARY_RANGE
    return [examples[i : i + size] for i in range(0, len(examples), size)]


def only(info: RunInfo, order: np.ndarray, examples) -> np.ndarray:
    """The examples of `order` (storage order) that are in `examples`, in storage order; NotFoundError naming any of
    `examples` that `order` lacks."""
    return order[_selected(info, order, examples)]


def _selected(info: RunInfo, order: np.ndarray, examples) -> np.ndarray:
    """`only`'s choice as a mask over `order`."""
    wanted = np.unique(np.fromiter((int(e) for e in examples), dtype=np.int64))
    chosen = member(order, wanted)
    if np.count_nonzero(chosen) != len(wanted):
        missing = wanted[~member(wanted, order)]  # not setdiff1d: it sorts the whole order (6 s at 8 M examples)
        raise NotFoundError(f"run {info.name!r} has no stored example(s) {missing[:10].tolist()}")
    return chosen


def member(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """np.isin(values, wanted) for distinct example positions: one look-up in a mask over 0..max where that is small
    (8 M positions against a sample of 1,000: 40 ms against np.isin's 66 ms alone, and 0.26 s per call in the
    sampled query's profile, where np.isin builds its table over both arrays), else np.isin."""
    if not len(values) or not len(wanted):
        return np.zeros(len(values), dtype=bool)
    low = min(int(values.min()), int(wanted.min()))
    top = max(int(values.max()), int(wanted.max()))
    if low < 0 or top > 4 * (len(values) + len(wanted)) + 4096:
        return np.isin(values, wanted)
    mask = np.zeros(top + 1, dtype=bool)
    mask[wanted] = True
    return mask[values]


def ascending(positions: np.ndarray) -> np.ndarray:
    """Distinct example positions (a storage order) sorted. Storage order is by length, so at 8 M examples np.sort
    costs 0.14-0.7 s; a mask over 0..max and its set positions gives the same in O(n) (0.05-0.16 s, same machine and
    load) where positions are dense (max below 4x their count) and distinct."""
    if not len(positions) or not np.any(positions[1:] < positions[:-1]):
        return positions
    if every_position(positions):  # a run that skipped none
        return np.arange(len(positions), dtype=positions.dtype)
    top = int(positions.max())
    if int(positions.min()) >= 0 and top < 4 * len(positions) + 4096:
        mask = np.zeros(top + 1, dtype=bool)
        mask[positions] = True
        if np.count_nonzero(mask) == len(positions):  # distinct
            return np.flatnonzero(mask).astype(positions.dtype, copy=False)
    return np.sort(positions)


def every_position(positions: np.ndarray) -> bool:
    """Whether `positions` are 0..len-1, each once, in any order (a run that skipped no example): a mask of one byte per
    position (~30 ms at 8 M), so a caller can use range(len) instead of sorting them or building their arange (64 MB
    at 8 M: 0.15 s of page faults in a fresh process)."""
    n = len(positions)
    if not n or int(positions.min()) != 0 or int(positions.max()) != n - 1:
        return False
    mask = np.zeros(n, dtype=bool)
    mask[positions] = True
    return bool(mask.all())


def storage_ranges(store: Store, info: RunInfo, examples=REQUESTED) -> list[np.ndarray]:
    """The run's committed examples (or those of `examples`; by default the query request's) in storage order, in
    consecutive ranges of SUMMARY_RANGE; NotFoundError naming any of `examples` that is not stored."""
    examples = requested_examples(info.id, examples)
    order = in_storage_order(store, info)
    return ranges(order if examples is None else only(info, order, examples))


def stored_only(store: Store, info: RunInfo, examples=REQUESTED) -> np.ndarray | None:
    """The asked-for examples that the run stores, in storage order (None: every example); asked-for examples it does
    not store are left out (a query that samples from a corpus larger than the run: frame_heads)."""
    examples = requested_examples(info.id, examples)
    if examples is None:
        return None
    order = in_storage_order(store, info)
    return order[member(order, np.unique(np.fromiter((int(e) for e in examples), dtype=np.int64)))]


def ranged_maps(store: Store, info: RunInfo, examples, prepare: Callable[[np.ndarray], Any]) -> Iterator[tuple[int, np.ndarray, Any]]:
    """(example, maps, context) over the run's committed examples (or `examples`) in storage order, with
    `context = prepare(range)` built for each range of SUMMARY_RANGE examples (for passes that are not summaries:
    collecting a probe's training data)."""
    for part in storage_ranges(store, info, examples):
        context = prepare(part)
        for example, maps in iter_maps(store, info, part):
            yield example, maps, context


# ---------------------------------------------------------------- keeping, and the one path


def covered(store: Store, info: RunInfo, kind: SummaryKind, params: Mapping[str, Any]) -> np.ndarray:
    """The examples the kind summarises for `params`, in storage order."""
    return kind.covers(store, info, _unweighted(params)) if kind.covers is not None else in_storage_order(store, info)


def _unweighted(params: Mapping[str, Any]) -> dict:
    """The kind's own parameters (what its hooks take), without the framework's `weights`."""
    return {k: v for k, v in params.items() if k != "weights"}


def committed_state(store: Store, info: RunInfo, kind: SummaryKind, params: Mapping[str, Any], fresh: bool = False) -> dict:
    """The committed state of the run(s) the kind's values depend on, part of its fingerprint: within a query call over
    the run, the count its request read (run_query reads it once, the run pinned), unless `fresh` (read again: whether
    the run grew while a summary was built)."""
    if kind.state is not None:
        return kind.state(store, info, _unweighted(params))
    request = None if fresh else current_request(info.id)
    return {"n_examples": int(request.n_examples if request is not None else store.n_committed(info.id))}


@dataclass(frozen=True)
class Bound:
    """A kind with its parameters bound once (the request's source filled in), and what follows from them and the run's
    committed state: the key and stamp its summary is kept under. Every step of one pass takes it, none binds again."""

    kind: SummaryKind
    params: dict
    state: dict
    key: str
    stamp: dict


def bound(store: Store, info: RunInfo, kind: SummaryKind, params: Mapping[str, Any]) -> Bound:
    params = kind.bind(requested_source(info.id, params))
    state = committed_state(store, info, kind, params)
    return Bound(kind, params, state, kind.bound_key(params), kind.bound_stamp(state, params))


def _summarise_range(store: Store, examples: list[int], run_id: int, kind_name: str, params: dict) -> dict[str, np.ndarray]:
    """A Dask worker's task (queries/scheduler.py): the kind's summary of one range of the run's examples."""
    return summarise_examples(store, store.run_info(run_id), kind_named(kind_name), examples, params)


def summarise_on(
    spec: str, store: Store, info: RunInfo, kind: SummaryKind, examples, params: Mapping[str, Any] | None = None
) -> Iterator[dict]:
    """The kind's summary of `examples` (storage order) on the Dask scheduler `spec`'s workers, part by part in order."""
    from .scheduler import map_ranges

    yield from map_ranges(spec, store, examples, _summarise_range, (info.id, kind.name, kind.bind(params)), SUMMARY_RANGE)


def is_kept(store: Store, info: RunInfo, kind: SummaryKind, **params) -> bool:
    """Whether the kind's summary of the run is kept and current (its stamp matches): nothing is read but its stamp."""
    b = bound(store, info, kind, params)
    return store.summaries(info).parts(b.key, b.stamp) is not None


def _built_parts(store: Store, info: RunInfo, kind: SummaryKind, order: np.ndarray, params: dict) -> Iterator[dict]:
    """The kind's summary of `order` (storage order), part by part: on the Dask scheduler in effect, or range by range here."""
    from .scheduler import current_scheduler

    scheduler = current_scheduler()
    if scheduler is not None:
        yield from summarise_on(scheduler, store, info, kind, order, params)
    else:
        for part in ranges(order):
            yield summarise_examples(store, info, kind, part, params)


def _saved_parts(
    saved: SummaryParts,
    wanted: np.ndarray | None,
    chosen: np.ndarray | None = None,
    column: np.ndarray | None = None,
    fields=None,
    batched: bool = False,
) -> Iterator[dict[str, np.ndarray]]:
    """A kept summary read back range by range (of `fields` and the example column only, if given). With `wanted`,
    only those examples' rows (a sample of 1,000 of 8 M: ~1,000 inner chunks or blosc blocks, not ~800 chunks), a
    part per range that holds some (`batched`: a part per batch of such ranges, at most SUMMARY_RANGE rows), found
    from the summary's example column alone (8 bytes per example): `column` and the mask `chosen` over it where the
    caller has them (this summary's own), else read here."""
    if wanted is None:
        for start in range(0, saved.n, SUMMARY_RANGE):
            yield saved.part(start, min(start + SUMMARY_RANGE, saved.n), fields)
        return
    if column is None or chosen is None or len(column) != saved.n:
        column = saved.column("example")
        chosen = member(column, wanted)
    positions = np.flatnonzero(chosen)
    # one part per range of SUMMARY_RANGE examples holding some (what the whole run's parts add up, in the same order),
    # read a few ranges at a time: ranges together while their rows number at most SUMMARY_RANGE (a sample of 1,000
    # of 8 M: one read per field, not one per range per field)
    groups = np.split(positions, np.flatnonzero(np.diff(positions // SUMMARY_RANGE)) + 1) if len(positions) else []
    batch: list[np.ndarray] = []
    held = 0  # rows in `batch`
    for i, group in enumerate(groups):
        batch.append(group)
        held += len(group)
        if i + 1 == len(groups) or held + len(groups[i + 1]) > SUMMARY_RANGE:
            rows = np.concatenate(batch)
            if batched:
                yield saved.rows(rows, fields, column[rows])
            else:
                yield from saved.rows_in_parts(rows, np.cumsum([len(g) for g in batch[:-1]]).tolist(), fields, column[rows])
            batch, held = [], 0


class _Changed(Exception):
    """The run's committed state changed while its summary was built: it is not stamped (never read back)."""


def kept_order(store: Store, info: RunInfo, kind: SummaryKind, params: Mapping[str, Any]) -> np.ndarray:
    """The examples the kind covers, in storage order: its kept summary's example column where that is current (8 bytes
    an example from one array, ~0.2 s at 8 M examples), else `covered` (streamed from SQL, ~10 s at 8 M)."""
    return _order(store, info, bound(store, info, kind, params))[0]


def _order(store: Store, info: RunInfo, b: Bound) -> tuple[np.ndarray, bool]:
    """`kept_order`, and whether it is the kept summary's own example column (else it came from SQL)."""
    which = (store.locations.array_root, info.array_path, b.key, json.dumps(b.stamp, sort_keys=True, default=str))
    last = _LAST_ORDERS.get(store)
    if last is not None and last[0] == which:
        return last[1], True
    saved = store.summaries(info).parts(b.key, b.stamp)
    if saved is None:
        return covered(store, info, b.kind, b.params), False
    column = saved.column("example").astype(np.int64, copy=False)
    column.flags.writeable = False  # shared by the calls below
    _LAST_ORDERS[store] = (which, column)
    return column, True


# Per open store, the last kept example column read (`_order`), by its summary and stamp: a sample's query reads it to
# draw the sample, then again to find the sample's rows (8 bytes an example: 64 MB, ~0.15 s at 8 M). One is kept per
# store, and goes with it: a summary of the same stamp holds the same examples, whoever rewrote it.
_LAST_ORDERS: weakref.WeakKeyDictionary[Any, tuple[tuple, np.ndarray]] = weakref.WeakKeyDictionary()


def keep(store: Store, info: RunInfo, kind: SummaryKind, **params) -> SummaryParts | None:
    """The kind's kept summary of every example it covers (`.n`, `.part(start, stop)`), built part by part and kept
    first if it is not (on the Dask scheduler in effect, if any). None where it cannot be kept: a read-only store, a
    layout-1 run, a run that grew while it was read, or a whole-run pass the kind refuses (InvalidArgumentError from
    its `prepare`, e.g. a pair of runs that tokenised some example differently)."""
    return _keep(store, info, bound(store, info, kind, params))


def _keep(store: Store, info: RunInfo, b: Bound) -> SummaryParts | None:
    """`keep` of a bound kind."""
    kind, params, state, stamp, key = b.kind, b.params, b.state, b.stamp, b.key
    kept = store.summaries(info)
    saved = kept.parts(key, stamp)
    if saved is not None or store.read_only or not kept.can_keep:
        return saved
    order = covered(store, info, kind, params)

    def parts() -> Iterator[dict[str, np.ndarray]]:
        yield from _built_parts(store, info, kind, order, params)
        if committed_state(store, info, kind, params, fresh=True) != state:
            raise _Changed

    totals, labels = range_reduction(store, info, kind)  # each part kept reduced too (range reductions), if it declares one
    try:
        if not kept.keep(key, parts(), stamp, n_examples=len(order), totals=totals, labels=labels):
            return None
    except (_Changed, InvalidArgumentError):
        return None  # written without a stamp: never read back
    return kept.parts(key, stamp)


def summary_parts(
    store: Store, info: RunInfo, kind: SummaryKind, examples=REQUESTED, *, fields=None, batched: bool = False, **params
) -> Iterator[dict[str, np.ndarray]]:
    """The one path: the kind's per-example fields for the examples it covers (or those of `examples`), in storage
    order, as consecutive parts of at most SUMMARY_RANGE examples (each as `summarise_examples` gives it for those
    alone). Kept ones are read back (`fields`: only those and the example column, where the caller needs no more);
    else they are built and kept where the store allows; else computed for this call over the asked-for examples only
    (see the module docstring). NotFoundError names asked-for examples the kind does not cover. `batched`: a caller whose
    result does not depend on where parts are cut (concatenation, integer counts) takes a sample's kept rows as a part
    per few ranges (up to SUMMARY_RANGE rows) rather than one per range it touches (~780 for 1,000 of 8 M). Within a
    query call, `examples` and the map source default to its request's (queries/request.py)."""
    return _summary_parts(store, info, bound(store, info, kind, params), requested_examples(info.id, examples), fields, batched)


def _summary_parts(store: Store, info: RunInfo, b: Bound, examples, fields=None, batched: bool = False) -> Iterator[dict[str, np.ndarray]]:
    """`summary_parts` of a bound kind and the examples asked for (None: all it covers)."""
    order, kept = (None, False) if examples is None else _order(store, info, b)
    chosen = None if order is None else _selected(info, order, examples)
    wanted = None if order is None else order[chosen]
    saved = _keep(store, info, b)
    if saved is not None:  # rows are found by `order` only where it is that summary's column; else it is read
        if kept:
            return _saved_parts(saved, wanted, chosen, order, fields, batched)
        return _saved_parts(saved, wanted, fields=fields, batched=batched)
    chosen = covered(store, info, b.kind, b.params) if wanted is None else wanted
    return (part for part in _built_parts(store, info, b.kind, chosen, b.params) if len(part["example"]))


def summary(store: Store, info: RunInfo, kind: SummaryKind, examples=REQUESTED, **params) -> dict[str, np.ndarray]:
    """`summary_parts` as one summary (for queries that need every example's numbers at once)."""
    return concatenate(kind, summary_parts(store, info, kind, examples, batched=True, **params))


# ---------------------------------------------------------------- range reductions

# Whether `summary_totals` adds a whole run's kept ranges (the default) or always the per-example parts' totals: its
# `use_ranges=`, else this context's choice (`per_example_totals`), so a query run inside that block takes the other
# path (benchmarks/range_summaries.py times the two paths in one store; the tests compare them).
_USE_RANGES: ContextVar[bool] = ContextVar("attnstore_use_ranges", default=True)


@contextmanager
def per_example_totals() -> Iterator[None]:
    """Inside: `summary_totals` adds the per-example parts' totals even where kept ranges could be added."""
    token = _USE_RANGES.set(False)
    try:
        yield
    finally:
        _USE_RANGES.reset(token)


RANGE_BLOCK = 128  # kept ranges added a block (a chunk) at a time (SummaryRanges.block): ~2 MB for `clark`, whatever the run


def range_reduction(store: Store, info: RunInfo, kind: SummaryKind) -> tuple[Callable[[dict], dict] | None, list[str] | None]:
    """The kind's range reduction for this run (`part` -> its totals; None where it declares none) and its labels
    (None where its totals have no labelled axis)."""
    if kind.totals is None or kind.labels is None:
        return kind.totals, None
    labels = kind.labels(store, info)
    return functools.partial(kind.totals, labels=labels), labels


def kept_ranges(store: Store, info: RunInfo, kind: SummaryKind, **params) -> SummaryRanges | None:
    """The kept range reductions of the kind's summary of the whole run (built with the summary where it is built;
    derived from a summary kept without them, once, on a writable store). None where the kind declares none or no
    summary can be kept (then `summary_totals` goes through the per-example fields)."""
    if kind.totals is None:
        return None
    return _kept_ranges(store, info, bound(store, info, kind, params))


def _kept_ranges(store: Store, info: RunInfo, b: Bound) -> SummaryRanges | None:
    """`kept_ranges` of a bound kind that declares totals."""
    kind, stamp, key = b.kind, b.stamp, b.key
    saved = _keep(store, info, b)
    if saved is None:
        return None
    summaries = store.summaries(info)
    kept = _whole(summaries.ranges(key, stamp), saved.n, kind)
    if kept is not None or store.read_only:
        return kept
    totals, labels = range_reduction(store, info, kind)
    assert totals is not None
    parts = ((len(p["example"]), totals(p)) for p in _saved_parts(saved, None))
    summaries.keep_ranges(key, parts, stamp, labels, n_examples=saved.n)
    return _whole(summaries.ranges(key, stamp), saved.n, kind)


def _whole(kept: SummaryRanges | None, n_examples: int, kind: SummaryKind) -> SummaryRanges | None:
    """The kept ranges if they cover the summary's `n_examples` examples (their counts read: O(ranges)) and carry
    labels where the kind's totals have them, else None: a group that two writers overwrote at once is never added up."""
    if kept is None or kept.n_examples() != n_examples or (kind.labels is not None and kept.labels is None):
        return None
    return kept


def _widened(values: np.ndarray) -> np.ndarray:
    """Integer totals (counts, kept as int32 where a range's fit) added as int64: a whole run's never overflow."""
    values = np.asarray(values)
    return values.astype(np.int64) if values.dtype.kind in "iu" and values.dtype != np.int64 else values


def add_totals(a: dict[str, np.ndarray] | None, b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Two consecutive ranges' totals -> theirs together (a None: b); integer ones as int64."""
    return {name: _widened(v) for name, v in b.items()} if a is None else {name: a[name] + _widened(b[name]) for name in a}


def summary_totals(
    store: Store, info: RunInfo, kind: SummaryKind, examples=REQUESTED, *, use_ranges: bool | None = None, **params
) -> dict[str, np.ndarray]:
    """The kind's `totals` of the examples it covers (or those of `examples`): what a query that only adds per-example
    numbers combines. The whole run (no `examples`), where the kind declares `totals` and its summary is kept: the
    kept ranges' totals added in storage order, O(ranges) (`kept_ranges`); otherwise the totals of each part
    `summary_parts` hands over, added in the same order. The two agree to float64 rounding (the same per-range totals
    added in the same order; tests/queries/test_range_totals.py: relative 1e-12). Empty: no examples. A kind with
    `labels` gets them too, as `labels` (an array of str: the kept ranges', else the run's read for the call)."""
    if kind.totals is None:
        raise InvalidArgumentError(f"summary kind {kind.name!r} declares no range reduction (totals)")
    examples = requested_examples(info.id, examples)
    b = bound(store, info, kind, params)
    use_ranges = _USE_RANGES.get() if use_ranges is None else use_ranges
    kept = _kept_ranges(store, info, b) if examples is None and use_ranges else None
    if kept is not None:
        out = _added_ranges(kept)
        labels = kept.labels
    else:
        totals, labels = range_reduction(store, info, kind)
        assert totals is not None
        out = None
        parts = _summary_parts(store, info, b, examples, fields=kind.totals_fields, batched=kind.integer_totals)
        for part in parts:
            got = totals(part)
            if kind.integer_totals and any(np.asarray(v).dtype.kind not in "iub" for v in got.values()):
                raise TypeError(f"summary kind {kind.name!r} declares integer_totals but its totals are not all integers")
            out = add_totals(out, got)
    out = out or {}
    if labels is not None:
        out["labels"] = np.asarray(labels, dtype=str)
    return out


def _added_ranges(kept: SummaryRanges) -> dict[str, np.ndarray] | None:
    """Every kept range's totals added, a block of RANGE_BLOCK ranges at a time, in storage order (None: no range)."""
    out: dict[str, np.ndarray] | None = None
    for start in range(0, kept.n, RANGE_BLOCK):
        block = kept.block(start, min(start + RANGE_BLOCK, kept.n))
        block.pop("range_examples")  # each range's count of examples (store/arrays.py; the totals carry their own)
        out = {name: _block_sum(None if out is None else out[name], values) for name, values in block.items()}
    return out


def _block_sum(before: np.ndarray | None, values: np.ndarray) -> np.ndarray:
    """`before` plus a block of ranges' rows of one field. Floats range after range, as the parts' totals are added:
    before + t0 + t1 + ... (accumulate is sequential), so both routes round alike; integers (exact in any order) summed
    at once as int64, ~10x faster for the dependency kind's counts."""
    if values.dtype.kind in "iu":
        total = values.sum(0, dtype=np.int64)
        return total if before is None else before + total
    return np.add.accumulate(values if before is None else np.concatenate([before[None], values]), axis=0)[-1]


# ---------------------------------------------------------------- Clark et al.'s standard statistics

DEFAULT_PUNCT = ".,"


# Hand-written on purpose: scipy (scipy.special.entr) is only in the ingest extra, and queries need numpy alone.
def row_entropy(maps: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Entropy in nats of every attention row: (..., query, key) -> (..., query); 0 log 0 = 0.

    A 0 is raised to the dtype's smallest normal number before the log (0 x log(tiny) = 0): unlike a masked log
    (`where=maps > 0`, 2-3x slower), it also changes values below that (subnormals, none in float16 maps cast to
    float32) by less than 1e-36. float16 maps are computed in float32 (float16's smallest normal, 6e-5, would raise
    their subnormals), each summand looked up by value (store/float16.py: the same float32 arithmetic, done once per
    float16 value). `out`: float32 scratch of the maps' shape for float16 maps, else of their shape and dtype."""
    if maps.dtype == np.float16:
        logs = plogp(maps, out=out)
        return -logs.sum(-1)
    tiny = np.finfo(maps.dtype).tiny
    logs = np.maximum(maps, tiny, out=out)
    np.log(logs, out=logs)
    logs *= maps
    return -logs.sum(-1)


def _clark_prepare(store: Store, info: RunInfo, examples=None, punct: str = DEFAULT_PUNCT):
    return token_flags(store, info, punct, examples)


def _clark_reduce(flags, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    f = flags[example]
    counts = {
        "length": np.asarray(maps.shape[-1], np.int64),
        "n_cls": np.asarray(f.cls.sum(), np.int64),
        "n_sep": np.asarray(f.sep.sum(), np.int64),
    }
    return {**counts, **example_sums(maps, f.cls, f.sep, f.punct)}


# Each (layer, head) field's query tokens: an example's mean of the field is its sum over them divided by their count.
CLARK_UNITS = {
    **{name: "tokens" for name in ("to_previous", "to_self", "to_next", "entropy")},
    **{f"received_{k}": "tokens" for k in ("cls", "sep", "punct", "other")},
    "sep_from_sep": "sep",
    "sep_from_other": "others",
    "entropy_from_cls": "cls",
}


def _clark_totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A range's reduction of the Clark fields, what `relative_position`, `special_tokens` and `entropy` combine:

    `<field>`: its sum over the range's examples (the pooled average, average="token");
    `mean_<field>`: the sum over the examples that have such query tokens of the example's mean (average="example");
    `n_<unit>`: the query tokens of each unit (tokens, sep, others: non-separators, cls); `examples_<unit>`: the examples
    that have any; `examples`: all of them;
    `log_length` / `length_log_length` / `lgamma_length` / `lgamma_per_length`: sums of log L, L log L, log L!, log L! / L
    (the uniform-attention entropies, L keys or a causal query's i + 1), and `cls_log_length` / `log_length_with_cls`: of
    n_cls log L and of log L over the examples with a [CLS]-like token."""
    length = part["length"].astype(np.int64)
    counts = {"tokens": length, "sep": part["n_sep"].astype(np.int64), "cls": part["n_cls"].astype(np.int64)}
    counts["others"] = length - counts["sep"]
    out: dict[str, np.ndarray] = {"examples": np.asarray(len(length), np.int64)}
    for unit, n in counts.items():
        out[f"n_{unit}"] = n.sum()
        out[f"examples_{unit}"] = np.asarray((n > 0).sum(), np.int64)
    for name, unit in CLARK_UNITS.items():
        values, n = part[name], counts[unit].astype(np.float64)
        used = n > 0
        out[name] = values.sum(0)
        out[f"mean_{name}"] = (values[used] / n[used][:, None, None]).sum(0)
    as_float = length.astype(np.float64)
    log_l = np.log(as_float)
    log_factorial = np.fromiter((lgamma(x + 1) for x in length.tolist()), dtype=np.float64, count=len(length))
    out["log_length"] = log_l.sum()
    out["length_log_length"] = (as_float * log_l).sum()
    out["lgamma_length"] = log_factorial.sum()
    out["lgamma_per_length"] = (log_factorial / as_float).sum()
    out["cls_log_length"] = (counts["cls"] * log_l).sum()
    out["log_length_with_cls"] = log_l[counts["cls"] > 0].sum()
    return out


def totals_or_zeros(totals: dict[str, np.ndarray], shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """The Clark totals, or those of no examples: `_clark_totals` of an empty part (every sum 0, fields of `shape`)."""
    if totals:
        return totals
    empty = {"length": np.zeros(0, np.int64), "n_sep": np.zeros(0, np.int64), "n_cls": np.zeros(0, np.int64)}
    return _clark_totals(empty | {name: np.zeros((0, *shape)) for name in CLARK_UNITS})


# punct: the characters counted as punctuation keys (special_tokens' parameter); the default's summary is `clark`.
# Version 3: compiled (queries/_clark.c), row entropies summed in float64 (in float32 before: within 1e-7 relative).
CLARK = register_kind(
    SummaryKind("clark", 3, _clark_prepare, _clark_reduce, defaults={"punct": DEFAULT_PUNCT}, totals=_clark_totals, threads=True)
)
