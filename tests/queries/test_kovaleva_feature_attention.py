"""K5 `feature_attention` on hand-built maps: every expected value is worked out by hand below; the per-example
numbers kept with the run (summary kind `kovaleva_features`) give the naive reference's results (tests/queries/reference.py)."""

import numpy as np
import pandas as pd
import pytest

from attnstore.queries import run_query
from attnstore.queries.feature_attention import negation_flags
from attnstore.store.errors import InvalidArgumentError
from attnstore.tests.queries.helpers import check_kept_frames, check_read_only_and_grown_rebuilt, random_maps, summary_group

# Example 0: "She do n't like cats" -- a pronoun subject, a split contraction (do + n't, pieces n ' t), verb, noun object.
TOKENS_0 = ["[CLS]", "she", "do", "n", "'", "t", "like", "cats", "[SEP]"]
WORDS_0 = [
    dict(form="She", upos="PRON", deprel="nsubj", head=3),
    dict(form="do", upos="AUX", deprel="aux", head=3),
    dict(form="n't", upos="PART", deprel="advmod", head=3),
    dict(form="like", upos="VERB", deprel="root"),
    dict(form="cats", upos="NOUN", deprel="obj", head=3),
]
TW_0 = [None, 0, 1, 2, 2, 2, 3, 4, None]
# Example 1, two segments: "dogs bark" / "birds sing"; "bark" is split (bar ##k); no pronoun, object or negation.
TOKENS_1 = ["[CLS]", "dogs", "bar", "##k", "[SEP]", "birds", "sing", "[SEP]"]
WORDS_1 = [
    dict(form="dogs", upos="NOUN", deprel="nsubj", head=1),
    dict(form="bark", upos="VERB", deprel="root"),
    dict(form="birds", upos="NOUN", deprel="nsubj", head=3, segment=1),
    dict(form="sing", upos="VERB", deprel="root", segment=1),
]
TW_1 = [None, 0, 1, 1, None, 2, 3, None]
# Example 2: "Never, does n't": "Never," matches after stripping the comma (both pieces count);
# "does" + "n't" = "doesn't" is not on the paper's list, so neither word is a negation.
TOKENS_2 = ["[CLS]", "never", ",", "does", "n", "'", "t", "[SEP]"]
WORDS_2 = [dict(form="Never,", upos="ADV"), dict(form="does", upos="AUX"), dict(form="n't", upos="PART")]
TW_2 = [None, 0, 0, 1, 2, 2, 2, None]

# Head "one-hot": each query row puts all its attention on one key (row i -> key TARGETS[i]).
TARGETS = [[0, 0, 3, 3, 3, 6, 7, 8, 8], [0, 2, 3, 3, 4, 7, 7, 7], [0, 2, 2, 4, 4, 4, 4, 7]]


def maps_for(targets):
    """2 layers x 2 heads: L0H0 and L1H1 one-hot rows (TARGETS), L0H1 and L1H0 uniform."""
    n = len(targets)
    onehot = np.zeros((n, n), dtype=np.float32)
    onehot[np.arange(n), targets] = 1
    uniform = np.full((n, n), 1 / n, dtype=np.float32)
    return np.stack([np.stack([onehot, uniform]), np.stack([uniform, onehot])])


@pytest.fixture
def feature_run(store, make_run):
    return make_run(
        store,
        [maps_for(t) for t in TARGETS],
        [TOKENS_0, TOKENS_1, TOKENS_2],
        name="features",
        words_list=[WORDS_0, WORDS_1, WORDS_2],
        token_words=[TW_0, TW_1, TW_2],
    )


# A token's score is (number of rows pointing at it) / L; per example the max over the feature's tokens.
# Column counts: ex0 (L=9): [CLS] 2, n 3, like 1, cats 1, [SEP] 2; ex1 (L=8): [CLS] 1, bar 1, ##k 2, [SEP]1 1, [SEP]2 3;
# ex2 (L=8): [CLS] 1, "," 2, n 4, [SEP] 1.
ONE_HOT = {  # feature: (value, n_examples)
    "noun": ((1 / 9 + 0) / 2, 2),  # ex0 cats 1/9; ex1 dogs, birds 0
    "verb": ((1 / 9 + 2 / 8) / 2, 2),  # ex0 like 1/9; ex1 max(bar 1/8, ##k 2/8)
    "pronoun": (0.0, 1),  # ex0 she 0
    "subject": (0.0, 2),  # ex0 she 0; ex1 dogs, birds 0
    "object": (1 / 9, 1),  # ex0 cats
    "negation": ((3 / 9 + 2 / 8) / 2, 2),  # ex0 max over do, n, ', t = 3/9; ex2 max(never 0, "," 2/8); not n 4/8
    "cls": ((2 / 9 + 1 / 8 + 1 / 8) / 3, 3),
    "sep": ((2 / 9 + 3 / 8 + 1 / 8) / 3, 3),  # ex1: max over its two [SEP]s
}
UNIFORM = {  # every token scores 1/L
    "noun": ((1 / 9 + 1 / 8) / 2, 2),
    "verb": ((1 / 9 + 1 / 8) / 2, 2),
    "pronoun": (1 / 9, 1),
    "subject": ((1 / 9 + 1 / 8) / 2, 2),
    "object": (1 / 9, 1),
    "negation": ((1 / 9 + 1 / 8) / 2, 2),
    "cls": ((1 / 9 + 1 / 8 + 1 / 8) / 3, 3),
    "sep": ((1 / 9 + 1 / 8 + 1 / 8) / 3, 3),
}


def test_feature_attention_exact_values(store, feature_run):
    df = run_query(store, "feature_attention", run=feature_run)
    assert list(df.columns) == ["layer", "head", "feature", "value", "n_examples"]
    assert len(df) == 2 * 2 * 8
    got = df.set_index(["layer", "head", "feature"])
    for (layer, head), expected in {(0, 0): ONE_HOT, (0, 1): UNIFORM, (1, 0): UNIFORM, (1, 1): ONE_HOT}.items():
        for feature, (value, n) in expected.items():
            row = got.loc[(layer, head, feature)]
            assert row["value"] == pytest.approx(value, abs=1e-6), (layer, head, feature)
            assert row["n_examples"] == n, feature


def test_features_and_examples_parameters(store, feature_run):
    df = run_query(store, "feature_attention", run=feature_run, features="sep, negation", examples=[1])
    assert df["feature"].unique().tolist() == ["sep", "negation"]
    neg = df[df["feature"] == "negation"]
    assert neg["value"].isna().all() and (neg["n_examples"] == 0).all()  # example 1 has no negation: skipped
    sep = df[(df["feature"] == "sep")].set_index(["layer", "head"])["value"]
    assert sep[(0, 0)] == pytest.approx(3 / 8) and sep[(0, 1)] == pytest.approx(1 / 8)


def test_unknown_feature_is_refused(store, feature_run):
    with pytest.raises(InvalidArgumentError, match="unknown feature.*'adjective'.*choose from noun"):
        run_query(store, "feature_attention", run=feature_run, features="noun,adjective")


def test_special_roles_come_from_recorded_ids(store, make_run):
    """RoBERTa-style <s> ... </s>: the cls/sep features are found by the bos/eos ids, not by strings."""
    specials = {"bos": {"token": "<s>", "id": 0}, "eos": {"token": "</s>", "id": 2}}
    maps = maps_for([2, 2, 0])
    run = make_run(store, [maps], [["<s>", "x", "</s>"]], name="roberta-like", specials=specials)
    df = run_query(store, "feature_attention", run=run, features="cls,sep").set_index(["layer", "head", "feature"])
    assert df.loc[(0, 0, "cls"), "value"] == pytest.approx(1 / 3) and df.loc[(0, 0, "sep"), "value"] == pytest.approx(2 / 3)


def test_negation_matching_rules():
    forms = ["Don't", "ca", "n't", "does", "n’t", "not", "nothing.", "Neither", "knot", "cannot", "wo", "n't"]
    words = pd.DataFrame({"example": 0, "position": range(len(forms)), "segment": 0, "form": forms})
    assert negation_flags(words).tolist() == [True, True, True, False, False, True, True, True, False, False, True, True]
    # a clitic never joins a host across examples or segments
    words = pd.DataFrame({"example": [0, 1, 1, 1], "position": [0, 0, 1, 2], "segment": [0, 0, 0, 1], "form": ["do", "n't", "is", "n't"]})
    assert negation_flags(words).tolist() == [False, False, False, False]


# ---------------------------------------------------------------- kept per-example numbers (queries/engine/)


@pytest.fixture
def random_feature_run(store, make_run):
    tokens = [TOKENS_0, TOKENS_1, TOKENS_2]
    return make_run(
        store,
        [random_maps(len(t), i, 2, 3) for i, t in enumerate(tokens)],
        tokens,
        name="kept-features",
        dtype="float16",
        words_list=[WORDS_0, WORDS_1, WORDS_2],
        token_words=[TW_0, TW_1, TW_2],
    )


@pytest.mark.parametrize("range_size", [4096, 2])  # 2: kept and read in parts of 2 and 1 examples
def test_kept_numbers_give_the_naive_results_and_maps_are_not_read_again(store, random_feature_run, monkeypatch, range_size):
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", range_size)
    run = random_feature_run
    cases = [
        ("feature_attention", dict(features=features, examples=examples))
        for features in (None, "sep,pronoun")
        for examples in (None, [2, 0], [1])
    ] + [
        ("cls_feature_attention", dict(layer=layer, features=features, pool=pool, examples=examples))
        for layer, features in ((None, None), (0, "noun,cls"))
        for pool in ("max", "sum")
        for examples in (None, [2, 1])
    ]
    kept = [run_query(store, name, run=run, **params) for name, params in cases]
    group = summary_group(store, run, "kovaleva_features")
    assert group.attrs["stamp"] == {"version": 2, "n_examples": 3}
    assert group["feature_max"].shape == group["cls_to_feature"].shape == group["cls_to_feature_max"].shape == (3, 8, 2, 3)
    assert group["feature_tokens"][:].tolist() == [[1, 1, 1, 1, 1, 4, 1, 1], [2, 3, 0, 2, 0, 0, 1, 2], [0, 0, 0, 0, 0, 2, 1, 1]]
    check_kept_frames(monkeypatch, store, run, cases, kept)


def test_kept_numbers_of_a_grown_run_are_rebuilt_and_read_only_stores_compute_alone(store, random_feature_run, monkeypatch):
    check_read_only_and_grown_rebuilt(store, random_feature_run, "feature_attention", "kovaleva_features", zero=("feature_max",))
