"""K1 reports (issue 26): Cohen's kappa, confusion-corrected class shares with bootstrap intervals, the classifiers
scored per labeller (leaving out the CNN's training maps), `patterns evaluate` and `patterns figure --report`."""

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.api.pattern_labels import LABELLER_KINDS, export_labels, is_labeller_source, labellers
from attnstore.api.pattern_report import evaluate_labellers
from attnstore.queries.pattern_metrics import CLASSES, _kappa, cohen_kappa, confusion_matrix, corrected_shares, share_intervals

pytestmark = pytest.mark.slow  # figures: the report draws its PNGs: not in make test-fast

TOKENS = ["[CLS]", *[f"w{i}" for i in range(10)], "[SEP]"]
KINDS = ("vertical", "diagonal", "heterogeneous")


def test_kappa_exact_on_a_hand_example():
    a = ["vertical"] * 6 + ["diagonal"] * 4
    b = ["vertical"] * 5 + ["diagonal"] + ["diagonal"] * 3 + ["vertical"]
    # p_o = 8/10; marginals: a 0.6 / 0.4, b 0.6 / 0.4 -> p_e = 0.36 + 0.16 = 0.52; kappa = 0.28 / 0.48
    assert cohen_kappa(a, b) == pytest.approx(0.28 / 0.48)
    assert _kappa(confusion_matrix(a, b)) == pytest.approx(0.28 / 0.48)
    assert cohen_kappa(a, a) == pytest.approx(1.0)
    assert np.isnan(_kappa(confusion_matrix(["block"] * 3, ["block"] * 3)))


def test_kappa_equals_scikit_learns():
    sklearn = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    x, y = rng.choice(CLASSES, 50), rng.choice(CLASSES, 50)
    assert _kappa(confusion_matrix(x, y)) == pytest.approx(sklearn.cohen_kappa_score(x, y))


def test_corrected_shares_and_their_bootstrap_intervals():
    predicted = np.array([[0.5, 0.2, 0.2, 0.0, 0.1], [0.7, 0.1, 0.1, 0.0, 0.1]])
    perfect = np.diag([30, 10, 10, 0, 10])
    bands = share_intervals(predicted, perfect, n_boot=200)
    for key in ("corrected", "low", "high"):  # a classifier always right: no correction, no spread
        np.testing.assert_allclose(bands[key], predicted)
    # half of what is predicted vertical is heterogeneous: the shares move by that much
    m = np.diag([10, 10, 10, 0, 10])
    m[4, 0] = 10
    corrected = corrected_shares(predicted, m)
    np.testing.assert_allclose(corrected[0], [0.25, 0.2, 0.2, 0.0, 0.35])
    np.testing.assert_allclose(corrected.sum(1), 1)
    bands = share_intervals(predicted, m, n_boot=500, seed=1)
    assert (bands["low"] <= bands["corrected"] + 1e-12).all() and (bands["corrected"] <= bands["high"] + 1e-12).all()
    assert bands["high"][0, 0] - bands["low"][0, 0] > 0.05  # 20 maps predicted vertical: a wide interval
    again = share_intervals(predicted, m, n_boot=500, seed=1)
    np.testing.assert_array_equal(again["low"], bands["low"])  # seeded


def kind_map(kind: str, rng) -> np.ndarray:
    n = len(TOKENS)
    m = rng.uniform(0, 0.05, (n, n))
    if kind == "vertical":
        m[:, 0] += 1
    elif kind == "diagonal":
        m[np.arange(1, n), np.arange(n - 1)] += 1
        m[0, 1] += 1
    return m / m.sum(1, keepdims=True)


@pytest.fixture
def two_labellers(store, make_run):
    """8 examples x (1 layer, 3 heads: vertical, diagonal, heterogeneous); 'human' labels every map right,
    'human:bob' the first 4 examples, calling every diagonal map heterogeneous."""
    rng = np.random.default_rng(0)
    maps = [np.stack([kind_map(k, rng) for k in KINDS])[None].astype(np.float32) for _ in range(8)]
    run = make_run(store, maps, [TOKENS] * 8, name="labelled")
    rows = pd.DataFrame([dict(run=run, example=e, layer=0, head=h, label=k) for e in range(8) for h, k in enumerate(KINDS)])
    store.save_pattern_labels(rows, source="human")
    bob = rows[rows["example"] < 4].copy()
    bob.loc[bob["label"] == "diagonal", "label"] = "heterogeneous"
    store.save_pattern_labels(bob, source="human:bob")
    return store, run


def test_each_labeller_scored_and_their_agreement(two_labellers):
    store, _ = two_labellers
    result = evaluate_labellers(store)
    table = result["per_labeller"].set_index(["source", "classifier"])
    assert set(table.index) == {("human", "rules"), ("human:bob", "rules")}
    assert table.loc[("human", "rules"), "n"] == 24 and table.loc[("human", "rules"), "accuracy"] == pytest.approx(1.0)
    bob = table.loc[("human:bob", "rules")]
    assert bob["labeller"] == "bob" and bob["n"] == 12 and bob["accuracy"] == pytest.approx(8 / 12)
    agreement = result["agreement"].iloc[0]
    assert (agreement["first"], agreement["second"], agreement["n_maps"]) == ("human", "human:bob", 12)
    assert agreement["agreement"] == pytest.approx(8 / 12)
    first = ["vertical", "diagonal", "heterogeneous"] * 4
    second = ["vertical", "heterogeneous", "heterogeneous"] * 4
    assert agreement["kappa"] == pytest.approx(cohen_kappa(first, second))


def test_a_models_labels_are_a_labeller_of_their_own_kind(two_labellers):
    """Labels a model gave (source model:NAME, as the shipped labels of docs/results/pattern_labels/) are scored and
    exported as NAME's, like a person's, but are not among the people who label in the viewer (`labellers`' default)."""
    store, run = two_labellers
    rows = store.pattern_labels(run, source="human")[["run", "example", "layer", "head", "label"]]
    store.save_pattern_labels(rows[rows["example"] >= 4], source="model:llm-1")
    store.save_pattern_labels(rows, source="cnn")  # a classifier's labels are no labeller's
    assert list(labellers(store)["source"]) == ["human", "human:bob"]
    every = labellers(store, kinds=LABELLER_KINDS)
    assert list(zip(every["source"], every["labeller"], every["n_labels"])) == [
        ("human", "(unnamed)", 24),
        ("human:bob", "bob", 12),
        ("model:llm-1", "llm-1", 12),
    ]
    table = evaluate_labellers(store)["per_labeller"].set_index(["source", "classifier"])
    assert table.loc[("model:llm-1", "rules"), "labeller"] == "llm-1" and table.loc[("model:llm-1", "rules"), "n"] == 12
    assert {r["labeller"] for r in export_labels(store, source="model:llm-1")} == {"llm-1"}
    candidates = ("human", "human:a", "model:a", "model", "model:", "human:", "cnn", "rules", "modelx:a")
    assert [s for s in candidates if is_labeller_source(s)] == ["human", "human:a", "model:a"]


@pytest.mark.one_backend
def test_cnn_scored_without_its_training_maps_and_the_commands(two_labellers, tmp_path):
    pytest.importorskip("torch")
    from attnstore.queries.pattern_cnn_store import train_from_store

    store, run = two_labellers
    weights = tmp_path / "cnn.pt"
    report = train_from_store(store, weights, epochs=3, size=16, width=8, seed=0, members=1)
    result = evaluate_labellers(store, weights)
    table = result["per_labeller"].set_index(["source", "classifier"])
    assert table.loc[("human", "cnn"), "n"] == report["n_test"] == table.loc[("human", "rules"), "n"]  # the held-out maps only
    assert table.loc[("human", "cnn"), "confusion"] == report["cnn"]["confusion"]
    assert result["cnn_trained_on"] == "human"
    args = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    out = tmp_path / "evaluate.json"
    done = CliRunner().invoke(main, ["patterns", "evaluate", "--model-file", str(weights), "--output", str(out), *args])
    assert done.exit_code == 0, done.output
    assert "agreement between labellers" in done.output and "human:bob" in done.output
    saved = json.loads(out.read_text())
    assert {(r["source"], r["classifier"]) for r in saved["per_labeller"]} == set(table.index)
    both = tmp_path / "both.pt"  # the command, trained on both labellers' labels
    command = ["patterns", "train-cnn", "--out", str(both), "--source", "human", "--source", "human:bob", "--members", "2", "--epochs", "2"]
    done = CliRunner().invoke(main, [*command, "--size", "16", *args])
    assert done.exit_code == 0, done.output
    assert "labels (human+human:bob)" in done.output and "2 network(s) averaged, picture + map scalars" in done.output
    assert json.loads(both.with_suffix(".json").read_text())["sources"] == ["human", "human:bob"]
    assert evaluate_labellers(store, both)["cnn_trained_on"] == "human+human:bob"
    store.save_pattern_labels(
        pd.DataFrame([dict(run=run, example=e, layer=0, head=h, label=k) for e in range(8) for h, k in enumerate(KINDS)]), source="cnn"
    )
    figures = tmp_path / "fig"
    done = CliRunner().invoke(
        main,
        [
            "patterns",
            "figure",
            "--run",
            run,
            "--source",
            "cnn",
            "--report",
            str(weights.with_suffix(".json")),
            "--out",
            str(figures),
            *args,
        ],
    )
    assert done.exit_code == 0, done.output
    long = pd.read_csv(figures / "fig2_pattern_classes_uncertainty.csv")
    assert len(long) == len(CLASSES) and (long["low"] <= long["high"]).all()
    np.testing.assert_allclose(long.set_index("label").loc[list(KINDS), "predicted"], 1 / 3, atol=1e-4)
    assert (figures / "fig2_pattern_classes_uncertainty.png").stat().st_size > 0
    done = CliRunner().invoke(
        main,
        [
            "patterns",
            "figure",
            "--run",
            run,
            "--source",
            "human",
            "--report",
            str(weights.with_suffix(".json")),
            "--out",
            str(figures),
            *args,
        ],
    )
    assert done.exit_code != 0 and "no held-out confusion matrix for 'human'" in done.output
