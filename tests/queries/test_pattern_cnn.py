"""The K1 pattern CNN: features, training on a small synthetic labelled set (seeded, fast), save/load, classify a run."""

import json

import numpy as np
import pandas as pd
import pytest

from attnstore.queries.patterns import CLASSES, evaluate, stratified_split
from attnstore.store.errors import InvalidArgumentError, NotFoundError

torch = pytest.importorskip("torch")

from attnstore.queries import pattern_cnn as C  # noqa: E402  (after the torch check)


def synthetic_map(label: str, length: int, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A noisy map of the given class over [CLS] a.. [SEP] b.. [SEP] (two segments)."""
    half = (length - 3) // 2
    special = np.zeros(length, bool)
    special[[0, half + 1, length - 1]] = True
    segment = np.r_[np.zeros(half + 2, int), np.ones(length - half - 2, int)]
    m = rng.uniform(0, 0.3, (length, length))
    idx = np.arange(length)
    if label in ("vertical", "vertical+diagonal"):
        m[:, 0] += 4.0 if label == "vertical" else 2.0
    if label in ("diagonal", "vertical+diagonal"):
        m[idx[1:], idx[:-1]] += 4.0 if label == "diagonal" else 2.0
    if label == "block":
        m[np.equal.outer(segment, segment)] += 0.8
    if label == "heterogeneous":
        m[idx, rng.integers(0, length, length)] += 3.0
    return m / m.sum(1, keepdims=True), special, segment


def synthetic_set(n_per_class: int, seed: int):
    rng = np.random.default_rng(seed)
    maps, labels = [], []
    for label in CLASSES:
        for _ in range(n_per_class):
            maps.append(synthetic_map(label, int(rng.integers(12, 40)), rng))
            labels.append(label)
    return maps, np.array(labels, dtype=object)


def test_features_shape_and_channels():
    rng = np.random.default_rng(0)
    attn, special, segment = synthetic_map("vertical", 20, rng)
    x = C.map_features(np.stack([attn, attn.T]), special, segment, size=16, masks=True)
    assert x.shape == (2, 3, 16, 16) and x.dtype == np.float32
    assert x[:, 0].max() == pytest.approx(1.0)  # the map scaled to its maximum
    np.testing.assert_allclose(x[0, 1, :, 0], x[0, 1, 0, 0])  # special columns: the same in every row
    assert x[0, 1, 0, 0] > 0 and x[0, 1, 0, 8] == 0
    short = C.map_features(attn[None, :5, :5] / attn[:5, :5].sum(1, keepdims=True), special[:5], np.zeros(5, int), size=16, masks=True)
    assert short.shape == (1, 3, 16, 16) and short[0, 2].max() == 0  # one segment: no own-segment channel
    np.testing.assert_array_equal(C.map_features(attn[None], special, segment, size=16), x[:1, :1])  # default: the picture


def test_cnn_learns_a_synthetic_labelled_set_and_beats_chance():
    maps, labels = synthetic_set(20, seed=1)
    x = np.concatenate([C.map_features(a[None], s, g, size=16) for a, s, g in maps])
    y = np.array([CLASSES.index(label) for label in labels])
    held = stratified_split(labels, 0.25, seed=0)
    model = C.train_model(x[~held], y[~held], seed=0, epochs=30, size=16, width=8)
    predicted, confidence = C.predict(model, x[held])
    result = evaluate(labels[held], np.array(CLASSES, dtype=object)[predicted])
    assert result["accuracy"] > 0.6 and result["macro_f1"] > 0.5  # chance is 0.2
    assert ((confidence > 0) & (confidence <= 1)).all()
    again = C.train_model(x[~held], y[~held], seed=0, epochs=30, size=16, width=8)
    assert (C.predict(again, x[held])[0] == predicted).all()  # seeded


def test_bad_model_files_are_refused(tmp_path):
    with pytest.raises(NotFoundError, match="no CNN weights"):
        C.load_model(tmp_path / "none.pt")
    (tmp_path / "bad.pt").write_bytes(b"not a torch file")
    with pytest.raises(InvalidArgumentError, match="not a pattern CNN file"):
        C.load_model(tmp_path / "bad.pt")
    torch.save({"x": 1}, str(tmp_path / "other.pt"))
    with pytest.raises(InvalidArgumentError, match="not a pattern CNN file"):
        C.load_model(tmp_path / "other.pt")
    with pytest.raises(InvalidArgumentError, match="multiple of 8"):
        C.build_model(size=20)


TOKENS = ["[CLS]", *[f"a{i}" for i in range(8)], "[SEP]", *[f"b{i}" for i in range(8)], "[SEP]"]


def test_train_from_store_then_classify_a_run(store, make_run, tmp_path):
    rng = np.random.default_rng(2)
    kinds = ["vertical", "diagonal", "vertical+diagonal", "heterogeneous"]
    runs_maps = []
    for _ in range(6):  # 6 examples x (1 layer, 4 heads): each head one class
        runs_maps.append(np.stack([synthetic_map(k, len(TOKENS), rng)[0] for k in kinds])[None].astype(np.float32))
    run = make_run(store, runs_maps, [TOKENS] * 6, name="cnn")
    rows = pd.DataFrame([dict(run=run, example=e, layer=0, head=h, label=k) for e in range(6) for h, k in enumerate(kinds)])
    store.save_pattern_labels(rows, source="human")
    out = tmp_path / "cnn" / "weights.pt"
    report = C.train_from_store(store, out, epochs=15, size=16, width=8, seed=0)
    assert report["n_labels"] == 24 and report["n_test"] == 8 and report["n_train"] == 16  # round(6 x 0.25) = 2 per class
    assert set(report) >= {"cnn", "rules", "cnn_train", "rules_train", "label_counts", "thresholds"}
    assert np.array(report["cnn"]["confusion"]).sum() == 8
    assert json.loads(out.with_suffix(".json").read_text())["n_labels"] == 24
    text = C.format_report(report)
    assert "cnn: held-out macro-F1" in text and "rules: held-out macro-F1" in text
    _, saved = C.load_model(out)
    assert saved["split"]["part"].count("test") == 8 and saved["size"] == 16
    labels = C.classify_run(store, run, out, save=True)
    assert len(labels) == 24 and set(labels["label"]) <= set(CLASSES)
    stored = store.pattern_labels(run, source="cnn")
    assert len(stored) == 24 and stored["confidence"].between(0, 1).all()


@pytest.mark.one_backend
def test_training_twice_with_one_seed_gives_bit_identical_weights_and_report(store, make_run, tmp_path):
    rng = np.random.default_rng(5)
    kinds = ["vertical", "diagonal", "vertical+diagonal", "heterogeneous"]
    maps = [np.stack([synthetic_map(k, len(TOKENS), rng)[0] for k in kinds])[None].astype(np.float32) for _ in range(4)]
    run = make_run(store, maps, [TOKENS] * 4, name="det")
    rows = pd.DataFrame([dict(run=run, example=e, layer=0, head=h, label=k) for e in range(4) for h, k in enumerate(kinds)])
    store.save_pattern_labels(rows, source="human")
    torch.manual_seed(123)
    caller_state = torch.random.get_rng_state()
    threads = torch.get_num_threads()
    first = C.train_from_store(store, tmp_path / "a.pt", epochs=4, size=16, width=8, seed=0)
    torch.set_num_threads(2)  # the caller's thread count does not matter
    try:
        second = C.train_from_store(store, tmp_path / "b.pt", epochs=4, size=16, width=8, seed=0)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(torch.random.get_rng_state(), caller_state)  # the caller's generator is left as it was
    assert not torch.are_deterministic_algorithms_enabled()  # ... and so is the deterministic setting
    a, b = (torch.load(str(tmp_path / name), weights_only=True)["state_dict"] for name in ("a.pt", "b.pt"))
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key  # bit for bit
    assert first == second
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    third = C.train_from_store(store, tmp_path / "c.pt", epochs=4, size=16, width=8, seed=1)
    c = torch.load(str(tmp_path / "c.pt"), weights_only=True)["state_dict"]
    assert not all(torch.equal(a[key], c[key]) for key in a)  # another seed, other weights
    assert third["seed"] == 1
