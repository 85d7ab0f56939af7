"""A query's per-example pass on Dask distributed (the scheduler forms are in store/cluster.py).

A query's costly part is one pass that decodes every map of a run and keeps a few numbers per
example (queries/summary.py). With a scheduler, the run's examples are cut into contiguous
ranges in storage order (a few per worker, so a slow worker does not hold the rest back), each
worker opens the same store read-only (its database URL and array root) and runs the pass over
its range, and the parts come back in order: the result equals the one-process pass exactly.

This module knows nothing of summaries: queries/summary.py hands it the task to run (a module-level
function, which Dask sends to the workers by reference), so the imports point one way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from ..store.cluster import PARTS_PER_WORKER, check_scheduler, client_for, current_scheduler, split, use_scheduler

__all__ = ["check_scheduler", "client_for", "current_scheduler", "map_ranges", "split", "use_scheduler"]

if TYPE_CHECKING:
    from ..store import Store


def _on_worker(task: Callable[..., Any], locations: dict, args: tuple, examples: list[int]) -> Any:
    """On a worker: open the store read-only and run `task(store, examples, *args)` over one range."""
    from ..store import Store
    from ..store.config import Locations

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
