"""Causal (decoder-only) runs: baselines over what each query token sees (models.causal, probed at ingest)."""

import math

import numpy as np
import pytest
import sqlalchemy as sa

from attnstore.queries import run_query
from attnstore.queries.common import is_causal

SPECIALS = {"bos": {"token": "<s>", "id": 1}}


def causal_maps(length: int) -> np.ndarray:
    """(layer 1, head 2, L, L): H0 uniform over the visible prefix (row i: 1/(i+1) on keys 0..i); H1 previous token
    (row 0: itself)."""
    maps = np.zeros((1, 2, length, length), dtype=np.float32)
    for i in range(length):
        maps[0, 0, i, : i + 1] = 1 / (i + 1)
        maps[0, 1, i, max(i - 1, 0)] = 1
    return maps


def mark_causal(store, run: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE models SET causal = :c WHERE id = :i"), {"c": True, "i": store.run_info(run).model_id})


@pytest.fixture
def causal_run(store, make_run):
    tokens = [["<s>", "a", "b", "c"], ["<s>", "d"]]
    run = make_run(store, [causal_maps(len(t)) for t in tokens], tokens, name="causal", specials=SPECIALS)
    mark_causal(store, run)
    return run


def test_models_default_to_bidirectional(store, make_run):
    run = make_run(store, [causal_maps(3)], [["<s>", "a", "b"]], name="plain", specials=SPECIALS)
    assert not is_causal(store, store.run_info(run))
    df = run_query(store, "entropy", run=run)
    assert df["uniform_entropy"].iloc[0] == pytest.approx(math.log(3))  # uniform over all L keys
    assert df["entropy_from_cls"].notna().all() and "note" not in df.attrs


def test_entropy_uniform_baseline_is_over_the_visible_prefix(store, causal_run):
    assert is_causal(store, store.run_info(causal_run))
    # L=4: rows see 1..4 keys; L=2: 1..2 keys. Head 0 is exactly uniform over the prefix, so it equals the baseline.
    per_example = (sum(math.log(k) for k in range(1, 5)) / 4 + math.log(2) / 2) / 2
    pooled = (sum(math.log(k) for k in range(1, 5)) + math.log(2)) / 6
    df = run_query(store, "entropy", run=causal_run).sort_values("head")
    np.testing.assert_allclose(df["uniform_entropy"], per_example, atol=1e-9)
    np.testing.assert_allclose(df["entropy"], [per_example, 0.0], atol=1e-6)
    assert df["entropy_from_cls"].isna().all() and df["uniform_entropy_from_cls"].isna().all()
    assert "causal" in df.attrs["note"]
    token = run_query(store, "entropy", run=causal_run, average="token").sort_values("head")
    np.testing.assert_allclose(token["uniform_entropy"], pooled, atol=1e-9)
    np.testing.assert_allclose(token["entropy"], [pooled, 0.0], atol=1e-6)


def test_relative_position_to_next_is_nan_for_a_causal_model(store, causal_run):
    df = run_query(store, "relative_position", run=causal_run).sort_values("head")
    assert df["to_next"].isna().all() and "to_next" in df.attrs["note"]
    np.testing.assert_allclose(df["to_previous"], [(1 / 2 + 1 / 3 + 1 / 4) / 4 / 2 + (1 / 2) / 2 / 2, (3 / 4 + 1 / 2) / 2])
    pooled = run_query(store, "relative_position", run=causal_run, average="token")
    assert pooled["to_next"].isna().all() and pooled["to_self"].notna().all()
