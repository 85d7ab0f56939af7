"""retrieval_heads on a hand-built needle run: a head that copies the needle, one on the first token, one a position
off; an answer that misses the needle is not counted; and the authors' needle search."""

import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.queries.errors import InvalidArgumentError
from attnstore.queries.retrieval_heads import answer_text, needle_span
from attnstore.tests.queries.helpers import needle_run
from attnstore.tests.snapshots import store_with

store = store_with("run", needle_run)


@pytest.fixture
def run(store):
    return "needle"


def test_retrieval_heads_by_hand(store, run):
    df = run_query(store, "retrieval_heads", run=run).set_index("head")
    # head 0 copies each needle token written: example 0, 4 x 1/4; example 2, 3 x 1/4; example 1 misses the needle
    assert df["retrieval"].tolist() == [0.875, 0.0, 0.0] and df["retrieval_head"].tolist() == [True, False, False]
    assert df.attrs["examples"] == 3 and df.attrs["retrieved"] == 2
    assert df.attrs["answers"] == {0: "sandwich in Dolores Park", 1: "nothing here", 2: "sandwich Dolores Park"}
    only_missed = run_query(store, "retrieval_heads", run=run, examples=[1])
    assert only_missed["retrieval"].isna().all() and only_missed.attrs["retrieved"] == 0


def test_retrieval_heads_from_row_stats_read_no_map(store, make_run, monkeypatch):
    """The same run keeping row statistics: each step's top-1 key comes from them, and the scores are the same."""
    from attnstore.store.store import Store

    rows = needle_run(store, make_run, name="needle-rows", row_stats=True)
    checked = run_query(store, "retrieval_heads", run=rows, weights="maps")

    def no_maps(*args, **kwargs):
        raise AssertionError("read a map")

    monkeypatch.setattr(Store, "attention", no_maps)
    df = run_query(store, "retrieval_heads", run=rows)
    assert df["retrieval"].tolist() == checked["retrieval"].tolist() == [0.875, 0.0, 0.0] and df.attrs["retrieved"] == 2


def test_a_run_over_another_dataset_is_refused(store, make_run):
    other = make_run(store, [np.full((1, 3, 2, 2), 0.5, np.float32)], [["a", "b"]], name="text", specials={})
    with pytest.raises(InvalidArgumentError, match=r"^query 'retrieval_heads' needs a run over a needle dataset; .* --generate 50"):
        run_query(store, "retrieval_heads", run=other)


def test_the_needle_is_found_as_the_authors_find_it():
    prompt = np.array([5, 6, 51, 52, 99, 54, 7])  # 3 of the 4 distinct ids: 75 %, not over 90 %
    assert needle_span(prompt, [51, 52, 53, 54]) == (-1, -1)
    assert needle_span(np.array([5, 51, 52, 53, 54, 7]), [51, 52, 53, 54]) == (1, 5)
    assert answer_text(["ĠThe", "Ġbest", "Ċ"]) == " The best\n"
