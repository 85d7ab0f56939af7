"""K6 (Kovaleva et al. 2019, Sec. 4.5, Fig. 7): token-to-token attention and what [CLS] attends to.

`token_to_token`: per head, attention between linked words -- a verb and its subject (both
directions) and nouns and pronouns of the same sentence (both directions). By default as the
authors' notebook computes it, at token level: per example the largest weight from a token of
A to a token of B over its linked pairs (statistic="token_max"); statistic="word_mean" takes
word-level maps instead (C5 convention: attention *to* a word sums its pieces, *from* a word
averages them) and the mean over the example's pairs.
`cls_feature_attention`: in one layer (the last by default), the attention *from* the first
special token to each feature type of K5: the largest over the type's tokens (pool="max", the
paper's Sec. 4.4 rule and the notebook), or their sum (pool="sum").

`token_to_token` reads each example's per-relation numbers (summary kind `kovaleva_relations`,
queries/engine/), `cls_feature_attention` those of K5 (`kovaleva_features`, every layer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import parse_choices
from .engine import MAP_SOURCES, SummaryKind, register, register_kind, summary_totals
from .errors import InvalidArgumentError
from .feature_attention import (
    FEATURES,
    NOUN_UPOS,
    PRONOUN_UPOS,
    SUBJECT_DEPRELS,
    VERB_UPOS,
    feature_totals,
    long_frame,
    masked_sum,
    parse_features,
)
from .word_level import units_of, word_level

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

RELATIONS = ("verb_to_subject", "subject_to_verb", "noun_to_pronoun", "pronoun_to_noun")
STATISTICS = ("token_max", "word_mean")
POOLS = ("max", "sum")


def parse_relations(relations: str | None) -> tuple[str, ...]:
    return parse_choices(relations, RELATIONS, "relation")


def relation_pairs(words: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per relation, the linked word pairs of a run: columns example, a (from word), b (to word) positions.

    verb/subject: a word whose relation is a subject (nsubj, nsubj:pass, nsubjpass) and its
    head word, when the head's UPOS is VERB. noun/pronoun: every noun (NOUN, PROPN) and every
    pronoun (PRON) of the same example, segment and sentence.
    """
    words = words.assign(
        upos=words["upos"].fillna(""),
        deprel=words["deprel"].fillna("").str.lower(),
        sentence=words["sentence"].fillna(0) if "sentence" in words else 0,
    )
    subjects = words[words["deprel"].isin(SUBJECT_DEPRELS) & words["head"].notna()]
    subjects = subjects.assign(head=subjects["head"].astype("int64"))[["example", "position", "head"]]
    verbs = words[words["upos"].isin(VERB_UPOS)][["example", "position"]].rename(columns={"position": "head"})
    sv = subjects.merge(verbs, on=["example", "head"]).rename(columns={"position": "subject", "head": "verb"})
    where = ["example", "segment", "sentence"]
    nouns = words[words["upos"].isin(NOUN_UPOS)][[*where, "position"]].rename(columns={"position": "noun"})
    pronouns = words[words["upos"].isin(PRONOUN_UPOS)][[*where, "position"]].rename(columns={"position": "pronoun"})
    np_ = nouns.merge(pronouns, on=where)

    def pairs(frame, a, b):
        return frame[["example", a, b]].set_axis(["example", "a", "b"], axis=1).sort_values(["example", "a", "b"])

    return {
        "verb_to_subject": pairs(sv, "verb", "subject"),
        "subject_to_verb": pairs(sv, "subject", "verb"),
        "noun_to_pronoun": pairs(np_, "noun", "pronoun"),
        "pronoun_to_noun": pairs(np_, "pronoun", "noun"),
    }


def by_example(frame: pd.DataFrame, columns) -> dict[int, np.ndarray]:
    """Rows of a frame sorted by example, as example -> (n, len(columns)) array."""
    if frame.empty:
        return {}
    examples = frame["example"].to_numpy()
    values = frame[list(columns)].to_numpy()
    starts = np.r_[0, np.flatnonzero(np.diff(examples)) + 1]
    ends = np.r_[starts[1:], len(examples)]
    return {int(examples[s]): values[s:e] for s, e in zip(starts, ends)}


def relation_units(store: Store, info: RunInfo, names=RELATIONS, examples=None) -> dict[int, tuple[np.ndarray, dict[str, np.ndarray]]]:
    """Per example (of `examples`, default all) that has a linked pair of one of `names`: its word positions (per
    token) and, per relation, the (from unit, to unit) pairs of the word-level map; pairs whose words have no unit
    (cut by truncation) dropped."""
    found = relation_pairs(store.word_table(info.id, examples))
    pairs = {r: by_example(found[r], ["a", "b"]) for r in names}
    table = store.token_table(info.id, examples)
    tokens = by_example(table.assign(word_position=table["word_position"].astype(float)), ["word_position"])
    out = {}
    for example in sorted(set().union(*(pairs[r] for r in names)) & tokens.keys()):
        word_positions = tokens[example][:, 0]
        units = units_of(word_positions)
        index = {int(w): u for u, w in enumerate(units.word) if w >= 0}
        wanted = {}
        for r in names:
            linked = [(index[a], index[b]) for a, b in pairs[r].get(example, ()) if a in index and b in index]
            if linked:
                wanted[r] = np.array(linked)
        if wanted:
            out[example] = (word_positions, wanted)
    return out


def _relations_prepare(store: Store, info: RunInfo, examples=None):
    return relation_units(store, info, examples=examples)


def _relations_reduce(linked, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    """One example's numbers for each relation (every layer and head): the mean word-level attention over its pairs,
    the largest token-to-token weight over its pairs' tokens, and the number of pairs."""
    means = np.zeros((len(RELATIONS), *maps.shape[:2]))
    token_max = np.zeros((len(RELATIONS), *maps.shape[:2]))
    n_pairs = np.zeros(len(RELATIONS), dtype=np.int64)
    if example in linked:
        word_positions, wanted = linked[example]
        units = units_of(word_positions)
        wmap = word_level(maps, units).astype(np.float64)  # (layer, head, from unit, to unit)
        pieces = units.assign.astype(bool)  # (units, tokens)
        for r, uv in wanted.items():
            i = RELATIONS.index(r)
            means[i] = wmap[:, :, uv[:, 0], uv[:, 1]].mean(-1)
            cells = (pieces[uv[:, 0], :, None] & pieces[uv[:, 1], None, :]).any(0)  # (from token, to token) of any pair
            token_max[i] = maps[:, :, cells].max(-1)
            n_pairs[i] = len(uv)
    return {"relation_pairs": n_pairs, "relation_mean": means, "relation_token_max": token_max}


def _relations_totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A range's reduction, what `token_to_token` adds: both statistics summed over the examples with a pair of the
    relation, (relation, layer, head), those examples' count and their pairs' per relation."""
    pairs = part["relation_pairs"]  # (example, relation)
    used = pairs > 0
    out = {name: masked_sum(part[name], used) for name in ("relation_mean", "relation_token_max")}
    out["n_examples"] = used.sum(0).astype(np.int64)
    out["n_pairs"] = pairs.sum(0, dtype=np.int64)
    return out


# relation_mean / relation_token_max: (relation in RELATIONS order, layer, head), 0 where the example has no pair
# (relation_pairs 0). Version 2: relation_token_max; 3: word maps compiled (queries/_words.c: float64 sums rounded to
# float32, not float32 products).
KOVALEVA_RELATIONS = register_kind(
    SummaryKind("kovaleva_relations", 3, _relations_prepare, _relations_reduce, totals=_relations_totals, threads=True)
)


@register("token_to_token", per_head=False, sources=MAP_SOURCES)
def token_to_token(store: Store, *, run, relations: str | None = None, statistic: str = "token_max") -> pd.DataFrame:
    """Kovaleva K6: per head, attention between linked words: verb->subject, subject->verb, noun->pronoun, pronoun->noun.

    statistic="token_max" (default, the authors' notebook): per example, the largest
    attention weight from a token of word A to a token of word B over the example's linked
    pairs (A, B); statistic="word_mean": per pair the attention from word A to word B on
    the word-level map (summed over B's pieces, averaged over A's pieces), averaged over the
    example's pairs. Either way then averaged over the examples that have at least one pair
    of that relation.
    Columns: layer, head, relation, value, n_examples, n_pairs.
    `relations`: comma-separated subset of verb_to_subject, subject_to_verb, noun_to_pronoun, pronoun_to_noun.
    """
    if statistic not in STATISTICS:
        raise InvalidArgumentError(
            f"statistic={statistic!r}: use 'token_max' (the largest token-to-token weight over the linked pairs, the "
            "authors' notebook) or 'word_mean' (the mean over pairs of word-level attention)"
        )
    field = "relation_token_max" if statistic == "token_max" else "relation_mean"
    names = parse_relations(relations)
    info = store.run_info(run)
    # per-example numbers kept with the run (queries/engine/); the whole run adds their kept range reductions
    totals = summary_totals(store, info, KOVALEVA_RELATIONS)
    total = {r: totals[field][RELATIONS.index(r)] for r in names}
    count = {r: int(totals["n_examples"][RELATIONS.index(r)]) for r in names}
    n_pairs = {r: int(totals["n_pairs"][RELATIONS.index(r)]) for r in names}
    frame = long_frame(range(info.n_layers), info.n_heads, names, total, count, "relation")
    frame["n_pairs"] = frame["relation"].map(n_pairs).astype(int)
    return frame


@register("cls_feature_attention", per_head=False, sources=MAP_SOURCES)
def cls_feature_attention(
    store: Store,
    *,
    run,
    layer: int | None = None,
    features: str | None = None,
    pool: str = "max",
) -> pd.DataFrame:
    """Kovaleva K6 (Fig. 7): attention from the first special token ([CLS]-like) to each K5 feature, in one layer.

    For each example and head of `layer` (default: the last): the attention the first
    [CLS]-like token pays to the feature's tokens, the largest over them (pool="max",
    default: the paper's Sec. 4.4 rule and the authors' notebook) or their sum (pool="sum");
    averaged over the examples that contain the feature (and a [CLS]-like token).
    Columns: layer, head, feature, value, mean_over_heads (the feature's value averaged over
    the layer's heads), n_examples.
    """
    if pool not in POOLS:
        raise InvalidArgumentError(
            f"pool={pool!r}: use 'max' (the largest weight among the feature's tokens, the paper's rule) or 'sum' (their total)"
        )
    field = "cls_to_feature_max" if pool == "max" else "cls_to_feature"
    names = parse_features(features)
    info = store.run_info(run)
    if layer is None:
        layer = info.n_layers - 1
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < info.n_layers:
        raise InvalidArgumentError(f"layer {layer!r} is out of range: the model has {info.n_layers} layers (0..{info.n_layers - 1})")
    totals = feature_totals(store, info)  # per-example sums, every layer (queries/feature_attention.py)
    total = {f: totals[field][FEATURES.index(f), layer][None] for f in names}
    count = {f: int(totals["n_cls_feature"][FEATURES.index(f)]) for f in names}
    frame = long_frame([int(layer)], info.n_heads, names, total, count, "feature")
    frame.insert(frame.columns.get_loc("value") + 1, "mean_over_heads", frame.groupby("feature", sort=False)["value"].transform("mean"))
    return frame
