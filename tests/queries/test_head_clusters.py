import math

import numpy as np
import pytest
import zarr

from attnstore.queries import run_query
from attnstore.queries.head_clusters import classical_mds, js_distance_matrix, js_upper
from attnstore.store import open_store
from attnstore.tests.queries import reference


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
    dist = run_query(store, "head_distances", run=run, smoothing=0)
    pair = dist[(dist["head_a"] == 0) & (dist["head_b"] == 1)].iloc[0]
    assert math.isclose(pair["distance"], 4 * per_row, rel_tol=1e-6)  # 2 examples x 2 query tokens
    assert math.isclose(pair["mean_distance"], per_row, rel_tol=1e-6)
    # the authors' smoothing (the default): [1, 0] becomes [0.9995, 0.0005], the uniform row stays [0.5, 0.5]
    p, q = (0.9995, 0.0005), (0.5, 0.5)
    m = [(a + b) / 2 for a, b in zip(p, q)]
    smoothed_row = 0.5 * sum(a * math.log(a / c) + b * math.log(b / c) for a, b, c in zip(p, q, m))
    pair = run_query(store, "head_distances", run=run).set_index(["head_a", "head_b"]).loc[(0, 1)]
    assert math.isclose(pair["distance"], 4 * smoothed_row, rel_tol=1e-12) and smoothed_row < per_row
    xy = run_query(store, "head_clusters", run=run, smoothing=0).set_index("head")
    assert np.allclose(xy.loc[0, ["x", "y"]], xy.loc[2, ["x", "y"]], atol=1e-6)
    assert math.isclose(float(np.hypot(*(xy.loc[0, ["x", "y"]] - xy.loc[1, ["x", "y"]]))), 4 * per_row, rel_tol=1e-6)


# ---------------------------------------------------------------- the JS sums kept with the run (summary "head_js")

TOKENS = [
    ["[CLS]", "a", ",", "b", "[SEP]"],
    ["[CLS]", "c", "[SEP]", "d", ".", "[SEP]"],
    ["[CLS]", "e", "f", "g", "h", "[SEP]"],
    ["[CLS]", "i", "[SEP]"],
]


def random_maps(length: int, seed: int, heads: int = 3) -> np.ndarray:
    """(2 layers, `heads`, L, L) float16 rows, some cells exactly 0, one head a copy of another."""
    rng = np.random.default_rng(seed)
    raw = rng.random((2, heads, length, length), dtype=np.float32) ** 4
    raw[raw < 0.02] = 0
    raw[..., 0] += 1e-3
    maps = (raw / raw.sum(-1, keepdims=True)).astype(np.float16)
    maps[1, 0] = maps[0, 1]  # two identical heads: distance exactly 0
    return maps


def textbook_js(maps: np.ndarray) -> np.ndarray:
    """The one-pair-at-a-time form: 0.5 * sum [p (log p - log m) + q (log q - log m)], 0 where p (q) is 0."""
    p = maps.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p = np.log(p)
        out = np.zeros((len(p), len(p)))
        for a in range(len(p)):
            for b in range(a + 1, len(p)):
                log_m = np.log(0.5 * (p[a] + p[b]))
                kl_a = np.where(p[a] > 0, p[a] * (log_p[a] - log_m), 0.0)
                kl_b = np.where(p[b] > 0, p[b] * (log_p[b] - log_m), 0.0)
                out[a, b] = out[b, a] = 0.5 * (kl_a + kl_b).sum()
    return out


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("block_bytes", [1, 4096, 1 << 30])
def test_blocked_threaded_js_equals_the_pair_by_pair_form_to_the_bit(threads, block_bytes):
    for length, seed in ((1, 0), (6, 1), (23, 2)):
        maps = random_maps(length, seed, heads=4).reshape(-1, length, length)
        expected = textbook_js(maps)
        rows, cols = np.triu_indices(len(maps), 1)
        np.testing.assert_array_equal(js_upper(maps, threads=threads, block_bytes=block_bytes), expected[rows, cols])
        np.testing.assert_array_equal(js_distance_matrix(maps, threads=threads), expected)
    assert js_distance_matrix(random_maps(6, 1).reshape(-1, 6, 6))[1, 3] == 0.0  # the copied head
    tiny = np.random.default_rng(3).random((4, 5, 5)).astype(np.float32)  # float32 subnormals next to zeros
    tiny[tiny < 0.3] = 0
    tiny[0, :, 1], tiny[1, :, 1], tiny[2, 0, :] = np.float32(2**-149), 1e-40, 0
    np.testing.assert_array_equal(js_distance_matrix(tiny, threads=threads), textbook_js(tiny))


def same(a, b):
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for column in a.columns:
        np.testing.assert_allclose(a[column].to_numpy(float), b[column].to_numpy(float), rtol=1e-12, atol=0)


def js_group(store, run="pairs", mode="r"):
    return zarr.open_group(store.locations.array_root, path=f"runs/{run}/summary/head_js", mode=mode)


@pytest.fixture
def run(store, make_run):
    return make_run(store, [random_maps(len(t), i) for i, t in enumerate(TOKENS)], TOKENS, name="pairs", dtype="float16")


@pytest.mark.parametrize("range_size", [4096, 3])  # 3: the summary is kept and read in parts of 3 examples
def test_kept_sums_give_the_naive_results_and_no_map_is_read_again(store, run, monkeypatch, range_size):
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", range_size)
    cases = [(name, examples) for name in ("head_distances", "head_clusters") for examples in (None, [2, 0], [3])]
    kept = [run_query(store, name, run=run, examples=examples) for name, examples in cases]
    group = js_group(store)
    assert group.attrs["stamp"] == {"version": 2, "n_examples": 4}
    assert group["example"][:].tolist() == [0, 1, 2, 3] and group["length"][:].tolist() == [5, 6, 6, 3]
    assert group["js"].shape == (4, 15) and group["js"].dtype == np.float64  # 6 heads: 15 pairs
    rows, cols = np.triu_indices(6, 1)
    heads = random_maps(6, 1).reshape(-1, 6, 6).astype(np.float64)
    expected = textbook_js(0.001 / 6 + 0.999 * heads)  # the authors' smoothing, the default
    np.testing.assert_array_equal(group["js"][1], expected[rows, cols])
    for (name, examples), frame in zip(cases, kept):
        same(frame, reference.query(store, name, run=run, examples=examples))
    d = kept[0].assign(a=kept[0]["layer_a"] * 3 + kept[0]["head_a"], b=kept[0]["layer_b"] * 3 + kept[0]["head_b"])
    copied = {(1, 3), (3, 1)}  # L0H1 and L1H0 are the same head
    assert (d.loc[[(a, b) in copied or a == b for a, b in zip(d["a"], d["b"])], "distance"] == 0).all()
    assert (d.loc[[(a, b) not in copied and a != b for a, b in zip(d["a"], d["b"])], "distance"] > 0).all()

    def no_maps(*args, **kwargs):
        raise AssertionError("the maps were read")

    monkeypatch.setattr(type(store), "iter_attention", no_maps)
    for (name, examples), frame in zip(cases, kept):
        same(run_query(store, name, run=run, examples=examples), frame)


def test_sums_of_a_grown_run_are_rebuilt_and_read_only_stores_compute_alone(store, run, monkeypatch):
    expected = reference.query(store, "head_distances", run=run)
    reader = open_store(db=store.locations.db_url, root=store.locations.array_root, read_only=True)
    try:
        same(run_query(reader, "head_distances", run=run), expected)
        assert not zarr.open_group(store.locations.array_root, path=f"runs/{run}", mode="r").get("summary")  # nothing kept
    finally:
        reader.close()
    run_query(store, "head_distances", run=run)
    group = js_group(store, mode="r+")  # as if kept before the 4th example was stored
    group["js"][...] = 0
    group.attrs["stamp"] = {"version": 2, "n_examples": 3}
    same(run_query(store, "head_distances", run=run), expected)
    assert js_group(store).attrs["stamp"]["n_examples"] == 4


def test_hand_built_run_gives_the_exact_js_both_ways(store, make_run, monkeypatch):
    run = make_run(store, [three_heads(), three_heads()], [["[CLS]", "[SEP]"], ["[CLS]", "[SEP]"]], name="exact")
    per_row = 0.75 * math.log(4 / 3)  # JS([1, 0], [.5, .5]) in nats
    for frame in (run_query(store, "head_distances", run=run, smoothing=0), reference.query(store, "head_distances", run=run, smoothing=0)):
        by_pair = frame.set_index(["head_a", "head_b"])["distance"]
        assert math.isclose(by_pair[0, 1], 4 * per_row, rel_tol=1e-12) and math.isclose(by_pair[2, 1], 4 * per_row, rel_tol=1e-12)
        assert by_pair[0, 2] == 0 and by_pair[1, 1] == 0
        assert math.isclose(frame.set_index(["head_a", "head_b"])["mean_distance"][1, 2], per_row, rel_tol=1e-12)


def test_smoothing_is_checked_and_each_setting_is_kept_apart(store, make_run):
    from attnstore.queries.errors import InvalidArgumentError
    from attnstore.queries.head_clusters import HEAD_JS

    run = make_run(store, [three_heads()], [["[CLS]", "[SEP]"]], name="smooth")
    for bad in (1.0, -0.1):
        with pytest.raises(InvalidArgumentError, match=rf"smoothing={bad!r}: give a number from 0"):
            run_query(store, "head_distances", run=run, smoothing=bad)
    raw, smooth = (run_query(store, "head_distances", run=run, smoothing=s)["distance"] for s in (0, 0.001))
    assert (smooth <= raw).all() and (smooth < raw).any()  # mixing with the uniform distribution brings heads closer
    kept = zarr.open_group(store.locations.array_root, path=f"runs/{run}/summary", mode="r")
    assert {"head_js", HEAD_JS.key({"smoothing": 0})} <= set(kept.group_keys())
