"""Head confidence and roles (Voita et al. 2019, "Analyzing Multi-Head Self-Attention"; the Primer, Sec. 5.1).

- confidence: the mean over query tokens of the head's largest attention weight, separator keys ([SEP]/eos-like,
  the paper's end-of-sentence symbol) left out of the maximum; pooled over the tokens of all examples, as the
  paper averages "over tokens in a set of sentences".
- positional: per relative offset k in -3..3, the share of query rows whose most-attended token (ties: the first)
  sits k tokens away, among the rows where offset k exists (row i with 0 <= i + k < length: the first row has no
  previous token, the last no next one); the paper calls a head positional when at least 90 % of rows point to one
  offset (in practice -1 or +1). Before version 2 of the kind every row counted, which capped a perfect previous-token
  head at (length - 1) / length.
- rare words: the share of query rows whose most-attended token is the example's rarest token (the non-special token
  whose id is least frequent in the run, ties to the first), against the uniform chance of hitting it.

Each example's counts are the `head_roles` summary kind, kept with the run (token frequencies are the run's, so the
kind's fingerprint includes the run's committed state, as every kind's does), and their sums per range of examples
(the kind's `totals`), which a whole-run query adds instead of every example's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import CAUSAL_NOTE, is_causal, per_head_frame, safe_divide, token_flags
from .engine import MAP_SOURCES, SummaryKind, register, register_kind, summary_totals

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

OFFSETS = tuple(range(-3, 4))
POSITIONAL_SHARE = 0.9  # the paper's "at least 90 % of the time"

FREQUENCIES_SQL = "SELECT token_id, COUNT(*) AS n FROM tokens WHERE run_id = :run GROUP BY token_id"


def _prepare(store: Store, info: RunInfo, examples=None):
    counts = store.sql(FREQUENCIES_SQL, {"run": int(info.id)})
    frequency = dict(zip(counts["token_id"].astype(int), counts["n"].astype(int)))
    table = store.token_table(info.id, examples)
    ids = {int(e): g["token_id"].to_numpy(np.int64) for e, g in table.groupby("example", sort=False)}
    return token_flags(store, info, examples=examples), ids, frequency


def rarest_token(ids: np.ndarray, special: np.ndarray, frequency: dict[int, int]) -> int:
    """Position of the non-special token whose id is least frequent in the run (the first of equals); -1 if none."""
    candidates = np.flatnonzero(~special)
    if not len(candidates):
        return -1
    counts = np.array([frequency.get(int(ids[k]), 0) for k in candidates])
    return int(candidates[np.argmin(counts)])


FLOAT16_INF = 0x7C00  # +inf's bits: every non-negative finite float16 is below it as an unsigned 16-bit integer


def confidence_and_best(maps: np.ndarray, sep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(layer, head): each query row's largest weight outside the separator keys, summed over the rows in float64 (0
    where every key is a separator); (layer, head, query): each row's argmax, the first of equals.

    float16 maps whose values are all non-negative and finite (attention weights) are compared as their bits, unsigned
    16-bit integers, which order as the values do, equals included: the same maxima and argmaxes without a float64
    copy of the example. Other maps (and float16 maps with a NaN, an infinity, a negative value or -0.0 anywhere) are
    compared in float64, by numpy's rules."""
    kept = ~np.asarray(sep, dtype=bool)
    if maps.dtype == np.float16:
        codes = maps.view(np.uint16)
        best = codes.argmax(-1)
        if np.take_along_axis(codes, best[..., None], -1).max(initial=0) < FLOAT16_INF:  # each row's largest code
            if not kept.any():
                return np.zeros(maps.shape[:2]), best
            top = codes.max(-1, where=kept, initial=0).view(np.float16)
            return top.astype(np.float64).sum(-1), best
    values = np.asarray(maps, dtype=np.float64)
    outside = values[..., kept] if kept.any() else np.zeros((*values.shape[:-1], 1))
    return outside.max(-1).sum(-1), values.argmax(-1)


def role_counts(maps: np.ndarray, sep: np.ndarray, rare: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One example's (layer, head) maps reduced: each row's largest weight outside the separator keys, summed over the
    rows in float64 (0 where every key is a separator); the rows whose argmax (the first of equals) lies k keys from
    the query, for each k of OFFSETS, (layer, head, offset); the rows whose argmax is the key `rare` (-1: none).
    (Compiled from d169872 until docs/PERFORMANCE.md, 2026-11-29 "two compiled reduces back to numpy": the C loop took
    the reduce 1.5-1.6x faster and the first whole-run query 1.0-1.1x.)"""
    confidence, best = confidence_and_best(maps, sep)
    offsets = best - np.arange(maps.shape[-1])
    counts = np.stack([(offsets == k).sum(-1, dtype=np.int64) for k in OFFSETS], axis=-1)  # (layer, head, offset)
    rare_hits = (best == rare).sum(-1, dtype=np.int64) if rare >= 0 else np.zeros(maps.shape[:2], np.int64)
    return confidence, counts, rare_hits


def offset_rows(length: int) -> np.ndarray:
    """Per offset of OFFSETS, the query rows of a `length`-token example where that offset is a token: length - |k|."""
    return np.maximum(length - np.abs(np.asarray(OFFSETS, dtype=np.int64)), 0)


def _reduce(context, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    flags, ids, frequency = context
    f = flags[example]
    length = maps.shape[-1]
    rare = rarest_token(ids[example], f.special, frequency)
    confidence, offset_counts, rare_hits = role_counts(maps, f.sep, rare)
    return {
        "confidence_sum": confidence,
        "offset_counts": offset_counts,
        "offset_rows": offset_rows(length),
        "rare_hits": rare_hits,
        "rows": np.asarray(length, dtype=np.int64),
        "rare_rows": np.asarray(length if rare >= 0 else 0, dtype=np.int64),
    }


def _totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A range's reduction, what `head_roles` adds: every count and sum over its examples, and `rare_examples` (those
    with a rarest token: each adds L x 1/L to the uniform chance)."""
    return {
        "confidence_sum": part["confidence_sum"].sum(0),
        "offset_counts": part["offset_counts"].sum(0),
        "offset_rows": part["offset_rows"].sum(0),
        "rare_hits": part["rare_hits"].sum(0),
        "rows": part["rows"].sum(dtype=np.int64),
        "rare_rows": part["rare_rows"].sum(dtype=np.int64),
        "rare_examples": np.asarray((part["rare_rows"] > 0).sum(), dtype=np.int64),
    }


# version 2: offset_rows, the positional share over the rows where each offset exists (version 1: over every row)
HEAD_ROLES = register_kind(SummaryKind("head_roles", 2, _prepare, _reduce, totals=_totals, threads=True))


@register("head_roles", sources=MAP_SOURCES)
def head_roles(store: Store, *, run) -> pd.DataFrame:
    """Head confidence and roles (Voita et al. 2019): confidence, positional offset, attention to the rarest token.

    Columns: layer, head; confidence (mean over query tokens of the largest weight, separator
    keys left out; [CLS] is kept, and on sink-heavy models it dominates); top_offset,
    offset_share (the relative offset -3..3 with the largest share of rows whose largest weight
    falls on it, among the rows where that offset is a token: not row 0 for -1, nor the last
    row for +1), positional (offset_share >= 0.9, the paper's rule); rare_share (share of rows
    whose largest weight is on the example's rarest token by the run's token frequencies, the
    leftmost of equally rare ones), rare_chance (that share under uniform attention, 1 / L
    averaged over rows). Pooled over every query token of the run (or `examples`).
    """
    info = store.run_info(run)
    # the whole run adds its kept range reductions (O(ranges)); a subset adds each part's
    totals = summary_totals(store, info, HEAD_ROLES)
    confidence, offsets, rare_hits = (totals[k].astype(np.float64) for k in ("confidence_sum", "offset_counts", "rare_hits"))
    rows, rare_rows, rare_chance = int(totals["rows"]), int(totals["rare_rows"]), float(totals["rare_examples"])
    share = safe_divide(offsets, totals["offset_rows"].astype(np.float64))  # NaN: an offset no row has (short inputs)
    top = np.where(np.isnan(share), -np.inf, share).argmax(-1)
    frame = per_head_frame(info, confidence=safe_divide(confidence, rows))
    frame["top_offset"] = np.asarray(OFFSETS)[top].ravel()
    frame["offset_share"] = np.take_along_axis(share, top[..., None], -1).ravel()
    frame["positional"] = frame["offset_share"] >= POSITIONAL_SHARE
    frame["rare_share"] = safe_divide(rare_hits, rare_rows).ravel()
    frame["rare_chance"] = float(safe_divide(rare_chance, rare_rows))
    if is_causal(store, info):
        frame.attrs["note"] = f"{CAUSAL_NOTE}: offsets above 0 never occur"
    return frame
