"""Heavy hitters: the few keys that take most of a head's attention (H2O, Zhang et al. 2023).

H2O keeps in the KV cache the keys with the largest accumulated attention. Per example and head, a key's score is its
column sum divided by the number of rows that see it (n - k in a causal model, so late keys are not penalised for
being seen by few rows; n in an encoder); the top `share` of keys by that score (ceil(share x n), ties to the earlier
key) are the heavy hitters. Per head: the share of the head's whole attention (n rows, each summing to 1) that falls on
its top 10 % and top 20 % of keys, averaged over the examples; and what the top 10 % are: how often the first token is
among them, and the share of them that are punctuation or function words (the words' UPOS; NaN where the run's words
have none).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.row_stats import ExampleRows
from .common import is_causal, per_head_frame, safe_divide
from .engine import MAP_SOURCES, SummaryKind, register, register_kind, summary_totals

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

SHARES = (0.1, 0.2)  # the top 10 % and 20 % of keys
FUNCTION_UPOS = ("ADP", "AUX", "CCONJ", "DET", "PART", "PRON", "SCONJ")
PUNCT, FUNCTION = 1, 2  # token classes (0: anything else, or no UPOS)


def _prepare(store: Store, info: RunInfo, examples=None):
    """Whether the model is causal, and per example each token's class (PUNCT, FUNCTION, 0) from its word's UPOS."""
    tokens = store.token_table(info.id, examples)[["example", "position", "word_position"]]
    words = store.word_table(info.id, examples)[["example", "position", "upos"]].rename(columns={"position": "word_position"})
    joined = tokens.merge(words, on=["example", "word_position"], how="left", sort=False)
    upos = joined["upos"].astype(object)
    classes = np.where(upos == "PUNCT", PUNCT, np.where(upos.isin(FUNCTION_UPOS), FUNCTION, 0))
    has_upos = bool(upos.notna().any())
    by_example = {int(k): classes[g.index.to_numpy()] for k, g in joined.groupby("example", sort=False)}
    return is_causal(store, info), by_example, has_upos


def _reduce(context, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    causal, _, _ = context
    n = maps.shape[-1]
    column = maps.astype(np.float64).sum(-2)  # (layer, head, key): the attention each key gets
    seen = (n - np.arange(n)) if causal else np.full(n, n)
    return _shares(context, example, column, column / seen)


def _rows(context, example: int, rows: ExampleRows) -> dict[str, np.ndarray]:
    """`_reduce` from a causal LM run's row statistics: each key's column over the n - k rows that see it, kept at
    ingest from the float32 rows (to 2^-22 relative: keys closer than that may rank otherwise than in the maps)."""
    score = rows.column()
    return _shares(context, example, score * (rows.n - np.arange(rows.n)), score)


def _shares(context, example: int, column: np.ndarray, score: np.ndarray) -> dict[str, np.ndarray]:
    """The fields from each key's column sum and score (layer, head, key)."""
    _, classes, _ = context
    n = column.shape[-1]
    order = np.argsort(-score, axis=-1, kind="stable")  # ties: the earlier key first
    out = {}
    for share in SHARES:
        top = order[..., : math.ceil(share * n)]
        out[f"mass_{round(share * 100)}"] = np.take_along_axis(column, top, -1).sum(-1) / n
    top10 = order[..., : math.ceil(SHARES[0] * n)]
    kinds = classes.get(int(example), np.zeros(n, np.int64))[top10]
    out["first"] = (top10 == 0).any(-1).astype(np.int64)
    out["punct"] = (kinds == PUNCT).sum(-1).astype(np.int64)
    out["function"] = (kinds == FUNCTION).sum(-1).astype(np.int64)
    out["top"] = np.asarray(top10.shape[-1], np.int64)
    return out


def _totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {name: part[name].sum(0) for name in ("mass_10", "mass_20", "first", "punct", "function")}
    out["top"] = np.asarray(part["top"].sum(), np.int64)
    out["examples"] = np.asarray(len(part["top"]), np.int64)
    return out


HEAVY = register_kind(
    SummaryKind("heavy_hitters", 1, _prepare, _reduce, totals=_totals, threads=True, rows=_rows, rows_fields=("column", "column_rest"))
)


@register("heavy_hitters", sources=MAP_SOURCES)
def heavy_hitters(store: Store, *, run) -> pd.DataFrame:
    """H2O (Zhang et al. 2023): per head, the share of attention on the top 10 % / 20 % of keys by accumulated score.

    A key's score is its column sum over the rows that see it (n - k causal, n bidirectional); the top keys are the
    ceil(10 % x n) (20 %) best, ties to the earlier key. Columns: layer, head; mass_top10, mass_top20 (the share of all
    the head's attention on them, averaged over the examples); first_in_top10 (the share of examples whose first token
    is among the top 10 %); top10_punct, top10_function (the share of all top-10 % keys whose word is punctuation, a
    function word: ADP AUX CCONJ DET PART PRON SCONJ; NaN where the run's words have no UPOS).
    """
    info = store.run_info(run)
    sums = summary_totals(store, info, HEAVY)
    examples, top = int(sums["examples"]), int(sums["top"])
    has_upos = _has_upos(store, info)
    nan = np.full((info.n_layers, info.n_heads), np.nan)
    return per_head_frame(
        info,
        mass_top10=safe_divide(sums["mass_10"], examples),
        mass_top20=safe_divide(sums["mass_20"], examples),
        first_in_top10=safe_divide(sums["first"], examples),
        top10_punct=safe_divide(sums["punct"], top) if has_upos else nan,
        top10_function=safe_divide(sums["function"], top) if has_upos else nan,
    )


def _has_upos(store: Store, info: RunInfo) -> bool:
    """Whether the run's words carry UPOS tags (a whitespace-annotated run's do not)."""
    words = store.word_table(info.id, [int(store.examples(info.id, texts=False)["example"].iloc[0])])
    return bool(words["upos"].notna().any())
