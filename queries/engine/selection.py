"""Which examples a pass reads: a run's committed examples in storage order, in ranges, or those a request asks for."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import NotFoundError
from . import kinds
from .kinds import SummaryKind
from .request import REQUESTED, requested_examples
from .sources import iter_maps

if TYPE_CHECKING:
    from ...store import Store
    from ...store.records import RunInfo


def in_storage_order(store: Store, info: RunInfo) -> np.ndarray:
    """The run's committed (not skipped) examples in storage order (int64: 8 bytes per example)."""
    return store.storage_order(info.id)


def ranges(examples: np.ndarray, size: int | None = None) -> list[np.ndarray]:
    """Consecutive ranges of `size` (default SUMMARY_RANGE) examples."""
    size = size or kinds.SUMMARY_RANGE  # read at each call: tests set a small one
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


def covered(store: Store, info: RunInfo, kind: SummaryKind, params: Mapping[str, Any]) -> np.ndarray:
    """The examples the kind summarises for `params`, in storage order."""
    return kind.covers(store, info, _unweighted(params)) if kind.covers is not None else in_storage_order(store, info)


def _unweighted(params: Mapping[str, Any]) -> dict:
    """The kind's own parameters (what its hooks take), without the framework's `weights`."""
    return {k: v for k, v in params.items() if k != "weights"}
