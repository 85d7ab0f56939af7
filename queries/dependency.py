"""C6 (Clark et al. 2019, Sec. 4.2, Table 1): heads that find a word's syntactic head.

Every prediction is made for a **dependent** word d and is right when it names d's gold
head, as in the authors' code (clarkkev/attention-analysis, Syntax_Analysis.ipynb), on
word-level maps (C5) restricted to words (special tokens ignored), the diagonal set to 0:

- `dep2head`: the word d attends to most;
- `head2dep`: with head2dep="transpose" (default, the authors' code), the word that
  attends to d most (the transposed map); with head2dep="direct", the edge is right when
  the head's most-attended word is d (a prediction made for the head word).

A row (or column) whose largest entry is 0 or is reached by more than one word makes **no
prediction** and counts as wrong. Root words (no head) are in the `all` row: no attention
prediction can name ROOT, so they always count as wrong there. The baseline predicts the
word at a fixed offset (-3..3, not 0) from the dependent, clamped to the sentence as in the
authors' code: before the first word is ROOT, past the last word is the last word.

The predictions (each word's most-attended word and the word attending to it most, per head)
and the gold trees are the `WORD_ARGMAX` summary (queries/engine/), kept with the run by one
pass the first time; a query counts hits from them without decoding a map or reading the words
from SQL.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.errors import DamagedDataError
from ..store.records import RunInfo
from .common import note_left_out, per_head_frame, unique_argmax
from .engine import MAP_SOURCES, SummaryKind, register, register_kind, summary_totals
from .errors import InvalidArgumentError
from .word_level import units_of, word_level

if TYPE_CHECKING:
    from ..store import Store

DIRECTIONS = ("dep2head", "head2dep")
HEAD2DEP = ("transpose", "direct")
SUMMARY_DIRECTIONS = ("best", "each", *DIRECTIONS)
OFFSETS = (-3, -2, -1, 1, 2, 3)
# Clark et al.'s Stanford Dependencies labels and the UD labels used for them here.
# Approximate where the schemes attach words differently: UD attaches a preposition to
# its noun (`case`), SD to the verb/noun it modifies (`prep`); the noun of a PP is UD
# `obl`/`nmod` (attached to the verb/noun), SD `pobj` (attached to the preposition).
PAPER_RELATIONS: dict[str, tuple[str, ...]] = {
    "prep": ("case",),
    "pobj": ("obl", "nmod"),
    "det": ("det",),
    "nn": ("compound",),
    "nsubj": ("nsubj",),
    "amod": ("amod",),
    "dobj": ("obj",),
    "advmod": ("advmod",),
    "aux": ("aux",),
    "poss": ("nmod:poss",),
    "auxpass": ("aux:pass",),
    "ccomp": ("ccomp",),
    "mark": ("mark",),
    "prt": ("compound:prt",),
}
# The paper's `poss` rule (Sec. 4.2): when a possessor is followed by 's, the prediction made
# for the 's is judged instead ("the accuracy in Table 1 counts 's as correct").
POSS_RELATIONS = ("nmod:poss", "poss")  # UD, Stanford/ClearNLP
POSSESSIVE_MARKERS = ("'s", "’s", "'", "’", "s'", "s’")


@dataclass
class DependencyCounts:
    """Hits per (direction, layer, head, relation) over the non-root edges, and the root words apart."""

    info: RunInfo
    relations: list[str]
    correct: np.ndarray  # (2, layers, heads, relations)
    totals: np.ndarray  # (relations,) edges evaluated
    baseline: np.ndarray  # (offsets, relations) baseline hits
    n_root: int  # root words evaluated (attention never predicts ROOT: always wrong)
    baseline_root: np.ndarray  # (offsets,) root words the clamped baseline gets right
    no_prediction: np.ndarray  # (2, layers, heads) evaluated words (root included) with no prediction


def _check(name: str, value: str, allowed) -> None:
    if value not in allowed:
        raise InvalidArgumentError(f"{name}={value!r}: use one of {', '.join(repr(a) for a in allowed)}")


def _word_map(maps: np.ndarray, units) -> tuple[np.ndarray, np.ndarray]:
    """(layer, head, words, words) word-level maps restricted to words (special tokens left out), and their positions."""
    keep = np.flatnonzero(units.is_word)
    return word_level(maps, units, keep), units.word[keep]


def word_predictions(maps: np.ndarray, units) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(by_row, by_col, words): for every head and word, the other word it attends to most (by_row) and
    the other word attending to it most (by_col), as indices into `words` (word positions), -1 for no
    prediction (largest entry 0, or reached by two words); special tokens ignored, diagonal set to 0."""
    wmap, words = _word_map(maps, units)
    diag = np.arange(len(words))
    wmap[:, :, diag, diag] = 0
    return unique_argmax(wmap), unique_argmax(wmap, transpose=True), words


# ---------------------------------------------------------------- word-level predictions kept with the run
# Per example, per word unit (in token order) and (layer, head): the other word it attends to most and the other
# word attending to it most (`word_predictions`' by_row and by_col), as indices into the example's words, -1 for
# no prediction: `argmax` (words, 2, layer, head), with the words' positions in `word`. Beside them, the example's
# gold tree, so that counting needs no word table from SQL: one `edge` row per word with a relation (in word
# order; the EDGE_* columns below) and the relations' UTF-8 bytes, concatenated in the same order, in `edge_label`.
# None of these for an example without a dependency tree. One pass over the run computes them (queries/engine/);
# a query then reads a few kilobytes per example instead of every map.

EDGE_POSITION, EDGE_HEAD, EDGE_FIRST, EDGE_LAST, EDGE_LABEL_BYTES, EDGE_FLAGS = range(6)  # EDGE_HEAD -1: none
EDGE_COLUMNS = 6
ROOT_FLAG = 1  # the word has no head (a root)
POSSESSIVE_NEXT_FLAG = 2  # the next word's form is a possessive marker (the paper's poss rule)


def _gold_edges(all_words: pd.DataFrame) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per example with a tree, its words with a relation as (edge (words, EDGE_COLUMNS) int32, edge_label uint8):
    position, head position (-1 for none), first and last word position of its sentence, its relation's length in
    UTF-8 bytes, flags; and the relations' bytes, concatenated."""
    tree = all_words["deprel"].notna().to_numpy()
    words = all_words[tree]
    example = words["example"].to_numpy(dtype=np.int64)
    position = words["position"].to_numpy(dtype=np.int64)
    grouped = all_words.groupby(["example", "segment", "sentence"])["position"]
    first = grouped.transform("min").to_numpy(dtype=np.int64)[tree]
    last = grouped.transform("max").to_numpy(dtype=np.int64)[tree]
    marker = _following_forms(all_words, example, position).str.lower().isin(POSSESSIVE_MARKERS).to_numpy(dtype=bool)
    root = words["head"].isna().to_numpy()
    labels = [str(rel).encode("utf-8") for rel in words["deprel"]]
    edge = np.empty((len(words), EDGE_COLUMNS), dtype=np.int64)
    edge[:, EDGE_POSITION] = position
    edge[:, EDGE_HEAD] = words["head"].fillna(-1).to_numpy(dtype=np.int64)
    edge[:, EDGE_FIRST], edge[:, EDGE_LAST] = first, last
    edge[:, EDGE_LABEL_BYTES] = [len(b) for b in labels]
    edge[:, EDGE_FLAGS] = root * ROOT_FLAG + marker * POSSESSIVE_NEXT_FLAG
    chars = np.frombuffer(b"".join(labels), dtype=np.uint8)
    char_end = np.cumsum(edge[:, EDGE_LABEL_BYTES])
    out = {}
    keys, starts = np.unique(example, return_index=True)  # words come ordered by example, then position
    ends = np.r_[starts[1:], len(example)]
    for key, lo, hi in zip(keys.tolist(), starts.tolist(), ends.tolist()):
        c_lo, c_hi = (int(char_end[lo - 1]) if lo else 0), int(char_end[hi - 1])
        out[key] = (edge[lo:hi].astype(np.int32), chars[c_lo:c_hi].copy())
    return out


def _word_argmax_prepare(store: Store, info: RunInfo, examples=None):
    table = store.token_table(info.id, examples)[["example", "word_position"]]
    tokens = {int(k): g["word_position"] for k, g in table.groupby("example")}
    words = store.word_table(info.id, examples)
    return tokens, _gold_edges(words), (np.int16 if info.max_length < 2**15 else np.int32)  # word indices < tokens <= max_length


def _word_argmax_reduce(context, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    tokens, edges, dtype = context
    if example not in edges:  # nothing to judge: no row
        return {
            "word": np.zeros(0, dtype=np.int32),
            "argmax": np.zeros((0, 2, *maps.shape[:2]), dtype=dtype),
            "edge": np.zeros((0, EDGE_COLUMNS), dtype=np.int32),
            "edge_label": np.zeros(0, dtype=np.uint8),
        }
    by_row, by_col, words = word_predictions(maps, units_of(tokens[example]))
    argmax = np.moveaxis(np.stack([by_row, by_col]), -1, 0)  # (words, 2, layer, head)
    edge, edge_label = edges[example]
    return {"word": np.asarray(words, dtype=np.int32), "argmax": argmax.astype(dtype), "edge": edge, "edge_label": edge_label}


def _keys(example: np.ndarray, position: np.ndarray) -> np.ndarray:
    """One int64 per (example, word position >= 0)."""
    return (np.asarray(example, dtype=np.int64) << 32) | np.asarray(position, dtype=np.int64)


def _following_forms(all_words: pd.DataFrame, example: np.ndarray, position: np.ndarray) -> pd.Series:
    """The form of the word at position + 1 of each (example, position) (None where there is none); of a position
    stored twice, the last."""
    keys = _keys(all_words["example"].to_numpy(), all_words["position"].to_numpy())
    last = ~pd.Index(keys).duplicated(keep="last")
    at = pd.Index(keys[last]).get_indexer(_keys(example, position + 1))
    forms = all_words["form"].to_numpy(dtype=object)[last]
    return pd.Series(np.where(at >= 0, forms[np.maximum(at, 0)], None), dtype=object)


def _decode_labels(chars: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Relations stored as concatenated UTF-8 bytes with their lengths -> (code per edge, the distinct relations,
    sorted as Python sorts str: UTF-8 bytes sort as code points)."""
    n = len(lengths)
    if not n:
        return np.zeros(0, dtype=np.int64), []
    lengths = lengths.astype(np.int64)
    width = max(int(lengths.max()), 1)
    grid = np.zeros((n, width), dtype=np.uint8)  # each relation's bytes, padded with NULs (the view drops them)
    rows = np.repeat(np.arange(n), lengths)
    columns = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    grid[rows, columns] = chars
    distinct, codes = np.unique(grid.view(f"S{width}").ravel(), return_inverse=True)
    return codes.ravel(), [bytes(b).decode("utf-8") for b in distinct]


def _per_bucket(hit: np.ndarray, first: np.ndarray, present: np.ndarray, n_buckets: int) -> np.ndarray:
    """Sums of `hit` (edges sorted by bucket, ...) per bucket, starting at rows `first`, as (..., n_buckets) counts."""
    out = np.zeros((n_buckets, *hit.shape[1:]), dtype=np.int64)
    if len(hit):
        out[present] = np.add.reduceat(hit.view(np.uint8), first, axis=0, dtype=np.int32)
    return np.moveaxis(out, 0, -1)


def _empty_counts(info: RunInfo, relations: list[str]) -> DependencyCounts:
    shape = (info.n_layers, info.n_heads)
    return DependencyCounts(
        info,
        relations,
        correct=np.zeros((2, *shape, len(relations))),
        totals=np.zeros(len(relations)),
        baseline=np.zeros((len(OFFSETS), len(relations))),
        n_root=0,
        baseline_root=np.zeros(len(OFFSETS)),
        no_prediction=np.zeros((2, *shape)),
    )


# The judged directions a part's counts hold: dep2head, and head2dep both ways (`head2dep` "transpose" or "direct").
JUDGED = ("dep2head", "transpose", "direct")


def _count_kept(arrays: dict[str, np.ndarray], poss_apostrophe: bool) -> tuple[list[str], dict[str, np.ndarray]]:
    """The counts of one part of the run's summary (its examples at once, from their predictions and gold trees): the
    part's relations (of its non-root words, sorted) and `correct` (JUDGED, layer, head, relation) hits, `edges`
    (relation,) edges, `baseline` (offset, relation) baseline hits, `root_words` and `baseline_root` (offset,), and
    `none` (JUDGED, layer, head) judged words (root included) with no prediction."""
    n_layers, n_heads = arrays["argmax"].shape[2:]
    n_edges = np.diff(arrays["edge_start"])
    edge = arrays["edge"]
    codes, names = _decode_labels(arrays["edge_label"], edge[:, EDGE_LABEL_BYTES])
    root = (edge[:, EDGE_FLAGS] & ROOT_FLAG) != 0
    relation_codes = np.unique(codes[~root])  # the part's relations (of non-root words), sorted
    relations = [names[c] for c in relation_codes]
    n_rel = len(relations)
    example = np.repeat(arrays["example"], n_edges)
    start = arrays["word_start"]
    sizes = np.diff(start)
    unit_first = np.repeat(start[:-1], sizes)  # per unit: the row of its example's first unit
    unit_keys = _keys(np.repeat(arrays["example"], sizes), arrays["word"])
    unit_order = np.argsort(unit_keys, kind="stable")
    sorted_keys = unit_keys[unit_order]

    def unit_of(keys: np.ndarray) -> np.ndarray:  # the row of each (example, position)'s unit, -1 where it has none
        if not len(sorted_keys):
            return np.full(len(keys), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
        return np.where(sorted_keys[at] == keys, unit_order[at], -1)

    d_pos = edge[:, EDGE_POSITION].astype(np.int64)
    h_pos = np.where(root, -1, edge[:, EDGE_HEAD]).astype(np.int64)  # -1: ROOT
    judged_pos = d_pos.copy()  # the word whose prediction is judged: the dependent, or the 's after a possessor
    if poss_apostrophe:
        possessor = np.isin(codes, [c for c, name in enumerate(names) if name in POSS_RELATIONS])
        judged_pos[possessor & ((edge[:, EDGE_FLAGS] & POSSESSIVE_NEXT_FLAG) != 0)] += 1
    dep = unit_of(_keys(example, d_pos))
    judged = unit_of(_keys(example, judged_pos))
    judged = np.where(judged >= 0, judged, dep)  # an 's cut by truncation: judge the dependent itself
    head = np.where(h_pos >= 0, unit_of(_keys(example, np.maximum(h_pos, 0))), -1)
    ok = (dep >= 0) & (root | (head >= 0))
    # edges sorted by relation, root words last (bucket n_rel)
    bucket_of_code = np.full(len(names), n_rel, dtype=np.int64)
    bucket_of_code[relation_codes] = np.arange(n_rel)
    bucket = np.where(root, n_rel, bucket_of_code[codes])
    order = np.flatnonzero(ok)
    order = order[np.argsort(bucket[order], kind="stable")]
    bucket, judged, head, h_pos, judged_pos = bucket[order], judged[order], head[order], h_pos[order], judged_pos[order]
    first, last = edge[order, EDGE_FIRST].astype(np.int64), edge[order, EDGE_LAST].astype(np.int64)  # the judged word's sentence
    present, starts = np.unique(bucket, return_index=True)
    has_head = (head >= 0)[:, None, None]
    head_local = np.where(head >= 0, head - unit_first[np.maximum(head, 0)], -1)[:, None, None]
    argmax = arrays["argmax"]
    hits = np.empty((len(order), len(JUDGED), n_layers, n_heads), dtype=bool)
    none = np.empty_like(hits)
    of_judged = argmax[judged]  # (edges, direction, layer, head); -1 never matches: `head` is checked >= 0
    hits[:, :2] = (of_judged == head_local[:, None]) & has_head[:, None]  # dep2head, and head2dep transposed
    none[:, :2] = of_judged < 0
    # head2dep "direct": the head word's most-attended word is the (judged) dependent
    of_head = argmax[np.where(head >= 0, head, judged), 0]
    hits[:, 2] = (of_head == (judged - unit_first[judged])[:, None, None]) & has_head
    none[:, 2] = (of_head < 0) | ~has_head
    correct = _per_bucket(hits, starts, present, n_rel + 1)  # (JUDGED, layer, head, bucket)
    edges = np.bincount(bucket, minlength=n_rel + 1)
    baseline = np.zeros((len(OFFSETS), n_rel + 1), dtype=np.int64)  # the fixed-offset baseline, clamped to the sentence
    for k, off in enumerate(OFFSETS):
        target = judged_pos + off
        pred = np.where(target < first, -1, np.minimum(target, last))
        baseline[k] = np.bincount(bucket[pred == h_pos], minlength=n_rel + 1)
    return relations, {
        "correct": correct[..., :n_rel],
        "edges": edges[:n_rel],
        "baseline": baseline[:, :n_rel],
        "root_words": edges[n_rel],
        "baseline_root": baseline[:, n_rel],
        "none": none.sum(0),
    }


POSS = {True: "poss", False: "plain"}  # the totals' fields for poss_apostrophe true / false


def relation_columns(labels: list[str], relations: list[str]) -> list[int]:
    """The column of each of `relations` (kept with a range's trees) among the run's relations in SQL (`labels`, a
    kind's labels: read from the same SQL rows before the pass); DamagedDataError where one is missing (the words
    changed in SQL after the trees were kept)."""
    index = {label: i for i, label in enumerate(labels)}
    unknown = sorted(set(relations) - set(index))
    if unknown:
        raise DamagedDataError(
            f"relation(s) {unknown} of kept dependency trees are not among the run's relations in SQL; re-ingest the run"
        )
    return [index[r] for r in relations]


def _word_argmax_totals(part: dict[str, np.ndarray], labels: list[str]) -> dict[str, np.ndarray]:
    """A range's counts on the run's relations (`labels`, sorted), for both `poss_apostrophe` settings and every judged
    direction (the counts a dependency query takes, whatever its parameters): `edges` (relation,) and `root_words`, and
    per setting S `correct.S` (JUDGED, layer, head, relation), `none.S` (JUDGED, layer, head), `baseline.S` (offset,
    relation), `baseline_root.S` (offset,). The edges, like the root words, do not depend on the setting. Counts of
    one range fit int32 (at most its words): half the bytes a whole-run query reads (`summary_totals` adds them as
    int64)."""
    out: dict[str, np.ndarray] = {}
    for poss_apostrophe, setting in POSS.items():
        relations, counts = _count_kept(part, poss_apostrophe)
        at = relation_columns(labels, relations)
        for name in ("correct", "baseline"):
            spread = np.zeros((*counts[name].shape[:-1], len(labels)), dtype=np.int32)
            spread[..., at] = counts[name]
            out[f"{name}.{setting}"] = spread
        out[f"baseline_root.{setting}"] = counts["baseline_root"].astype(np.int32)
        out[f"none.{setting}"] = counts["none"].astype(np.int32)
        out["edges"] = np.zeros(len(labels), dtype=np.int32)
        out["edges"][at] = counts["edges"]
        out["root_words"] = np.asarray(counts["root_words"], dtype=np.int64)
    return out


def run_relations(store: Store, info: RunInfo) -> list[str]:
    """The labels of the kinds that count per dependency relation: the run's relations, from SQL."""
    return store.dependency_relations(info.id)


# version 2: the gold tree (`edge`, `edge_label`) kept beside the predictions; its totals count on the run's relations
WORD_ARGMAX = register_kind(
    SummaryKind(
        "word_argmax",
        3,  # word maps compiled (queries/_words.c): float64 sums rounded to float32, not float32 products
        _word_argmax_prepare,
        _word_argmax_reduce,
        ragged=("word", "argmax", "edge", "edge_label"),
        totals=_word_argmax_totals,
        labels=run_relations,
        threads=True,
        integer_totals=True,
    )
)


def dependency_counts(store: Store, run, head2dep: str = "transpose", poss_apostrophe: bool = True) -> DependencyCounts:
    """Correct predictions per (direction, layer, head, relation), edge counts, baseline hits, root words.

    `relations` are those of the non-root words of the run's stored examples (skipped ones not evaluated), whatever
    `examples`. Counted from the word-level predictions and gold trees of the `WORD_ARGMAX` summary: for the whole run
    its kept ranges' counts added (O(ranges)), else each part's.
    """
    _check("head2dep", head2dep, HEAD2DEP)
    info = store.run_info(run)
    totals = summary_totals(store, info, WORD_ARGMAX)
    relations = totals.pop("labels").tolist()
    if not totals:  # no example
        return _empty_counts(info, relations)
    setting, judged = POSS[poss_apostrophe], [0, JUDGED.index(head2dep)]
    return DependencyCounts(
        info,
        relations,
        correct=totals[f"correct.{setting}"][judged],
        totals=totals["edges"],
        baseline=totals[f"baseline.{setting}"],
        n_root=int(totals["root_words"]),
        baseline_root=totals[f"baseline_root.{setting}"],
        no_prediction=totals[f"none.{setting}"][judged],
    )


@register("dependency", sources=MAP_SOURCES)
def dependency(
    store: Store,
    *,
    run,
    min_count: int = 100,
    head2dep: str = "transpose",
    poss_apostrophe: bool = True,
) -> pd.DataFrame:
    """Per head, accuracy at finding the gold head of each relation's dependents, in both directions.

    Columns: layer, head, then `<relation>:<direction>` for every relation with at least
    `min_count` edges (UD labels as stored; see `dependency_summary` for the paper's
    labels). dep2head: the dependent's most-attended other word is its head; head2dep:
    the word attending most to the dependent is its head (head2dep="transpose", the
    authors' code) or the head's most-attended word is the dependent ("direct").
    poss_apostrophe: judge the 's after a possessor instead (the paper's poss rule).
    Needs a run over a corpus with dependency trees (gold CoNLL-U, or spaCy's).
    """
    counts = dependency_counts(store, run, head2dep, poss_apostrophe)
    columns = {}
    for r, rel in enumerate(counts.relations):
        if counts.totals[r] >= min_count:
            for d, direction in enumerate(DIRECTIONS):
                columns[f"{rel}:{direction}"] = counts.correct[d, :, :, r] / counts.totals[r]
    frame = per_head_frame(counts.info, **columns)
    note_left_out(frame, counts.totals, min_count)
    return frame


@register("dependency_summary", per_head=False, sources=MAP_SOURCES)
def dependency_summary(
    store: Store,
    *,
    run,
    min_count: int = 100,
    direction: str = "best",
    head2dep: str = "transpose",
    root_in_all: bool = True,
    poss_apostrophe: bool = True,
) -> pd.DataFrame:
    """Table 1 of Clark et al.: per relation, the best head against the best fixed offset.

    Columns: relation (UD; `all` = every evaluated word), paper_relation (Clark et al.'s label,
    where one maps), direction, n (edges), layer, head, accuracy (the best head),
    baseline_offset, baseline_accuracy. direction="best" (default, the paper's Table 1): one
    row per relation, the best head over both directions (`direction` says which; ties go to
    dep2head, then the lowest layer and head); "each": a row per relation and direction;
    "dep2head" / "head2dep": that direction only. root_in_all (default true, the authors'
    code): root words count in `all` (always wrong for attention; the clamped baseline gets
    a root right when its offset falls before the sentence). Relations with fewer than
    `min_count` edges are left out; head2dep and poss_apostrophe as in `dependency`.
    """
    _check("direction", direction, SUMMARY_DIRECTIONS)
    counts = dependency_counts(store, run, head2dep, poss_apostrophe)
    paper = defaultdict(str)
    for label, uds in PAPER_RELATIONS.items():
        for ud in uds:
            paper[ud] = label
    # "all": every edge whatever its relation, and the root words (the paper's first row)
    n_root = counts.n_root if root_in_all else 0
    relations = ["all", *counts.relations]
    correct = np.concatenate([counts.correct.sum(-1, keepdims=True), counts.correct], axis=-1)
    baseline_all = counts.baseline.sum(-1) + (counts.baseline_root if root_in_all else 0)
    baseline = np.concatenate([baseline_all[:, None], counts.baseline], axis=-1)
    totals = np.concatenate([[counts.totals.sum() + n_root], counts.totals])
    paper["all"] = "All"
    groups: dict[str, list[tuple[int, ...]]] = {"best": [(0, 1)], "each": [(0,), (1,)], "dep2head": [(0,)], "head2dep": [(1,)]}
    chosen = groups[direction]
    rows = []
    for r, rel in enumerate(relations):
        if totals[r] < min_count or totals[r] == 0:
            continue
        k = int(np.argmax(baseline[:, r]))
        for group in chosen:
            acc = correct[list(group), :, :, r] / totals[r]  # (directions, layer, head)
            d, layer, head = np.unravel_index(np.argmax(acc), acc.shape)
            rows.append(
                dict(
                    relation=rel,
                    paper_relation=paper[rel],
                    direction=DIRECTIONS[group[d]],
                    n=int(totals[r]),
                    layer=int(layer),
                    head=int(head),
                    accuracy=float(acc[d, layer, head]),
                    baseline_offset=OFFSETS[k],
                    baseline_accuracy=float(baseline[k, r] / totals[r]),
                )
            )
    frame = pd.DataFrame(
        rows, columns=["relation", "paper_relation", "direction", "n", "layer", "head", "accuracy", "baseline_offset", "baseline_accuracy"]
    )
    note_left_out(frame, counts.totals, min_count)
    return frame
