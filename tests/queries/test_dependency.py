import numpy as np
import pandas as pd
import pytest

from attnstore.queries import engine as summary_module
from attnstore.queries import run_query
from attnstore.queries.common import unique_argmax
from attnstore.queries.dependency import (
    EDGE_FLAGS,
    HEAD2DEP,
    POSSESSIVE_NEXT_FLAG,
    ROOT_FLAG,
    WORD_ARGMAX,
    _decode_labels,
    dependency_counts,
)
from attnstore.queries.engine import asked
from attnstore.queries.errors import InvalidArgumentError
from attnstore.store.errors import DamagedDataError, NotFoundError
from attnstore.tests.queries import reference
from attnstore.tests.queries.helpers import (
    check_rebuilt_once_grown,
    forbid_map_reads,
    has_summaries,
    read_only_store,
    sparse_random_maps,
    summary_group,
)

# The analysis, not the database: SQLite only (kept summaries are Zarr; each query's SQL meets PostgreSQL in test_conformance.py).
pytestmark = pytest.mark.one_backend

TOKENS = ["[CLS]", "the", "dog", "bar", "##ks", "[SEP]"]
TOKEN_WORDS = [None, 0, 1, 2, 2, None]
WORDS = [
    dict(form="the", head=1, deprel="det", upos="DET"),
    dict(form="dog", head=2, deprel="nsubj", upos="NOUN"),
    dict(form="barks", head=None, deprel="root", upos="VERB"),
]


def hand_maps() -> np.ndarray:
    """1 layer, 2 heads over [CLS] the dog bar ##ks [SEP].

    Head 0 looks from each dependent to its head: the->dog, dog->bar/##ks; barks -> mostly [CLS].
    Head 1 looks from each head to its dependent: dog->the, barks->dog; the -> mostly [CLS].
    """
    a = np.zeros((1, 2, 6, 6), dtype=np.float32)
    for h in range(2):
        a[0, h, 0, 0] = a[0, h, 5, 5] = 1
    a[0, 0, 1, 2] = 1
    a[0, 0, 2, 3], a[0, 0, 2, 4] = 0.6, 0.4
    a[0, 0, 3, 0], a[0, 0, 3, 1] = 0.9, 0.1
    a[0, 0, 4, 0] = 1
    a[0, 1, 1, 0], a[0, 1, 1, 4] = 0.8, 0.2
    a[0, 1, 2, 1] = 1
    a[0, 1, 3, 2] = 1
    a[0, 1, 4, 3] = 1
    return a


@pytest.fixture
def dep_run(store, make_run):
    return make_run(store, [hand_maps()], [TOKENS], name="dep", token_words=[TOKEN_WORDS], words_list=[WORDS])


def summary(store, run, **params):
    df = run_query(store, "dependency_summary", run=run, min_count=1, **params)
    return {
        (r.relation, r.direction): (
            r.paper_relation,
            r.n,
            r.layer,
            r.head,
            pytest.approx(r.accuracy),
            r.baseline_offset,
            pytest.approx(r.baseline_accuracy),
        )
        for r in df.itertuples()
    }


def test_dependency_accuracy_per_head_exact(store, dep_run):
    df = run_query(store, "dependency", run=dep_run, min_count=1).sort_values(["layer", "head"])
    assert list(df.columns) == ["layer", "head", "det:dep2head", "det:head2dep", "nsubj:dep2head", "nsubj:head2dep"]
    assert df["det:dep2head"].tolist() == [1.0, 0.0]
    assert df["nsubj:dep2head"].tolist() == [1.0, 0.0]
    # head 1: the word attending most to "the" is "dog", to "dog" is "barks" (the transposed map)
    assert df["det:head2dep"].tolist() == [0.0, 1.0]
    assert df["nsubj:head2dep"].tolist() == [0.0, 1.0]
    assert "note" not in df.attrs
    none_kept = run_query(store, "dependency", run=dep_run, min_count=2)
    assert none_kept.columns.tolist() == ["layer", "head"]
    # the table without relations says why (the CLI prints the note on stderr)
    assert none_kept.attrs["note"] == (
        "2 of 2 relations have fewer than min_count=2 edges and are left out (a smaller min_count keeps them: --param min_count=N)"
    )
    assert run_query(store, "dependency_summary", run=dep_run, min_count=2).attrs["note"].startswith("2 of 2 relations")


def test_dependency_summary_best_direction_with_root_in_all(store, dep_run):
    """The paper's Table 1: one row per relation, the best head over both directions; `all` counts the root word.

    The root "barks" is always wrong for attention; the clamped baseline gets it right at offset -3
    (position 2 - 3 falls before the sentence: ROOT), but +1 is best overall (det and nsubj).
    """
    assert summary(store, dep_run) == {
        ("all", "dep2head"): ("All", 3, 0, 0, 2 / 3, 1, 2 / 3),
        ("det", "dep2head"): ("det", 1, 0, 0, 1.0, 1, 1.0),
        ("nsubj", "dep2head"): ("nsubj", 1, 0, 0, 1.0, 1, 1.0),
    }
    assert summary(store, dep_run, direction="each") == {
        ("all", "dep2head"): ("All", 3, 0, 0, 2 / 3, 1, 2 / 3),
        ("all", "head2dep"): ("All", 3, 0, 1, 2 / 3, 1, 2 / 3),
        ("det", "dep2head"): ("det", 1, 0, 0, 1.0, 1, 1.0),
        ("det", "head2dep"): ("det", 1, 0, 1, 1.0, 1, 1.0),
        ("nsubj", "dep2head"): ("nsubj", 1, 0, 0, 1.0, 1, 1.0),
        ("nsubj", "head2dep"): ("nsubj", 1, 0, 1, 1.0, 1, 1.0),
    }
    assert summary(store, dep_run, direction="head2dep", root_in_all=False)[("all", "head2dep")] == ("All", 2, 0, 1, 1.0, 1, 1.0)


# --- transposed vs direct head->dependent prediction -------------------------------------------------

ABC = ["[CLS]", "a", "b", "c", "[SEP]"]
ABC_TOKEN_WORDS = [None, 0, 1, 2, None]
# a -x-> c, b -y-> c, c is the root
ABC_WORDS = [dict(form="a", head=2, deprel="x"), dict(form="b", head=2, deprel="y"), dict(form="c", head=None, deprel="root")]


def abc_maps() -> np.ndarray:
    """Head 0: a -> [CLS] .7 / b .3; b -> a .2 / [SEP] .8; c -> b .6 / a .4.
    Head 1: a -> b; b -> c; c -> [CLS]."""
    m = np.zeros((1, 2, 5, 5), dtype=np.float32)
    for h in range(2):
        m[0, h, 0, 0] = m[0, h, 4, 4] = 1
    m[0, 0, 1, 0], m[0, 0, 1, 2] = 0.7, 0.3
    m[0, 0, 2, 1], m[0, 0, 2, 4] = 0.2, 0.8
    m[0, 0, 3, 2], m[0, 0, 3, 1] = 0.6, 0.4
    m[0, 1, 1, 2] = m[0, 1, 2, 3] = m[0, 1, 3, 0] = 1
    return m


@pytest.fixture
def abc_run(store, make_run):
    return make_run(store, [abc_maps()], [ABC], name="abc", token_words=[ABC_TOKEN_WORDS], words_list=[ABC_WORDS])


def test_head2dep_transposed_versus_direct(store, abc_run):
    """transpose (default, the authors' code): for dependent d, the word attending most to d is its predicted head.
    direct: the head's most-attended word is d. Head 0: the column of "a" is largest in row c (.4 > .2), but row c
    attends most to b."""
    transposed = run_query(store, "dependency", run=abc_run, min_count=1).sort_values("head")
    direct = run_query(store, "dependency", run=abc_run, min_count=1, head2dep="direct").sort_values("head")
    assert transposed["x:head2dep"].tolist() == [1.0, 0.0]
    assert transposed["y:head2dep"].tolist() == [1.0, 0.0]
    assert direct["x:head2dep"].tolist() == [0.0, 0.0]
    assert direct["y:head2dep"].tolist() == [1.0, 0.0]  # head 1: row c has no word: no prediction
    for frame in (transposed, direct):  # dep2head does not depend on it
        assert frame["x:dep2head"].tolist() == [0.0, 0.0]
        assert frame["y:dep2head"].tolist() == [0.0, 1.0]


def test_summary_picks_the_best_direction_and_clamps_the_baseline(store, abc_run):
    """Baseline for x (a at 0, head c at 2): +2 and +3 (clamped to the last word) are right; the root c is
    right at -3 (before the sentence: ROOT). `all`: +2 and +3 get x and y (2 of 3), the first wins."""
    assert summary(store, abc_run) == {
        ("all", "head2dep"): ("All", 3, 0, 0, 2 / 3, 2, 2 / 3),
        ("x", "head2dep"): ("", 1, 0, 0, 1.0, 2, 1.0),
        ("y", "dep2head"): ("", 1, 0, 1, 1.0, 1, 1.0),  # tie with head2dep head 0: dep2head goes first
    }
    assert summary(store, abc_run, head2dep="direct") == {
        ("all", "dep2head"): ("All", 3, 0, 1, 1 / 3, 2, 2 / 3),  # tie with direct head 0 (1/3)
        ("x", "dep2head"): ("", 1, 0, 0, 0.0, 2, 1.0),
        ("y", "dep2head"): ("", 1, 0, 1, 1.0, 1, 1.0),
    }
    assert summary(store, abc_run, root_in_all=False)[("all", "head2dep")] == ("All", 2, 0, 0, 1.0, 2, 1.0)


# --- ties and all-zero rows make no prediction ---------------------------------------------------------

# a is the root, b -x-> a, c -y-> a: a naive argmax over a row of zeros, or a tie, picks word 0 = a: "right"
TIE_WORDS = [dict(form="a", head=None, deprel="root"), dict(form="b", head=0, deprel="x"), dict(form="c", head=0, deprel="y")]


def tie_maps() -> np.ndarray:
    """Head 0, stored in float16: a -> [CLS]; b -> [CLS] (1e-8 to a underflows to 0); c -> a .4 = b .4, [SEP] .2 (a tie).
    Head 1 (control): a -> b; b -> a; c -> a .6 / b .4."""
    m = np.zeros((1, 2, 5, 5), dtype=np.float32)
    for h in range(2):
        m[0, h, 0, 0] = m[0, h, 4, 4] = 1
    m[0, 0, 1, 0] = 1
    m[0, 0, 2, 0], m[0, 0, 2, 1] = 1 - 1e-8, 1e-8
    m[0, 0, 3, 1], m[0, 0, 3, 2], m[0, 0, 3, 4] = 0.4, 0.4, 0.2
    m[0, 1, 1, 2] = m[0, 1, 2, 1] = 1
    m[0, 1, 3, 1], m[0, 1, 3, 2] = 0.6, 0.4
    return m


@pytest.fixture
def tie_run(store, make_run):
    return make_run(store, [tie_maps()], [ABC], name="tie", token_words=[ABC_TOKEN_WORDS], words_list=[TIE_WORDS], dtype="float16")


def test_unique_argmax():
    rows = np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.7, 0.1], [0.0, 0.0, 1e-3]])
    assert unique_argmax(rows).tolist() == [-1, -1, 1, 2]
    assert unique_argmax(rows, transpose=True).tolist() == [1, 2, 2]  # each column's largest, reached once
    assert unique_argmax(np.zeros((2, 0))).tolist() == [-1, -1]
    assert unique_argmax(np.zeros((2, 0)), transpose=True).tolist() == []
    assert unique_argmax(np.array([0.1, np.nan, 0.3])).tolist() == -1  # a NaN predicts nothing (numpy's argmax names it)
    assert unique_argmax(np.array([0.1, 0.4, 0.3], np.float32)).tolist() == 1


def numpy_unique_argmax(scores):
    """The numpy computation the compiled one replaced (queries/common.py before c818184, 2026-11-28)."""
    if scores.shape[-1] == 0:
        return np.full(scores.shape[:-1], -1, dtype=np.int64)
    best = scores.argmax(-1)
    top = np.take_along_axis(scores, best[..., None], -1)
    return np.where(((scores == top).sum(-1) == 1) & (top[..., 0] > 0), best, -1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(3, 4, 7, 7), (2, 5, 1, 9), (6, 3, 3), (2, 3, 0, 4), (2, 3, 4, 0), (40, 33, 33)])
def test_unique_argmax_of_rows_and_columns_equals_numpys(dtype, shape):
    rng = np.random.default_rng(sum(shape))
    scores = (rng.integers(0, 4, shape) / 3).astype(dtype)  # ties and zeros everywhere
    if scores.size:
        scores.flat[rng.integers(0, scores.size, 3)] = np.nan
    np.testing.assert_array_equal(unique_argmax(scores), numpy_unique_argmax(scores))
    np.testing.assert_array_equal(unique_argmax(scores, transpose=True), numpy_unique_argmax(np.swapaxes(scores, -1, -2)))


def test_zero_rows_and_ties_never_score(store, tie_run):
    df = run_query(store, "dependency", run=tie_run, min_count=1).sort_values("head")
    assert df["x:dep2head"].tolist() == [0.0, 1.0]  # head 0: b's row is all zeros among the words
    assert df["y:dep2head"].tolist() == [0.0, 1.0]  # head 0: c's row ties a and b
    # transposed, head 0: the column of b is largest in row c (.4): c is predicted (wrong); the column of c is empty
    assert df["x:head2dep"].tolist() == [0.0, 1.0]
    assert df["y:head2dep"].tolist() == [0.0, 0.0]
    counts = dependency_counts(store, tie_run)
    # dep2head, head 0: rows a, b, c all make no prediction; head 1: none. head2dep: the column of c, in both heads
    assert counts.no_prediction[:, 0].tolist() == [[3, 0], [1, 1]]
    direct = run_query(store, "dependency", run=tie_run, min_count=1, head2dep="direct").sort_values("head")
    assert direct["x:head2dep"].tolist() == [0.0, 1.0]  # the head a's row: zeros in head 0, b in head 1
    assert direct["y:head2dep"].tolist() == [0.0, 0.0]


# --- the paper's poss rule: a possessor followed by 's is judged by the 's ------------------------------

POSS = ["[CLS]", "john", "'s", "book", "[SEP]"]
POSS_WORDS = [
    dict(form="John", head=2, deprel="nmod:poss"),
    dict(form="'s", head=0, deprel="case"),
    dict(form="book", head=None, deprel="root"),
]


@pytest.fixture
def poss_run(store, make_run):
    m = np.zeros((1, 1, 5, 5), dtype=np.float32)
    m[0, 0, 0, 0] = m[0, 0, 4, 4] = m[0, 0, 3, 3] = 1
    m[0, 0, 1, 2] = 1  # John -> 's
    m[0, 0, 2, 3] = 1  # 's -> book
    return make_run(store, [m], [POSS], name="poss", token_words=[ABC_TOKEN_WORDS], words_list=[POSS_WORDS])


def test_possessive_judged_by_its_apostrophe_s(store, poss_run):
    rule = summary(store, poss_run, direction="dep2head")
    plain = summary(store, poss_run, direction="dep2head", poss_apostrophe=False)
    # with the rule: 's -> book is John's prediction (right), and the baseline is +1 from the 's
    assert rule[("nmod:poss", "dep2head")] == ("poss", 1, 0, 0, 1.0, 1, 1.0)
    assert plain[("nmod:poss", "dep2head")] == ("poss", 1, 0, 0, 0.0, 2, 1.0)
    assert rule[("case", "dep2head")] == plain[("case", "dep2head")] == ("prep", 1, 0, 0, 0.0, -1, 1.0)


def test_bad_parameters_are_refused(store, dep_run):
    with pytest.raises(InvalidArgumentError, match="head2dep='both'"):
        run_query(store, "dependency", run=dep_run, head2dep="both")
    with pytest.raises(InvalidArgumentError, match="direction='all'"):
        run_query(store, "dependency_summary", run=dep_run, direction="all")


def test_dependency_results_can_be_saved(store, dep_run):
    df = run_query(store, "dependency", run=dep_run, min_count=1)
    assert store.save_head_metrics(dep_run, df, prefix="dependency", params={"min_count": 1}) == 8
    best = store.sql("SELECT head FROM head_metrics WHERE metric = 'dependency.det:dep2head' AND value > 0.8")
    assert best["head"].tolist() == [0]


# --- word-level predictions and gold trees kept with the run (queries/engine/): the naive reference's counts, exactly

KEPT_RELATIONS = ("det", "nsubj", "obj", "amod", "nmod:poss", "case")


def kept_example(seed: int):
    """Random words (1-2 pieces each, two sentences from seed 2 on) with random heads and relations, possessors
    followed by 's, the last word cut (no piece) in every third example and no tree in example 6; float16 maps
    with rows and columns of exact zeros among the words and ties. Returns (maps (2, 3, L, L), tokens,
    token_words, words)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 9))
    words = []
    for i in range(n):
        rel = str(rng.choice(KEPT_RELATIONS))
        head = int(rng.choice([j for j in range(n) if j != i]))
        words.append(dict(form=f"w{i}", head=head, deprel=rel, sentence=int(seed >= 2 and i >= n // 2)))
    words[int(rng.integers(n))].update(head=None, deprel="root")
    for i in range(n - 1):
        if words[i]["deprel"] == "nmod:poss" and rng.random() < 0.7:
            words[i + 1]["form"] = "'s"
    if seed == 6:  # no tree: nothing judged, nothing kept
        for word in words:
            word.update(head=None, deprel=None)
    covered = n - 1 if seed % 3 == 2 else n
    if covered < n and words[-2]["deprel"] not in ("root", None):  # a possessor whose 's was cut: judged by itself
        words[-2]["deprel"], words[-1]["form"] = "nmod:poss", "'s"
    tokens, token_words = ["[CLS]"], [None]
    for i in range(covered):
        pieces = int(rng.integers(1, 3))
        tokens += [words[i]["form"].lower(), *["##x"] * (pieces - 1)]
        token_words += [i] * pieces
        if seed % 2 and i == covered // 2:  # a separator between the words
            tokens.append("[SEP]")
            token_words.append(None)
    tokens.append("[SEP]")
    token_words.append(None)
    maps = sparse_random_maps(rng, len(tokens), unattended_keys=True)
    return maps, tokens, token_words, words


@pytest.fixture
def kept_run(store, make_run):
    examples = [kept_example(seed) for seed in range(7)]
    maps, tokens, token_words, words = (list(x) for x in zip(*examples))
    return make_run(store, maps, tokens, name="keptdep", token_words=token_words, words_list=words, dtype="float16")


def assert_same_counts(a, b):
    assert a.relations == b.relations and a.n_root == b.n_root
    for field in ("correct", "totals", "baseline", "baseline_root", "no_prediction"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


@pytest.mark.parametrize("range_size", [4096, 2])  # 2: the run is read in ranges of 2 examples (4 ranges)
def test_kept_predictions_give_the_naive_counts_exactly(store, kept_run, monkeypatch, range_size):
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", range_size)
    with read_only_store(store) as reader:  # a read-only store computes for the call alone and keeps nothing
        with asked(reader, kept_run, [0, 2]):
            read_only = dependency_counts(reader, kept_run, "direct")
    assert not has_summaries(store, kept_run)
    with asked(store, kept_run, [0, 2]):
        assert_same_counts(read_only, dependency_counts(store, kept_run, "direct"))
    for examples in (None, [], [6], [4, 2, 6, 2]):
        for head2dep in HEAD2DEP:
            for poss in (True, False):
                with asked(store, kept_run, examples):
                    kept_counts = dependency_counts(store, kept_run, head2dep, poss)
                assert_same_counts(kept_counts, reference.dependency_counts(store, kept_run, head2dep, poss, examples=examples))
    assert kept_counts.totals.sum() > 0 and kept_counts.no_prediction.sum() > 0
    assert kept_counts.relations == sorted(KEPT_RELATIONS)  # the run's relations, whatever the examples
    params = dict(min_count=1, direction="each", root_in_all=False)
    summary = run_query(store, "dependency_summary", run=kept_run, **params)
    pd.testing.assert_frame_equal(summary, reference.query(store, "dependency_summary", run=kept_run, **params))
    for query in (run_query, reference.query):
        with pytest.raises(NotFoundError, match=r"has no stored example\(s\) \[9\]"):
            query(store, "dependency", run=kept_run, examples=[0, 9])


def test_predictions_and_trees_are_kept_with_the_run_read_without_maps_or_words_and_rebuilt_once_it_grew(store, kept_run, monkeypatch):
    first = run_query(store, "dependency", run=kept_run, min_count=1)
    group = summary_group(store, kept_run, "word_argmax")
    assert group.attrs["stamp"] == {"version": 3, "n_examples": 7}
    assert group["argmax"].dtype == np.int16 and group["argmax"].shape[1:] == (2, 2, 3)  # (words, direction, layer, head)
    assert group["word_start"][-1] == group["argmax"].shape[0] == sum(len(set(kept_example(s)[2]) - {None}) for s in range(6))  # 6: no tree
    # the gold trees: a row per word with a relation (example 6 has none), the relations' bytes beside
    words = [[(i, w) for i, w in enumerate(kept_example(s)[3])] for s in range(7)]
    edge = group["edge"][:]
    assert group["edge_start"][:].tolist() == np.cumsum([0, *map(len, words[:6]), 0]).tolist()
    bounds = [(0, len(e) - 1) if s < 2 else (0, len(e) // 2 - 1, len(e) // 2, len(e) - 1) for s, e in enumerate(words[:6])]
    expected = [
        [i, -1 if w["head"] is None else w["head"], *bounds[s][2 * w["sentence"] : 2 * w["sentence"] + 2], len(w["deprel"])]
        for s, e in enumerate(words[:6])
        for i, w in e
    ]
    assert edge[:, :EDGE_FLAGS].tolist() == expected
    assert (edge[:, EDGE_FLAGS] & ROOT_FLAG).sum() == 6 and (edge[:, EDGE_FLAGS] & POSSESSIVE_NEXT_FLAG).any()
    assert group["edge_label"][:].tobytes() == "".join(w["deprel"] for e in words[:6] for _, w in e).encode()
    with monkeypatch.context() as m:
        forbid_map_reads(m, store, "word_table", "token_table", "token_roles")
        pd.testing.assert_frame_equal(run_query(store, "dependency", run=kept_run, min_count=1), first, check_exact=True)
        run_query(store, "dependency_summary", run=kept_run, min_count=1, head2dep="direct", examples=[3])
    check_rebuilt_once_grown(
        store,
        kept_run,
        "word_argmax",
        lambda: assert_same_counts(dependency_counts(store, kept_run), reference.dependency_counts(store, kept_run)),
        zero=("argmax", "edge"),
    )


def test_predictions_kept_by_an_older_version_are_rebuilt_and_passed_by_on_a_read_only_store(store, kept_run, monkeypatch):
    expected = reference.dependency_counts(store, kept_run, "direct")
    dependency_counts(store, kept_run)
    group = summary_group(store, kept_run, "word_argmax", "r+")  # as version 1 kept it: no gold trees
    for field in ("edge", "edge_start", "edge_label", "edge_label_start"):
        del group[field]
    group.attrs["stamp"] = {"version": 1, "n_examples": 7}
    with read_only_store(store) as reader:
        assert_same_counts(dependency_counts(reader, kept_run, "direct"), expected)
    assert summary_group(store, kept_run, "word_argmax").attrs["stamp"]["version"] == 1  # left as it was
    assert_same_counts(dependency_counts(store, kept_run, "direct"), expected)
    assert summary_group(store, kept_run, "word_argmax").attrs["stamp"] == {"version": 3, "n_examples": 7}


def test_counts_are_kept_per_range_on_the_runs_relations_and_derived_for_a_summary_kept_without_them(store, kept_run, monkeypatch):
    """A whole-run count adds the kept ranges' counts (every parameter setting's, on the run's relations, kept with
    them); a summary kept before ranges had labels gets its ranges derived once, a read-only store adds its parts."""
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 2)
    expected = {(h, p): reference.dependency_counts(store, kept_run, h, p) for h in HEAD2DEP for p in (True, False)}
    first = {key: dependency_counts(store, kept_run, *key) for key in expected}
    info = store.run_info(kept_run)
    kept = summary_module.kept_ranges(store, info, WORD_ARGMAX)
    assert kept is not None and kept.n == 4 and kept.labels == sorted(KEPT_RELATIONS)
    assert summary_group(store, kept_run, "word_argmax")["ranges"].attrs["labels"] == sorted(KEPT_RELATIONS)
    with monkeypatch.context() as m:
        m.setattr("attnstore.queries.engine.kept._summary_parts", lambda *a, **k: pytest.fail("read per-example fields"))
        for key, counts in first.items():
            assert_same_counts(counts, expected[key])
            assert_same_counts(dependency_counts(store, kept_run, *key), counts)
    ranges = summary_group(store, kept_run, "word_argmax", "r+")
    del ranges["ranges"]  # as a store of an earlier version kept it: no ranges
    with read_only_store(store) as reader:
        assert_same_counts(dependency_counts(reader, kept_run, "direct", False), expected[("direct", False)])
        assert summary_module.kept_ranges(reader, reader.run_info(kept_run), WORD_ARGMAX) is None
    assert_same_counts(dependency_counts(store, kept_run, "direct", False), expected[("direct", False)])
    assert summary_module.kept_ranges(store, info, WORD_ARGMAX).labels == sorted(KEPT_RELATIONS)


def test_a_run_without_trees_counts_nothing_through_its_kept_ranges(store, make_run):
    """No relation: the kept ranges' per-relation fields have no values (width 0) and are added as such."""
    name = make_run(store, [hand_maps()], [TOKENS], name="treeless", token_words=[TOKEN_WORDS])
    for _ in range(2):  # builds the summary and its ranges, then reads them back
        counts = dependency_counts(store, name)
        assert counts.relations == [] and counts.correct.shape == (2, 1, 2, 0) and counts.n_root == 0
    assert summary_module.kept_ranges(store, store.run_info(name), WORD_ARGMAX).labels == []
    assert run_query(store, "dependency", run=name, min_count=0).columns.tolist() == ["layer", "head"]
    assert run_query(store, "dependency_summary", run=name, min_count=0).empty


def test_kept_trees_with_a_relation_sql_lacks_are_refused_in_one_line(store, kept_run, monkeypatch):
    monkeypatch.setattr(type(store), "dependency_relations", lambda self, run: ["det"])
    with pytest.raises(DamagedDataError, match=r"relation\(s\) \['amod', .*'obj'\] of kept dependency trees .*re-ingest the run"):
        dependency_counts(store, kept_run)


def test_a_skipped_example_is_not_evaluated_and_its_relations_are_not_listed(store, make_run, monkeypatch):
    """A skipped example's words are stored with the run (the word table lists them), but it has no maps: no edge of
    its own is counted, and a relation found only there has no column (the query and its naive reference)."""
    skipped_words = [dict(form="x", head=1, deprel="only_here"), dict(form="y", head=None, deprel="root")]
    tokens = [TOKENS, ["[CLS]", "x", "y", "[SEP]"]]
    name, writer = make_run(
        store, [hand_maps()], tokens, name="skipping", token_words=[TOKEN_WORDS], words_list=[WORDS, skipped_words], finish=False
    )
    try:
        ids = store.sql(
            "SELECT e.id FROM examples e JOIN datasets d ON d.id = e.dataset_id WHERE d.name = 'hand-skipping' AND e.position = 1"
        )
        writer.add_skipped(int(ids["id"].iloc[0]), 600)
        writer.finish(0.0)
    finally:
        writer.close()
    assert store.examples(name)["skipped"].tolist() == [False, True] and "only_here" in store.word_table(name)["deprel"].tolist()
    with asked(store, name, [0]):
        first = dependency_counts(store, name)
    for counts in (dependency_counts(store, name), reference.dependency_counts(store, name), first):
        assert counts.relations == ["det", "nsubj"] and counts.totals.tolist() == [1, 1] and counts.n_root == 1
    assert run_query(store, "dependency", run=name, min_count=0).columns.tolist() == [
        "layer",
        "head",
        "det:dep2head",
        "det:head2dep",
        "nsubj:dep2head",
        "nsubj:head2dep",
    ]


def test_relations_are_kept_as_bytes_and_read_back_in_python_order():
    labels = ["nsubj", "é", "a", "", "zz:ü", "nmod:poss", "a", "Z", "依存", "é"]
    encoded = [label.encode() for label in labels]
    codes, names = _decode_labels(np.frombuffer(b"".join(encoded), np.uint8), np.array([len(b) for b in encoded]))
    assert names == sorted(set(labels)) and [names[c] for c in codes] == labels
    assert _decode_labels(np.zeros(0, np.uint8), np.zeros(0, np.int32))[1] == []
