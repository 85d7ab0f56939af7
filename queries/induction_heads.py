"""Induction and duplicate-token heads, on a generated dataset of repeated random tokens.

Olsson et al. 2022 ("In-context Learning and Induction Heads") feed a first token, then T random tokens, then the same
T tokens again (`attnstore ingest --dataset generated/repeated_tokens:T20,50,200`, ingest/generated.py). In the second
copy, position i holds the token that stood at i - T: an induction head attends from i to i - T + 1 (the token that
came after it last time: Olsson et al.'s prefix-matching score), a duplicate-token head to i - T (the earlier copy of
itself), a previous-token head to i - 1. Per head, the mean attention on that key over the second copy's positions,
averaged over the examples of each T: the score falls as T grows, so it is reported per T.

Of TransformerLens' two head-detector metrics ("mul": the attention on the detection pattern over the attention of
the rows, "abs": one minus the mean absolute difference from the pattern), this is "mul" restricted to the second
copy's rows, where each row's total is 1: the mean attention on the expected key. It is Olsson et al.'s score, it does
not change with the attention the head puts elsewhere, and it does not reward a head for the zeros of the pattern.

The in-context loss gain (Olsson et al.'s "in-context learning score" for this input) is the mean next-token loss over
the first copy's tokens minus that over the second copy's, each without its first token (which nothing predicts), from
the run's per-token loss (`frame.attrs["loss_gain"]`, per T, in nats).

On a run that keeps per-row statistics (store/row_stats.py: a causal LM's, kept at ingest) the scores come from
them, a few numbers per row, instead of the maps: each row's attention on the latest earlier key holding its token
id and on the key after it, which in the second copy are i - T and i - T + 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.row_stats import ExampleRows
from .common import per_head_frame
from .engine import MAP_SOURCES, SummaryKind, register, register_kind, requested_examples, summary
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

# The runs these queries answer on: those over ingest/generated.py's repeated-token datasets (datasets.format).
DATASET = (
    "repeated_tokens",
    "ingest --dataset generated/repeated_tokens:T20,50,200 with a causal model (e.g. --model SmolLM2-135M-Instruct) and query that run",
)
OFFSETS = {"induction": 1, "duplicate": 0, "previous": None}  # the key of row i: i - T + offset (None: i - 1)


def repeated_layout(store: Store, info: RunInfo, examples=None) -> dict[int, tuple[int, int]]:
    """{example: (first, T)}: where each example's second copy starts and its T, checked on the stored token ids (the
    tokens after `first - T` are T ids, then the same T ids, then only special tokens). Runs over any other
    dataset are refused before (`run_query`, DATASET)."""
    lengths = sorted(info.dataset_options.get("lengths", []), reverse=True)
    layout = {}
    table = store.token_roles(info.id, examples)
    for example, rows in table.groupby("example", sort=False):
        ids = rows["token_id"].to_numpy()
        special = rows["is_special"].to_numpy().astype(bool)
        m = len(ids) - int(np.argmin(special[::-1])) if not special.all() else 0  # without the special tokens at the end
        for t in lengths:
            if m - 2 * t >= 1 and np.array_equal(ids[m - 2 * t : m - t], ids[m - t : m]):
                layout[int(example)] = (m - t, t)
                break
    return layout


def _prepare(store: Store, info: RunInfo, examples=None):
    return repeated_layout(store, info, examples)


def _reduce(layout, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    """Per (layer, head): the mean attention from the second copy's rows on each offset's key, and the example's T
    (0: not a repeated example, e.g. truncated)."""
    first, t = layout.get(int(example), (0, 0))
    out: dict[str, np.ndarray] = {"length": np.asarray(t, np.int64)}
    rows = np.arange(first, first + t)
    for name, offset in OFFSETS.items():
        if not t:
            out[name] = np.zeros(maps.shape[:2])
            continue
        keys = rows - 1 if offset is None else rows - t + offset
        out[name] = maps[..., rows, keys].astype(np.float64).mean(-1)
    return out


# The row statistic of each offset's key: ingest/generated.py draws no id twice in a copy, so a second-copy row's token
# last occurred T before it (store/row_stats.py `duplicate`, `induction`); distance bin 1 is the distance-1 key alone.
ROW_FIELDS = {"induction": "induction", "duplicate": "duplicate", "previous": "distance_1"}


def _rows(layout, example: int, rows: ExampleRows) -> dict[str, np.ndarray]:
    """`_reduce` from a run's row statistics (a causal LM's, kept at ingest): no map read."""
    first, t = layout.get(int(example), (0, 0))
    out: dict[str, np.ndarray] = {"length": np.asarray(t, np.int64)}
    for name, field in ROW_FIELDS.items():
        out[name] = rows.field(field)[..., first : first + t].mean(-1) if t else np.zeros(rows.stats.shape[1:3])
    return out


REPEATED = register_kind(
    SummaryKind(
        "repeated_tokens",
        1,
        _prepare,
        _reduce,
        threads=True,
        rows=_rows,
        rows_fields=tuple(ROW_FIELDS.values()),
        dataset=DATASET[0],
    )
)


def _scores(store: Store, info: RunInfo, name: str) -> tuple[pd.DataFrame, dict[int, int]]:
    """Per head, `name`'s mean over all repeated examples and over those of each T (columns `{name}_T{t}`)."""
    fields = summary(store, info, REPEATED)
    lengths = fields.get("length", np.zeros(0, np.int64))
    counted = {int(t): int((lengths == t).sum()) for t in sorted(set(lengths.tolist()) - {0})}
    if not counted:
        raise InvalidArgumentError(
            f"run {info.name!r} holds no complete repeated example (each was cut at --max-length, or none was stored): "
            "ingest the generated dataset with T small enough for the model"
        )
    values = fields[name]
    columns = {name: values[lengths > 0].mean(0)}
    columns.update({f"{name}_T{t}": values[lengths == t].mean(0) for t in counted})
    return per_head_frame(info, **columns), counted


def _loss_gain(store: Store, info: RunInfo, layout: dict[int, tuple[int, int]]) -> dict[int, float]:
    """Per T: mean next-token loss over the first copy's tokens minus over the second copy's, each without its first."""
    if not info.has_token_loss:
        return {}
    gains: dict[int, list[float]] = {}
    for example, loss in store.iter_token_loss(info.id, sorted(layout)):
        first, t = layout[example]
        # loss[j] is the loss of predicting token j + 1: the copies' tokens first-t+1 .. first-1 and first+1 .. first+t-1
        before, after = loss[first - t : first - 1], loss[first : first + t - 1]
        gains.setdefault(t, []).append(float(before.mean() - after.mean()))
    return {t: float(np.mean(v)) for t, v in sorted(gains.items())}


def _finish(store: Store, info: RunInfo, frame: pd.DataFrame, counted: dict[int, int]) -> pd.DataFrame:
    frame.attrs["examples_per_length"] = counted
    frame.attrs["loss_gain"] = _loss_gain(store, info, repeated_layout(store, info, requested_examples(info.id)))
    frame.attrs["dataset_options"] = info.dataset_options
    return frame


@register("induction_heads", sources=MAP_SOURCES, dataset=DATASET)
def induction_heads(store: Store, *, run) -> pd.DataFrame:
    """Olsson et al. 2022: per head, the mean attention from each second-copy token to the one after its first copy.

    Columns: layer, head, induction (the mean over the second copy's positions i of A[i, i - T + 1], averaged over the
    run's repeated examples), induction_T<t> (the same over the examples of each T). frame.attrs: examples_per_length,
    loss_gain ({T: mean loss on the first copy minus the second, nats}; empty without per-token loss), dataset_options
    (seed, lengths, first token, candidate tokens). Needs a run over `generated/repeated_tokens`.
    """
    info = store.run_info(run)
    frame, counted = _scores(store, info, "induction")
    return _finish(store, info, frame, counted)


@register("duplicate_token_heads", sources=MAP_SOURCES, dataset=DATASET)
def duplicate_token_heads(store: Store, *, run) -> pd.DataFrame:
    """Per head, the mean attention from each second-copy token to its own first copy (i to i - T).

    Columns: layer, head, duplicate (averaged over the run's repeated examples), duplicate_T<t> (over those of each
    T), previous (the mean attention on i - 1 over the same rows, for comparison with previous_token_heads on real
    text). frame.attrs as induction_heads'. Needs a run over `generated/repeated_tokens`.
    """
    info = store.run_info(run)
    frame, counted = _scores(store, info, "duplicate")
    previous, _ = _scores(store, info, "previous")
    frame["previous"] = previous["previous"].to_numpy()
    return _finish(store, info, frame, counted)
