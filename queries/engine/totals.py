"""Range reductions: what a query that only adds per-example numbers reads, kept per range for a whole run.

A kind may declare `totals(part)`: a range's reduction, sums over the part's examples of what its queries combine (sums
of fields, sums of each example's means, counts), derived from the per-example fields alone, so that adding consecutive
ranges' totals gives the totals of them all. Where a kind declares one, each part of its summary is kept reduced too
when the summary is kept (`summary/<key>/ranges/`, a row per range of SUMMARY_RANGE examples, stamped like the summary
and before it; a summary kept without them gets them derived from its per-example fields on the first whole-run query of
a writable store). `summary_totals` is then what its queries read: for the whole run it adds the kept ranges' rows
(O(ranges), a block of RANGE_BLOCK ranges at a time), else (`examples=`, a read-only store with nothing kept, no ranges)
it adds `totals` of each part `summary_parts` hands over. Both add the same per-range totals in the same storage order,
so they agree to float64 rounding (tested at relative 1e-12; equal in every test and benchmark so far). The query's
combine is written once, over the totals.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InvalidArgumentError
from . import kept as kept_path
from .kept import Bound, _keep, _saved_parts, bound
from .kinds import SummaryKind, range_reduction
from .request import REQUESTED, requested_examples

if TYPE_CHECKING:
    from ...store import Store
    from ...store.records import RunInfo
    from ...store.summaries import SummaryRanges


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
        parts = kept_path._summary_parts(store, info, b, examples, fields=kind.totals_fields, batched=kind.integer_totals)
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
