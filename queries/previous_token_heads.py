"""Previous-token heads: how much of each row's attention goes to the token just before it.

Olsson et al. 2022 ("In-context Learning and Induction Heads") describe previous-token heads as the first half of an
induction circuit; on real text they are found by the mean attention from each token i to i - 1. Per head: that mean
over the rows i >= 1 of each example, then over the examples with at least two tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.row_stats import ExampleRows
from .common import per_head_frame, safe_divide
from .engine import MAP_SOURCES, SummaryKind, register, register_kind, summary_totals

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo


def _prepare(store: Store, info: RunInfo, examples=None):
    return None


def _reduce(context, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    """Per (layer, head): the mean over rows i >= 1 of A[i, i - 1] (0 for a one-token example, not counted)."""
    n = maps.shape[-1]
    if n < 2:
        return {"previous": np.zeros(maps.shape[:2]), "counted": np.asarray(0, np.int64)}
    rows = np.arange(1, n)
    return {"previous": maps[..., rows, rows - 1].astype(np.float64).mean(-1), "counted": np.asarray(1, np.int64)}


def _rows(context, example: int, rows: ExampleRows) -> dict[str, np.ndarray]:
    """`_reduce` from a causal LM run's row statistics: A[i, i - 1] is the mass at distance 1 (distance bin 1)."""
    if rows.n < 2:
        return {"previous": np.zeros(rows.stats.shape[1:3]), "counted": np.asarray(0, np.int64)}
    return {"previous": rows.field("distance_1")[..., 1:].mean(-1), "counted": np.asarray(1, np.int64)}


def _totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"previous": part["previous"].sum(0), "counted": np.asarray(part["counted"].sum(), np.int64)}


PREVIOUS = register_kind(
    SummaryKind("previous_token", 1, _prepare, _reduce, totals=_totals, threads=True, rows=_rows, rows_fields=("distance_1",))
)


@register("previous_token_heads", sources=MAP_SOURCES)
def previous_token_heads(store: Store, *, run) -> pd.DataFrame:
    """Olsson et al. 2022: per head, the mean attention from each token to the one before it.

    Columns: layer, head, previous (the mean over rows i >= 1 of A[i, i - 1], averaged over the examples with at least
    two tokens). frame.attrs: examples (those counted).
    """
    info = store.run_info(run)
    sums = summary_totals(store, info, PREVIOUS)
    frame = per_head_frame(info, previous=safe_divide(sums["previous"], int(sums["counted"])))
    frame.attrs["examples"] = int(sums["counted"])
    return frame
