"""Attention sinks: how much attention each head puts on the first tokens of its input.

Xiao et al. 2023 (StreamingLLM) found decoders put a large share of every row's attention on the first token,
whatever it is; Gu et al. 2024 ("When Attention Sink Emerges in Language Models") measure it as Sink_1^eps. Per head
this query gives:

- `position_p` for p = 0..3: the attention on position p averaged over the rows that see it (rows i >= p in a causal
  model, every row in an encoder), then over the examples that have position p;
- Gu et al.'s importance of the first token on the example's first `window` tokens (T = 64): the mean over the T
  queries of A[q, 0], averaged over the examples that have T tokens (`importance`), and the share of those examples in
  which it exceeds `epsilon` = 0.3 (`sink_share`).

As the authors' code computes it (sail-sg/Attention-Sink, eval_sink_open_source.py, read): every prompt is cut to its
first T tokens, the importance of key k is the sum over queries of A[q, k] / (T - k), and the metric is the percentage
of (example, layer, head) whose importance of the first token exceeds eps; `frame.attrs["sink_percentage"]` holds it.
In a causal model the first T rows of a longer example are exactly the maps of its T-token prefix, so the windows come
from the stored maps. Examples shorter than T are left out of it (counted in `frame.attrs["short_examples"]`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.row_stats import FIRST, ExampleRows
from .common import CAUSAL_NOTE, is_causal, per_head_frame, safe_divide
from .engine import MAP_SOURCES, SummaryKind, register, register_kind, summary_totals

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

POSITIONS = 4  # position_0 .. position_3
WINDOW = 64  # Gu et al.'s T
EPSILON = 0.3  # Gu et al.'s eps


def _prepare(store: Store, info: RunInfo, examples=None, window: int = WINDOW, epsilon: float = EPSILON):
    return is_causal(store, info), int(window), float(epsilon), info.sink_logits


def _reduce(context, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    """Per (layer, head): the mean attention on each of the first positions over the rows that see it, and on the
    first `window` tokens the first token's importance and whether it passes epsilon; with learned sink logits, the
    mean over the rows of the mass on the sink, 1 - the row's sum (0 otherwise, where no row is summed)."""
    causal, window, epsilon, sink_logits = context
    n = maps.shape[-1]
    out: dict[str, np.ndarray] = {}
    if sink_logits:
        out["learned_sink"] = 1.0 - maps.sum(-1, dtype=np.float64).mean(-1)
    else:
        out["learned_sink"] = np.zeros(maps.shape[:2])
    for p in range(POSITIONS):
        if p < n:
            column = maps[..., p:, p] if causal else maps[..., :, p]
            out[f"position_{p}"] = column.astype(np.float64).mean(-1)
        else:
            out[f"position_{p}"] = np.zeros(maps.shape[:2])
        out[f"has_{p}"] = np.asarray(int(p < n), np.int64)
    if n >= window:
        importance = maps[..., :window, 0].astype(np.float64).sum(-1) / window  # key 0: seen by all T queries
        out["importance"] = importance
        out["sink"] = (importance > epsilon).astype(np.int64)
    else:
        out["importance"] = np.zeros(maps.shape[:2])
        out["sink"] = np.zeros(maps.shape[:2], np.int64)
    out["windowed"] = np.asarray(int(n >= window), np.int64)
    return out


def _rows(context, example: int, rows: ExampleRows) -> dict[str, np.ndarray]:
    """`_reduce`'s fields from a causal LM run's row statistics: the first positions' columns and the rows' sums."""
    _, window, epsilon, sink_logits = context
    n = rows.n
    first = rows.fields(FIRST)  # (layer, head, row, position)
    shape = first.shape[:2]
    out: dict[str, np.ndarray] = {"learned_sink": rows.field("learned_sink").mean(-1) if sink_logits else np.zeros(shape)}
    for p in range(POSITIONS):
        out[f"position_{p}"] = first[..., p:, p].mean(-1) if p < n else np.zeros(shape)
        out[f"has_{p}"] = np.asarray(int(p < n), np.int64)
    windowed = n >= window
    importance = first[..., :window, 0].sum(-1) / window if windowed else np.zeros(shape)
    out["importance"] = importance
    out["sink"] = (importance > epsilon).astype(np.int64) if windowed else np.zeros(shape, np.int64)
    out["windowed"] = np.asarray(int(windowed), np.int64)
    return out


def _totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Sums over a range's examples: each position's mean and the examples that have it, the first token's importance
    and its sinks over the windowed examples, the windowed and all examples."""
    out = {f"position_{p}": part[f"position_{p}"].sum(0) for p in range(POSITIONS)}
    out.update({f"has_{p}": np.asarray(part[f"has_{p}"].sum(), np.int64) for p in range(POSITIONS)})
    out["importance"] = part["importance"].sum(0)
    out["learned_sink"] = part["learned_sink"].sum(0)
    out["sink"] = part["sink"].sum(0)
    out["windowed"] = np.asarray(part["windowed"].sum(), np.int64)
    out["examples"] = np.asarray(len(part["windowed"]), np.int64)
    return out


SINKS = register_kind(
    SummaryKind(
        "attention_sink",
        2,
        _prepare,
        _reduce,
        defaults={"window": WINDOW, "epsilon": EPSILON},
        totals=_totals,
        threads=True,
        rows=_rows,
        rows_fields=("first", "learned_sink"),
    )
)


@register("attention_sink", sources=MAP_SOURCES)
def attention_sink(store: Store, *, run, window: int = WINDOW, epsilon: float = EPSILON) -> pd.DataFrame:
    """Xiao et al. 2023, Gu et al. 2024: per head, the attention on the first 4 positions and the first token's sink score.

    Columns: layer, head;
    position_0 .. position_3: attention on that position, averaged over the rows that see it (rows at or after it in
      a causal model, all rows in an encoder), then over the examples that have the position;
    importance: Gu et al.'s importance of the first token on each example's first `window` tokens, the mean over the
      `window` queries of their attention on it, averaged over the examples with at least `window` tokens;
    sink_share: the share of those examples in which the importance exceeds `epsilon`;
    learned_sink (models with learned sink logits, gpt-oss; NaN for others): the mass each row puts on the sink logit,
      1 - the row's sum over the tokens, averaged over the rows, then over the examples.
    frame.attrs: sink_percentage (Gu et al.'s Sink_1^epsilon: the percentage of (example, layer, head) over the
    windowed examples whose importance exceeds epsilon), window, epsilon, windowed_examples, short_examples (fewer
    tokens than `window`: left out of the three).
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(f"window={window!r}: give a positive number of tokens (Gu et al.: 64)")
    info = store.run_info(run)
    sums = summary_totals(store, info, SINKS, window=window, epsilon=epsilon)
    columns = {f"position_{p}": safe_divide(sums[f"position_{p}"], int(sums[f"has_{p}"])) for p in range(POSITIONS)}
    windowed = int(sums["windowed"])
    columns["importance"] = safe_divide(sums["importance"], windowed)
    columns["sink_share"] = safe_divide(sums["sink"], windowed)
    learned = safe_divide(sums["learned_sink"], int(sums["examples"]))
    columns["learned_sink"] = learned if info.sink_logits else np.full_like(learned, np.nan)
    frame = per_head_frame(info, **columns)
    cells = windowed * info.n_layers * info.n_heads
    frame.attrs.update(
        sink_percentage=float(100 * sums["sink"].sum() / cells) if cells else float("nan"),
        window=window,
        epsilon=epsilon,
        windowed_examples=windowed,
        short_examples=int(sums["examples"]) - windowed,
    )
    if is_causal(store, info):
        frame.attrs["note"] = CAUSAL_NOTE
    return frame
