import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.queries.coreference import choose_antecedent

TOKENS = ["[CLS]", "anna", "met", "bob", "she", "smiled", "[SEP]"]
WORDS = [
    dict(form="Anna", upos="PROPN", feats="Number=Sing"),
    dict(form="met", upos="VERB"),
    dict(form="Bob", upos="PROPN", feats="Gender=Masc|Number=Sing"),
    dict(form="she", upos="PRON", feats="Gender=Fem|Number=Sing|Person=3"),
    dict(form="smiled", upos="VERB"),
]
MENTIONS = [
    dict(word_start=0, word_end=1, head=0, entity="A", kind="proper", doc_order=0),
    dict(word_start=2, word_end=3, head=2, entity="B", kind="proper", doc_order=1),
    dict(word_start=3, word_end=4, head=3, entity="A", kind="pronoun", doc_order=2),
]


def hand_maps():
    """1 layer, 2 heads: everything attends to [CLS], except "she" -> "anna" (head 0) / -> "bob" (head 1)."""
    a = np.zeros((1, 2, 7, 7), dtype=np.float32)
    a[..., 0] = 1
    a[0, 0, 4] = 0
    a[0, 0, 4, 1] = 1
    a[0, 1, 4] = 0
    a[0, 1, 4, 3] = 1
    return a


@pytest.fixture
def coref_run(store, make_run):
    return make_run(
        store,
        [hand_maps()],
        [TOKENS],
        name="coref",
        token_words=[[None, 0, 1, 2, 3, 4, None]],
        words_list=[WORDS],
        mentions_list=[MENTIONS],
    )


def test_coreference_per_head_exact(store, coref_run):
    df = run_query(store, "coreference", run=coref_run).sort_values("head")
    assert df["all"].tolist() == [1.0, 0.0] and df["pronoun"].tolist() == [1.0, 0.0]
    assert df["proper"].isna().all() and df["nominal"].isna().all()  # no proper/nominal mention has an antecedent


def test_coreference_summary_and_baselines(store, coref_run):
    df = run_query(store, "coreference_summary", run=coref_run).set_index("method")
    assert df.loc["head 0-0", "all"] == 1.0
    assert df.loc["nearest", "pronoun"] == 0.0  # Bob is nearer
    assert df.loc["head_match", "pronoun"] == 0.0  # no earlier "she": no pick
    assert df.loc["sieve", "pronoun"] == 1.0  # gender agreement rules Bob out
    assert df.loc["n", "all"] == 1 and df.loc["n", "proper"] == 0


def test_sieve_order():
    m = dict(text="the cat", head_form="cat", feats={"Number": "Sing"})
    exact = dict(text="the cat", head_form="cat", feats={}, entity=1)
    head = dict(text="a cat", head_form="cat", feats={}, entity=2)
    agree = dict(text="it", head_form="it", feats={"Number": "Sing"}, entity=3)
    plural = dict(text="they", head_form="they", feats={"Number": "Plur"}, entity=4)
    assert choose_antecedent(m, [exact, head, agree, plural], "sieve") is exact
    assert choose_antecedent(m, [head, agree, plural], "sieve") is head
    assert choose_antecedent(m, [agree, plural], "sieve") is agree
    assert choose_antecedent(m, [plural], "sieve") is plural
    assert choose_antecedent(m, [], "nearest") is None
