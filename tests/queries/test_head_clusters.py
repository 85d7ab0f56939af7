import math

import numpy as np

from attnstore.queries import run_query
from attnstore.queries.head_clusters import classical_mds, js_distance_matrix


def three_heads() -> np.ndarray:
    """1 layer x 3 heads, L=2: head 0 attends to itself, head 1 uniformly, head 2 like head 0."""
    maps = np.zeros((1, 3, 2, 2), dtype=np.float32)
    maps[0, 0] = maps[0, 2] = np.eye(2)
    maps[0, 1] = 0.5
    return maps


def test_js_distance_exact():
    d = js_distance_matrix(three_heads()[0])
    per_row = 0.75 * math.log(4 / 3)  # JS([1, 0], [.5, .5])
    np.testing.assert_allclose(d, [[0, 2 * per_row, 0], [2 * per_row, 0, 2 * per_row], [0, 2 * per_row, 0]], atol=1e-12)


def test_mds_reproduces_distances():
    pts = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 4.0], [3.0, 4.0]])
    dist = np.sqrt(((pts[:, None] - pts[None]) ** 2).sum(-1))
    xy = classical_mds(dist)
    np.testing.assert_allclose(np.sqrt(((xy[:, None] - xy[None]) ** 2).sum(-1)), dist, atol=1e-9)


def test_head_queries_on_a_stored_run(store, make_run):
    run = make_run(store, [three_heads(), three_heads()], [["[CLS]", "[SEP]"], ["[CLS]", "[SEP]"]], name="clusters")
    per_row = 0.75 * math.log(4 / 3)
    dist = run_query(store, "head_distances", run=run)
    pair = dist[(dist["head_a"] == 0) & (dist["head_b"] == 1)].iloc[0]
    assert math.isclose(pair["distance"], 4 * per_row, rel_tol=1e-6)  # 2 examples x 2 query tokens
    assert math.isclose(pair["mean_distance"], per_row, rel_tol=1e-6)
    xy = run_query(store, "head_clusters", run=run).set_index("head")
    assert np.allclose(xy.loc[0, ["x", "y"]], xy.loc[2, ["x", "y"]], atol=1e-6)
    assert math.isclose(float(np.hypot(*(xy.loc[0, ["x", "y"]] - xy.loc[1, ["x", "y"]]))), 4 * per_row, rel_tol=1e-6)
