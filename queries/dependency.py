"""C6 (Clark et al. 2019, Sec. 4.2, Table 1): heads that find a word's syntactic head (or dependents).

For each head and relation: the accuracy of "the dependent's most-attended other word
is its gold head" (direction `dep2head`) and of "the head's most-attended other word is
the dependent" (`head2dep`), on word-level maps (C5) with special tokens ignored. The
baseline predicts the word at the best fixed offset (-3..3, not 0) for each relation.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from .common import iter_maps, per_head_frame
from .registry import register
from .word_level import most_attended_words, units_of

DIRECTIONS = ("dep2head", "head2dep")
OFFSETS = (-3, -2, -1, 1, 2, 3)
# Clark et al.'s Stanford Dependencies labels and the UD labels used for them here.
# Approximate where the schemes attach words differently: UD attaches a preposition to
# its noun (`case`), SD to the verb/noun it modifies (`prep`); the noun of a PP is UD
# `obl`/`nmod` (attached to the verb/noun), SD `pobj` (attached to the preposition).
PAPER_RELATIONS = {
    "prep": ("case",), "pobj": ("obl", "nmod"), "det": ("det",), "nn": ("compound",), "nsubj": ("nsubj",),
    "amod": ("amod",), "dobj": ("obj",), "advmod": ("advmod",), "aux": ("aux",), "poss": ("nmod:poss",),
    "auxpass": ("aux:pass",), "ccomp": ("ccomp",), "mark": ("mark",), "prt": ("compound:prt",),
}


def _groups(frame: pd.DataFrame) -> dict[int, pd.DataFrame]:
    return {int(k): g for k, g in frame.groupby("example", sort=False)}


def dependency_counts(store, run, examples=None):
    """Correct predictions per (direction, layer, head, relation), edge counts and baseline hits."""
    info = store.run_info(run)
    words = store.word_table(info.id)
    words = words[words["head"].notna() & words["deprel"].notna()]
    relations = sorted(set(words["deprel"]))
    rel_index = {r: i for i, r in enumerate(relations)}
    tokens = _groups(store.token_table(info.id)[["example", "word_position"]])
    edges = _groups(words)
    correct = np.zeros((2, info.n_layers, info.n_heads, len(relations)))
    baseline = np.zeros((2, len(OFFSETS), len(relations)))
    totals = np.zeros(len(relations))
    for example, maps in iter_maps(store, info, examples):
        if example not in edges:
            continue
        pred, unit_words = most_attended_words(maps, units_of(tokens[example]["word_position"]))
        word_units = {int(w): i for i, w in enumerate(unit_words)}
        e = edges[example]
        dep = np.array([word_units.get(int(p), -1) for p in e["position"]])
        head = np.array([word_units.get(int(p), -1) for p in e["head"]])
        ok = (dep >= 0) & (head >= 0)
        dep, head = dep[ok], head[ok]
        rel = np.array([rel_index[r] for r in e["deprel"][ok]], dtype=np.int64)
        onehot = np.zeros((len(rel), len(relations)))
        onehot[np.arange(len(rel)), rel] = 1
        correct[0] += (pred[:, :, dep] == head) @ onehot
        correct[1] += (pred[:, :, head] == dep) @ onehot
        totals += onehot.sum(0)
        d_pos, h_pos = e["position"].to_numpy()[ok], e["head"].to_numpy(dtype=np.int64)[ok]
        for k, off in enumerate(OFFSETS):
            baseline[0, k] += (h_pos == d_pos + off) @ onehot
            baseline[1, k] += (d_pos == h_pos + off) @ onehot
    return info, relations, correct, totals, baseline


@register("dependency")
def dependency(store, *, run, examples=None, min_count: int = 100) -> pd.DataFrame:
    """Per head, accuracy at finding the gold head (dep2head) or dependent (head2dep) of each relation.

    Columns: layer, head, then `<relation>:<direction>` for every relation with at least
    `min_count` edges (UD labels as stored; see `dependency_summary` for the paper's
    labels). Needs a run over a corpus with dependency trees (gold CoNLL-U, or spaCy's).
    """
    info, relations, correct, totals, _ = dependency_counts(store, run, examples)
    columns = {}
    for r, rel in enumerate(relations):
        if totals[r] >= min_count:
            for d, direction in enumerate(DIRECTIONS):
                columns[f"{rel}:{direction}"] = correct[d, :, :, r] / totals[r]
    return per_head_frame(info, **columns)


@register("dependency_summary", per_head=False)
def dependency_summary(store, *, run, examples=None, min_count: int = 100) -> pd.DataFrame:
    """Table 1 of Clark et al.: per relation and direction, the best head against the best fixed offset.

    Columns: relation (UD; `all` pools every edge), paper_relation (Clark et al.'s label, where one maps),
    direction, n (edges), layer, head, accuracy (the best head), baseline_offset,
    baseline_accuracy. Relations with fewer than `min_count` edges are left out.
    """
    info, relations, correct, totals, baseline = dependency_counts(store, run, examples)
    paper = defaultdict(str)
    for label, uds in PAPER_RELATIONS.items():
        for ud in uds:
            paper[ud] = label
    # "all": every edge whatever its relation (the paper's first row)
    relations = ["all", *relations]
    correct = np.concatenate([correct.sum(-1, keepdims=True), correct], axis=-1)
    baseline = np.concatenate([baseline.sum(-1, keepdims=True), baseline], axis=-1)
    totals = np.concatenate([[totals.sum()], totals])
    paper["all"] = "All"
    rows = []
    for r, rel in enumerate(relations):
        if totals[r] < min_count:
            continue
        for d, direction in enumerate(DIRECTIONS):
            acc = correct[d, :, :, r] / totals[r]
            layer, head = np.unravel_index(np.argmax(acc), acc.shape)
            k = int(np.argmax(baseline[d, :, r]))
            rows.append(dict(relation=rel, paper_relation=paper[rel], direction=direction, n=int(totals[r]),
                             layer=int(layer), head=int(head), accuracy=float(acc[layer, head]),
                             baseline_offset=OFFSETS[k], baseline_accuracy=float(baseline[d, k, r] / totals[r])))
    return pd.DataFrame(rows, columns=["relation", "paper_relation", "direction", "n", "layer", "head", "accuracy",
                                       "baseline_offset", "baseline_accuracy"])
