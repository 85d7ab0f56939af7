"""K2 (Kovaleva et al. 2019, Sec. 4.2, Fig. 3): heads that link a frame's lexical unit to its core elements.

On a run over FrameNet exemplars (`framenet/1.5:exemplars`): keep the annotation sets whose
sentence has at most `max_words` words, whose frame elements all span at most
`max_fe_words` words, and whose every core frame element lies at least `min_distance` words
from the lexical unit (LU); per head, take the largest attention weight between a token of
the LU and a token of a core FE, in either direction; average over the kept sentences.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import iter_maps, per_head_frame
from .errors import InvalidArgumentError
from .registry import register

if TYPE_CHECKING:
    from ..store import Store

CORE = ("type", "set")

FRAMES_SQL = """
SELECT e.position AS example, f.id AS frame_row_id, f.target_start, f.target_end,
       fe.id AS fe_id, fe.core_type, fe.in_core_set, fe.word_start, fe.word_end
FROM frames f
JOIN examples e ON e.id = f.example_id
LEFT JOIN frame_elements fe ON fe.frame_row_id = f.id
WHERE e.dataset_id = :dataset
ORDER BY e.position, f.id, fe.id
"""


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


def select_sentences(
    store: Store, info, examples=None, max_words: int = 12, max_fe_words: int = 3, min_distance: int = 2, core: str = "type"
) -> tuple[dict[int, list[tuple[tuple[int, int], list[tuple[int, int]]]]], dict]:
    """Annotation sets that pass the filters, per example: [(LU span, [core FE spans])], and the count after each filter."""
    if core not in CORE:
        raise InvalidArgumentError(f"core must be 'type' (FrameNet coreType Core) or 'set' (in a frame's FEcoreSets), not {core!r}")
    rows = store.sql(FRAMES_SQL, {"dataset": info.dataset_id})
    if rows.empty:
        raise InvalidArgumentError(
            f"run {info.name!r} (dataset {info.dataset}:{info.split}) has no FrameNet frames; "
            "frame_heads needs a run over framenet/1.5:exemplars"
        )
    stored = store.examples(info.id)
    stored = set(stored.loc[~stored["skipped"], "example"].astype(int))
    if examples is not None:
        stored &= {int(e) for e in examples}
    n_words = store.word_table(info.id).groupby("example").size().to_dict()
    counts = dict(annotation_sets=0, max_words=0, max_fe_words=0, has_core=0, min_distance=0)
    kept: dict[int, list] = {}
    for example, lu, elements in annotation_sets(rows):
        if example not in stored:
            continue
        counts["annotation_sets"] += 1
        if int(n_words.get(example, 0)) > max_words:
            continue
        counts["max_words"] += 1
        if lu is None:
            continue
        if any(end - start > max_fe_words for start, end, _, _ in elements):
            continue
        counts["max_fe_words"] += 1
        core_spans = [(start, end) for start, end, core_type, in_set in elements if (core_type == "Core" if core == "type" else in_set)]
        if not core_spans:
            continue
        counts["has_core"] += 1
        if any(span_distance(lu, span) < min_distance for span in core_spans):
            continue
        counts["min_distance"] += 1
        kept.setdefault(example, []).append((lu, core_spans))
    return kept, counts


def frame_head_scores(
    store: Store, run, examples=None, max_words: int = 12, max_fe_words: int = 3, min_distance: int = 2, core: str = "type"
):
    info = store.run_info(run)
    kept, counts = select_sentences(store, info, examples, max_words, max_fe_words, min_distance, core)
    tokens = {int(k): g["word_position"].to_numpy(dtype=float) for k, g in store.token_table(info.id).groupby("example")}
    total = np.zeros((info.n_layers, info.n_heads))
    n = 0
    for example, maps in iter_maps(store, info, sorted(kept) if kept else []):
        words = tokens[example]
        for lu, core_spans in kept[example]:
            lu_tok = np.flatnonzero((words >= lu[0]) & (words < lu[1]))
            fe_tok = np.flatnonzero(np.any([(words >= s) & (words < e) for s, e in core_spans], axis=0))
            if not len(lu_tok) or not len(fe_tok):
                continue
            one_way = maps[:, :, lu_tok][:, :, :, fe_tok].max(axis=(-2, -1))
            other_way = maps[:, :, fe_tok][:, :, :, lu_tok].max(axis=(-2, -1))
            total += np.maximum(one_way, other_way).astype(np.float64)
            n += 1
    counts["with_tokens"] = n
    if n == 0:
        steps = ", ".join(f"{k}: {v}" for k, v in counts.items())
        raise InvalidArgumentError(
            f"no FrameNet sentence of run {info.name!r} passes the filters (max_words={max_words}, "
            f"max_fe_words={max_fe_words}, min_distance={min_distance}, core={core!r}); "
            f"annotation sets left after each step: {steps}"
        )
    return info, total / n, n, counts


@register("frame_heads")
def frame_heads(
    store: Store,
    *,
    run,
    examples=None,
    max_words: int = 12,
    max_fe_words: int = 3,
    min_distance: int = 2,
    core: str = "type",
    percentile: float = 99.0,
) -> pd.DataFrame:
    """Kovaleva K2: per head, mean over FrameNet sentences of the max attention between the LU and its core frame elements.

    Columns: layer, head, value (mean over kept sentences of the largest weight a[i, j]
    with i, j a token of the lexical unit and a token of a core frame element, either
    direction), n_sentences, top (value above the `percentile`-th percentile of all heads).
    Filters (in words, FrameNet's tokens): sentence <= max_words, every frame element
    <= max_fe_words, at least one core FE and every core FE >= min_distance words from the LU.
    core='type': FEs with FrameNet coreType Core; core='set': FEs in the frame's FEcoreSets.
    The count left after each filter is in frame.attrs["filter_counts"].
    """
    if not 0 <= percentile <= 100:
        raise InvalidArgumentError(f"percentile must be between 0 and 100, not {percentile!r}")
    info, value, n, counts = frame_head_scores(store, run, examples, max_words, max_fe_words, min_distance, core)
    frame = per_head_frame(info, value=value)
    frame["n_sentences"] = n
    frame["top"] = frame["value"] > np.nanpercentile(frame["value"], percentile)
    frame.attrs["filter_counts"] = counts
    return frame


@register("frame_heads_top", per_head=False)
def frame_heads_top(
    store: Store,
    *,
    run,
    examples=None,
    max_words: int = 12,
    max_fe_words: int = 3,
    min_distance: int = 2,
    core: str = "type",
    percentile: float = 99.0,
) -> pd.DataFrame:
    """Kovaleva K2: the heads of `frame_heads` above the given percentile of all heads (paper: 99th), best first.

    Columns: layer, head, value, n_sentences, threshold (the percentile's value).
    """
    frame = frame_heads(
        store,
        run=run,
        examples=examples,
        max_words=max_words,
        max_fe_words=max_fe_words,
        min_distance=min_distance,
        core=core,
        percentile=percentile,
    )
    threshold = float(np.nanpercentile(frame["value"], percentile))
    top = frame[frame["top"]].drop(columns="top").sort_values("value", ascending=False).reset_index(drop=True)
    top["threshold"] = threshold
    top.attrs.update(frame.attrs)
    return top
