import numpy as np
import pytest

from attnstore.queries import run_query

TOKENS = ["[CLS]", "the", "dog", "bar", "##ks", "[SEP]"]
TOKEN_WORDS = [None, 0, 1, 2, 2, None]
WORDS = [dict(form="the", head=1, deprel="det", upos="DET"), dict(form="dog", head=2, deprel="nsubj", upos="NOUN"),
         dict(form="barks", head=None, deprel="root", upos="VERB")]


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


def test_dependency_accuracy_per_head_exact(store, dep_run):
    df = run_query(store, "dependency", run=dep_run, min_count=1).sort_values(["layer", "head"])
    assert list(df.columns) == ["layer", "head", "det:dep2head", "det:head2dep", "nsubj:dep2head", "nsubj:head2dep"]
    assert df["det:dep2head"].tolist() == [1.0, 0.0]
    assert df["nsubj:dep2head"].tolist() == [1.0, 0.0]
    assert df["det:head2dep"].tolist() == [0.0, 1.0]
    assert df["nsubj:head2dep"].tolist() == [0.0, 1.0]
    assert run_query(store, "dependency", run=dep_run, min_count=2).columns.tolist() == ["layer", "head"]


def test_dependency_summary_with_fixed_offset_baseline(store, dep_run):
    df = run_query(store, "dependency_summary", run=dep_run, min_count=1)
    got = {(r.relation, r.direction): (r.paper_relation, r.n, r.layer, r.head, r.accuracy, r.baseline_offset, r.baseline_accuracy)
           for r in df.itertuples()}
    assert got == {
        ("all", "dep2head"): ("All", 2, 0, 0, 1.0, 1, 1.0),
        ("all", "head2dep"): ("All", 2, 0, 1, 1.0, -1, 1.0),
        ("det", "dep2head"): ("det", 1, 0, 0, 1.0, 1, 1.0),
        ("det", "head2dep"): ("det", 1, 0, 1, 1.0, -1, 1.0),
        ("nsubj", "dep2head"): ("nsubj", 1, 0, 0, 1.0, 1, 1.0),
        ("nsubj", "head2dep"): ("nsubj", 1, 0, 1, 1.0, -1, 1.0),
    }


def test_dependency_results_can_be_saved(store, dep_run):
    df = run_query(store, "dependency", run=dep_run, min_count=1)
    assert store.save_head_metrics(dep_run, df, prefix="dependency", params={"min_count": 1}) == 8
    best = store.sql("SELECT head FROM head_metrics WHERE metric = 'dependency.det:dep2head' AND value > 0.8")
    assert best["head"].tolist() == [0]
