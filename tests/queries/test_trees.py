"""Trees from heads (Htut et al. 2019): the numpy Chu-Liu/Edmonds against networkx, and MAX/MST undirected attachment on
hand-built maps with values worked out by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.queries.errors import InvalidArgumentError
from attnstore.queries.trees import first_mst_heads, max_links, mst_heads

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


def first_maximum_tree(scores: np.ndarray, root: int) -> list[int]:
    """By enumeration: of the trees with the largest total (to 1e-9), the first in head order (node 0's head lowest,
    then node 1's, ...)."""
    n = len(scores)
    found = None
    for choice in itertools.product(range(n), repeat=n - 1):
        heads = [*choice[:root], -1, *choice[root:]]
        if any(h == d for d, h in enumerate(heads)) or not all(reaches_root(heads, d, root) for d in range(n)):
            continue
        key = (round(tree_score(scores, np.array(heads)), 9), [-h for h in heads])
        if found is None or key > found[0]:
            found = (key, heads)
    return found[1]


def reaches_root(heads: list[int], node: int, root: int) -> bool:
    seen = set()
    while node != root:
        if node in seen:
            return False
        seen.add(node)
        node = heads[node]
    return True


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_ties_go_to_the_first_maximum_tree_in_head_order(n):
    """first_mst_heads (the documented rule the spread is measured against) equals enumeration; mst_heads returns a
    maximum tree, not always that one."""
    rng = np.random.default_rng(10 + n)
    for trial in range(60):
        scores = rng.integers(0, 3, (n, n)) / 4  # few distinct values: many maximum trees
        root = int(rng.integers(n))
        first = first_maximum_tree(scores, root)
        assert first_mst_heads(scores, root).tolist() == first, (n, trial)
        ours = mst_heads(scores, root)
        assert ours[root] == -1 and all(reaches_root(ours.tolist(), d, root) for d in range(n))
        assert tree_score(scores, ours) == pytest.approx(tree_score(scores, np.array(first)), abs=1e-12), (n, trial)


# Two maximum trees of total 2 rooted at node 3: 1 -> 0, 3 -> 1, 0 -> 2 (1 + 0 + 1) and 2 -> 0, 0 -> 1, 3 -> 2
# (0.5 + 1 + 0.5). The best heads (0 <- 1, 1 <- 0, 2 <- 0) make the cycle 0 <-> 1; Chu-Liu/Edmonds with argmax at
# every step (mst_heads, the query's) and networkx both return the second; the first in head order (first_mst_heads)
# is the first, whose node 0 has head 1, not 2.
TIED = np.array([[0, 1, 0.5, 0], [1, 0, 0, 0], [1, 1, 0, 0.5], [0, 0, 0, 0]])


def test_a_tied_spanning_tree_by_hand():
    first = first_mst_heads(TIED, 3)
    assert first.tolist() == [1, 3, 0, -1] and tree_score(TIED, first) == 2.0
    assert mst_heads(TIED, 3).tolist() == [2, 0, 3, -1] and tree_score(TIED, mst_heads(TIED, 3)) == 2.0
    assert networkx_heads(TIED, 3).tolist() == [2, 0, 3, -1]


def test_the_tied_tree_in_a_query(store, make_run):
    """A quarter of the TIED scores as the word map of "w x y z" (gold: w <- x, x <- z (root), y <- w): the query's
    tree (2 -> 0, 0 -> 1, 3 -> 2) finds w-x and w-y, 2 of 3; the first in head order, as good, is the gold tree (UUAS 1)."""
    maps = np.zeros((1, 1, 6, 6), dtype=np.float32)
    maps[0, 0, 1:5, 1:5] = TIED / 4  # the same trees at a quarter of the scores
    maps[0, 0, :, 0] += 1 - maps[0, 0].sum(1)  # the rest of each row on [CLS]: rows sum to 1
    words = [
        dict(form="w", head=1, deprel="nsubj"),
        dict(form="x", head=3, deprel="obj"),
        dict(form="y", head=0, deprel="det"),
        dict(form="z", head=None, deprel="root"),
    ]
    run = make_run(
        store, [maps], [["[CLS]", "w", "x", "y", "z", "[SEP]"]], name="tied", token_words=[[None, 0, 1, 2, 3, None]], words_list=[words]
    )
    frame = run_query(store, "head_trees", run=run, min_count=1)
    assert frame.loc[0, "uuas_mst"] == pytest.approx(2 / 3)
    assert frame.loc[0, "uuas_max"] == pytest.approx(2 / 3)  # w -> x, x -> w, y -> w, z -> w (its zeros: the first)


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
