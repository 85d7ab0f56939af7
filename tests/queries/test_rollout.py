"""Attention rollout and flow (Abnar & Zuidema 2020) on hand-built maps: values worked out by hand, a naive rollout
written here with explicit sums, the flow of a one-layer model equal to its rollout, and the length cap."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa

from attnstore.queries import run_query
from attnstore.queries.errors import InvalidArgumentError

TOKENS = ["[CLS]", "a", ",", "[SEP]"]


def uniform(n_layers: int, n_heads: int = 2, length: int = 4) -> np.ndarray:
    return np.full((n_layers, n_heads, length, length), 1 / length, dtype=np.float32)


def naive_rollout(maps: np.ndarray) -> np.ndarray:
    """Layer by layer with explicit sums: Ã = mean over heads + identity, rows renormalised; R_l = Ã_l R_(l-1)."""
    n_layers, n_heads, length, _ = maps.shape
    out = []
    previous = None
    for layer in range(n_layers):
        aug = np.zeros((length, length))
        for i in range(length):
            for j in range(length):
                aug[i, j] = sum(float(maps[layer, h, i, j]) for h in range(n_heads)) / n_heads + (i == j)
            aug[i] /= aug[i].sum()
        if previous is None:
            current = aug
        else:
            current = np.array([[sum(aug[i, k] * previous[k, j] for k in range(length)) for j in range(length)] for i in range(length)])
        out.append(current)
        previous = current
    return np.array(out)


def test_uniform_maps_give_the_hand_values(store, make_run):
    run = make_run(store, [uniform(2)], [TOKENS], name="uniform")
    frame = run_query(store, "rollout", run=run)
    # layer 0: 0.5 U + 0.5 I -> [CLS] keeps 0.5 + 0.125; layer 1: (0.5 U + 0.5 I)^2 = 0.75 U + 0.25 I -> 0.25 + 0.1875
    np.testing.assert_allclose(
        frame[["to_cls", "to_sep", "to_punct", "to_other"]].to_numpy(), [[0.625, 0.125, 0.125, 0.125], [0.4375, 0.1875, 0.1875, 0.1875]]
    )
    assert frame["layer"].tolist() == [0, 1] and (frame["n_examples"] == 1).all()


def test_rollout_equals_the_naive_product_and_is_kept(store, make_run, monkeypatch):
    rng = np.random.default_rng(0)
    tokens = [TOKENS, ["[CLS]", "x", "y", ".", "z", "[SEP]"], ["[CLS]", "p", "[SEP]", "q", "[SEP]"]]
    maps = []
    for t in tokens:
        raw = rng.random((3, 2, len(t), len(t))) ** 3 + 1e-3
        maps.append((raw / raw.sum(-1, keepdims=True)).astype(np.float32))
    run = make_run(store, maps, tokens, name="random")
    frame = run_query(store, "rollout", run=run)
    expected = np.zeros((3, 4))
    classes = [
        lambda t: t == "[CLS]",
        lambda t: t == "[SEP]",
        lambda t: t in (".", ","),
        lambda t: t not in ("[CLS]", "[SEP]", ".", ","),
    ]
    for m, t in zip(maps, tokens):
        row = naive_rollout(m)[:, 0, :]  # from [CLS]
        expected += np.array([[sum(row[layer, j] for j in range(len(t)) if c(t[j])) for c in classes] for layer in range(3)])
    np.testing.assert_allclose(frame[["to_cls", "to_sep", "to_punct", "to_other"]].to_numpy(), expected / 3, rtol=1e-12)
    np.testing.assert_allclose(frame[["to_cls", "to_sep", "to_punct", "to_other"]].sum(axis=1), 1, rtol=1e-12)
    one = run_query(store, "rollout_map", run=run, example=1)
    assert len(one) == 3 * 36 and one.groupby(["layer", "query"])["rollout"].sum().round(12).eq(1).all()
    np.testing.assert_allclose(one["rollout"].to_numpy().reshape(3, 6, 6), naive_rollout(maps[1]), rtol=1e-12)
    assert one.loc[one["query"] == 3, "query_token"].eq(".").all()
    monkeypatch.setattr(type(store), "iter_attention", lambda *a, **k: pytest.fail("the maps were read"))
    np.testing.assert_allclose(run_query(store, "rollout", run=run)[["to_cls", "to_other"]], frame[["to_cls", "to_other"]])  # kept


def test_flow_of_two_uniform_layers_by_hand_and_of_one_layer_equal_to_its_rollout(store, make_run):
    two = make_run(store, [uniform(2)], [TOKENS], name="flow2")
    flow = run_query(store, "attention_flow", run=two)
    # paths [CLS] -> (layer 1, m) -> (layer 0, b): sum over m of min(Ã1[cls, m], Ã0[m, b]); Ã: 0.625 diagonal, 0.125 off
    # b = [CLS]: 0.625 + 3 x 0.125 = 1; any other b: 4 x 0.125 = 0.5; normalised: 0.4, 0.2, 0.2, 0.2
    np.testing.assert_allclose(flow["flow"], [0.4, 0.2, 0.2, 0.2], atol=1e-9)
    np.testing.assert_allclose(flow["rollout"], [0.4375, 0.1875, 0.1875, 0.1875])
    rng = np.random.default_rng(1)
    raw = rng.random((1, 2, 5, 5)) + 0.1
    one = make_run(store, [(raw / raw.sum(-1, keepdims=True)).astype(np.float32)], [["[CLS]", "a", "b", "c", "[SEP]"]], name="flow1")
    frame = run_query(store, "attention_flow", run=one)
    np.testing.assert_allclose(frame["flow"], frame["rollout"], atol=1e-9)  # one layer: one path per input token
    assert frame["token"].tolist() == ["[CLS]", "a", "b", "c", "[SEP]"]


def test_long_examples_are_refused_and_causal_models_read_the_last_token(store, make_run):
    long_tokens = ["[CLS]", *(f"w{i}" for i in range(70)), "[SEP]"]
    run = make_run(store, [uniform(1, length=72)], [long_tokens], name="long")
    with pytest.raises(InvalidArgumentError, match=r"example 0 of run 'long' has 72 tokens, more than max_tokens=64.*max_tokens=72"):
        run_query(store, "attention_flow", run=run)
    assert len(run_query(store, "attention_flow", run=run, max_tokens=72)) == 72
    maps = np.zeros((1, 1, 4, 4), dtype=np.float32)
    for i in range(4):
        maps[0, 0, i, : i + 1] = 1 / (i + 1)  # causal: row i over the first i + 1 tokens
    causal = make_run(store, [maps], [TOKENS], name="causal")
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE models SET causal = :t WHERE id = (SELECT model_id FROM runs WHERE name = 'causal')"), {"t": True})
    frame = run_query(store, "rollout", run=causal)
    # the last token's row: 0.5 x 1/4 each + 0.5 on itself ([SEP])
    np.testing.assert_allclose(frame[["to_cls", "to_sep", "to_punct", "to_other"]].to_numpy(), [[0.125, 0.625, 0.125, 0.125]])
    assert "last token" in frame.attrs["note"]


def test_scipy_flow_equals_networkx_exact_flow():
    pytest.importorskip("scipy")
    pytest.importorskip("networkx")
    from attnstore.queries.rollout import _flow_networkx, flow_from, residual_maps

    rng = np.random.default_rng(1)
    raw = rng.random((3, 2, 9, 9))
    aug = residual_maps(raw / raw.sum(-1, keepdims=True))
    for source in (0, 4):
        np.testing.assert_allclose(flow_from(aug, source), _flow_networkx(aug, source), atol=1e-8)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (6, 12, 47, 47), (1, 1, 1, 1)])
def test_maps_average_over_heads_as_their_float64_copy_does(shape, dtype):
    """The head means equal numpy's mean of a float64 copy bit for bit (compiled, queries/_rollout.c, from a37eb6c to
    2026-11-29; numpy again since)."""
    from attnstore.queries.rollout import residual_maps

    raw = np.random.default_rng(shape[-1]).random(shape) ** 4
    maps = (raw / raw.sum(-1, keepdims=True)).astype(dtype)
    mean = maps.astype(np.float64).mean(axis=1)  # before a37eb6c (2026-11-28): numpy's mean over the head axis
    mixed = mean + np.eye(shape[-1])[None]
    np.testing.assert_array_equal(residual_maps(maps), mixed / mixed.sum(-1, keepdims=True))
