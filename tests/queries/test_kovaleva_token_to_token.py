"""K6 `token_to_token` and `cls_feature_attention` on hand-built maps, expected values worked out by hand; the
per-example numbers kept with the run (summary kind `kovaleva_relations`) give the naive reference's results
(tests/queries/reference.py)."""

import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.store.errors import InvalidArgumentError
from attnstore.tests.queries import reference
from attnstore.tests.queries.helpers import (
    assert_same_frames_within,
    check_kept_frames,
    check_read_only_and_grown_rebuilt,
    random_maps,
    summary_group,
)

# The analysis, not the database: SQLite only (kept summaries are Zarr; each query's SQL meets PostgreSQL in test_conformance.py).
pytestmark = pytest.mark.one_backend

# A: "she likes cats" with split "likes" (like ##s) and "cats" (ca ##ts).
TOKENS_A = ["[CLS]", "she", "like", "##s", "ca", "##ts", "[SEP]"]
WORDS_A = [
    dict(form="she", upos="PRON", deprel="nsubj", head=1),
    dict(form="likes", upos="VERB", deprel="root"),
    dict(form="cats", upos="NOUN", deprel="obj", head=1),
]
TW_A = [None, 0, 1, 1, 2, 2, None]
# B, two segments: "dogs bark" / "they chase cats"; the pronoun pairs only with the noun of its own segment.
TOKENS_B = ["[CLS]", "dogs", "bark", "[SEP]", "they", "chase", "cats", "[SEP]"]
WORDS_B = [
    dict(form="dogs", upos="NOUN", deprel="nsubj", head=1),
    dict(form="bark", upos="VERB", deprel="root"),
    dict(form="they", upos="PRON", deprel="nsubj", head=3, segment=1),
    dict(form="chase", upos="VERB", deprel="root", segment=1),
    dict(form="cats", upos="NOUN", deprel="obj", head=3, segment=1),
]
TW_B = [None, 0, 1, None, 2, 3, 4, None]
# C: no verb-subject and no noun-pronoun pair: skipped by token_to_token.
TOKENS_C = ["[CLS]", "hello", "[SEP]"]
WORDS_C = [dict(form="hello", upos="INTJ", deprel="root")]
TW_C = [None, 0, None]

ROWS_A = {0: {0: 1}, 1: {2: 0.5, 3: 0.1, 4: 0.4}, 2: {1: 1}, 3: {1: 0.5, 6: 0.5}, 4: {1: 0.2, 5: 0.8}, 5: {1: 0.8, 0: 0.2}, 6: {6: 1}}
ROWS_B = {0: {0: 1}, 1: {2: 1}, 2: {1: 1}, 3: {3: 1}, 4: {0: 1}, 5: {4: 0.3, 7: 0.7}, 6: {4: 1}, 7: {7: 1}}
ROWS_C = {0: {0: 1}, 1: {0: 1}, 2: {2: 1}}
CLS_ROWS = {"A": [0.1, 0.3, 0.2, 0.1, 0.05, 0.05, 0.2], "B": [0.5, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05], "C": [0.6, 0, 0.4]}


def build(rows, cls_row):
    """2 layers x 2 heads. L0H0: `rows`; L0H1 and L1H0 uniform; L1H1 uniform except the [CLS] row `cls_row`."""
    n = len(rows)
    designed = np.zeros((n, n), dtype=np.float32)
    for i, row in rows.items():
        for j, w in row.items():
            designed[i, j] = w
    uniform = np.full((n, n), 1 / n, dtype=np.float32)
    cls = uniform.copy()
    cls[0] = cls_row
    return np.stack([np.stack([designed, uniform]), np.stack([uniform, cls])])


@pytest.fixture
def t2t_run(store, make_run):
    maps = [build(ROWS_A, CLS_ROWS["A"]), build(ROWS_B, CLS_ROWS["B"]), build(ROWS_C, CLS_ROWS["C"])]
    return make_run(
        store, maps, [TOKENS_A, TOKENS_B, TOKENS_C], name="t2t", words_list=[WORDS_A, WORDS_B, WORDS_C], token_words=[TW_A, TW_B, TW_C]
    )


# L0H0, word level (from a word: mean of its pieces' rows; to a word: sum of its pieces' columns):
# A: likes->she (1 + 0.5)/2 = 0.75; she->likes 0.5 + 0.1 = 0.6; cats->she (0.2 + 0.8)/2 = 0.5; she->cats 0.4.
# B: bark->dogs 1, chase->they 0.3 (mean 0.65); dogs->bark 1, they->chase 0 (mean 0.5); cats->they 1; they->cats 0.
DESIGNED = {
    "verb_to_subject": (0.75 + 0.65) / 2,
    "subject_to_verb": (0.6 + 0.5) / 2,
    "noun_to_pronoun": (0.5 + 1) / 2,
    "pronoun_to_noun": (0.4 + 0) / 2,
}
# Uniform maps: attention to a word = its number of pieces / L.
UNIFORM = {
    "verb_to_subject": (1 / 7 + 1 / 8) / 2,
    "subject_to_verb": (2 / 7 + 1 / 8) / 2,
    "noun_to_pronoun": (1 / 7 + 1 / 8) / 2,
    "pronoun_to_noun": (2 / 7 + 1 / 8) / 2,
}
N_PAIRS = {"verb_to_subject": 3, "subject_to_verb": 3, "noun_to_pronoun": 2, "pronoun_to_noun": 2}
# statistic="token_max" (the default): per example the largest weight from a token of A to a token of B over its pairs.
# A: likes->she max(1, 0.5) = 1; she->likes max(0.5, 0.1) = 0.5; cats->she max(0.2, 0.8) = 0.8; she->cats max(0.4, 0) = 0.4.
# B: verb->subject max(bark->dogs 1, chase->they 0.3) = 1; subject->verb max(1, 0) = 1; cats->they 1; they->cats 0.
DESIGNED_MAX = {"verb_to_subject": 1.0, "subject_to_verb": (0.5 + 1) / 2, "noun_to_pronoun": (0.8 + 1) / 2, "pronoun_to_noun": 0.4 / 2}
UNIFORM_MAX = dict.fromkeys(N_PAIRS, (1 / 7 + 1 / 8) / 2)  # every weight is 1 / L


@pytest.mark.parametrize(
    "statistic, designed, uniform",
    [("word_mean", DESIGNED, UNIFORM), ("token_max", DESIGNED_MAX, UNIFORM_MAX), (None, DESIGNED_MAX, UNIFORM_MAX)],
)
def test_token_to_token_exact_values(store, t2t_run, statistic, designed, uniform):
    params = {} if statistic is None else {"statistic": statistic}
    df = run_query(store, "token_to_token", run=t2t_run, **params)
    assert list(df.columns) == ["layer", "head", "relation", "value", "n_examples", "n_pairs"]
    got = df.set_index(["layer", "head", "relation"])
    for (layer, head), expected in {(0, 0): designed, (0, 1): uniform, (1, 0): uniform, (1, 1): uniform}.items():
        for relation, value in expected.items():
            row = got.loc[(layer, head, relation)]
            assert row["value"] == pytest.approx(value, abs=1e-6), (layer, head, relation)
            assert row["n_examples"] == 2 and row["n_pairs"] == N_PAIRS[relation]  # example C has no pair


def test_token_to_token_relations_parameter(store, t2t_run):
    df = run_query(store, "token_to_token", run=t2t_run, relations="pronoun_to_noun", examples=[1, 2])
    assert df["relation"].unique().tolist() == ["pronoun_to_noun"]
    assert df.set_index(["layer", "head"]).loc[(0, 0), "value"] == pytest.approx(0.0)
    assert (df["n_examples"] == 1).all() and (df["n_pairs"] == 1).all()
    with pytest.raises(InvalidArgumentError, match="unknown relation.*'verb_to_object'"):
        run_query(store, "token_to_token", run=t2t_run, relations="verb_to_object")
    with pytest.raises(InvalidArgumentError, match="statistic='max': use 'token_max'"):
        run_query(store, "token_to_token", run=t2t_run, statistic="max")


# cls_feature_attention, last layer (1), pool="sum": head 1 reads CLS_ROWS, head 0 is uniform (feature's piece count / L).
CLS_HEAD1_SUM = {
    "noun": (0.1 + 0.15) / 2,
    "verb": (0.3 + 0.15) / 2,
    "pronoun": (0.3 + 0.05) / 2,
    "subject": (0.3 + 0.15) / 2,
    "object": (0.1 + 0.05) / 2,
    "cls": (0.1 + 0.5 + 0.6) / 3,
    "sep": (0.2 + 0.15 + 0.4) / 3,
}
CLS_HEAD0_SUM = {
    "noun": (2 / 7 + 2 / 8) / 2,
    "verb": (2 / 7 + 2 / 8) / 2,
    "pronoun": (1 / 7 + 1 / 8) / 2,
    "subject": (1 / 7 + 2 / 8) / 2,
    "object": (2 / 7 + 1 / 8) / 2,
    "cls": (1 / 7 + 1 / 8 + 1 / 3) / 3,
    "sep": (1 / 7 + 2 / 8 + 1 / 3) / 3,
}
# pool="max" (the default): the largest weight among the feature's tokens; uniform head 0: 1 / L for every feature.
CLS_HEAD1 = {
    "noun": (0.05 + 0.1) / 2,  # A: ca/##ts 0.05; B: dogs 0.1, cats 0.05
    "verb": (0.2 + 0.1) / 2,  # A: like 0.2 (##s 0.1); B: bark 0.1, chase 0.05
    "pronoun": (0.3 + 0.05) / 2,
    "subject": (0.3 + 0.1) / 2,  # B: dogs 0.1, they 0.05
    "object": (0.05 + 0.05) / 2,
    "cls": (0.1 + 0.5 + 0.6) / 3,
    "sep": (0.2 + 0.1 + 0.4) / 3,  # B: max of its two separators
}
CLS_HEAD0 = {f: (1 / 7 + 1 / 8) / 2 for f in ("noun", "verb", "pronoun", "subject", "object")} | dict.fromkeys(
    ("cls", "sep"), (1 / 7 + 1 / 8 + 1 / 3) / 3
)
CLS_N = {"noun": 2, "verb": 2, "pronoun": 2, "subject": 2, "object": 2, "cls": 3, "sep": 3, "negation": 0}


@pytest.mark.parametrize("pool", [None, "max", "sum"])
def test_cls_feature_attention_last_layer(store, t2t_run, pool):
    head0, head1 = (CLS_HEAD0_SUM, CLS_HEAD1_SUM) if pool == "sum" else (CLS_HEAD0, CLS_HEAD1)
    df = run_query(store, "cls_feature_attention", run=t2t_run, **({} if pool is None else {"pool": pool}))
    assert list(df.columns) == ["layer", "head", "feature", "value", "mean_over_heads", "n_examples"]
    assert (df["layer"] == 1).all() and len(df) == 2 * 8
    got = df.set_index(["head", "feature"])
    for feature, n in CLS_N.items():
        assert (got.loc[(0, feature), "n_examples"], got.loc[(1, feature), "n_examples"]) == (n, n)
        if n == 0:  # no negation anywhere: skipped, not zero
            assert np.isnan(got.loc[(0, feature), "value"]) and np.isnan(got.loc[(0, feature), "mean_over_heads"])
            continue
        assert got.loc[(0, feature), "value"] == pytest.approx(head0[feature], abs=1e-6), feature
        assert got.loc[(1, feature), "value"] == pytest.approx(head1[feature], abs=1e-6), feature
        mean = (head0[feature] + head1[feature]) / 2
        assert got.loc[(0, feature), "mean_over_heads"] == pytest.approx(mean, abs=1e-6)


def test_cls_feature_attention_other_layer_and_bad_layer(store, t2t_run):
    df = run_query(store, "cls_feature_attention", run=t2t_run, layer=0, features="cls,noun").set_index(["head", "feature"])
    assert df.loc[(0, "cls"), "value"] == pytest.approx(1.0) and df.loc[(0, "noun"), "value"] == pytest.approx(0.0)
    assert df.loc[(1, "noun"), "value"] == pytest.approx((1 / 7 + 1 / 8) / 2, abs=1e-6)  # the largest of a noun's pieces
    with pytest.raises(InvalidArgumentError, match="pool='mean': use 'max'"):
        run_query(store, "cls_feature_attention", run=t2t_run, pool="mean")
    with pytest.raises(InvalidArgumentError, match="layer of query 'cls_feature_attention' is 2, out of range.*2 layers"):
        run_query(store, "cls_feature_attention", run=t2t_run, layer=2)
    with pytest.raises(InvalidArgumentError, match="unknown feature"):
        run_query(store, "cls_feature_attention", run=t2t_run, features="verbs")


# ---------------------------------------------------------------- kept per-example numbers (queries/engine/)


@pytest.fixture
def random_t2t_run(store, make_run):
    tokens = [TOKENS_A, TOKENS_B, TOKENS_C]
    return make_run(
        store,
        [random_maps(len(t), i, 3, 2) for i, t in enumerate(tokens)],
        tokens,
        name="kept-relations",
        dtype="float16",
        words_list=[WORDS_A, WORDS_B, WORDS_C],
        token_words=[TW_A, TW_B, TW_C],
    )


@pytest.mark.parametrize("range_size", [4096, 2])  # 2: kept and read in parts of 2 and 1 examples
def test_kept_numbers_give_the_naive_results_and_maps_are_not_read_again(store, random_t2t_run, monkeypatch, range_size):
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", range_size)
    run = random_t2t_run
    cases = [
        ("token_to_token", dict(relations=relations, statistic=statistic, examples=examples))
        for relations in (None, "pronoun_to_noun,subject_to_verb")
        for statistic in ("token_max", "word_mean")
        for examples in (None, [2, 0], [2])
    ] + [
        ("cls_feature_attention", dict(layer=layer, pool=pool, examples=examples))
        for layer in (None, 0)
        for pool in ("max", "sum")
        for examples in (None, [1])
    ]
    kept = [run_query(store, name, run=run, **params) for name, params in cases]
    group = summary_group(store, run, "kovaleva_relations")
    assert group.attrs["stamp"] == {"version": 3, "n_examples": 3}
    assert group["relation_pairs"][:].tolist() == [[1, 1, 1, 1], [2, 2, 1, 1], [0, 0, 0, 0]]
    assert group["relation_mean"].shape == group["relation_token_max"].shape == (3, 4, 3, 2)
    check_kept_frames(monkeypatch, store, run, cases, kept)


def test_kept_numbers_of_a_grown_run_are_rebuilt_and_read_only_stores_compute_alone(store, random_t2t_run, monkeypatch):
    check_read_only_and_grown_rebuilt(store, random_t2t_run, "token_to_token", "kovaleva_relations", zero=("relation_token_max",))


@pytest.mark.parametrize("query", ["token_to_token", "cls_feature_attention", "feature_attention"])
def test_norm_weighted_numbers_equal_the_naive_reference(store, make_run, query):
    """weights="norm" (maps weighted by each key's value norm, rows renormalised): the same as the naive reference, which
    weights each map with loops (tests/queries/reference.py)."""
    tokens = [TOKENS_A, TOKENS_B, TOKENS_C]
    rng = np.random.default_rng(7)
    norms = [(rng.random((3, 2, len(t))) * 3 + 0.1).astype(np.float16).astype(np.float32) for t in tokens]
    run = make_run(
        store,
        [random_maps(len(t), i, 3, 2) for i, t in enumerate(tokens)],
        tokens,
        name="normed-relations",
        dtype="float16",
        words_list=[WORDS_A, WORDS_B, WORDS_C],
        token_words=[TW_A, TW_B, TW_C],
        norms_list=norms,
    )
    got = run_query(store, query, run=run, weights="norm")
    expected = reference.query(store, query, run=run, weights="norm")
    assert_same_frames_within(got, expected, 2e-6)
    assert not np.allclose(got["value"], run_query(store, query, run=run)["value"], equal_nan=True)
