"""Per-row statistics kept by `attnstore ingest` (ingest/row_stats.py) for tiny decoders, dense and Q/K tiers, against
a computation of each field written here in numpy from the transformers model's own eager maps; blocks of 3 rows, so
every row block and a batch of examples of different lengths (padding rows) are crossed."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnstore.store import row_stats as fmt  # noqa: E402
from attnstore.tests.ingest.test_streaming_qk import LONG, eager_maps, ingest_cli, open_tmp_store  # noqa: E402


def expected_fields(maps: np.ndarray, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(token, layer, head, field) float64 and the top keys (token, layer, head, k) of (layer, head, L, L) causal maps
    over token ids `ids`, by the definitions of store/row_stats.py."""
    a = maps.astype(np.float64)
    layers, heads, n, _ = a.shape
    out = np.zeros((layers, heads, n, len(fmt.FIELDS)))
    out[..., fmt.FIRST.start : fmt.FIRST.start + min(4, n)] = a[..., : min(4, n)]
    out[..., fmt.FIELD["entropy"]] = -np.where(a > 0, a * np.log(np.where(a > 0, a, 1)), 0).sum(-1)
    out[..., fmt.FIELD["learned_sink"]] = 1 - a.sum(-1)
    distance = np.arange(n)[:, None] - np.arange(n)[None, :]
    edges = [0, 1, *[1 << b for b in range(1, 15)], np.inf]  # bin b: edges[b] <= d < edges[b + 1]
    for b in range(fmt.DISTANCE_BINS):
        inside = (distance >= edges[b]) & (distance < edges[b + 1])
        out[..., fmt.DISTANCE.start + b] = (a * inside).sum(-1)
    column = a.sum(-2) / (n - np.arange(n))  # (layer, head, key)
    out[..., fmt.FIELD["column"]] = column  # the sum of the two fields is compared below
    out[..., fmt.FIELD["column_rest"]] = 0
    for i in range(n):  # the latest earlier position of row i's id, and the one after it
        before = [j for j in range(i) if ids[j] == ids[i]]
        if before:
            out[:, :, i, fmt.FIELD["duplicate"]] = a[:, :, i, before[-1]]
            out[:, :, i, fmt.FIELD["induction"]] = a[:, :, i, before[-1] + 1]
    order = np.argsort(-a, axis=-1, kind="stable")[..., : fmt.TOP_K]
    values = np.take_along_axis(a, order, -1)
    out[..., fmt.TOP_VALUES.start : fmt.TOP_VALUES.start + order.shape[-1]] = values
    top = np.full((layers, heads, n, fmt.TOP_K), -1)
    top[..., : order.shape[-1]] = np.where(values > 0, order, -1)
    return out.transpose(2, 0, 1, 3), top.transpose(2, 0, 1, 3)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # gemma3: a sliding-window layer (window 4)
def test_row_stats_of_each_tier_equal_the_eager_maps_fields(arch, tiny, tmp_path, monkeypatch):
    from attnstore.ingest import streaming
    from attnstore.store.check import check_run

    monkeypatch.setattr(streaming, "QUERY_BLOCK", 3)
    path = tiny(arch)
    for name, tier in (("dense", "dense"), ("qk", "qk")):
        result = ingest_cli(tmp_path, path, name, LONG, "--tier", tier, "--qk-dtype", "float32", "--device", "cpu", "--row-stats")
        assert result.exit_code == 0, result.output
    store = open_tmp_store(tmp_path)
    try:
        for run in ("dense", "qk"):
            info = store.run_info(run)
            assert info.has_row_stats and info.manifest["row_stats"]["top_k"] == fmt.TOP_K
            assert check_run(store, run).problems == []
            seen = duplicated = 0
            for example, rows in store.iter_row_stats(run):
                ids = store.tokens(run, example)["token_id"].tolist()
                stats, top = expected_fields(eager_maps(path, ids), ids)
                repeats = len(ids) - len(set(ids))
                assert rows.stats.shape == stats.shape and rows.top.shape == top.shape
                # float16 storage: 2^-11 relative, and sums of float32 weights to 1e-6 absolute
                got = rows.stats.astype(np.float64)
                got[..., fmt.FIELD["column"]] = rows.column().transpose(2, 0, 1)
                got[..., fmt.FIELD["column_rest"]] = 0
                np.testing.assert_allclose(got, stats, rtol=2**-10, atol=2e-6)
                np.testing.assert_allclose(rows.column().transpose(2, 0, 1), stats[..., fmt.FIELD["column"]], rtol=1e-5)
                exact = (top == rows.top).mean()
                assert exact > 0.97, (run, example, exact)  # near-equal weights may swap ranks in float32
                assert (rows.top[..., 0] == top[..., 0]).mean() > 0.99
                seen += 1
                duplicated += repeats
            assert seen == 3 and duplicated > 0  # some rows' ids occurred before: their duplicate and induction keys
    finally:
        store.close()


def test_no_row_stats_keeps_none_and_the_queries_read_the_maps(tiny, tmp_path):
    """By default a Q/K run keeps row statistics and a dense one does not; --no-row-stats keeps none. Once a run that
    keeps them is complete, the command keeps the summaries of the queries that read them, so each answers the whole
    run from its kept totals."""
    from attnstore.queries import run_query

    path = tiny("llama")
    outputs = {}
    for name, extra in (("without", ("--tier", "qk", "--no-row-stats")), ("with", ("--tier", "qk")), ("dense", ("--tier", "dense"))):
        result = ingest_cli(tmp_path, path, name, LONG, *extra)
        assert result.exit_code == 0, result.output
        outputs[name] = result.output
    assert "kept 5 summaries from the run's row statistics" in outputs["with"] and "summaries" not in outputs["without"]
    store = open_tmp_store(tmp_path)
    try:
        assert not store.run_info("without").has_row_stats and store.run_info("with").has_row_stats
        assert not store.run_info("dense").has_row_stats and "summaries" not in outputs["dense"]
        kept = {name for name, _ in store.summaries("with").stamped()}
        assert {"attention_sink", "previous_token", "sink_window_mass", "entropy_bins", "heavy_hitters"} <= kept
        assert not store.summaries("without").stamped()
        a, b = run_query(store, "attention_sink", run="without"), run_query(store, "attention_sink", run="with")
        np.testing.assert_allclose(a["position_0"], b["position_0"], rtol=2**-9, atol=1e-4)  # float16 maps against rows
        # float16 Q/K: with the statistics their pass takes the log-sum-exps from the stored values, without them a
        # second flash call does: the same rebuilt maps, and the statistics are those of these maps.
        for example, rows in store.iter_row_stats("with"):
            maps = store.attention("with", example)
            np.testing.assert_allclose(maps, store.attention("without", example), atol=1e-6)
            ids = store.tokens("with", example)["token_id"].tolist()
            stats, top = expected_fields(maps, ids)
            got = rows.stats.astype(np.float64)
            got[..., fmt.FIELD["column"]] = rows.column().transpose(2, 0, 1)
            got[..., fmt.FIELD["column_rest"]] = 0
            np.testing.assert_allclose(got, stats, rtol=2**-10, atol=2e-6)
            assert (rows.top[..., 0] == top[..., 0]).mean() > 0.99
    finally:
        store.close()
