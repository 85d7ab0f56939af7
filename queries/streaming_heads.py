"""Streaming and retrieval heads: how much of each row's attention a sink-plus-window cache would keep.

DuoAttention (Xiao et al. 2024) serves "streaming heads" with a cache of the first few tokens (the attention sink) and
the most recent ones, and keeps the full cache for "retrieval heads". Per head this query gives the mass that cache
keeps: for each row i, the attention on the first `sinks` = 4 keys plus the last `recent` = 64 keys (i - 63 .. i),
averaged over the rows that see more than those (i >= sinks + recent: nearer rows keep everything by construction),
then over the examples that have such rows. A head whose mass is above `threshold` = 0.9 is a streaming head, the rest
retrieval heads (`streaming`). The mass-based rule is what this store computes from the maps; DuoAttention itself
learns its gates by optimisation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.row_stats import POSITIONS, ExampleRows, bins_within
from .common import per_head_frame, safe_divide
from .engine import MAP_SOURCES, SummaryKind, register, register_kind, summary_totals
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

SINKS, RECENT, THRESHOLD = 4, 64, 0.9


def _prepare(store: Store, info: RunInfo, examples=None, sinks: int = SINKS, recent: int = RECENT):
    return int(sinks), int(recent)


def _reduce(context, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    """Per (layer, head): the mean over rows i >= sinks + recent of the mass on keys < sinks and keys > i - recent."""
    sinks, recent = context
    n = maps.shape[-1]
    first = sinks + recent
    if n <= first:
        return {"kept": np.zeros(maps.shape[:2]), "counted": np.asarray(0, np.int64)}
    rows = np.arange(first, n)
    kept = maps[..., first:, :sinks].astype(np.float64).sum(-1)  # (layer, head, row)
    for back in range(recent):  # the diagonals i - back: keys i - recent + 1 .. i, never a whole (row, key) copy
        kept += maps[..., rows, rows - back]
    return {"kept": kept.mean(-1), "counted": np.asarray(1, np.int64)}


def _rows(context, example: int, rows: ExampleRows) -> dict[str, np.ndarray]:
    """`_reduce` from a causal LM run's row statistics: the first `sinks` positions plus the distance bins below
    `recent` (a power of 2: `_rows_accept`); for rows i >= sinks + recent the two sets of keys are apart."""
    sinks, recent = context
    first = sinks + recent
    if rows.n <= first:
        return {"kept": np.zeros(rows.stats.shape[1:3]), "counted": np.asarray(0, np.int64)}
    kept = np.sum([rows.field(name)[..., first:] for name in _fields({"sinks": sinks, "recent": recent})], axis=0)
    return {"kept": kept.mean(-1), "counted": np.asarray(1, np.int64)}


def _fields(params) -> tuple[str, ...]:
    """The statistics `_rows` reads: the first `sinks` positions and the distance bins below `recent`."""
    within = bins_within(params["recent"]) or 0
    return (*(f"first_{p}" for p in range(params["sinks"])), *(f"distance_{b}" for b in range(within)))


def _rows_accept(params) -> bool:
    """Row statistics give the kept mass for sinks up to 4 and a power-of-2 window up to 2^14."""
    return params["sinks"] <= POSITIONS and bins_within(params["recent"]) is not None


def _totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"kept": part["kept"].sum(0), "counted": np.asarray(part["counted"].sum(), np.int64)}


KEPT = register_kind(
    SummaryKind(
        "sink_window_mass",
        1,
        _prepare,
        _reduce,
        defaults={"sinks": SINKS, "recent": RECENT},
        totals=_totals,
        rows=_rows,
        rows_accept=_rows_accept,
        rows_fields=_fields,
    )
)


@register("streaming_heads", sources=MAP_SOURCES)
def streaming_heads(store: Store, *, run, sinks: int = SINKS, recent: int = RECENT, threshold: float = THRESHOLD) -> pd.DataFrame:
    """DuoAttention (Xiao et al. 2024): per head, the attention a cache of the first `sinks` and last `recent` tokens keeps.

    Columns: layer, head, kept (per row i >= sinks + recent, the mass on keys 0 .. sinks - 1 and i - recent + 1 .. i,
    averaged over those rows and then over the examples that have them), streaming (kept > threshold: a streaming
    head; otherwise a retrieval head). frame.attrs: sinks, recent, threshold, examples (those counted: longer than
    sinks + recent tokens).
    """
    for name, value in (("sinks", sinks), ("recent", recent)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"{name}={value!r}: give a positive number of tokens")
    info = store.run_info(run)
    sums = summary_totals(store, info, KEPT, sinks=sinks, recent=recent)
    kept = safe_divide(sums["kept"], int(sums["counted"]))
    frame = per_head_frame(info, kept=kept)
    frame["streaming"] = frame["kept"] > threshold
    frame.attrs.update(sinks=sinks, recent=recent, threshold=threshold, examples=int(sums["counted"]))
    return frame
