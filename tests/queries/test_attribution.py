"""Attention vs attribution (Jain & Wallace 2019): Kendall's tau-b against scipy, and the query on hand-built runs whose
saliency is written as `attnstore saliency` writes it (the run group's `saliency` array and attribute)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnstore.queries import run_query
from attnstore.queries.attribution import kendall_tau_b
from attnstore.store import arrays
from attnstore.store.errors import InvalidArgumentError
from attnstore.tests.queries.helpers import write_saliency

TOKENS = [["[CLS]", "a", "bb", "c", "[SEP]"], ["[CLS]", "dd", "e", "[SEP]"]]


def test_tau_b_equals_scipy_with_and_without_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for n in (2, 3, 7, 20):
        y = rng.integers(0, 4, n).astype(float)  # ties
        x = np.stack([rng.random(n), rng.integers(0, 3, n).astype(float)])
        got = kendall_tau_b(x, y)
        for row, value in zip(x, got):
            expected = stats.kendalltau(row, y).statistic
            assert (np.isnan(value) and np.isnan(expected)) or value == pytest.approx(expected, abs=1e-12)
    assert np.isnan(kendall_tau_b(np.ones((1, 4)), np.arange(4.0)))[0]  # uniform attention ranks nothing


def saliency_of(store, run: str, values: list[list[float]]) -> None:
    write_saliency(store, run, [np.asarray(v) for v in values])


def designed() -> list[np.ndarray]:
    """1 layer, 3 heads. The [CLS] row (row 0): head 0 ranks the words as the saliency does, head 1 the other way round,
    head 2 uniform. Other rows uniform."""
    out = []
    for toks, rows in (
        (TOKENS[0], ([0.1, 0.5, 0.2, 0.1, 0.1], [0.1, 0.1, 0.2, 0.5, 0.1])),
        (TOKENS[1], ([0.2, 0.5, 0.1, 0.2], [0.2, 0.1, 0.5, 0.2])),
    ):
        n = len(toks)
        maps = np.full((1, 3, n, n), 1 / n, dtype=np.float32)
        maps[0, 0, 0], maps[0, 1, 0] = rows
        out.append(maps)
    return out


SALIENCY = [[9.0, 3.0, 2.0, 1.0, 9.0], [9.0, 2.0, 1.0, 9.0]]  # words a > bb > c, dd > e; specials ignored by default


def test_tau_per_head_by_hand(store, make_run):
    run = make_run(store, designed(), TOKENS, name="attr")
    saliency_of(store, run, SALIENCY)
    frame = run_query(store, "attention_attribution", run=run).set_index("head")
    assert frame.loc[0, "tau"] == pytest.approx(1.0) and frame.loc[1, "tau"] == pytest.approx(-1.0)
    assert np.isnan(frame.loc[2, "tau"]) and frame.loc[2, "n_examples"] == 0  # uniform: no ranking, left out
    assert frame.loc[0, "tau_sd"] == pytest.approx(0.0) and frame.loc[0, "n_examples"] == 2
    assert np.isnan(frame.loc[0, "tau_norm"])  # no value norms in this run
    # rollout of one layer: 0.5 (mean of the three heads) + 0.5 I; the [CLS] row over the words:
    # example 0: heads' rows over a, bb, c are (.5,.2,.1), (.1,.2,.5), (.2,.2,.2) -> mean (.2667, .2, .2667): tied a/c
    rolled = np.array([0.8 / 3, 0.6 / 3, 0.8 / 3])
    expected_0 = kendall_tau_b(rolled[None], np.array([3.0, 2.0, 1.0]))[0]
    rolled_1 = np.array([0.8 / 3, 0.8 / 3])  # dd, e: (.5 + .1 + .25) / 3 and (.1 + .5 + .25) / 3, tied
    assert np.isnan(kendall_tau_b(rolled_1[None], np.array([2.0, 1.0]))[0])
    assert frame.loc[0, "tau_rollout"] == pytest.approx(expected_0)
    assert -1 <= frame.loc[0, "tau_random"] <= 1
    with_specials = run_query(store, "attention_attribution", run=run, specials="include").set_index("head")
    assert with_specials.loc[0, "tau"] != frame.loc[0, "tau"]


def test_norm_weighted_rows_are_compared_where_the_run_keeps_norms(store, make_run):
    norms = [np.ones((1, 3, 5), np.float32), np.ones((1, 3, 4), np.float32)]
    norms[0][0, 2, 1:4] = [3.0, 2.0, 1.0]  # head 2's uniform row, weighted by norms ranked as the saliency: tau 1
    norms[1][0, 2, 1:3] = [2.0, 1.0]
    run = make_run(store, designed(), TOKENS, name="attr-normed", norms_list=norms)
    saliency_of(store, run, SALIENCY)
    frame = run_query(store, "attention_attribution", run=run).set_index("head")
    assert frame.loc[2, "tau_norm"] == pytest.approx(1.0) and frame.loc[0, "tau_norm"] == pytest.approx(1.0)


def test_a_run_without_saliency_is_refused_in_one_line(store, make_run):
    run = make_run(store, designed(), TOKENS, name="no-saliency")
    with pytest.raises(InvalidArgumentError, match="run 'no-saliency' has no saliency: run `attnstore saliency --run no-saliency`") as err:
        run_query(store, "attention_attribution", run=run)
    assert "\n" not in str(err.value)
    with pytest.raises(InvalidArgumentError, match="specials='some'"):
        run_query(store, "attention_attribution", run=run, specials="some")


def test_check_verifies_the_saliency_and_a_bundle_carries_it(tmp_path, store, make_run):
    from attnstore.store import migrate, open_store
    from attnstore.store.bundle import export_runs, import_bundle
    from attnstore.store.check import check_run

    run = make_run(store, designed(), TOKENS, name="attr-check")
    saliency_of(store, run, SALIENCY)
    assert not check_run(store, run).problems
    export_runs(store, [run], str(tmp_path / "b.zip"))
    url = f"sqlite:///{tmp_path / 'dst.sqlite'}"
    migrate.upgrade(url)
    dst = open_store(db=url, root=str(tmp_path / "dst.zarr"))
    try:
        import_bundle(dst, str(tmp_path / "b.zip"))
        assert dst.saliency_info(run)["complete"]
        assert [v.tolist() for _, v in dst.iter_saliency(run)] == SALIENCY
    finally:
        dst.close()
    info = store.run_info(run)
    arrays.TokenArray(store.locations.array_root, info.array_path, arrays.SALIENCY, read_only=False).write(
        0, np.array([np.nan], np.float32)
    )
    assert any("saliency" in p["problem"] and "attnstore saliency" in p["problem"] for p in check_run(store, run).problems)


def test_absolute_saliency_by_default_signed_as_the_option(store, make_run):
    """Jain & Wallace rank by |gradient x input| (their plotting code takes the absolute value before Kendall's tau): the
    default; the signed product is the option. Hand-built saliency of known signs tells the two apart."""
    run = make_run(store, designed(), TOKENS, name="attr-signed")
    # words a, bb, c of known signs: by magnitude a > bb > c as head 0 ranks them, signed bb > c > a
    saliency_of(store, run, [[0.0, -3.0, 2.0, 1.0, 0.0], [0.0, 2.0, 1.0, 0.0]])
    default = run_query(store, "attention_attribution", run=run).set_index("head")
    signed = run_query(store, "attention_attribution", run=run, saliency="signed").set_index("head")
    absolute = run_query(store, "attention_attribution", run=run, saliency="absolute").set_index("head")
    assert default.equals(absolute) and not default.equals(signed)
    tau = {s: kendall_tau_b(np.array([[0.5, 0.2, 0.1]]), np.array(v))[0] for s, v in (("signed", [-3, 2, 1]), ("absolute", [3, 2, 1]))}
    assert tau["absolute"] == pytest.approx(1.0) and tau["signed"] == pytest.approx(-1 / 3)
    assert signed.loc[0, "tau"] == pytest.approx((tau["signed"] + 1) / 2)  # example 1 (dd > e both ways): tau 1
    assert absolute.loc[0, "tau"] == pytest.approx(1.0)
    # head 1 ranks c > bb > a: against the magnitudes -1, against the signed bb > c > a 1/3; example 1 (e > dd) -1
    assert absolute.loc[1, "tau"] == pytest.approx(-1.0) and signed.loc[1, "tau"] == pytest.approx((1 / 3 - 1) / 2)
    with pytest.raises(InvalidArgumentError, match="saliency='abs'"):
        run_query(store, "attention_attribution", run=run, saliency="abs")


def test_summaries_kept_under_the_old_signed_default_are_not_read_as_absolute(store, make_run):
    from attnstore.queries.attribution import ATTRIBUTION_TAU

    assert ATTRIBUTION_TAU.version >= 2 and ATTRIBUTION_TAU.defaults["saliency"] == "absolute"
    assert ATTRIBUTION_TAU.key({}) == ATTRIBUTION_TAU.key({"saliency": "absolute"}) != ATTRIBUTION_TAU.key({"saliency": "signed"})


def test_kept_taus_follow_a_recomputed_saliency(store, make_run):
    run = make_run(store, designed(), TOKENS, name="attr-again")
    saliency_of(store, run, SALIENCY)
    assert run_query(store, "attention_attribution", run=run).set_index("head").loc[0, "tau"] == pytest.approx(1.0)
    info = store.run_info(run)
    reversed_saliency = [[9.0, 1.0, 2.0, 3.0, 9.0], [9.0, 1.0, 2.0, 9.0]]
    saliency_of(store, run, reversed_saliency)
    arrays.set_run_group_attribute(
        store.locations.array_root, info.array_path, arrays.SALIENCY, {**store.saliency_info(run), "method": "other"}
    )
    assert run_query(store, "attention_attribution", run=run).set_index("head").loc[0, "tau"] == pytest.approx(-1.0)


def test_seed_run_gives_the_agreement_of_two_saliencies(store, make_run):
    from attnstore.tests.queries.helpers import hand_run

    run = make_run(store, designed(), TOKENS, name="attr-seed0")
    saliency_of(store, run, SALIENCY)
    info = store.run_info(run)
    other = hand_run(store, "attr-seed1", dataset_id=info.dataset_id, n_layers=1, n_heads=3, dtype="float32", specials=info.special_tokens)
    writer = store.writer.run_writer(other.id)
    ids = dict(store.sql("SELECT position, id FROM examples WHERE dataset_id = :d", {"d": info.dataset_id}).values.tolist())
    for example, maps in enumerate(designed()):
        rows = store.tokens(run, example)[["token", "token_id", "word_position", "segment", "is_special"]].to_dict("records")
        rows = [
            dict(r, word_position=None if pd.isna(r["word_position"]) else int(r["word_position"]), char_start=None, char_end=None)
            for r in rows
        ]
        writer.add(ids[example], maps, rows)
        writer.commit()
    writer.finish(0.0)
    # seed 1 ranks example 0's words a > c > bb (tau with a > bb > c: 1/3) and example 1's e > dd (tau -1)
    saliency_of(store, "attr-seed1", [[9.0, 3.0, 1.0, 2.0, 9.0], [9.0, 1.0, 2.0, 9.0]])
    frame = run_query(store, "attention_attribution", run=run, seed_run="attr-seed1")
    assert frame["tau_seed"].to_numpy() == pytest.approx(np.full(3, (1 / 3 - 1) / 2))
    with pytest.raises(InvalidArgumentError, match="over another dataset"):
        run_query(store, "attention_attribution", run=run, seed_run=make_run(store, designed(), TOKENS, name="elsewhere"))
