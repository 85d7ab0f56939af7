"""K1 (Kovaleva et al. 2019, Sec 4.1, Fig 1-2): attention-pattern classes of single maps, by transparent rules.

Longer than ~500 lines on purpose: the rules, their kind and the three queries over it are one definition, read
and changed together (the metrics and the CNN are modules of their own).

Every (example, layer, head) map gets one of five classes from scores, each a mean over the
map's L query rows (a[i, j]: attention of query i to key j; rows sum to 1). Raw scores:

- ``vertical``: mass on the special tokens' columns, mean_i sum_{j special} a[i, j].
  Special tokens are the tokenizer's special ids recorded with the model ([CLS]-, [SEP]-like),
  never strings. The paper: "mainly corresponds to attention to special BERT tokens".
- ``stripe``: the largest column mass on one ordinary (non-special) token, max_j mean_i a[i, j]:
  a stripe on an ordinary token is vertical too.
- ``diagonal``: mass on the two neighbouring keys, mean_i (a[i, i-1] + a[i, i+1]) (a missing
  neighbour counts 0). The main diagonal a[i, i] is **not** counted: the paper defines the class
  as "formed by the attention to the previous/following tokens", and at the resolution of its
  Fig 1 a line at offset 0 and one at offset 1 look the same, so the picture cannot decide. The
  hand labels did: the six sharp diagonal lines among them are previous/next-token lines (score
  >= 0.96, self <= 0.04), no labelled map has more than 0.17 of its mass on the main diagonal, and
  counting it (or widening to |i-j| <= 2 or 3) lowered the cross-validated macro-F1 on the
  training part (0.61 or less against 0.65). The self score is reported (column ``self``), not used.
- ``block``: for inputs with two segments only (two segment ids among the non-special tokens),
  the share of a query's attention to non-special keys that stays in its own segment,
  mean over non-special queries of sum_{j own segment} a[i, j] / sum_{j non-special} a[i, j]
  (0 for a query with no attention on non-special keys). NaN for one-segment inputs.

Raw scores depend on the length: a perfectly uniform map has vertical 2/L (two special tokens)
and diagonal 2(L-1)/L^2, so at L = 6 it passed the old fixed thresholds as vertical+diagonal, and
at L = 10-12 as diagonal. The rules therefore decide on scores **normalised against what a uniform
map of the same length and layout scores**: x = (s - u) / (1 - u), 0 for the uniform map, 1 for the
pure pattern, at every L:

- ``vertical_norm`` = max(x of vertical, x of stripe); ``diagonal_norm``; ``block_norm``;
- ``vertical_seg``, ``diagonal_seg`` (two segments only): the same normalised against a pure block
  map (every query spread evenly over its own segment's ordinary tokens) instead of the uniform one.

Decision, by margins, not by a fixed order (thresholds are the module constants below): each of
``vertical+diagonal`` (margin min(vertical_norm / MIX_VERTICAL_MIN, diagonal_norm / MIX_DIAGONAL_MIN)),
``vertical`` (vertical_norm / VERTICAL_MIN) and ``diagonal`` (diagonal_norm / DIAGONAL_MIN) holds
at margin >= 1, and the one with the largest margin wins (equal margins: that order). So a clearly
diagonal map with a quarter of its mass on [CLS] is diagonal (its diagonal margin is the larger), and
a map whose [CLS] share is modest but far above a uniform map's is vertical. ``block`` takes a
two-segment map with block_norm >= BLOCK_MIN where no margin holds, or where the map is no more
striped or diagonal than a pure block map (vertical_seg < MIX_VERTICAL_MIN and diagonal_seg <
MIX_DIAGONAL_MIN): on short inputs a block is local attention too, so its diagonal score is high.
Block does not compete on margins: a diagonal map's attention also stays in its segment
(block_norm 0.6-0.7 for the labelled diagonal and vertical+diagonal maps). ``heterogeneous`` otherwise.

The four vertical and diagonal thresholds were chosen by an exhaustive grid search (CALIBRATION_GRID,
finer below 0.1) maximising macro-F1 on the training part (359 maps: 75%, seeded and stratified,
`stratified_split` with seed 0) of 480 hand-labelled maps of all-MiniLM-L6-v2 on six GLUE dev sets
(docs/results/pattern_labels/): macro-F1 0.592 there, 0.485 on the 121 held-out maps (accuracy 0.760;
0.606 averaged over the four classes that occur more than once; the fixed-order rules on raw scores
scored 0.573, 0.615 / 0.810 / 0.769 on the same parts). BLOCK_MIN is set, not fitted: two of the 480
labels are block. `calibrate` (CLI: `attnstore patterns calibrate`) reproduces the search; results and
confusion matrices are in docs/results/all-MiniLM-L6-v2/pattern_classifiers.md.

This module needs numpy and pandas only; the CNN classifier is in attnstore.queries.pattern_cnn.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .engine import (
    ATTENTION_ONLY,
    REQUESTED,
    SummaryKind,
    as_kernel_maps,
    ascending,
    every_position,
    kept_order,
    kernel,
    register,
    register_kind,
    requested_examples,
    summary,
    summary_totals,
)
from .errors import InvalidArgumentError
from .pattern_metrics import (  # noqa: F401  (the metrics' names are re-exported here, where callers have imported them)
    CLASSES,
    _macro_f1_rows,
    confusion_matrix,
    evaluate,
    f1_scores,
    stratified_split,
)

if TYPE_CHECKING:
    from ..store import Store

# Thresholds on the normalised scores (0: what a uniform map of the same length scores, 1: the pure pattern),
# calibrated on the training part of the hand labels (see the module docstring and docs/QUERIES.md).
VERTICAL_MIN = 0.15
DIAGONAL_MIN = 0.12
MIX_VERTICAL_MIN = 0.12
MIX_DIAGONAL_MIN = 0.02
BLOCK_MIN = 0.5  # not calibrated (2 of the 480 labels are block): half of the way from a uniform map's own-segment share to all

THRESHOLDS = dict(
    vertical_min=VERTICAL_MIN,
    diagonal_min=DIAGONAL_MIN,
    mix_vertical_min=MIX_VERTICAL_MIN,
    mix_diagonal_min=MIX_DIAGONAL_MIN,
    block_min=BLOCK_MIN,
)
RAW_SCORES = ("vertical", "diagonal", "self", "block", "stripe")
NORMALISED = ("vertical_norm", "diagonal_norm", "block_norm", "vertical_seg", "diagonal_seg")
SCORES = (*RAW_SCORES, *NORMALISED)
DECIDED = ("vertical+diagonal", "vertical", "diagonal")  # the classes a margin decides; ties go to the earlier


# ---------------------------------------------------------------- scores and rules


def _raw_scores(maps: np.ndarray, special: np.ndarray, segment: np.ndarray) -> dict[str, np.ndarray]:
    """The raw scores of float16 or float64 maps (..., L, L) in one compiled pass, every cell summed in float64
    (queries/_patterns.c). block: NaN unless the plain tokens span two segments; stripe: 0 without a plain key."""
    shape, length = maps.shape[:-2], maps.shape[-1]
    plain = ~special
    block = bool(plain.any()) and np.unique(segment[plain]).size >= 2
    segment_codes = np.unique(segment, return_inverse=True)[1].astype(np.int64).reshape(-1)  # any labels, as int64
    out = np.empty((len(RAW_SCORES), int(np.prod(shape, dtype=np.int64))))
    values, table, is_float16 = as_kernel_maps(maps)
    compiled = kernel("_patterns")
    compiled.raw_scores(values, out.shape[1], length, plain.astype(np.float64), segment_codes, table, out, is_float16, block)
    return {name: out[i].reshape(shape) for i, name in enumerate(RAW_SCORES)}


def _excess(score: np.ndarray, null: float) -> np.ndarray:
    """(score - null) / (1 - null): 0 for the null map (a uniform map), 1 for the pure pattern; 0 where the null scores 1."""
    score = np.asarray(score, dtype=np.float64)
    if np.isnan(null):
        return np.full(score.shape, np.nan)
    if not null < 1:
        return np.zeros_like(score)
    return (score - null) / (1 - null)


def _segment_uniform(special: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """The (L, L) map whose every query attends evenly to the plain tokens of its own segment: a pure block map."""
    plain = ~special
    own = (segment[:, None] == segment[None, :]) & plain[None, :]
    counts = own.sum(1, keepdims=True)
    return np.where(counts > 0, own / np.maximum(counts, 1), 1.0 / len(special))


def pattern_scores(maps: np.ndarray, special: np.ndarray, segment: np.ndarray) -> dict[str, np.ndarray]:
    """Scores of maps (..., L, L) of one example, each (...): the raw vertical, diagonal, self, block (NaN: one segment)
    and stripe; the normalised vertical_norm, diagonal_norm, block_norm the rules decide on; and vertical_seg,
    diagonal_seg, the stripe and diagonal beyond a pure block map's (NaN: one segment). See the module docstring."""
    maps = np.asarray(maps)
    maps = maps if maps.dtype == np.float16 else maps.astype(np.float64, copy=False)  # float16: by table, in C
    if maps.ndim < 2 or maps.shape[-1] != maps.shape[-2]:
        raise InvalidArgumentError(f"attention maps must be (..., L, L), not {maps.shape}")
    length = maps.shape[-1]
    special = np.asarray(special, dtype=bool)
    segment = np.asarray(segment)
    if special.shape != (length,) or segment.shape != (length,):
        raise InvalidArgumentError(f"special and segment must have the map's length {length}, not {special.shape}, {segment.shape}")
    raw = _raw_scores(maps, special, segment)

    def normalised(null: np.ndarray) -> dict[str, np.ndarray]:
        base = {k: float(v) for k, v in _raw_scores(null, special, segment).items()}
        vertical = np.maximum(_excess(raw["vertical"], base["vertical"]), _excess(raw["stripe"], base["stripe"]))
        return dict(vertical=vertical, diagonal=_excess(raw["diagonal"], base["diagonal"]), block=_excess(raw["block"], base["block"]))

    uniform = normalised(np.full((length, length), 1.0 / length))
    out = dict(raw, vertical_norm=uniform["vertical"], diagonal_norm=uniform["diagonal"], block_norm=uniform["block"])
    if np.isnan(raw["block"]).all():  # one segment
        nan = np.full(maps.shape[:-2], np.nan)
        return dict(out, vertical_seg=nan, diagonal_seg=nan.copy())
    blocks = normalised(_segment_uniform(special, segment))
    return dict(out, vertical_seg=blocks["vertical"], diagonal_seg=blocks["diagonal"])


def rule_margins(vertical, diagonal, thresholds: dict | None = None) -> np.ndarray:
    """Margins (..., 3) of the normalised scores over their thresholds, in the order of DECIDED: vertical+diagonal
    min(vertical / mix_vertical_min, diagonal / mix_diagonal_min), vertical vertical / vertical_min, diagonal
    diagonal / diagonal_min. A class holds at margin >= 1."""
    t = check_thresholds(thresholds)
    vertical, diagonal = (np.asarray(x, dtype=np.float64) for x in (vertical, diagonal))
    mix = np.minimum(vertical / t["mix_vertical_min"], diagonal / t["mix_diagonal_min"])
    return np.stack([mix, vertical / t["vertical_min"], diagonal / t["diagonal_min"]], axis=-1)


def check_thresholds(thresholds: dict | None = None) -> dict:
    """The module's thresholds with `thresholds` over them; an unknown name or one that is not positive raises."""
    t = dict(THRESHOLDS, **(thresholds or {}))
    unknown = set(t) - set(THRESHOLDS)
    if unknown:
        raise InvalidArgumentError(f"unknown thresholds {sorted(unknown)}; known: {', '.join(THRESHOLDS)}")
    bad = {k: v for k, v in t.items() if not v > 0}
    if bad:
        raise InvalidArgumentError(f"thresholds must be positive, not {bad}")
    return t


def labels_from_scores(scores, thresholds: dict | None = None) -> np.ndarray:
    """The rule decision for arrays of normalised scores (a mapping or DataFrame with the NORMALISED fields, as
    pattern_scores gives them): the class of the largest margin over its threshold (rule_margins) among
    vertical+diagonal, vertical and diagonal; else, or where the map is no more striped or diagonal than a pure block
    map (vertical_seg < mix_vertical_min and diagonal_seg < mix_diagonal_min), block when block_norm >= block_min;
    else heterogeneous."""
    t = check_thresholds(thresholds)
    v, d, b, v_seg, d_seg = (np.asarray(scores[k], dtype=np.float64) for k in NORMALISED)
    margins = rule_margins(v, d, t)
    best = margins.argmax(-1)  # the first of equal margins, in the order of DECIDED
    held = np.take_along_axis(margins, best[..., None], -1)[..., 0] >= 1
    block = ~np.isnan(b) & (np.nan_to_num(b, nan=0.0) >= t["block_min"])
    explained = (np.nan_to_num(v_seg, nan=np.inf) < t["mix_vertical_min"]) & (np.nan_to_num(d_seg, nan=np.inf) < t["mix_diagonal_min"])
    out = np.where(held, np.asarray(DECIDED, dtype=object)[best], np.where(block, "block", "heterogeneous"))
    out = np.where(block & explained, "block", out)
    return np.asarray(out, dtype=object)


def classify_maps(maps: np.ndarray, special: np.ndarray, segment: np.ndarray, thresholds: dict | None = None) -> np.ndarray:
    """Class of each map of one example: maps (layer, head, L, L) -> labels (layer, head), an object array of str."""
    return labels_from_scores(pattern_scores(maps, special, segment), thresholds)


def classify_map(attn: np.ndarray, special: np.ndarray, segment: np.ndarray, thresholds: dict | None = None) -> str:
    """Class of one (L, L) map: vertical, diagonal, vertical+diagonal, block or heterogeneous."""
    attn = np.asarray(attn)
    if attn.ndim != 2:
        raise InvalidArgumentError(f"classify_map takes one (L, L) map, not {attn.shape}; use classify_maps for more")
    return str(classify_maps(attn[None, None], special, segment, thresholds)[0, 0])


# ---------------------------------------------------------------- calibration (the metrics: pattern_metrics.py)


# Normalised scores of the labelled classes sit low (a vertical+diagonal map's diagonal_norm is ~0.12), so the grid is finer there.
CALIBRATION_GRID = (0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def calibrate(scores: pd.DataFrame, labels, grid=CALIBRATION_GRID) -> tuple[dict, float]:
    """Thresholds maximising macro-F1 of the rules on (scores, labels); exhaustive over `grid` for the four
    vertical and diagonal thresholds (block_min stays the module constant: too few block labels to fit it).

    `scores`: columns vertical_norm, diagonal_norm, block_norm (NaN for one-segment inputs). Ties go to the
    first combination in the order (mix_vertical_min, mix_diagonal_min, vertical_min, diagonal_min), each
    ascending. Returns (thresholds, macro-F1).
    """
    true = np.array([CLASSES.index(x) for x in labels])
    v, d, b, v_seg, d_seg = (scores[c].to_numpy(np.float64) for c in NORMALISED)
    grid = np.asarray(grid, dtype=np.float64)
    k = len(CLASSES)
    block = ~np.isnan(b) & (np.nan_to_num(b, nan=0.0) >= BLOCK_MIN)
    fallback = np.where(block, CLASSES.index("block"), CLASSES.index("heterogeneous"))
    to_index = np.array([CLASSES.index(c) for c in DECIDED])
    diag = d[None, :] / grid[:, None]  # every diagonal_min at once: (n_grid, n)
    best, best_t = -1.0, None
    for mv, md in itertools.product(grid, grid):
        mix = np.broadcast_to(np.minimum(v / mv, d / md), diag.shape)
        explained = block & (np.nan_to_num(v_seg, nan=np.inf) < mv) & (np.nan_to_num(d_seg, nan=np.inf) < md)
        for vm in grid:
            margins = np.stack([mix, np.broadcast_to(v / vm, diag.shape), diag], axis=-1)
            top = margins.argmax(-1)
            held = np.take_along_axis(margins, top[..., None], -1)[..., 0] >= 1
            preds = np.where(held, to_index[top], fallback[None, :])
            preds = np.where(explained[None, :], CLASSES.index("block"), preds)
            scores_f1 = _macro_f1_rows(true, preds, k)
            i = int(np.argmax(scores_f1))
            if scores_f1[i] > best + 1e-12:
                best = float(scores_f1[i])
                best_t = dict(
                    mix_vertical_min=float(mv),
                    mix_diagonal_min=float(md),
                    vertical_min=float(vm),
                    diagonal_min=float(grid[i]),
                    block_min=float(BLOCK_MIN),
                )
    assert best_t is not None
    return best_t, best


# ---------------------------------------------------------------- reading a run


def token_layout(store: Store, info, examples=None) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per example position (of `examples`, default all): (special mask, segment ids) of its tokens, from the tokenizer's roles."""
    table = store.token_table(info.id, examples)
    out = {}
    for example, part in table.groupby("example", sort=False):
        out[int(example)] = (part["is_special"].to_numpy(bool), part["segment"].to_numpy(np.int64))
    return out


def _scores_prepare(store: Store, info, examples=None):
    return token_layout(store, info, examples)


def _scores_reduce(layout, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    special, segment = layout[example]
    return pattern_scores(maps, special, segment)


# Each example's rule scores per (layer, head), kept with the run (queries/engine/): pattern_classes,
# pattern_proportions and pattern_heads (source "rules") then classify without decoding a map.
def _scores_totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A range's rule labels counted: `label_counts` (layer, head, class in CLASSES' order) and `examples`. Kept per range
    (queries/engine/), so pattern_proportions and pattern_heads over a whole run add a row per 4,096 examples."""
    labels = labels_from_scores(part)  # (examples, layer, head)
    counts = np.stack([(labels == c).sum(0, dtype=np.int32) for c in CLASSES], axis=-1)
    return {"label_counts": counts, "examples": np.asarray(len(part["example"]), np.int64)}


PATTERN_SCORES = register_kind(
    SummaryKind(
        "pattern_scores",
        3,  # 3: the raw scores compiled (queries/_patterns.c), their sums in another order (within 1e-15)
        _scores_prepare,
        _scores_reduce,
        threads=True,
        totals=_scores_totals,
        totals_fields=NORMALISED,
        integer_totals=True,
    )
)


def sample_examples(store: Store, info, examples=None, max_examples: int | None = 1000, seed: int = 0) -> list[int]:
    """Stored (not skipped) example positions, restricted to `examples`; a default_rng(seed) sample of `max_examples`
    when there are more (sorted). From the kept rule scores' example column (`kept_order`: no SQL stream of the run)."""
    if max_examples is not None and max_examples < 1:
        raise InvalidArgumentError(f"max_examples must be at least 1, not {max_examples}")
    order = kept_order(store, info, PATTERN_SCORES, {})
    if examples is None and max_examples is not None and len(order) > max_examples and every_position(order):
        # positions 0..n-1: `choice` of n draws what `choice` of their arange draws, without the arange (64 MB at 8 M)
        return sorted(np.random.default_rng(seed).choice(len(order), size=max_examples, replace=False).tolist())
    positions = ascending(order)
    if examples is not None:
        wanted = np.unique(np.fromiter((int(e) for e in examples), dtype=np.int64))
        missing = wanted[~np.isin(wanted, positions)]
        if missing.size:
            raise InvalidArgumentError(f"run {info.name!r} has no stored example(s) {missing[:10].tolist()}")
        positions = positions[np.isin(positions, wanted)]
    if max_examples is not None and len(positions) > max_examples:
        positions = np.sort(np.random.default_rng(seed).choice(positions, size=max_examples, replace=False))
    return [int(p) for p in positions]


def rule_label_counts(store: Store, info, examples=None, max_examples: int | None = 1000, seed: int = 0) -> tuple[np.ndarray, int]:
    """(layer, head, class) counts of the rule labels of the examples pattern_classes would label (the same sample), and
    how many examples: added from the kept range counts when that is the whole run (no `examples`, and no more
    examples than `max_examples`), else from the sample's kept scores."""
    whole = examples is None and (max_examples is None or 1 <= max_examples and store.n_committed(info.id) <= max_examples)
    chosen = None if whole else sample_examples(store, info, examples, max_examples, seed)
    totals = summary_totals(store, info, PATTERN_SCORES, chosen) if chosen is None or chosen else {}
    if not totals:
        return np.zeros((info.n_layers, info.n_heads, len(CLASSES)), np.int64), 0
    return totals["label_counts"], int(totals["examples"])


def _check_source(source: str) -> None:
    if not source:
        raise InvalidArgumentError("source must name a classifier (rules) or a stored label source (human, cnn, ...)")


@register("pattern_classes", per_head=False, sources=ATTENTION_ONLY)
def pattern_classes(store: Store, *, run, max_examples: int | None = 1000, seed: int = 0, save: bool = False) -> pd.DataFrame:
    """Rule-based attention-pattern class of every (example, layer, head) map (Kovaleva et al. Fig 1).

    Columns: example, layer, head, label (vertical, diagonal, vertical+diagonal, block,
    heterogeneous), the raw scores vertical, diagonal, self, block (NaN for one-segment inputs),
    stripe, and the length-normalised scores the rules decide on: vertical_norm, diagonal_norm,
    block_norm (0 for a uniform map of the same length, 1 for the pure pattern), vertical_seg,
    diagonal_seg (against a pure block map; NaN for one segment); see the module docstring for
    definitions, thresholds and the decision by margins. At most `max_examples` examples
    (a default_rng(seed) sample when the run has more). save=true also stores the labels in
    pattern_labels with source "rules".
    """
    info = store.run_info(run)
    frame = classified(store, info, sample_examples(store, info, requested_examples(info.id), max_examples, seed))
    if save:
        store.save_pattern_labels(frame.assign(run=info.name)[["run", "example", "layer", "head", "label"]], source="rules")
    return frame


def classified(store: Store, info, chosen: list[int]) -> pd.DataFrame:
    """The rule classes and scores of the maps of examples `chosen` (pattern_classes' columns), from the kept scores."""
    layer, head = np.meshgrid(np.arange(info.n_layers), np.arange(info.n_heads), indexing="ij")
    scored = summary(store, info, PATTERN_SCORES, chosen)  # each example's scores (queries/engine/): kept with the run
    n = len(scored["example"])
    parts = []
    if n:
        labels = labels_from_scores(scored)
        parts.append(
            pd.DataFrame(
                dict(
                    example=np.repeat(scored["example"], layer.size),
                    layer=np.tile(layer.ravel(), n),
                    head=np.tile(head.ravel(), n),
                    label=labels.ravel().astype(str),
                    **{k: scored[k].ravel() for k in SCORES},
                )
            )
        )
    columns = ["example", "layer", "head", "label", *SCORES]
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
    return frame[columns].sort_values(["example", "layer", "head"], ignore_index=True)


def labels_of(store: Store, info, source: str, examples=REQUESTED, max_examples: int | None = 1000, seed: int = 0) -> pd.DataFrame:
    """Labels (example, layer, head, label) of a run from `source`: "rules" classifies now, any other
    source reads pattern_labels (over the same example sample). `examples`: by default the query request's."""
    _check_source(source)
    examples = requested_examples(info.id, examples)
    if source == "rules":
        return classified(store, info, sample_examples(store, info, examples, max_examples, seed))
    stored = store.pattern_labels(info.id, source=source)
    if stored.empty:
        raise InvalidArgumentError(
            f"run {info.name!r} has no pattern labels from source {source!r}; "
            f"save some with `attnstore patterns classify --run {info.name} --save`"
        )
    chosen = sample_examples(store, info, examples if examples is not None else sorted(set(stored["example"])), max_examples, seed)
    return stored[stored["example"].isin(chosen)][["example", "layer", "head", "label"]].reset_index(drop=True)


@register("pattern_proportions", per_head=False, sources=ATTENTION_ONLY)
def pattern_proportions(store: Store, *, run, source: str = "rules", max_examples: int | None = 1000, seed: int = 0) -> pd.DataFrame:
    """Share of maps in each attention-pattern class over a run (Kovaleva et al. Fig 2's bars).

    Columns: label (the five classes, in order), n_maps, fraction (of all maps read), n_examples.
    source "rules" classifies now with the rules; any other source (cnn, human) reads the labels
    stored in pattern_labels. At most `max_examples` examples (default_rng(seed) sample; `none`: every example).
    Over a whole run, source "rules" adds the label counts kept per range of examples.
    """
    info = store.run_info(run)
    examples = requested_examples(info.id)
    if source == "rules":
        by_head, n_examples = rule_label_counts(store, info, examples, max_examples, seed)
        counts = pd.Series(by_head.sum((0, 1)), index=list(CLASSES))
    else:
        labels = labels_of(store, info, source, examples, max_examples, seed)
        counts = labels["label"].value_counts().reindex(list(CLASSES), fill_value=0)
        n_examples = labels["example"].nunique()
    total = int(counts.sum())
    return pd.DataFrame(
        dict(
            label=list(CLASSES),
            n_maps=counts.to_numpy(np.int64),
            fraction=counts.to_numpy(np.float64) / total if total else np.nan,
            n_examples=n_examples,
        )
    )


@register("pattern_heads", sources=ATTENTION_ONLY)
def pattern_heads(store: Store, *, run, source: str = "rules", max_examples: int | None = 1000, seed: int = 0) -> pd.DataFrame:
    """Per head, the share of its maps in each attention-pattern class, and its most frequent class.

    Columns: layer, head, vertical, diagonal, vertical+diagonal, block, heterogeneous (fractions of
    the head's maps), majority (the most frequent class; ties to the earlier class), n_maps.
    source, max_examples and the whole-run counts as in pattern_proportions.
    """
    info = store.run_info(run)
    full = pd.MultiIndex.from_product([range(info.n_layers), range(info.n_heads)], names=["layer", "head"])
    examples = requested_examples(info.id)
    if source == "rules":
        by_head, _ = rule_label_counts(store, info, examples, max_examples, seed)
        table = pd.DataFrame(by_head.reshape(-1, len(CLASSES)).astype(np.int64), index=full, columns=list(CLASSES))
    else:
        labels = labels_of(store, info, source, examples, max_examples, seed)
        table = pd.crosstab([labels["layer"], labels["head"]], labels["label"]).reindex(columns=list(CLASSES), fill_value=0)
        table = table.reindex(full, fill_value=0)
    n = table.sum(axis=1)
    fractions = table.div(n.where(n > 0), axis=0)
    frame = fractions.reset_index()
    frame.columns.name = None
    frame["majority"] = [CLASSES[int(np.argmax(row))] if total else None for row, total in zip(table.to_numpy(), n)]
    frame["n_maps"] = n.to_numpy(np.int64)
    return frame


def labelled_maps(store: Store, source: str = "human", run=None) -> tuple[pd.DataFrame, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Stored labels of `source` with their maps, in a fixed order (run id, example, layer, head).

    Returns (frame, maps): frame has the pattern_labels columns plus the rule scores; maps[i] is
    (attn (L, L) float64, special mask, segment ids) of row i.
    """
    labels = store.pattern_labels(run, source=source)
    if labels.empty:
        raise InvalidArgumentError(
            f"no pattern labels from source {source!r} in the store; import some with `attnstore patterns import LABELS.jsonl`"
        )
    unknown = sorted(set(labels["label"]) - set(CLASSES))
    if unknown:
        raise InvalidArgumentError(f"labels from source {source!r} include unknown classes {unknown}")
    maps, scores = [], []
    layouts: dict[str, dict] = {}
    for row in labels.itertuples():
        if row.run not in layouts:
            layouts[row.run] = token_layout(store, store.run_info(row.run))
        special, segment = layouts[row.run][int(row.example)]
        attn = store.attention(row.run, int(row.example), layer=int(row.layer), head=int(row.head))[0, 0].astype(np.float64)
        maps.append((attn, special, segment))
        scores.append({k: float(v) for k, v in pattern_scores(attn, special, segment).items()})
    frame = pd.concat([labels.reset_index(drop=True), pd.DataFrame(scores)], axis=1)
    return frame, maps


def labelled_scores(store: Store, source: str = "human") -> pd.DataFrame:
    """Stored labels of `source` with the rule scores of their maps (see labelled_maps)."""
    return labelled_maps(store, source)[0]
