"""Trees from heads (Htut et al. 2019): the numpy Chu-Liu/Edmonds against networkx, and MAX/MST undirected attachment on
hand-built maps with values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.queries.errors import InvalidArgumentError
from attnstore.queries.trees import max_links, mst_heads

nx = pytest.importorskip("networkx")


def networkx_heads(scores: np.ndarray, root: int) -> np.ndarray:
    graph = nx.DiGraph()
    n = len(scores)
    for h in range(n):
        for d in range(n):
            if h != d and d != root:
                graph.add_edge(h, d, weight=float(scores[d, h]))
    heads = np.full(n, -1)
    for h, d in nx.maximum_spanning_arborescence(graph, attr="weight").edges:
        heads[d] = h
    return heads


def tree_score(scores: np.ndarray, heads: np.ndarray) -> float:
    return float(sum(scores[d, h] for d, h in enumerate(heads) if h >= 0))


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 21])
def test_chu_liu_edmonds_equals_networkx(n):
    rng = np.random.default_rng(n)
    for trial in range(30):
        scores = rng.random((n, n)) ** 2
        root = int(rng.integers(n))
        ours = mst_heads(scores, root)
        theirs = networkx_heads(scores, root)
        assert ours[root] == -1 and (ours >= 0).sum() == n - 1
        assert tree_score(scores, ours) == pytest.approx(tree_score(scores, theirs), abs=1e-12), (n, trial)
        assert (ours == theirs).all()  # random scores: one best tree


def test_max_links_take_the_first_of_equals():
    assert max_links(np.array([[0.9, 0.5, 0.5], [0.2, 0.1, 0.7], [0.3, 0.3, 0.4]])).tolist() == [1, 2, 0]


TOKENS = ["[CLS]", "the", "dog", "barks", "[SEP]"]
WORDS = [
    dict(form="the", head=1, deprel="det"),
    dict(form="dog", head=2, deprel="nsubj"),
    dict(form="barks", head=None, deprel="root"),
]


def hand_maps() -> np.ndarray:
    """1 layer, 2 heads over [CLS] the dog barks [SEP]. Head 0: the -> dog, dog -> barks, barks -> dog (a perfect
    dependent-to-head head). Head 1: every word on [CLS], except dog -> the."""
    maps = np.zeros((1, 2, 5, 5), dtype=np.float32)
    maps[0, 0, :, 0] = 1
    maps[0, 0, 1], maps[0, 0, 2], maps[0, 0, 3] = 0, 0, 0
    maps[0, 0, 1, 2], maps[0, 0, 2, 3], maps[0, 0, 3, 2] = 1, 1, 1
    maps[0, 1, :, 0] = 1
    maps[0, 1, 2] = 0
    maps[0, 1, 2, 0], maps[0, 1, 2, 1] = 0.5, 0.5
    return maps


def test_max_and_mst_by_hand(store, make_run):
    run = make_run(store, [hand_maps()], [TOKENS], name="trees", token_words=[[None, 0, 1, 2, None]], words_list=[WORDS])
    frame = run_query(store, "head_trees", run=run, min_count=1).set_index("head")
    # head 0 finds both gold edges (the-dog, dog-barks) with MAX and MST
    assert frame.loc[0, ["uuas_max", "uuas_mst", "det:max", "nsubj:mst"]].tolist() == [1.0, 1.0, 1.0, 1.0]
    # head 1 over words only: "the" and "barks" have only zeros among the words, so MAX links each to the first other
    # word ("the" - "dog", "barks" - "the"), and "dog" - "the": edges {the-dog, barks-the}: det found, nsubj missed.
    # MST rooted at "barks": the best heads make the cycle the <-> dog (the's scores are all 0, dog's best is the, 0.5);
    # entering it from barks costs least at "the" (0 - 0 against 0 - 0.5 at "dog"): barks -> the -> dog, the same edges.
    assert frame.loc[1, ["uuas_max", "det:max", "nsubj:max"]].tolist() == [0.5, 1.0, 0.0]
    assert frame.loc[1, ["uuas_mst", "det:mst", "nsubj:mst"]].tolist() == [0.5, 1.0, 0.0]
    assert frame.attrs["chain_uuas"] == 1.0  # both gold edges join adjacent words
    summary = run_query(store, "head_trees_summary", run=run, min_count=1).set_index("relation")
    assert summary.loc["all", ["n", "max_head", "max_uuas", "mst_head", "mst_uuas", "chain_uuas"]].tolist() == [2, 0, 1.0, 0, 1.0, 1.0]
    with_specials = run_query(store, "head_trees", run=run, min_count=1, specials="include").set_index("head")
    assert with_specials.loc[1, "uuas_max"] == 0.0  # "the" and "barks" now point at [CLS]; "dog" splits 0.5/0.5 -> [CLS]
    assert with_specials.loc[0, "uuas_max"] == 1.0
    with pytest.raises(InvalidArgumentError, match="specials='none': use 'exclude'"):
        run_query(store, "head_trees", run=run, specials="none")


def test_a_run_without_trees_is_refused(store, make_run):
    run = make_run(store, [np.full((1, 1, 3, 3), 1 / 3, dtype=np.float32)], [["[CLS]", "x", "[SEP]"]], name="notree")
    with pytest.raises(InvalidArgumentError, match="has no gold dependency trees"):
        run_query(store, "head_trees", run=run)
