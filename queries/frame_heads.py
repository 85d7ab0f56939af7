"""K2 (Kovaleva et al. 2019, Sec. 4.2, Fig. 3): heads that link a frame's lexical unit to its core elements.

On a run over FrameNet exemplars (`framenet/1.5:exemplars`), the annotation sets the authors'
notebook (visualize_attention.ipynb) keeps, by default: a sentence of at most `max_words`
words, a one-word target (the lexical unit, LU), every frame element at most `max_fe_words`
words, no word of any frame element within `min_distance - 1` words of the target, and a core
frame element among the frame's FEcoreSets. Per head, the paper's statistic: the largest
attention weight between a token of the LU and a token of a core FE, in either direction;
averaged over the kept sentences.

Per overt frame element of every annotation set, that largest weight between the LU's tokens
and the FE's tokens (per head), with what the filters need (the sentence's word count, LU and
FE word spans, core type and core-set membership), is kept with the run (`LU_FE_MAX`,
queries/engine/) by one pass the first time; later calls apply the filters and take the
largest over each set's core FEs from it, without decoding a map, with the same values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import per_head_frame
from .engine import MAP_SOURCES, SummaryKind, register, register_kind, stored_only, summary_parts
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..store import Store

CORE = ("type", "set")
DISTANCE_TO = ("all", "core")


@dataclass(frozen=True)
class FrameFilters:
    """Which annotation sets count. The defaults are the authors' notebook's selection; the project's earlier one was
    core="type", min_distance=2, distance_to="core", one_word_target=False."""

    max_words: int = 12  # words of the sentence (FrameNet's whitespace tokens)
    max_fe_words: int = 3  # words of every frame element of the set
    min_distance: int = 3  # words between the target and ...
    distance_to: str = "all"  # ... every frame element ("all", the notebook) or every core one ("core")
    core: str = "set"  # core FEs: in the frame's FEcoreSets ("set", the notebook) or of coreType Core ("type")
    one_word_target: bool = True  # the target is one word (the notebook: a one-token, one-span target)

    def check(self) -> None:
        if self.core not in CORE:
            raise InvalidArgumentError(
                f"core must be 'set' (in a frame's FEcoreSets) or 'type' (FrameNet coreType Core), not {self.core!r}"
            )
        if self.distance_to not in DISTANCE_TO:
            raise InvalidArgumentError(
                f"distance_to must be 'all' (every frame element, the authors' notebook) or 'core' (the core ones), "
                f"not {self.distance_to!r}"
            )

    def describe(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in vars(self).items())


FRAMES_SQL = """
SELECT e.position AS example, f.id AS frame_row_id, f.target_start, f.target_end,
       fe.id AS fe_id, fe.core_type, fe.in_core_set, fe.word_start, fe.word_end
FROM frames f
JOIN examples e ON e.id = f.example_id
LEFT JOIN frame_elements fe ON fe.frame_row_id = f.id
WHERE e.dataset_id = :dataset
ORDER BY e.position, f.id, fe.id
"""
HAS_FRAMES_SQL = "SELECT 1 FROM frames f JOIN examples e ON e.id = f.example_id WHERE e.dataset_id = :dataset LIMIT 1"


def span_distance(a: tuple[int, int], b: tuple[int, int]) -> int:
    """Words between two [start, end) word spans, counted as |i - j| of their closest words (0 if they overlap)."""
    if a[0] < b[1] and b[0] < a[1]:
        return 0
    return b[0] - (a[1] - 1) if b[0] >= a[1] else a[0] - (b[1] - 1)


def _int(value) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def annotation_sets(rows: pd.DataFrame):
    """(example, LU word span or None, [(FE start, end, core_type, in_core_set)] of overt FEs) per frame row."""
    records = zip(
        rows["example"],
        rows["frame_row_id"],
        rows["target_start"],
        rows["target_end"],
        rows["fe_id"],
        rows["core_type"],
        rows["in_core_set"],
        rows["word_start"],
        rows["word_end"],
    )
    current = None
    out: tuple[int, tuple[int | None, int | None] | None, list[tuple[int, int, str, bool]]] | None = None
    fes: list[tuple[int, int, str, bool]] = []
    for example, frame_row, t_start, t_end, fe_id, core_type, in_set, w_start, w_end in records:
        if frame_row != current:
            if out is not None:
                yield out
            current = frame_row
            lu = (_int(t_start), _int(t_end))
            fes = []
            out = (int(example), None if None in lu else lu, fes)
        start, end = _int(w_start), _int(w_end)
        if _int(fe_id) is not None and start is not None and end is not None:
            fes.append((start, end, core_type, bool(in_set)))
    if out is not None:
        yield out


def check_frames(store: Store, info, filters: FrameFilters) -> None:
    """Refuse unknown filter values, and a run whose dataset has no FrameNet frames."""
    filters.check()
    if store.sql(HAS_FRAMES_SQL, {"dataset": info.dataset_id}).empty:
        raise InvalidArgumentError(
            f"run {info.name!r} (dataset {info.dataset}:{info.split}) has no FrameNet frames; "
            "frame_heads needs a run over framenet/1.5:exemplars"
        )


# counts after each filter; `target`: the set has a target (one word, where asked)
FILTER_STEPS = ("annotation_sets", "max_words", "target", "max_fe_words", "has_core", "min_distance")


# ---------------------------------------------------------------- LU <-> frame element maxima kept with the run
# Per example: its number of words (`n_words`). Per annotation set (frame row, in id order): the LU's word span
# (`lu`, -1 -1 where it has none). Per overt frame element (in id order, grouped by set): its set's index in the
# example, its word span, whether its coreType is Core and whether it is in the frame's FEcoreSets (`fe`), and per
# (layer, head) the largest weight between a token of the LU and a token of the FE, either direction (`fe_max`,
# the stored value itself; -1 where the LU or the FE has no token). The largest weight between the LU and a set
# of core FEs is the largest of their `fe_max`, so every filter and either `core` is applied at query time.


def _lu_fe_max_prepare(store: Store, info, examples=None):
    rows = store.sql(FRAMES_SQL, {"dataset": info.dataset_id})
    if examples is not None:
        rows = rows[rows["example"].isin([int(e) for e in examples])]
    sets: dict[int, list] = {}
    for example, lu, elements in annotation_sets(rows):
        sets.setdefault(example, []).append((lu, elements))
    table = store.token_table(info.id, examples)[["example", "word_position"]]
    tokens = {int(k): g["word_position"].to_numpy(dtype=float) for k, g in table.groupby("example")}
    n_words = store.word_counts(info.id)
    return sets, tokens, n_words, (info.n_layers, info.n_heads)


def _lu_fe_max_reduce(context, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    sets, tokens, n_words, shape = context
    words = tokens.get(example, np.zeros(0))
    lus: list[tuple[int, int]] = []
    fes: list[tuple[int, int, int, bool, bool]] = []
    maxima: list[np.ndarray] = []
    for index, (lu, elements) in enumerate(sets.get(example, ())):
        lus.append(lu if lu is not None else (-1, -1))
        lu_tok = np.flatnonzero((words >= lu[0]) & (words < lu[1])) if lu is not None else np.zeros(0, dtype=np.intp)
        for start, end, core_type, in_set in elements:
            fes.append((index, start, end, core_type == "Core", in_set))
            fe_tok = np.flatnonzero((words >= start) & (words < end))
            if len(lu_tok) and len(fe_tok):  # over this FE's tokens only
                one_way = maps[:, :, lu_tok][:, :, :, fe_tok].max(axis=(-2, -1))
                other_way = maps[:, :, fe_tok][:, :, :, lu_tok].max(axis=(-2, -1))
                maxima.append(np.maximum(one_way, other_way))
            else:
                maxima.append(np.full(shape, -1.0))
    return {
        "n_words": np.asarray(int(n_words.get(example, 0)), dtype=np.int32),
        "lu": np.asarray(lus, dtype=np.int32).reshape(-1, 2),
        "fe": np.asarray(fes, dtype=np.int32).reshape(-1, 5),
        "fe_max": np.asarray(maxima, dtype=np.float32).reshape(-1, *shape),  # float16 and float32 values exactly
    }


LU_FE_MAX = register_kind(SummaryKind("lu_fe_max", 1, _lu_fe_max_prepare, _lu_fe_max_reduce, ragged=("lu", "fe", "fe_max"), threads=True))


def _any_per_set(fe_set: np.ndarray, mask: np.ndarray, n_sets: int) -> np.ndarray:
    return np.bincount(fe_set[mask], minlength=n_sets) > 0


def _kept_scores(arrays: dict[str, np.ndarray], total: np.ndarray, filters: FrameFilters) -> tuple[int, dict]:
    """The sum of the kept sets' per-head maxima (the largest over each set's core FEs), added to `total`, from one
    part of the summary; returns (sets added, counts after each filter)."""
    if "lu" not in arrays:  # no example summarised
        return 0, dict.fromkeys(FILTER_STEPS, 0)
    lu, fe = arrays["lu"], arrays["fe"]
    n_sets = len(lu)
    set_example = np.repeat(np.arange(len(arrays["example"])), np.diff(arrays["lu_start"]))
    fe_set = np.repeat(arrays["lu_start"][:-1], np.diff(arrays["fe_start"])) + fe[:, 0]  # each FE's set, numbered in the run
    start, end = fe[:, 1], fe[:, 2]
    counts = dict(annotation_sets=n_sets)
    keep = arrays["n_words"][set_example] <= filters.max_words
    counts["max_words"] = int(keep.sum())
    keep &= lu[:, 0] >= 0
    if filters.one_word_target:
        keep &= lu[:, 1] - lu[:, 0] == 1
    counts["target"] = int(keep.sum())
    keep &= ~_any_per_set(fe_set, end - start > filters.max_fe_words, n_sets)
    counts["max_fe_words"] = int(keep.sum())
    is_core = fe[:, 3 if filters.core == "type" else 4].astype(bool)
    keep &= _any_per_set(fe_set, is_core, n_sets)
    counts["has_core"] = int(keep.sum())
    lu_start, lu_end = lu[fe_set, 0], lu[fe_set, 1]
    overlap = (lu_start < end) & (start < lu_end)
    distance = np.where(overlap, 0, np.where(start >= lu_end, start - (lu_end - 1), lu_start - (end - 1)))  # span_distance
    near = distance < filters.min_distance
    keep &= ~_any_per_set(fe_set, near if filters.distance_to == "all" else is_core & near, n_sets)
    counts["min_distance"] = int(keep.sum())
    rows = np.flatnonzero(is_core & keep[fe_set])  # the core FEs of the kept sets, set by set in storage order
    if not len(rows):
        return 0, counts
    first = np.r_[0, np.flatnonzero(np.diff(fe_set[rows])) + 1]
    values = np.maximum.reduceat(arrays["fe_max"][rows], first, axis=0)  # per kept set: the largest over its core FEs
    values = values[values[:, 0, 0] >= 0].astype(np.float64)  # -1: the LU or every core FE has no token
    for value in values:  # one set at a time, in storage order
        total += value
    return len(values), counts


def frame_head_scores(store: Store, run, filters: FrameFilters | None = None):
    filters = filters or FrameFilters()
    info = store.run_info(run)
    check_frames(store, info, filters)
    # asked-for examples that are not stored are left out
    chosen = stored_only(store, info)
    total, n, counts = np.zeros((info.n_layers, info.n_heads)), 0, dict.fromkeys(FILTER_STEPS, 0)
    for part in summary_parts(store, info, LU_FE_MAX, chosen):  # one part of the summary at a time
        added, part_counts = _kept_scores(part, total, filters)
        n += added
        counts = {step: counts[step] + part_counts[step] for step in FILTER_STEPS}
    counts["with_tokens"] = n
    if n == 0:
        steps = ", ".join(f"{k}: {v}" for k, v in counts.items())
        raise InvalidArgumentError(
            f"no FrameNet sentence of run {info.name!r} passes the filters ({filters.describe()}); "
            f"annotation sets left after each step: {steps}"
        )
    return info, total / n, n, counts


@register("frame_heads", sources=MAP_SOURCES)
def frame_heads(
    store: Store,
    *,
    run,
    max_words: int = 12,
    max_fe_words: int = 3,
    min_distance: int = 3,
    distance_to: str = "all",
    core: str = "set",
    one_word_target: bool = True,
    percentile: float = 99.0,
) -> pd.DataFrame:
    """Kovaleva K2: per head, mean over FrameNet sentences of the max attention between the LU and its core frame elements.

    Columns: layer, head, value (mean over kept sentences of the largest weight a[i, j]
    with i, j a token of the lexical unit and a token of a core frame element, either
    direction), n_sentences, top (value above the `percentile`-th percentile of all heads).
    Filters (in words, FrameNet's tokens; defaults: the authors' notebook): sentence <= max_words;
    a target (LU), of one word with one_word_target; every frame element <= max_fe_words; at
    least one core FE; no frame element (distance_to='all') or no core FE (distance_to='core')
    closer than min_distance words to the LU (3: none within 2 words). core='set': FEs in the
    frame's FEcoreSets; core='type': FEs with FrameNet coreType Core. The project's earlier
    selection: core='type', min_distance=2, distance_to='core', one_word_target=false.
    The count left after each filter is in frame.attrs["filter_counts"].
    """
    if not 0 <= percentile <= 100:
        raise InvalidArgumentError(f"percentile must be between 0 and 100, not {percentile!r}")
    filters = FrameFilters(max_words, max_fe_words, min_distance, distance_to, core, one_word_target)
    info, value, n, counts = frame_head_scores(store, run, filters)
    frame = per_head_frame(info, value=value)
    frame["n_sentences"] = n
    frame["top"] = frame["value"] > np.nanpercentile(frame["value"], percentile)
    frame.attrs["filter_counts"] = counts
    return frame


@register("frame_heads_top", per_head=False, sources=MAP_SOURCES)
def frame_heads_top(
    store: Store,
    *,
    run,
    max_words: int = 12,
    max_fe_words: int = 3,
    min_distance: int = 3,
    distance_to: str = "all",
    core: str = "set",
    one_word_target: bool = True,
    percentile: float = 99.0,
) -> pd.DataFrame:
    """Kovaleva K2: the heads of `frame_heads` above the given percentile of all heads (paper: 99th), best first.

    Columns: layer, head, value, n_sentences, threshold (the percentile's value).
    Filters as in `frame_heads` (defaults: the authors' notebook's selection).
    """
    frame = frame_heads(
        store,
        run=run,
        max_words=max_words,
        max_fe_words=max_fe_words,
        min_distance=min_distance,
        distance_to=distance_to,
        core=core,
        one_word_target=one_word_target,
        percentile=percentile,
    )
    threshold = float(np.nanpercentile(frame["value"], percentile))
    top = frame[frame["top"]].drop(columns="top").sort_values("value", ascending=False).reset_index(drop=True)
    top["threshold"] = threshold
    top.attrs.update(frame.attrs)
    return top
