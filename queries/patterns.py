"""K1 (Kovaleva et al. 2019, Sec 4.1, Fig 1-2): attention-pattern classes of single maps, by transparent rules.

Every (example, layer, head) map gets one of five classes from three scores, each a
mean over the map's L query rows (a[i, j]: attention of query i to key j; rows sum to 1):

- ``vertical``: mass on the special tokens' columns, mean_i sum_{j special} a[i, j].
  Special tokens are the tokenizer's special ids recorded with the model ([CLS]-, [SEP]-like),
  never strings. The paper: "mainly corresponds to attention to special BERT tokens".
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

Decision, in this order (thresholds are the module constants below):

1. ``vertical+diagonal`` when vertical >= MIX_VERTICAL_MIN and diagonal >= MIX_DIAGONAL_MIN;
2. ``vertical`` when vertical >= VERTICAL_MIN;
3. ``diagonal`` when diagonal >= DIAGONAL_MIN;
4. ``block`` when the input has two segments and block >= BLOCK_MIN;
5. ``heterogeneous`` otherwise (the paper's catch-all class).

The thresholds were chosen by an exhaustive grid search (0.05 to 0.95, step 0.05, for all five)
maximising macro-F1 on the training part (359 maps: 75%, seeded and stratified, `stratified_split`
with seed 0) of 480 hand-labelled maps of all-MiniLM-L6-v2 on six GLUE dev sets
(docs/results/pattern_labels/): macro-F1 0.573 there, 0.615 on the 121 held-out maps (accuracy
0.810; 0.77 averaged over the four classes that occur more than once — block has two labels in
all). `calibrate` (CLI: `attnstore patterns calibrate`) reproduces the search; results and
confusion matrices are in docs/results/all-MiniLM-L6-v2/pattern_classifiers.md.

This module needs numpy and pandas only; the CNN classifier is in attnstore.queries.pattern_cnn.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .errors import InvalidArgumentError
from .registry import register
from .summary import SummaryKind, register_kind, summary

if TYPE_CHECKING:
    from ..store import Store

CLASSES = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")

# Calibrated on the training part of the hand labels (see the module docstring and docs/QUERIES.md).
VERTICAL_MIN = 0.25
DIAGONAL_MIN = 0.15
MIX_VERTICAL_MIN = 0.25
MIX_DIAGONAL_MIN = 0.10
BLOCK_MIN = 0.90

THRESHOLDS = dict(
    vertical_min=VERTICAL_MIN,
    diagonal_min=DIAGONAL_MIN,
    mix_vertical_min=MIX_VERTICAL_MIN,
    mix_diagonal_min=MIX_DIAGONAL_MIN,
    block_min=BLOCK_MIN,
)
SCORES = ("vertical", "diagonal", "self", "block")


# ---------------------------------------------------------------- scores and rules


def pattern_scores(maps: np.ndarray, special: np.ndarray, segment: np.ndarray) -> dict[str, np.ndarray]:
    """Scores of maps (..., L, L) of one example: vertical, diagonal, self, block (NaN: one segment), each (...)."""
    maps = np.asarray(maps, dtype=np.float64)
    if maps.ndim < 2 or maps.shape[-1] != maps.shape[-2]:
        raise InvalidArgumentError(f"attention maps must be (..., L, L), not {maps.shape}")
    length = maps.shape[-1]
    special = np.asarray(special, dtype=bool)
    segment = np.asarray(segment)
    if special.shape != (length,) or segment.shape != (length,):
        raise InvalidArgumentError(f"special and segment must have the map's length {length}, not {special.shape}, {segment.shape}")
    vertical = maps[..., special].sum(-1).mean(-1)
    neighbours = np.diagonal(maps, offset=-1, axis1=-2, axis2=-1).sum(-1) + np.diagonal(maps, offset=1, axis1=-2, axis2=-1).sum(-1)
    diagonal = neighbours / length
    self_ = np.diagonal(maps, axis1=-2, axis2=-1).mean(-1)
    plain = ~special
    if plain.any() and np.unique(segment[plain]).size >= 2:
        own = (segment[:, None] == segment[None, :]) & plain[None, :]  # (query, key): key in the query's segment
        to_own = (maps * own).sum(-1)[..., plain]
        to_plain = maps[..., plain].sum(-1)[..., plain]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(to_plain > 0, to_own / np.where(to_plain > 0, to_plain, 1), 0.0)
        block = share.mean(-1)
    else:
        block = np.full(maps.shape[:-2], np.nan)
    return dict(vertical=vertical, diagonal=diagonal, self=self_, block=block)


def labels_from_scores(vertical, diagonal, block, thresholds: dict | None = None) -> np.ndarray:
    """The rule decision (see the module docstring) for arrays of scores; block NaN = one-segment input."""
    t = dict(THRESHOLDS, **(thresholds or {}))
    unknown = set(t) - set(THRESHOLDS)
    if unknown:
        raise InvalidArgumentError(f"unknown thresholds {sorted(unknown)}; known: {', '.join(THRESHOLDS)}")
    vertical, diagonal, block = (np.asarray(x, dtype=np.float64) for x in (vertical, diagonal, block))
    two_segments = ~np.isnan(block)
    conditions = [
        (vertical >= t["mix_vertical_min"]) & (diagonal >= t["mix_diagonal_min"]),
        vertical >= t["vertical_min"],
        diagonal >= t["diagonal_min"],
        two_segments & (np.nan_to_num(block, nan=0.0) >= t["block_min"]),
    ]
    out = np.full(vertical.shape, "heterogeneous", dtype=object)
    for condition, name in reversed(list(zip(conditions, ("vertical+diagonal", "vertical", "diagonal", "block")))):
        out[condition] = name  # reversed: the first rule that holds wins
    return out


def classify_maps(maps: np.ndarray, special: np.ndarray, segment: np.ndarray, thresholds: dict | None = None) -> np.ndarray:
    """Class of each map of one example: maps (layer, head, L, L) -> labels (layer, head), an object array of str."""
    scores = pattern_scores(maps, special, segment)
    return labels_from_scores(scores["vertical"], scores["diagonal"], scores["block"], thresholds)


def classify_map(attn: np.ndarray, special: np.ndarray, segment: np.ndarray, thresholds: dict | None = None) -> str:
    """Class of one (L, L) map: vertical, diagonal, vertical+diagonal, block or heterogeneous."""
    attn = np.asarray(attn)
    if attn.ndim != 2:
        raise InvalidArgumentError(f"classify_map takes one (L, L) map, not {attn.shape}; use classify_maps for more")
    return str(classify_maps(attn[None, None], special, segment, thresholds)[0, 0])


# ---------------------------------------------------------------- evaluation and calibration


# Hand-written on purpose (this and f1_scores): scikit-learn is no dependency; f1_scores follows its zero_division=0.
def confusion_matrix(true, predicted, classes=CLASSES) -> np.ndarray:
    """Counts (len(classes), len(classes)): rows the true class, columns the predicted one."""
    index = {c: i for i, c in enumerate(classes)}
    out = np.zeros((len(classes), len(classes)), dtype=np.int64)
    for t, p in zip(true, predicted):
        if t not in index or p not in index:
            raise InvalidArgumentError(f"unknown class {t if t not in index else p!r}; classes: {', '.join(classes)}")
        out[index[t], index[p]] += 1
    return out


def f1_scores(matrix: np.ndarray) -> dict[str, np.ndarray | float]:
    """Per-class precision, recall, F1 and support from a confusion matrix (rows true), and their averages.

    As scikit-learn with zero_division=0: a class never predicted has precision 0, one never
    true recall 0. `macro_f1` averages F1 over the classes that are true or predicted at least
    once (scikit-learn's default label set); `weighted_f1` weights by support; `accuracy`.
    """
    m = np.asarray(matrix, dtype=np.float64)
    tp = np.diag(m)
    predicted, support = m.sum(0), m.sum(1)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    recall = np.divide(tp, support, out=np.zeros_like(tp), where=support > 0)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(tp), where=total > 0)
    present = (predicted > 0) | (support > 0)
    n = m.sum()
    return dict(
        precision=precision,
        recall=recall,
        f1=f1,
        support=support.astype(np.int64),
        macro_f1=float(f1[present].mean()) if present.any() else 0.0,
        weighted_f1=float((f1 * support).sum() / n) if n else 0.0,
        accuracy=float(tp.sum() / n) if n else 0.0,
    )


def evaluate(true, predicted, classes=CLASSES) -> dict:
    """Confusion matrix and F1 scores of predicted against true labels."""
    matrix = confusion_matrix(true, predicted, classes)
    return dict(confusion=matrix, classes=tuple(classes), n=int(matrix.sum()), **f1_scores(matrix))


def stratified_split(labels, test_fraction: float = 0.25, seed: int = 0) -> np.ndarray:
    """Boolean mask of the held-out part: per class, round(n * test_fraction) items drawn with default_rng(seed).

    A class with at least two items keeps at least one on each side. Give labels in a fixed
    order (e.g. sorted by run, example, layer, head) for a split that does not depend on the database.
    """
    if not 0 < test_fraction < 1:
        raise InvalidArgumentError(f"test_fraction must be between 0 and 1, not {test_fraction}")
    labels = np.asarray(labels, dtype=object)
    rng = np.random.default_rng(seed)
    held_out = np.zeros(len(labels), dtype=bool)
    for cls in sorted(set(labels.tolist())):
        members = np.flatnonzero(labels == cls)
        k = int(round(len(members) * test_fraction))
        if len(members) >= 2:
            k = min(max(k, 1), len(members) - 1)
        held_out[rng.permutation(members)[:k]] = True
    return held_out


CALIBRATION_GRID = tuple(np.round(np.arange(0.05, 0.951, 0.05), 2))


def calibrate(scores: pd.DataFrame, labels, grid=CALIBRATION_GRID) -> tuple[dict, float]:
    """Thresholds maximising macro-F1 of the rules on (scores, labels); exhaustive over `grid` for all five.

    `scores`: columns vertical, diagonal, block (NaN for one-segment inputs). Ties go to the first
    combination in the order (mix_vertical_min, mix_diagonal_min, vertical_min, diagonal_min, block_min),
    each ascending. Returns (thresholds, macro-F1).
    """
    true = np.array([CLASSES.index(x) for x in labels])
    v, d, b = (scores[c].to_numpy(np.float64) for c in ("vertical", "diagonal", "block"))
    two = ~np.isnan(b)
    b = np.nan_to_num(b, nan=-1.0)
    grid = np.asarray(grid, dtype=np.float64)
    k = len(CLASSES)
    # block decision for every block threshold at once: (n_grid, n)
    block_hit = two[None, :] & (b[None, :] >= grid[:, None])
    best, best_t = -1.0, None
    for mv, md in itertools.product(grid, grid):
        mix = (v >= mv) & (d >= md)
        for vm in grid:
            vert = ~mix & (v >= vm)
            for dm in grid:
                diag = ~mix & ~vert & (d >= dm)
                rest = ~(mix | vert | diag)
                pred = np.where(mix, 2, np.where(vert, 0, np.where(diag, 1, 4)))  # (n,)
                preds = np.where(rest[None, :] & block_hit, 3, pred[None, :])  # (n_grid, n)
                scores_f1 = _macro_f1_rows(true, preds, k)
                i = int(np.argmax(scores_f1))
                if scores_f1[i] > best + 1e-12:
                    best = float(scores_f1[i])
                    best_t = dict(
                        mix_vertical_min=float(mv),
                        mix_diagonal_min=float(md),
                        vertical_min=float(vm),
                        diagonal_min=float(dm),
                        block_min=float(grid[i]),
                    )
    assert best_t is not None
    return best_t, best


def _macro_f1_rows(true: np.ndarray, preds: np.ndarray, k: int) -> np.ndarray:
    """Macro-F1 (classes true or predicted) of each row of preds (m, n) against true (n,)."""
    m = preds.shape[0]
    cells = (true[None, :] * k + preds + (np.arange(m) * k * k)[:, None]).ravel()
    conf = np.bincount(cells, minlength=m * k * k).reshape(m, k, k).astype(np.float64)
    tp = np.diagonal(conf, axis1=1, axis2=2)
    predicted, support = conf.sum(1), conf.sum(2)
    denom = predicted + support
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)  # = 2PR/(P+R)
    present = denom > 0
    return (f1 * present).sum(1) / np.maximum(present.sum(1), 1)


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


# Each example's rule scores per (layer, head), kept with the run (queries/summary.py): pattern_classes,
# pattern_proportions and pattern_heads (source "rules") then classify without decoding a map.
PATTERN_SCORES = register_kind(SummaryKind("pattern_scores", 1, _scores_prepare, _scores_reduce))


def sample_examples(store: Store, info, examples=None, max_examples: int = 1000, seed: int = 0) -> list[int]:
    """Stored (not skipped) example positions, restricted to `examples`; a default_rng(seed) sample of
    `max_examples` when there are more (sorted)."""
    if max_examples is not None and max_examples < 1:
        raise InvalidArgumentError(f"max_examples must be at least 1, not {max_examples}")
    positions = np.sort(store.storage_order(info.id))
    if examples is not None:
        wanted = set(int(e) for e in examples)
        missing = wanted - set(positions.tolist())
        if missing:
            raise InvalidArgumentError(f"run {info.name!r} has no stored example(s) {sorted(missing)[:10]}")
        positions = positions[np.isin(positions, sorted(wanted))]
    if max_examples is not None and len(positions) > max_examples:
        positions = np.sort(np.random.default_rng(seed).choice(positions, size=max_examples, replace=False))
    return [int(p) for p in positions]


def _check_source(source: str) -> None:
    if not source:
        raise InvalidArgumentError("source must name a classifier (rules) or a stored label source (human, cnn, ...)")


@register("pattern_classes", per_head=False)
def pattern_classes(store: Store, *, run, examples=None, max_examples: int = 1000, seed: int = 0, save: bool = False) -> pd.DataFrame:
    """Rule-based attention-pattern class of every (example, layer, head) map (Kovaleva et al. Fig 1).

    Columns: example, layer, head, label (vertical, diagonal, vertical+diagonal, block,
    heterogeneous), and the scores vertical, diagonal, self, block (NaN for one-segment inputs);
    see the module docstring for definitions and thresholds. At most `max_examples` examples
    (a default_rng(seed) sample when the run has more). save=true also stores the labels in
    pattern_labels with source "rules".
    """
    info = store.run_info(run)
    chosen = sample_examples(store, info, examples, max_examples, seed)
    layer, head = np.meshgrid(np.arange(info.n_layers), np.arange(info.n_heads), indexing="ij")
    scored = summary(store, info, PATTERN_SCORES, chosen)  # each example's scores (queries/summary.py): kept with the run
    n = len(scored["example"])
    parts = []
    if n:
        labels = labels_from_scores(scored["vertical"], scored["diagonal"], scored["block"])
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
    frame = frame[columns].sort_values(["example", "layer", "head"], ignore_index=True)
    if save:
        store.save_pattern_labels(frame.assign(run=info.name)[["run", "example", "layer", "head", "label"]], source="rules")
    return frame


def labels_of(store: Store, info, source: str, examples=None, max_examples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Labels (example, layer, head, label) of a run from `source`: "rules" classifies now, any other
    source reads pattern_labels (over the same example sample)."""
    _check_source(source)
    if source == "rules":
        return pattern_classes(store, run=info.id, examples=examples, max_examples=max_examples, seed=seed)
    stored = store.pattern_labels(info.id, source=source)
    if stored.empty:
        raise InvalidArgumentError(
            f"run {info.name!r} has no pattern labels from source {source!r}; "
            f"save some with `attnstore patterns classify --run {info.name} --save`"
        )
    chosen = sample_examples(store, info, examples if examples is not None else sorted(set(stored["example"])), max_examples, seed)
    return stored[stored["example"].isin(chosen)][["example", "layer", "head", "label"]].reset_index(drop=True)


@register("pattern_proportions", per_head=False)
def pattern_proportions(
    store: Store, *, run, source: str = "rules", examples=None, max_examples: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """Share of maps in each attention-pattern class over a run (Kovaleva et al. Fig 2's bars).

    Columns: label (the five classes, in order), n_maps, fraction (of all maps read), n_examples.
    source "rules" classifies now with the rules; any other source (cnn, human) reads the labels
    stored in pattern_labels. At most `max_examples` examples (default_rng(seed) sample).
    """
    info = store.run_info(run)
    labels = labels_of(store, info, source, examples, max_examples, seed)
    counts = labels["label"].value_counts().reindex(list(CLASSES), fill_value=0)
    total = int(counts.sum())
    return pd.DataFrame(
        dict(
            label=list(CLASSES),
            n_maps=counts.to_numpy(np.int64),
            fraction=counts.to_numpy(np.float64) / total if total else np.nan,
            n_examples=labels["example"].nunique(),
        )
    )


@register("pattern_heads")
def pattern_heads(store: Store, *, run, source: str = "rules", examples=None, max_examples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per head, the share of its maps in each attention-pattern class, and its most frequent class.

    Columns: layer, head, vertical, diagonal, vertical+diagonal, block, heterogeneous (fractions of
    the head's maps), majority (the most frequent class; ties to the earlier class), n_maps.
    source as in pattern_proportions.
    """
    info = store.run_info(run)
    labels = labels_of(store, info, source, examples, max_examples, seed)
    table = pd.crosstab([labels["layer"], labels["head"]], labels["label"]).reindex(columns=list(CLASSES), fill_value=0)
    full = pd.MultiIndex.from_product([range(info.n_layers), range(info.n_heads)], names=["layer", "head"])
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
