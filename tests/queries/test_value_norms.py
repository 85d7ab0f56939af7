"""Value norms (Kobayashi et al. 2020) stored beside the maps, and queries with weights="norm", on hand-built runs.

Expected values are worked out by hand: weighting a row by the keys' norms and renormalising gives
a'_ij = a_ij n_j / sum_k a_ik n_k.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from attnstore.queries import run_query
from attnstore.store.errors import InvalidArgumentError
from attnstore.tests.queries.helpers import assert_same_frames_within, read_only_store

# The analysis, not the database: SQLite only (kept summaries are Zarr; each query's SQL meets PostgreSQL in test_conformance.py).
pytestmark = pytest.mark.one_backend

TOKENS = [["[CLS]", "a", "[SEP]"], ["[CLS]", "bb", "c", "[SEP]"]]


def uniform(length: int, heads: int = 2) -> np.ndarray:
    return np.full((1, heads, length, length), 1 / length, dtype=np.float32)


def norms_of(length: int) -> np.ndarray:
    """(layer, head, key): head 0 weighs every key 1; head 1 weighs a plain token twice as much as a special one."""
    n = np.ones((1, 2, length), dtype=np.float32)
    n[0, 1, 1:-1] = 2.0
    return n


@pytest.fixture
def normed(store, make_run):
    return make_run(store, [uniform(3), uniform(4)], TOKENS, name="normed", norms_list=[norms_of(3), norms_of(4)])


def test_norms_are_read_back_per_example_in_storage_order(store, normed):
    assert store.has_value_norms(normed)
    assert np.array_equal(store.value_norms(normed, 1), norms_of(4))
    got = dict(store.iter_value_norms(normed))
    assert sorted(got) == [0, 1] and np.array_equal(got[0], norms_of(3))
    assert [e for e, _ in store.iter_value_norms(normed, [1])] == [1]
    # plain zarr: (token, layer, head), the examples' tokens back to back
    array = zarr.open_array(store.locations.array_root, path="runs/normed/value_norm", mode="r")
    assert array.shape == (7, 1, 2) and array.dtype == np.float16
    assert array[:, 0, 1].tolist() == [1, 2, 1, 1, 2, 2, 1]


def test_special_tokens_weighted_by_norms_by_hand(store, normed):
    plain = run_query(store, "special_tokens", run=normed).set_index("head")
    weighted = run_query(store, "special_tokens", run=normed, weights="norm").set_index("head")
    # head 0 (all norms 1): the same as the maps
    for column in ("to_cls", "to_sep", "to_other"):
        assert weighted.loc[0, column] == pytest.approx(plain.loc[0, column], abs=1e-7)
    # head 1, example 0: row (1/3)(1, 2, 1) -> (1/4, 1/2, 1/4); example 1: (1/4)(1, 2, 2, 1) -> (1/6, 1/3, 1/3, 1/6)
    assert weighted.loc[1, "to_cls"] == pytest.approx((1 / 4 + 1 / 6) / 2)
    assert weighted.loc[1, "to_sep"] == pytest.approx((1 / 4 + 1 / 6) / 2)
    assert weighted.loc[1, "to_other"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert plain.loc[1, "to_cls"] == pytest.approx((1 / 3 + 1 / 4) / 2)  # the kept attention summary is untouched


def test_entropy_weighted_by_norms_by_hand(store, normed):
    frame = run_query(store, "entropy", run=normed, weights="norm").set_index("head")
    h0 = -(2 * 0.25 * np.log(0.25) + 0.5 * np.log(0.5))
    h1 = -(2 * (1 / 6) * np.log(1 / 6) + 2 * (1 / 3) * np.log(1 / 3))
    assert frame.loc[1, "entropy"] == pytest.approx((h0 + h1) / 2)
    assert frame.loc[0, "entropy"] == pytest.approx((np.log(3) + np.log(4)) / 2, rel=1e-6)


def test_a_read_only_store_computes_the_same_weighted_values(store, normed):
    expected = run_query(store, "special_tokens", run=normed, weights="norm")
    with read_only_store(store) as reader:
        got = run_query(reader, "special_tokens", run=normed, weights="norm")
    assert np.allclose(got.to_numpy(float), expected.to_numpy(float), rtol=0, atol=0)


def test_a_run_without_norms_is_refused_in_one_line(store, make_run):
    run = make_run(store, [uniform(3)], TOKENS[:1], name="plain")
    assert not store.has_value_norms(run)
    with pytest.raises(InvalidArgumentError, match="run 'plain' has no value norms") as err:
        run_query(store, "special_tokens", run=run, weights="norm")
    assert "\n" not in str(err.value)
    with pytest.raises(InvalidArgumentError, match="run 'plain' has no value norms"):
        store.value_norms(run, 0)


def test_unknown_weights_are_refused(store, normed):
    with pytest.raises(InvalidArgumentError, match="weights='value'"):
        run_query(store, "special_tokens", run=normed, weights="value")


def test_writer_refuses_missing_or_misshapen_norms(store, make_run):
    from attnstore.store.errors import InvalidArgumentError as Invalid

    name, writer = make_run(store, [uniform(3)], TOKENS[:1], name="partial", norms_list=[norms_of(3)], finish=False)
    try:
        ids = dict(store.sql("SELECT position, id FROM examples").values.tolist())
        rows = [dict(token=t, token_id=1, word_position=None, segment=0, is_special=False, char_start=None, char_end=None) for t in "xyz"]
        with pytest.raises(Invalid, match="keeps value norms"):
            writer.add(ids[0], uniform(3), rows)
        with pytest.raises(Invalid, match="value norms of shape"):
            writer.add(ids[0], uniform(3), rows, norms=np.ones((2, 1, 2), np.float32))
    finally:
        writer.close()


def test_norms_written_but_never_committed_are_overwritten_on_resume(store, make_run):
    """A writer cut off after writing an example's norms but before its rows committed: the next writer starts from the
    committed token count, so the stored norms are those of a clean run."""
    name, writer = make_run(
        store, [uniform(3), uniform(4)], TOKENS, name="resumed", norms_list=[norms_of(3), norms_of(4)], write=1, finish=False
    )
    info = store.run_info(name)
    writer._write_norms([np.full((4, 1, 2), 9.0, np.float32)])  # on disk, no rows: as a crash between the two
    writer.close()
    ids = dict(store.sql("SELECT e.position, e.id FROM examples e WHERE e.dataset_id = :d", {"d": info.dataset_id}).values.tolist())
    rows = [
        dict(token=t, token_id=1, word_position=None, segment=0, is_special=t.startswith("["), char_start=None, char_end=None)
        for t in TOKENS[1]
    ]
    again = store.writer.run_writer(info.id)
    again.add(ids[1], uniform(4), rows, norms=norms_of(4).transpose(2, 0, 1))
    again.finish(0.0)
    assert np.array_equal(store.value_norms(name, 1), norms_of(4))
    assert np.array_equal(store.value_norms(name, 0), norms_of(3))


def test_norms_travel_in_a_bundle_and_check_verifies_them(tmp_path, store, normed):
    from attnstore.store import migrate, open_store
    from attnstore.store.bundle import export_runs, import_bundle
    from attnstore.store.check import check_run

    assert not check_run(store, normed).problems
    export_runs(store, [normed], str(tmp_path / "b.zip"))
    url = f"sqlite:///{tmp_path / 'dst.sqlite'}"
    migrate.upgrade(url)
    dst = open_store(db=url, root=str(tmp_path / "dst.zarr"))
    try:
        import_bundle(dst, str(tmp_path / "b.zip"))
        assert dst.has_value_norms(normed)
        for example in (0, 1):
            assert np.array_equal(dst.value_norms(normed, example), store.value_norms(normed, example))
        assert not check_run(dst, normed).problems
    finally:
        dst.close()


def test_check_reports_norms_missing_or_cut_short(store, normed):
    from attnstore.store.check import check_run

    array = zarr.open_array(store.locations.array_root, path="runs/normed/value_norm", mode="r+")
    array.resize((5, 1, 2))  # two tokens short of the seven committed
    report = check_run(store, normed)
    assert any("value_norm" in p["problem"] for p in report.problems)
    array.resize((7, 1, 2))
    array[6] = np.array([[np.inf, 1]], np.float16)
    report = check_run(store, normed)
    assert any("not finite" in p["problem"] for p in report.problems)


@pytest.mark.parametrize("query", ["relative_position", "special_tokens", "entropy", "head_distances"])
def test_weighted_queries_equal_the_naive_reference(store, make_run, query):
    """Random maps and norms: each query with weights="norm" equals the naive reference (maps weighted and renormalised
    with loops, tests/queries/reference.py), to float32 rounding of the weighted maps."""
    from attnstore.tests.queries import reference

    rng = np.random.default_rng(3)
    tokens = [["[CLS]", "a", ".", "bb", "[SEP]"], ["[CLS]", "c", "[SEP]", "dd", ",", "[SEP]"]]
    maps, norms = [], []
    for toks in tokens:
        m = rng.random((2, 3, len(toks), len(toks))).astype(np.float32) + 0.01
        maps.append(m / m.sum(-1, keepdims=True))
        norms.append((rng.random((2, 3, len(toks))) * 4).astype(np.float16).astype(np.float32))
    run = make_run(store, maps, tokens, name="random", norms_list=norms)
    got = run_query(store, query, run=run, weights="norm")
    assert_same_frames_within(got, reference.query(store, query, run=run, weights="norm"), 2e-6)
    plain = run_query(store, query, run=run)
    assert not np.allclose(got.to_numpy(float), plain.to_numpy(float))  # the weights change the answer


def test_norm_attention_by_hand(store, normed):
    frame = run_query(store, "norm_attention", run=normed).set_index("head")
    h = frame.loc[1]  # example 0: uniform 1/3 rows, norms (1, 2, 1); example 1: uniform 1/4 rows, norms (1, 2, 2, 1)
    assert h["weight_cls"] == pytest.approx((1 / 3 + 1 / 4) / 2)
    assert h["weight_other"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert h["norm_cls"] == pytest.approx(1.0) and h["norm_other"] == pytest.approx(2.0)
    assert h["contribution_cls"] == pytest.approx((1 / 3 + 1 / 4) / 2)
    assert h["contribution_other"] == pytest.approx((2 / 3 + 1) / 2)
    assert h["share_cls"] == pytest.approx((1 / 4 + 1 / 6) / 2)
    assert np.isnan(h["norm_punct"]) and h["weight_punct"] == 0  # no punctuation: no norm, no weight
    shares = frame[["share_cls", "share_sep", "share_punct", "share_other"]].sum(axis=1)
    np.testing.assert_allclose(shares, 1.0)
    weighted = run_query(store, "special_tokens", run=normed, weights="norm").set_index("head")
    np.testing.assert_allclose(frame["share_other"], weighted["to_other"], rtol=1e-6)  # the same shares, two ways


def test_norm_attention_refuses_a_run_without_norms(store, make_run):
    run = make_run(store, [uniform(3)], TOKENS[:1], name="plain2")
    with pytest.raises(InvalidArgumentError, match="run 'plain2' has no value norms"):
        run_query(store, "norm_attention", run=run)
