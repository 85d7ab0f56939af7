"""Range reductions (queries/engine/totals.py `summary_totals`, store/arrays.py `SummaryRanges`): a whole-run
`relative_position`, `special_tokens` or `entropy` adds the Clark totals kept per range of examples instead of every
example's fields. Exact values on hand-built maps, and the range path against the per-example path (relative 1e-12)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from attnstore.queries import clark, load_all, run_query
from attnstore.queries import engine as summary
from attnstore.queries.clark import CLARK
from attnstore.queries.engine import kept_ranges
from attnstore.store import arrays, summaries

DATA = str(Path(__file__).parents[1] / "fixtures" / "data")
QUERIES = ("relative_position", "special_tokens", "entropy")
RTOL = 1e-12  # the documented tolerance between the two paths (they add the same per-range totals in the same order)


def hand_run(store, make_run):
    """Two examples: [CLS] a [SEP] attending to itself only, [CLS] a . [SEP] attending uniformly; 1 layer, 2 heads."""
    one = np.broadcast_to(np.eye(3, dtype=np.float32), (1, 2, 3, 3)).copy()
    two = np.full((1, 2, 4, 4), 0.25, dtype=np.float32)
    return make_run(store, [one, two], [["[CLS]", "a", "[SEP]"], ["[CLS]", "a", ".", "[SEP]"]], name="ranges", dtype="float32")


def random_maps(tokens, seed):
    rng = np.random.default_rng(seed)
    raw = rng.random((3, 2, len(tokens), len(tokens)), dtype=np.float32) ** 3 + 1e-3
    return (raw / raw.sum(-1, keepdims=True)).astype(np.float16)


TOKENS = [["[CLS]", *(["a", ",", "b", "."] * (1 + i % 3))[: 2 + i % 5], "[SEP]"] for i in range(9)]


def both_paths(store, run, monkeypatch, **params) -> dict[str, tuple]:
    """Each query's frame by the range path and by the per-example path."""
    out = {}
    for name in QUERIES:
        ranged = run_query(store, name, run=run, **params)
        with summary.per_example_totals():
            per_example = run_query(store, name, run=run, **params)
        out[name] = (ranged, per_example)
    return out


@pytest.mark.parametrize("average", ["example", "token"])
def test_exact_values_from_kept_ranges(store, make_run, monkeypatch, average):
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 1)  # one range per example: the query adds two kept ranges
    run = hand_run(store, make_run)
    first = {name: run_query(store, name, run=run, average=average) for name in QUERIES}  # builds summary and ranges
    info = store.run_info(run)
    kept = kept_ranges(store, info, CLARK)
    assert kept is not None and kept.n == 2
    assert kept.block(0, 2)["range_examples"].tolist() == [1, 1]

    def refuse(*args, **kwargs):
        raise AssertionError("a whole-run query read per-example fields although ranges are kept")

    monkeypatch.setattr("attnstore.queries.engine.kept._summary_parts", refuse)
    frames = {name: run_query(store, name, run=run, average=average) for name in QUERIES}
    for name in QUERIES:
        np.testing.assert_array_equal(frames[name].to_numpy(), first[name].to_numpy())
    rp, st, en = frames["relative_position"], frames["special_tokens"], frames["entropy"]
    log3, log4 = math.log(3), math.log(4)
    if average == "example":  # each example's mean, then the mean of the two
        expect_rp = dict(to_previous=(0 + 3 / 16) / 2, to_self=(1 + 1 / 4) / 2, to_next=(0 + 3 / 16) / 2)
        expect_st = dict(
            to_cls=(1 / 3 + 1 / 4) / 2, to_sep=(1 / 3 + 1 / 4) / 2, to_punct=(0 + 1 / 4) / 2, to_other=(1 / 3 + 1 / 4) / 2,
            sep_from_sep=(1 + 1 / 4) / 2, sep_from_other=(0 + 1 / 4) / 2,
        )  # fmt: skip
        expect_en = dict(
            entropy=log4 / 2, entropy_from_cls=log4 / 2, uniform_entropy=(log3 + log4) / 2, uniform_entropy_from_cls=(log3 + log4) / 2
        )
    else:  # pooled over the 7 query tokens (5 with a previous token)
        expect_rp = dict(to_previous=(3 / 4) / 5, to_self=(3 + 1) / 7, to_next=(3 / 4) / 5)
        expect_st = dict(
            to_cls=2 / 7, to_sep=2 / 7, to_punct=1 / 7, to_other=2 / 7, sep_from_sep=(1 + 1 / 4) / 2, sep_from_other=(0 + 3 / 4) / 5
        )
        expect_en = dict(
            entropy=4 * log4 / 7,
            entropy_from_cls=log4 / 2,
            uniform_entropy=(3 * log3 + 4 * log4) / 7,
            uniform_entropy_from_cls=(log3 + log4) / 2,
        )
    for frame, expect in ((rp, expect_rp), (st, expect_st), (en, expect_en)):
        assert len(frame) == 2
        for column, value in expect.items():
            rtol = 1e-6 if column in ("entropy", "entropy_from_cls") else 1e-15  # each p log p is a float32 (store/float16.py)
            np.testing.assert_allclose(frame[column].to_numpy(), value, rtol=rtol, atol=1e-15, err_msg=column)


def test_range_path_equals_per_example_path(store, make_run, monkeypatch):
    load_all()
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 2)  # 9 examples: 5 ranges, the last of one
    run = make_run(store, [random_maps(t, i) for i, t in enumerate(TOKENS)], TOKENS, name="ranged", dtype="float16")
    for average in ("example", "token"):
        for name, (ranged, per_example) in both_paths(store, run, monkeypatch, average=average).items():
            np.testing.assert_allclose(ranged.to_numpy(float), per_example.to_numpy(float), rtol=RTOL, atol=0, err_msg=name)
    assert kept_ranges(store, store.run_info(run), CLARK).n == 5
    # a subset (examples=) takes the per-example path: the same numbers as a run of those examples alone
    sub = run_query(store, "special_tokens", run=run, examples=[0, 4, 7])
    alone = make_run(store, [random_maps(TOKENS[i], i) for i in (0, 4, 7)], [TOKENS[i] for i in (0, 4, 7)], name="alone", dtype="float16")
    np.testing.assert_allclose(sub.to_numpy(float), run_query(store, "special_tokens", run=alone).to_numpy(float), rtol=RTOL)


def test_a_summary_kept_without_ranges_gets_them(store, make_run, monkeypatch):
    """A summary kept before range reductions existed: the first whole-run query derives them from it, once."""
    import shutil

    run = make_run(store, [random_maps(t, i) for i, t in enumerate(TOKENS)], TOKENS, name="old", dtype="float16")
    info = store.run_info(run)
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 4)
    before = run_query(store, "entropy", run=run)
    group = Path(store.locations.array_root) / arrays.group_path_of(info.array_path) / "summary" / "clark"
    shutil.rmtree(group / "ranges")
    stamp = CLARK.stamp(store.n_committed(info.id))
    assert store.summaries(info.id).ranges("clark", stamp) is None and store.summaries(info.id).parts("clark", stamp) is not None
    after = run_query(store, "entropy", run=run)
    assert store.summaries(info.id).ranges("clark", stamp).n == 3  # 9 examples in ranges of 4
    np.testing.assert_allclose(after.to_numpy(float), before.to_numpy(float), rtol=RTOL, atol=0)


@pytest.mark.model
@pytest.mark.one_backend
def test_real_run_range_path_equals_per_example_path(store, loaded_model, monkeypatch):
    """The real model's maps of the UD excerpt, in ranges of 7 examples."""
    from attnstore.ingest import ingest

    load_all()
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 7)
    run = ingest(store, dataset="ud/en_ewt:dev", data_dir=DATA, loaded=loaded_model, progress=False).run.name
    for average in ("example", "token"):
        for name, (ranged, per_example) in both_paths(store, run, monkeypatch, average=average).items():
            np.testing.assert_allclose(ranged.to_numpy(float), per_example.to_numpy(float), rtol=RTOL, atol=0, err_msg=name)
    info = store.run_info(run)
    assert kept_ranges(store, info, CLARK).n == -(-store.n_committed(info.id) // 7)


def test_a_pinned_run_counts_its_examples_from_the_runs_row(store, make_run):
    """`n_committed` of a pinned run (every query's) is `runs.n_stored` read with the pin, not a count over the rows
    (seconds at millions of examples); `attnstore check` still counts the rows and reports a runs row that disagrees."""
    import sqlalchemy as sa

    from attnstore.store.check import check_run

    run = make_run(store, [random_maps(t, i) for i, t in enumerate(TOKENS)], TOKENS, name="counted", dtype="float16")
    info = store.run_info(run)
    with store.pinned(info.id):
        assert store.n_committed(info.id) == store.n_committed(info.id, counted=True) == 9
    assert check_run(store, run).problems == []
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE runs SET n_stored = 7 WHERE id = :r"), {"r": info.id})
    with store.pinned(info.id):
        assert (store.n_committed(info.id), store.n_committed(info.id, counted=True)) == (7, 9)
    problems = [p["problem"] for p in check_run(store, run).problems]
    assert any("runs row says 7 stored" in p for p in problems), problems


def test_ranges_that_do_not_cover_the_summary_are_not_added(store, make_run, monkeypatch):
    """Ranges under the right stamp that hold fewer examples than the summary (two writers overwriting one group) are
    not used: the writable store derives them again, and the result is the per-example path's."""
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 4)
    run = make_run(store, [random_maps(t, i) for i, t in enumerate(TOKENS)], TOKENS, name="short", dtype="float16")
    info = store.run_info(run)
    want = run_query(store, "special_tokens", run=run)
    stamp = CLARK.stamp(9)
    kept = store.summaries(info.id).ranges("clark", stamp)
    first = {k: v[:1] for k, v in kept.block(0, 1).items()}
    writer = summaries.SummaryRangesWriter(store.locations.array_root, info.array_path, "clark")
    writer.extend(first.pop("range_examples"), first)  # one range of 4 examples, stamped
    writer.finish(stamp)
    assert store.summaries(info.id).ranges("clark", stamp).n_examples() == 4
    np.testing.assert_allclose(run_query(store, "special_tokens", run=run).to_numpy(float), want.to_numpy(float), rtol=RTOL, atol=0)
    assert store.summaries(info.id).ranges("clark", stamp).n_examples() == 9  # derived again from the summary


def test_a_read_only_store_adds_the_kept_ranges(store, make_run, monkeypatch):
    """A collaborator's read-only store reads the ranges a writable one kept; with none kept it takes the per-example
    path, computed for the call alone, and gets the same numbers."""
    from attnstore.store import open_store

    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 4)
    run = make_run(store, [random_maps(t, i) for i, t in enumerate(TOKENS)], TOKENS, name="shared", dtype="float16")
    reader = open_store(db=store.locations.db_url, root=store.locations.array_root, read_only=True)
    try:
        computed = run_query(reader, "entropy", run=run)  # nothing kept yet: computed from the maps for this call
        assert kept_ranges(reader, reader.run_info(run), CLARK) is None
        kept = run_query(store, "entropy", run=run)  # the writable store keeps summary and ranges
        assert kept_ranges(reader, reader.run_info(run), CLARK).n == 3
        with monkeypatch.context() as m:
            refuse = lambda *a, **k: (_ for _ in ()).throw(AssertionError("per-example path"))  # noqa: E731
            m.setattr("attnstore.queries.engine.kept._summary_parts", refuse)
            ranged = run_query(reader, "entropy", run=run)
    finally:
        reader.close()
    for frame in (computed, kept):
        np.testing.assert_allclose(ranged.to_numpy(float), frame.to_numpy(float), rtol=RTOL, atol=0)


def test_ranges_are_packed_one_array_per_dtype_and_an_older_group_is_derived_again(store, make_run, monkeypatch):
    """The ranges' fields are kept in one array per dtype (a first query creates 2 arrays, not ~40); a group written
    before packing (one array per field, no `fields` attribute) is not read: the writable store derives it again."""
    import zarr

    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 4)
    run = make_run(store, [random_maps(t, i) for i, t in enumerate(TOKENS)], TOKENS, name="packed", dtype="float16")
    info = store.run_info(run)
    want = run_query(store, "entropy", run=run)
    path = f"{arrays.group_path_of(info.array_path)}/summary/clark/ranges"
    group = zarr.open_group(store.locations.array_root, path=path, mode="r")
    assert sorted(name for name, _ in group.arrays()) == ["packed_float64", "packed_int64"]
    kept = store.summaries(info.id).ranges("clark", CLARK.stamp(9))
    block = kept.block(0, kept.n)
    assert block["range_examples"].tolist() == [4, 4, 1] and block["entropy"].shape == (3, 3, 2)
    totals = {name: value.sum(0) for name, value in block.items()}
    parts = list(summary.summary_parts(store, info, CLARK))
    direct = [clark._clark_totals(p) for p in parts]
    for name in direct[0]:
        np.testing.assert_allclose(totals[name], sum(d[name] for d in direct), rtol=RTOL, atol=0, err_msg=name)

    old = zarr.create_group(store.locations.array_root, path=path, overwrite=True, attributes={"stamp": CLARK.stamp(9)})
    old.create_array("range_examples", data=np.asarray([9], np.int64))
    assert store.summaries(info.id).ranges("clark", CLARK.stamp(9)) is None
    np.testing.assert_allclose(run_query(store, "entropy", run=run).to_numpy(float), want.to_numpy(float), rtol=RTOL, atol=0)
    assert store.summaries(info.id).ranges("clark", CLARK.stamp(9)).n_examples() == 9


@pytest.mark.parametrize("query", ["head_roles", "rollout"])
def test_other_kinds_add_their_kept_ranges_as_their_parts(store, make_run, monkeypatch, query):
    """`head_roles` and `rollout` declare range reductions too: the whole run adds the kept ranges, equal to adding
    every part's per-example fields (relative 1e-12), and to what a subset of every example gives."""
    load_all()
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 2)  # 9 examples: 5 ranges
    run = make_run(store, [random_maps(t, i) for i, t in enumerate(TOKENS)], TOKENS, name=f"{query}-ranges", dtype="float16")
    kind = summary.KINDS[query]
    ranged = run_query(store, query, run=run)
    kept = kept_ranges(store, store.run_info(run), kind)
    assert kept is not None and kept.n == 5 and kept.block(0, 5)["range_examples"].tolist() == [2, 2, 2, 2, 1]
    with summary.per_example_totals():
        per_example = run_query(store, query, run=run)
    subset = run_query(store, query, run=run, examples=list(range(9)))
    for frame in (per_example, subset):
        assert list(frame.columns) == list(ranged.columns)
        for column in ranged.columns:
            np.testing.assert_allclose(frame[column].to_numpy(float), ranged[column].to_numpy(float), rtol=RTOL, atol=0, err_msg=column)
