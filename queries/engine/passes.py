"""One pass of a kind over some examples: in this process (reducing on threads where the kind allows) or on the
workers of a Dask scheduler (`--scheduler`; the scheduler forms are in store/cluster.py).

A query's costly part is one pass that decodes every map of a run and keeps a few numbers per example. With a
scheduler, the run's examples are cut into contiguous ranges in storage order (a few per worker, so a slow worker does
not hold the rest back), each worker opens the same store read-only (its database URL and array root) and runs the pass
over its range, and the parts come back in order: the result equals the one-process pass exactly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from ...store.cluster import PARTS_PER_WORKER, check_scheduler, client_for, current_scheduler, split, use_scheduler
from ...store.pools import SizedPool
from . import kinds
from .kinds import SummaryKind, _assemble, kind_named, run_kinds
from .selection import covered, ranges
from .sources import iter_weighted_maps, reads_rows, rows_fields

__all__ = ["check_scheduler", "client_for", "current_scheduler", "map_ranges", "split", "use_scheduler"]

if TYPE_CHECKING:
    from ...store import Store
    from ...store.records import RunInfo


def summarise_examples(
    store: Store, info: RunInfo, kind: SummaryKind, examples=None, params: Mapping[str, Any] | None = None
) -> dict[str, np.ndarray]:
    """One pass of the kind over `examples` (default: every example it covers), in storage order."""
    params = kind.bind(params)
    if examples is None:
        examples = covered(store, info, kind, params)
    from_rows = reads_rows(info, kind, params)
    weights = params.pop("weights", "attention")
    order: list[int] = []
    rows: list[dict[str, np.ndarray]] = []
    if from_rows:  # the run's per-row statistics: a few numbers per row, no map read or rebuilt
        context: Any = kind.prepare(store, info, examples, **params)
        assert kind.rows is not None
        fields = rows_fields(kind, params)
        for example, stats in store.iter_row_stats(info.id, examples, fields, kind.rows_top):
            order.append(example)
            rows.append(kind.rows(context, example, stats))
        return _assemble(kind, order, rows)
    pool = _reduce_pool() if kind.threads and kind.read is None else None
    if pool is not None:  # the context (SQL) is read on the pool while this thread reads the first maps
        context = pool.submit(kind.prepare, store, info, examples, **params)
        pairs: Iterable[tuple[int, Any]] = iter_weighted_maps(store, info, examples, weights, kind.by_layer)
    else:
        context = kind.prepare(store, info, examples, **params)
        if kind.read is not None:
            pairs = kind.read(store, info, examples, context)
        else:
            pairs = iter_weighted_maps(store, info, examples, weights, kind.by_layer)
    for example, row in reduced(kind, context, pairs, pool):
        order.append(example)
        rows.append(row)
    if pool is not None:
        context.result()  # its error, where no example's reduce raised it
    return _assemble(kind, order, rows)


def row_kinds(info: RunInfo) -> list[SummaryKind]:
    """The kinds whose pass over run `info` with their defaults reads its per-row statistics: those to keep once the
    run is ingested (a kind defined on another dataset, e.g. induction_heads' repeated tokens, left out)."""
    return [
        kind
        for kind in run_kinds().values()
        if kind.read is None and kind.dataset in (None, info.dataset_format) and reads_rows(info, kind, kind.bind())
    ]


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


def _summarise_range(store: Store, examples: list[int], run_id: int, kind_name: str, params: dict) -> dict[str, np.ndarray]:
    """A Dask worker's task (`map_ranges`): the kind's summary of one range of the run's examples."""
    return summarise_examples(store, store.run_info(run_id), kind_named(kind_name), examples, params)


def summarise_on(
    spec: str, store: Store, info: RunInfo, kind: SummaryKind, examples, params: Mapping[str, Any] | None = None
) -> Iterator[dict]:
    """The kind's summary of `examples` (storage order) on the Dask scheduler `spec`'s workers, part by part in order."""

    yield from map_ranges(spec, store, examples, _summarise_range, (info.id, kind.name, kind.bind(params)), kinds.SUMMARY_RANGE)


def _built_parts(store: Store, info: RunInfo, kind: SummaryKind, order: np.ndarray, params: dict) -> Iterator[dict]:
    """The kind's summary of `order` (storage order), part by part: on the Dask scheduler in effect, or range by range here."""
    scheduler = current_scheduler()
    if scheduler is not None:
        yield from summarise_on(scheduler, store, info, kind, order, params)
    else:
        for part in ranges(order):
            yield summarise_examples(store, info, kind, part, params)


def _on_worker(task: Callable[..., Any], locations: dict, args: tuple, examples: list[int]) -> Any:
    """On a worker: open the store read-only and run `task(store, examples, *args)` over one range."""
    from ...store import Store
    from ...store.config import Locations

    store = Store(Locations(**{**locations, "read_only": True}))
    try:
        return task(store, examples, *args)
    finally:
        store.engine.dispose()


def map_ranges(
    spec: str, store: Store, examples: np.ndarray | list[int], task: Callable[..., Any], args: tuple, max_range: int
) -> Iterator[Any]:
    """`task(store, range, *args)` over contiguous ranges of `examples` (storage order) of at most `max_range`
    examples, on the scheduler's workers; the results one by one, in order (the caller holds one at a time)."""
    locations = asdict(store.locations)
    with client_for(spec) as client:
        workers = max(1, len(client.scheduler_info().get("workers", {})))
        ranges = split(examples, max(workers * PARTS_PER_WORKER, -(-len(examples) // max_range)))
        n = len(ranges)
        futures = client.map(_on_worker, [task] * n, [locations] * n, [args] * n, ranges, pure=False)
        for future in futures:
            yield future.result()
            future.release()
