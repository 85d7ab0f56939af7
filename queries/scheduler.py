"""A query's per-example pass on Dask distributed (the scheduler forms are in store/cluster.py).

A query's costly part is one pass that decodes every map of a run and keeps a few numbers per
example (queries/summary.py). With a scheduler, the run's committed examples are cut into
contiguous ranges in storage order (a few per worker, so a slow worker does not hold the rest
back), each worker opens the same store read-only (its database URL and array root),
summarises its range, and the parts are concatenated in order: the result equals the
one-process pass exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING

import numpy as np

from ..store.cluster import PARTS_PER_WORKER, check_scheduler, client_for, current_scheduler, split, use_scheduler

__all__ = ["check_scheduler", "client_for", "current_scheduler", "split", "summarise_on", "use_scheduler"]

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo
    from .summary import SummaryKind


def _summarise_part(locations: dict, run_id: int, kind_name: str, examples: list[int]) -> dict[str, np.ndarray]:
    """On a worker: open the store read-only and summarise one range of the run's examples."""
    from ..store import Store
    from ..store.config import Locations
    from .summary import kind_named, summarise_examples

    store = Store(Locations(**{**locations, "read_only": True}))
    try:
        return summarise_examples(store, store.run_info(run_id), kind_named(kind_name), examples)
    finally:
        store.engine.dispose()


def summarise_on(
    spec: str, store: Store, info: RunInfo, kind: SummaryKind, examples: np.ndarray | list[int]
) -> Iterator[dict[str, np.ndarray]]:
    """The kind's summary of `examples` (storage order), computed on the scheduler's workers, part by part in order
    (ranges of at most SUMMARY_RANGE examples, so the caller holds one part at a time)."""
    from .summary import SUMMARY_RANGE

    locations = asdict(store.locations)
    with client_for(spec) as client:
        workers = max(1, len(client.scheduler_info().get("workers", {})))
        ranges = split(examples, max(workers * PARTS_PER_WORKER, -(-len(examples) // SUMMARY_RANGE)))
        n = len(ranges)
        futures = client.map(_summarise_part, [locations] * n, [info.id] * n, [kind.name] * n, ranges, pure=False)
        for future in futures:
            yield future.result()
            future.release()
