"""The one path a kind's per-example fields come through: kept with the run, built and kept, or computed for the call.

`summary_parts` hands a query its kind's per-example fields range by range, in storage order, whatever the store allows:

1. **kept** with the run (`summary/<key>/` in its Zarr group; store/summaries.py), when the stamp matches: the stamp
   is the result's fingerprint, (kind, its version, the parameters that change its values, the run's committed state:
   `n_examples`, plus what a kind adds, e.g. the other run's count for a pair of runs), compared whole;
2. **built and kept** the first time on a writable store (in process range by range, or on the Dask workers of
   `--scheduler`; engine/passes.py), then read back as in 1;
3. **computed for this call alone** where nothing can be kept (a read-only store, a run that grew while it was read,
   or a kind whose whole-run pass cannot be built), by the same `prepare`/`reduce` over only the asked-for examples,
   in process or on the workers.

There is no second implementation: 1-3 give the same per-example fields, so a query's result does not depend on which
was taken (the values are those of the same float64 arithmetic on the same maps, combined in the same storage order).
A kind is bound to its parameters once per call (`Bound`: key, stamp, committed state) and every step takes that.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidArgumentError
from . import kinds
from .kinds import SummaryKind, concatenate, range_reduction
from .passes import _built_parts
from .request import REQUESTED, current_request, requested_examples, requested_source
from .selection import _selected, _unweighted, covered, member

if TYPE_CHECKING:
    from ...store import Store
    from ...store.records import RunInfo
    from ...store.summaries import SummaryParts


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


def is_kept(store: Store, info: RunInfo, kind: SummaryKind, **params) -> bool:
    """Whether the kind's summary of the run is kept and current (its stamp matches): nothing is read but its stamp."""
    b = bound(store, info, kind, params)
    return store.summaries(info).parts(b.key, b.stamp) is not None


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
        for start in range(0, saved.n, kinds.SUMMARY_RANGE):
            yield saved.part(start, min(start + kinds.SUMMARY_RANGE, saved.n), fields)
        return
    if column is None or chosen is None or len(column) != saved.n:
        column = saved.column("example")
        chosen = member(column, wanted)
    positions = np.flatnonzero(chosen)
    # one part per range of SUMMARY_RANGE examples holding some (what the whole run's parts add up, in the same order),
    # read a few ranges at a time: ranges together while their rows number at most SUMMARY_RANGE (a sample of 1,000
    # of 8 M: one read per field, not one per range per field)
    groups = np.split(positions, np.flatnonzero(np.diff(positions // kinds.SUMMARY_RANGE)) + 1) if len(positions) else []
    batch: list[np.ndarray] = []
    held = 0  # rows in `batch`
    for i, group in enumerate(groups):
        batch.append(group)
        held += len(group)
        if i + 1 == len(groups) or held + len(groups[i + 1]) > kinds.SUMMARY_RANGE:
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
    run that grew while it was read, or a whole-run pass the kind refuses (InvalidArgumentError from
    its `prepare`, e.g. a pair of runs that tokenised some example differently)."""
    return _keep(store, info, bound(store, info, kind, params))


def _keep(store: Store, info: RunInfo, b: Bound) -> SummaryParts | None:
    """`keep` of a bound kind."""
    kind, params, state, stamp, key = b.kind, b.params, b.state, b.stamp, b.key
    kept = store.summaries(info)
    saved = kept.parts(key, stamp)
    if saved is not None or store.read_only:
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
    query call, `examples` and the map source default to its request's (queries/engine/request.py)."""
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
