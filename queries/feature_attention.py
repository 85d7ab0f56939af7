"""K5 (Kovaleva et al. 2019, Sec. 4.4, Fig. 6): attention each head pays to linguistic features.

Features are decided at word level from the stored annotation (UPOS, dependency relation,
form) and then cover *every* wordpiece of a matching word; the first special token
([CLS]-like) and the separators ([SEP]-like) come from the tokenizer's recorded ids.
The feature definitions here are shared with `token_to_token` (K6).

Each example's numbers for K5 and `cls_feature_attention` (every feature, layer and head) are
the summary kind `kovaleva_features` (queries/engine/), kept with the run: the queries read
them instead of decoding the maps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import TokenFlags, parse_choices, token_flags
from .engine import MAP_SOURCES, SummaryKind, register, register_kind, summary_totals

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

# Paper, footnote 6: the authors' list of negation words.
NEGATION_WORDS = frozenset(
    {
        "neither",
        "nor",
        "not",
        "never",
        "none",
        "don't",
        "won't",
        "didn't",
        "hadn't",
        "haven't",
        "can't",
        "isn't",
        "wasn't",
        "shouldn't",
        "couldn't",
        "nothing",
        "nowhere",
    }
)
NOUN_UPOS = frozenset({"NOUN", "PROPN"})  # the authors' PTB tags NN, NNS, NNP, NNPS
VERB_UPOS = frozenset({"VERB"})
PRONOUN_UPOS = frozenset({"PRON"})
# UD labels (gold treebanks) and the ClearNLP labels spaCy's English pipelines write.
SUBJECT_DEPRELS = frozenset({"nsubj", "nsubj:pass", "nsubjpass"})
OBJECT_DEPRELS = frozenset({"obj", "iobj", "dobj", "dative"})

WORD_FEATURES = ("noun", "verb", "pronoun", "subject", "object", "negation")
FEATURES = (*WORD_FEATURES, "cls", "sep")

_EDGE_PUNCT = re.compile(r"^\W+|\W+$")


def parse_features(features: str | None) -> tuple[str, ...]:
    """'noun,sep' -> ('noun', 'sep'); None or '' -> every feature. Unknown names raise InvalidArgumentError."""
    return parse_choices(features, FEATURES, "feature")


def normalise_form(form) -> str:
    """Lower case, typographic apostrophe as ', punctuation stripped from both ends ("Don't," -> "don't")."""
    if not isinstance(form, str):
        return ""
    return _EDGE_PUNCT.sub("", form.lower().replace("\u2019", "'"))


def negation_flags(words: pd.DataFrame) -> np.ndarray:
    """Which words are negation words (paper's list), for a words frame sorted by example and position.

    A word matches when its normalised form is on the list ("not", "never", or "don't" kept whole
    by a whitespace tokenizer). A contraction split by the annotator ("do" + "n't", "ca" + "n't",
    as spaCy and UD write them) matches when host + "n't" is on the list, and then *both* words
    count. Contractions not on the list ("doesn't", "aren't") do not match, as in the paper.
    """
    forms = words["form"].map(normalise_form)
    whole = forms.isin(NEGATION_WORDS).to_numpy()
    same = words["example"].to_numpy()[1:] == words["example"].to_numpy()[:-1]
    if "segment" in words:
        same &= words["segment"].to_numpy()[1:] == words["segment"].to_numpy()[:-1]
    clitic = (forms.to_numpy()[1:] == "n't") & same
    joined = np.array([f"{host}n't" in NEGATION_WORDS for host in forms.to_numpy()[:-1]], dtype=bool)
    split = clitic & joined  # True at the host's index
    out = whole.copy()
    out[:-1] |= split
    out[1:] |= split
    return out


def word_feature_table(words: pd.DataFrame) -> pd.DataFrame:
    """Per word (example, position): one boolean column per word-level feature."""
    words = words.sort_values(["example", "position"]).reset_index(drop=True)
    upos = words["upos"].fillna("")
    deprel = words["deprel"].fillna("").str.lower()
    return pd.DataFrame(
        {
            "example": words["example"].to_numpy(),
            "position": words["position"].to_numpy(),
            "noun": upos.isin(NOUN_UPOS).to_numpy(),
            "verb": upos.isin(VERB_UPOS).to_numpy(),
            "pronoun": upos.isin(PRONOUN_UPOS).to_numpy(),
            "subject": deprel.isin(SUBJECT_DEPRELS).to_numpy(),
            "object": deprel.isin(OBJECT_DEPRELS).to_numpy(),
            "negation": negation_flags(words) if len(words) else np.zeros(0, dtype=bool),
        }
    )


@dataclass(frozen=True)
class FeatureMasks:
    """Per example: feature name -> boolean mask over its tokens (length L)."""

    masks: dict[int, dict[str, np.ndarray]]
    flags: dict[int, TokenFlags]


def feature_masks(store: Store, info, features=FEATURES, examples=None) -> FeatureMasks:
    """Token masks of every feature for every stored example of a run (or of `examples`).

    Word features cover every wordpiece of a matching word (special tokens never match);
    `cls` / `sep` are the tokens with the tokenizer's recorded cls/bos and sep/eos ids.
    """
    flags = token_flags(store, info, examples=examples)
    tokens = store.token_table(info.id, examples)[["example", "position", "word_position"]]
    tokens = tokens.assign(word_position=pd.array(tokens["word_position"], dtype="Int64"))
    wanted = [f for f in features if f in WORD_FEATURES]
    if wanted:
        table = word_feature_table(store.word_table(info.id, examples))
        table = table.assign(position=pd.array(table["position"], dtype="Int64"))
        tokens = tokens.merge(
            table[["example", "position", *wanted]].rename(columns={"position": "word_position"}),
            on=["example", "word_position"],
            how="left",
        )
        for f in wanted:
            tokens[f] = tokens[f].astype("boolean").fillna(False).astype(bool)
    tokens = tokens.sort_values(["example", "position"], kind="stable")
    examples = tokens["example"].to_numpy()
    values = {f: tokens[f].to_numpy(bool) for f in wanted}
    starts = np.r_[0, np.flatnonzero(np.diff(examples)) + 1]
    ends = np.r_[starts[1:], len(examples)]
    masks: dict[int, dict[str, np.ndarray]] = {}
    for start, end in zip(starts, ends):
        if end <= start:
            continue
        ex = int(examples[start])
        per = {f: values[f][start:end] for f in wanted}
        if "cls" in features:
            per["cls"] = flags[ex].cls
        if "sep" in features:
            per["sep"] = flags[ex].sep
        masks[ex] = per
    return FeatureMasks(masks, flags)


# ---------------------------------------------------------------- kept per-example sums (queries/engine/)


def _features_prepare(store: Store, info: RunInfo, examples=None) -> FeatureMasks:
    return feature_masks(store, info, FEATURES, examples)


def _features_reduce(fm: FeatureMasks, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    """One example's numbers for K5 and `cls_feature_attention`, for every feature and every layer and head."""
    masks = fm.masks[example]
    shape = (len(FEATURES), *maps.shape[:2])
    n_tokens = np.array([int(masks[f].sum()) for f in FEATURES], dtype=np.int64)
    received = maps.sum(axis=2, dtype=np.float64) / maps.shape[-1]  # (layer, head, key): column means
    feature_max = np.zeros(shape)
    cls_to_feature = np.zeros(shape)
    cls_to_feature_max = np.zeros(shape)
    cls = np.flatnonzero(fm.flags[example].cls)
    rows = maps[:, :, cls[0], :].astype(np.float64) if len(cls) else None  # (layer, head, key)
    for i, f in enumerate(FEATURES):
        if n_tokens[i]:
            feature_max[i] = received[..., masks[f]].max(-1)
            if rows is not None:
                cls_to_feature[i] = rows[..., masks[f]].sum(-1)
                cls_to_feature_max[i] = rows[..., masks[f]].max(-1)
    return {
        "feature_tokens": n_tokens,
        "cls_position": np.asarray(cls[0] if len(cls) else -1, dtype=np.int64),
        "feature_max": feature_max,
        "cls_to_feature": cls_to_feature,
        "cls_to_feature_max": cls_to_feature_max,
    }


def _features_totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A range's reduction, what `feature_attention` and `cls_feature_attention` add: each field summed over the examples
    that count for it (with the feature; and a [CLS]-like token, for cls_to_feature*), (feature, layer, head), and those
    examples' counts per feature (`n_feature`, `n_cls_feature`)."""
    used = part["feature_tokens"] > 0  # (example, feature)
    with_cls = used & (part["cls_position"] >= 0)[:, None]
    out = {name: masked_sum(part[name], used) for name in ("feature_max",)}
    out.update({name: masked_sum(part[name], with_cls) for name in ("cls_to_feature", "cls_to_feature_max")})
    out["n_feature"] = used.sum(0).astype(np.int64)
    out["n_cls_feature"] = with_cls.sum(0).astype(np.int64)
    return out


def masked_sum(values: np.ndarray, used: np.ndarray) -> np.ndarray:
    """values (example, k, ...) summed over the examples where used (example, k): (k, ...), float64."""
    return values.sum(0, dtype=np.float64, where=used.reshape(used.shape + (1,) * (values.ndim - used.ndim)))


# feature_max / cls_to_feature / cls_to_feature_max: (feature in FEATURES order, layer, head), 0 where the example lacks
# the feature (feature_tokens 0) or, for cls_to_feature*, a [CLS]-like token (cls_position -1): the [CLS] row's sum
# and largest weight over the feature's tokens. Version 2: cls_to_feature_max.
KOVALEVA_FEATURES = register_kind(
    SummaryKind("kovaleva_features", 2, _features_prepare, _features_reduce, totals=_features_totals, threads=True)
)


def feature_totals(store: Store, info: RunInfo) -> dict[str, np.ndarray]:
    """The K5 totals (`_features_totals`) of the asked-for examples (queries/engine/request.py): the whole run adds its kept
    range reductions (O(ranges), queries/engine/totals.py `summary_totals`), a subset each part's."""
    return summary_totals(store, info, KOVALEVA_FEATURES)


@register("feature_attention", per_head=False, sources=MAP_SOURCES)
def feature_attention(store: Store, *, run, features: str | None = None) -> pd.DataFrame:
    """Kovaleva K5: per head, normalised attention received by nouns, verbs, ... negation, [CLS], [SEP] (long format).

    For each example and head, a token's score is the sum over all query tokens of the
    attention they pay it, divided by L (the mean of its column); the example's value for a
    feature is the highest score among the feature's tokens; examples without the feature are
    skipped; the result is the mean over the remaining examples.
    Columns: layer, head, feature, value, n_examples (examples that had the feature).
    `features`: comma-separated subset of noun, verb, pronoun, subject, object, negation, cls, sep.
    """
    names = parse_features(features)
    info = store.run_info(run)
    totals = feature_totals(store, info)
    total = {f: totals["feature_max"][FEATURES.index(f)] for f in names}
    count = {f: int(totals["n_feature"][FEATURES.index(f)]) for f in names}
    return long_frame(range(info.n_layers), info.n_heads, names, total, count, "feature")


def long_frame(layers, n_heads: int, names, total: dict, count: dict, key: str) -> pd.DataFrame:
    """Rows (layer, head, key, value, n_examples) from per-name (layer, head) sums and example counts."""
    layer, head = np.meshgrid(np.asarray(list(layers)), np.arange(n_heads), indexing="ij")
    parts = []
    for name in names:
        n = count[name]
        value = total[name] / n if n else np.full(layer.shape, np.nan)
        parts.append(
            pd.DataFrame(
                {"layer": layer.ravel(), "head": head.ravel(), key: name, "value": np.asarray(value, dtype=float).ravel(), "n_examples": n}
            )
        )
    return pd.concat(parts, ignore_index=True)
