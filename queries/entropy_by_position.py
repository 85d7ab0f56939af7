"""Attention entropy by query position: how spread each head's rows are as the context grows.

Row i of a causal map sees i + 1 keys, so its entropy is at most log(i + 1), the entropy of the uniform row; comparing
a head's entropy with that bound position by position shows whether it spreads its attention as the context grows or
keeps it on a few tokens (a sink, the previous token). Per head and log-spaced bin of positions (bin b holds rows i
with 2^b <= i + 1 < 2^(b + 1): 0, 1-2, 3-6, 7-14, ...): the mean row entropy in nats and the mean log(i + 1) of the
same rows, over every row of every example in the bin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.row_stats import ExampleRows
from .common import is_causal
from .engine import MAP_SOURCES, SummaryKind, register, register_kind, summary_totals

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

BINS = 17  # rows up to position 2^17 - 2


def _prepare(store: Store, info: RunInfo, examples=None):
    return is_causal(store, info)


def bin_of(n: int) -> np.ndarray:
    """The bin of each row 0 .. n - 1: floor(log2(i + 1))."""
    return np.floor(np.log2(np.arange(1, n + 1))).astype(np.int64)


def _reduce(causal, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    """Per (layer, head, bin): the summed row entropy and, per bin, the rows and their summed log(keys seen)."""
    n = maps.shape[-1]
    entropy = np.zeros((*maps.shape[:2], n))
    for layer in range(maps.shape[0]):  # one layer at a time: a (head, L, L) float32 temporary, not the example's
        a = maps[layer].astype(np.float32)
        plogp = np.zeros_like(a)
        np.multiply(a, np.log(a, where=a > 0, out=np.zeros_like(a)), out=plogp, where=a > 0)
        entropy[layer] = -plogp.sum(-1, dtype=np.float64)  # (head, L)
    return _binned(causal, entropy)


def _rows(causal, example: int, rows: ExampleRows) -> dict[str, np.ndarray]:
    """`_reduce` from a causal LM run's row statistics: each row's entropy, kept at ingest."""
    return _binned(causal, rows.field("entropy"))


def _binned(causal: bool, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Per-row entropies (layer, head, row) -> `_reduce`'s fields."""
    n = rows.shape[-1]
    bins = bin_of(n)
    entropy = np.zeros((*rows.shape[:2], BINS))
    for b in range(min(BINS, int(bins[-1]) + 1)):
        entropy[:, :, b] = rows[:, :, bins == b].sum(-1)
    seen = np.log(np.arange(1, n + 1) if causal else np.full(n, n, dtype=np.float64))
    counts = np.bincount(bins, minlength=BINS)[:BINS]
    bound = np.bincount(bins, weights=seen, minlength=BINS)[:BINS]
    return {"entropy": entropy, "rows": counts.astype(np.int64), "uniform": bound}


def _totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"entropy": part["entropy"].sum(0), "rows": part["rows"].sum(0), "uniform": part["uniform"].sum(0)}


ENTROPY_BINS = register_kind(SummaryKind("entropy_bins", 1, _prepare, _reduce, totals=_totals, rows=_rows, rows_fields=("entropy",)))


@register("entropy_by_position", sources=MAP_SOURCES)
def entropy_by_position(store: Store, *, run) -> pd.DataFrame:
    """Per head and log-spaced bin of query positions: mean row entropy against the uniform row's log(keys seen).

    Columns: layer, head, bin, first_position, last_position (the bin's rows i: 2^bin - 1 .. 2^(bin+1) - 2),
    entropy (mean row entropy in nats over the bin's rows of every example), uniform_entropy (their mean log(i + 1) in
    a causal model, log(L) in an encoder: the largest entropy a row can have), rows (how many rows the bin holds).
    Bins no example reaches are left out.
    """
    info = store.run_info(run)
    sums = summary_totals(store, info, ENTROPY_BINS)
    rows = sums["rows"]
    frames = []
    for b in np.flatnonzero(rows):
        frames.append(
            pd.DataFrame(
                {
                    "layer": np.repeat(np.arange(info.n_layers), info.n_heads),
                    "head": np.tile(np.arange(info.n_heads), info.n_layers),
                    "bin": int(b),
                    "first_position": 2**b - 1,
                    "last_position": 2 ** (b + 1) - 2,
                    "entropy": (sums["entropy"][:, :, b] / rows[b]).ravel(),
                    "uniform_entropy": float(sums["uniform"][b] / rows[b]),
                    "rows": int(rows[b]),
                }
            )
        )
    columns = ["layer", "head", "bin", "first_position", "last_position", "entropy", "uniform_entropy", "rows"]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    return frame.sort_values(["layer", "head", "bin"], kind="stable").reset_index(drop=True)
