"""The query engine: what every query over stored maps shares, so that a query module holds only its analysis.

- `run.py`: the door, `run_query`: parameters checked once, the run pinned, one frozen request built;
- `request.py`: that request (its `examples` and map `source`), which every read below takes by default;
- `sources.py`: the map sources (attention as stored, norm-weighted attention) and the readers of maps;
- `registry.py`: `@register`, the built-in queries and those of installed packages (entry-point group
  `attnstore.queries`);
- `kinds.py`: `SummaryKind`, a query's per-example reduction, and the kinds registered;
- `selection.py`: which examples a pass reads, in storage order and in ranges;
- `passes.py`: one pass of a kind, on this process's threads or on Dask workers;
- `kept.py`: the one path a kind's fields come through (kept, built and kept, or computed for the call);
- `totals.py`: range reductions, what a query that adds per-example numbers reads;
- `kernels.py`: the compiled reduces (queries/_*.c), imported on first use.

The kept-summary format itself lives in the store (store/summaries.py, `store.summaries(run)`). A query module imports
what it needs from here: `from .engine import MAP_SOURCES, SummaryKind, register, register_kind, summary_totals`.
"""

from __future__ import annotations

from .kept import Bound, bound, committed_state, is_kept, keep, kept_order, summary, summary_parts
from .kernels import as_kernel_maps, kernel
from .kinds import KINDS, SUMMARY_RANGE, SummaryKind, concatenate, kind_named, ragged_rows, range_reduction, register_kind, run_kinds
from .passes import reduce_threads, row_kinds, summarise_examples, summarise_on, use_scheduler
from .registry import QUERIES, QuerySpec, get_query, load_all, register
from .request import (
    ATTENTION_ONLY,
    ENGINE_PARAMS,
    MAP_SOURCES,
    REQUESTED,
    SOURCES,
    QueryRequest,
    asked,
    asked_of,
    check_source,
    current_request,
    requested_examples,
    requested_source,
    serving,
    whole_run,
)
from .run import run_query
from .selection import ascending, covered, every_position, in_storage_order, member, only, ranged_maps, ranges, storage_ranges, stored_only
from .sources import WEIGHTS, check_weights, iter_maps, iter_maps_with_norms, iter_weighted_maps, weighted_maps
from .totals import add_totals, kept_ranges, per_example_totals, summary_totals

__all__ = [
    "ATTENTION_ONLY",
    "ENGINE_PARAMS",
    "KINDS",
    "MAP_SOURCES",
    "QUERIES",
    "REQUESTED",
    "SOURCES",
    "SUMMARY_RANGE",
    "WEIGHTS",
    "Bound",
    "QueryRequest",
    "QuerySpec",
    "SummaryKind",
    "add_totals",
    "as_kernel_maps",
    "ascending",
    "asked",
    "asked_of",
    "bound",
    "check_source",
    "check_weights",
    "committed_state",
    "concatenate",
    "covered",
    "current_request",
    "every_position",
    "get_query",
    "in_storage_order",
    "is_kept",
    "iter_maps",
    "iter_maps_with_norms",
    "iter_weighted_maps",
    "keep",
    "kept_order",
    "kept_ranges",
    "kernel",
    "kind_named",
    "load_all",
    "member",
    "only",
    "per_example_totals",
    "ragged_rows",
    "range_reduction",
    "ranged_maps",
    "ranges",
    "reduce_threads",
    "row_kinds",
    "register",
    "register_kind",
    "requested_examples",
    "requested_source",
    "run_kinds",
    "run_query",
    "serving",
    "storage_ranges",
    "stored_only",
    "summarise_examples",
    "summarise_on",
    "summary",
    "summary_parts",
    "summary_totals",
    "use_scheduler",
    "weighted_maps",
    "whole_run",
]
