"""The K1 pattern CNN: features, training on a small synthetic labelled set (seeded, fast), save/load, classify a run."""

import json

import numpy as np
import pandas as pd
import pytest

from attnstore.queries.patterns import CLASSES, evaluate, stratified_split
from attnstore.store.errors import InvalidArgumentError, NotFoundError

torch = pytest.importorskip("torch")

from attnstore.queries import pattern_cnn as C  # noqa: E402  (after the torch check)
from attnstore.queries import pattern_cnn_store as S  # noqa: E402


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


def test_map_scalars_of_a_uniform_and_a_diagonal_map():
    length = 10
    special = np.zeros(length, bool)
    special[[0, length - 1]] = True
    segment = np.zeros(length, int)
    uniform = np.full((length, length), 1 / length)
    shifted = np.eye(length, k=-1)
    shifted[0, 0] = 1.0  # query 0 has no previous token: it attends to itself
    s = C.map_scalars(np.stack([uniform, shifted]), special, segment)
    assert s.shape == (2, len(C.SCALARS)) and s.dtype == np.float32
    col = {name: s[:, i] for i, name in enumerate(C.SCALARS)}
    np.testing.assert_allclose(col["vertical_norm"][0], 0.0, atol=1e-6)  # a uniform map scores 0 after normalising
    np.testing.assert_allclose(col["diagonal_norm"][0], 0.0, atol=1e-6)
    np.testing.assert_allclose(col["row_entropy"], [1.0, 0.0], atol=1e-6)  # log(L) over log(L); one-hot rows
    np.testing.assert_allclose(col["log_length"], np.log(10) / np.log(512), rtol=1e-6)
    np.testing.assert_allclose(col["peak"], [0.1, 1.0], rtol=1e-6)
    np.testing.assert_allclose(col["first_column"], [0.1, 0.2], rtol=1e-6)  # queries 0 and 1 attend to token 0
    np.testing.assert_allclose(col["diagonal"][1], 9 / 10, rtol=1e-6)  # 9 of 10 rows on the previous token
    assert (col["two_segments"] == 0).all() and (col["block_norm"] == 0).all()
    pictures, numbers = C.map_inputs(uniform[None], special, segment, size=16, scalars=False)
    assert pictures.shape == (1, 1, 16, 16) and numbers.shape == (1, 0)


def test_cnn_learns_a_synthetic_labelled_set_and_beats_chance():
    maps, labels = synthetic_set(20, seed=1)
    x, s = C.stack_inputs([C.map_inputs(a[None], sp, g, size=16) for a, sp, g in maps])
    y = np.array([CLASSES.index(label) for label in labels])
    held = stratified_split(labels, 0.25, seed=0)
    model = C.train_model(x[~held], s[~held], y[~held], seed=0, epochs=30, size=16, width=8)
    np.testing.assert_allclose(model.scalar_mean.numpy(), s[~held].mean(0), rtol=1e-5, atol=1e-6)  # standardised on the training part
    predicted, confidence = C.predict(model, x[held], s[held])
    result = evaluate(labels[held], np.array(CLASSES, dtype=object)[predicted])
    assert result["accuracy"] > 0.6 and result["macro_f1"] > 0.5  # chance is 0.2
    assert ((confidence > 0) & (confidence <= 1)).all()
    again = C.train_model(x[~held], s[~held], y[~held], seed=0, epochs=30, size=16, width=8)
    assert (C.predict(again, x[held], s[held])[0] == predicted).all()  # seeded
    other = C.train_model(x[~held], s[~held], y[~held], seed=1, epochs=30, size=16, width=8)
    both = C.predict_proba([model, other], x[held], s[held])
    np.testing.assert_allclose(both, (C.predict_proba(model, x[held], s[held]) + C.predict_proba(other, x[held], s[held])) / 2, atol=1e-6)
    np.testing.assert_allclose(both.sum(1), 1.0, rtol=1e-6)


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
    with pytest.raises(InvalidArgumentError, match="members must be at least 1"):
        C.train_ensemble(np.zeros((2, 1, 16, 16), np.float32), np.zeros((2, 0), np.float32), np.array([0, 1]), members=0)


def test_a_format_1_file_one_network_without_scalars_still_loads(tmp_path):
    maps, labels = synthetic_set(4, seed=3)
    x, s = C.stack_inputs([C.map_inputs(a[None], sp, g, size=16, scalars=False) for a, sp, g in maps])
    model = C.train_model(x, s, np.array([CLASSES.index(label) for label in labels]), seed=0, epochs=2, size=16, width=8)
    old = {}  # the names of the earlier nn.Sequential: conv layers 0-14, linear layers 16 and 18
    for key, value in model.state_dict().items():
        part, index, rest = key.split(".", 2) if key.count(".") == 2 else (key, "", "")
        if part == "conv":
            old[f"{index}.{rest}"] = value
        elif part == "head":
            old[f"{int(index) + 16}.{rest}"] = value
    torch.save(dict(state_dict=old, size=16, width=8, masks=False, channels=1, classes=list(CLASSES)), str(tmp_path / "v1.pt"))
    models, saved = C.load_model(tmp_path / "v1.pt")
    assert saved["format"] == 1 and saved["scalars"] == [] and len(models) == 1
    np.testing.assert_array_equal(C.predict_proba(models, x, s), C.predict_proba(model, x, s))


TOKENS = ["[CLS]", *[f"a{i}" for i in range(8)], "[SEP]", *[f"b{i}" for i in range(8)], "[SEP]"]


KINDS = ["vertical", "diagonal", "vertical+diagonal", "heterogeneous"]


def labelled_run(store, make_run, n_examples: int, seed: int, name: str) -> tuple[str, pd.DataFrame]:
    """A run of n_examples x (1 layer, 4 heads), head h a synthetic map of KINDS[h], and those labels (not saved)."""
    rng = np.random.default_rng(seed)
    maps = [np.stack([synthetic_map(k, len(TOKENS), rng)[0] for k in KINDS])[None].astype(np.float32) for _ in range(n_examples)]
    run = make_run(store, maps, [TOKENS] * n_examples, name=name)
    rows = pd.DataFrame([dict(run=run, example=e, layer=0, head=h, label=k) for e in range(n_examples) for h, k in enumerate(KINDS)])
    return run, rows


def test_train_from_store_then_classify_a_run(store, make_run, tmp_path):
    run, rows = labelled_run(store, make_run, 6, seed=2, name="cnn")
    store.save_pattern_labels(rows, source="human")
    out = tmp_path / "cnn" / "weights.pt"
    report = S.train_from_store(store, out, epochs=15, size=16, width=8, seed=0, members=2)
    assert report["n_labels"] == 24 and report["n_test"] == 8 and report["n_train"] == 16  # round(6 x 0.25) = 2 per class
    assert set(report) >= {"cnn", "rules", "cnn_train", "rules_train", "label_counts", "thresholds"}
    assert np.array(report["cnn"]["confusion"]).sum() == 8
    assert json.loads(out.with_suffix(".json").read_text())["n_labels"] == 24
    text = S.format_report(report)
    assert "cnn: held-out macro-F1" in text and "rules: held-out macro-F1" in text
    models, saved = C.load_model(out)
    assert saved["split"]["part"].count("test") == 8 and saved["size"] == 16
    assert len(models) == 2 and saved["scalars"] == list(C.SCALARS) and report["members"] == 2
    labels = S.classify_run(store, run, out, save=True)
    assert len(labels) == 24 and set(labels["label"]) <= set(CLASSES)
    stored = store.pattern_labels(run, source="cnn")
    assert len(stored) == 24 and stored["confidence"].between(0, 1).all()


@pytest.mark.one_backend
def test_training_twice_with_one_seed_gives_bit_identical_weights_and_report(store, make_run, tmp_path):
    _, rows = labelled_run(store, make_run, 4, seed=5, name="det")
    store.save_pattern_labels(rows, source="human")
    torch.manual_seed(123)
    caller_state = torch.random.get_rng_state()
    threads = torch.get_num_threads()
    first = S.train_from_store(store, tmp_path / "a.pt", epochs=4, size=16, width=8, seed=0, members=2)
    torch.set_num_threads(2)  # the caller's thread count does not matter
    try:
        second = S.train_from_store(store, tmp_path / "b.pt", epochs=4, size=16, width=8, seed=0, members=2)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(torch.random.get_rng_state(), caller_state)  # the caller's generator is left as it was
    assert not torch.are_deterministic_algorithms_enabled()  # ... and so is the deterministic setting
    a_all, b_all = (torch.load(str(tmp_path / name), weights_only=True)["state_dicts"] for name in ("a.pt", "b.pt"))
    assert len(a_all) == len(b_all) == 2
    for a, b in zip(a_all, b_all):
        assert list(a) == list(b)
        for key in a:
            assert torch.equal(a[key], b[key]), key  # bit for bit
    a = a_all[0]
    assert not all(torch.equal(a[key], a_all[1][key]) for key in a)  # the two members: two seeds
    assert first == second
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    third = S.train_from_store(store, tmp_path / "c.pt", epochs=4, size=16, width=8, seed=1, members=1)
    c = torch.load(str(tmp_path / "c.pt"), weights_only=True)["state_dicts"][0]
    assert not all(torch.equal(a[key], c[key]) for key in a)  # another seed, other weights
    assert third["seed"] == 1


def test_two_labellers_train_together_and_a_map_both_labelled_stays_on_one_side(store, make_run, tmp_path):
    _, first = labelled_run(store, make_run, 8, seed=7, name="two")
    store.save_pattern_labels(first, source="human")
    second = first[first["example"] >= 4].copy()  # the second labeller labels half the maps again, one of them otherwise
    second.loc[second.index[0], "label"] = "heterogeneous"
    store.save_pattern_labels(second, source="human:b")
    report = S.train_from_store(store, tmp_path / "two.pt", sources=["human", "human:b"], epochs=3, size=16, width=8, members=1)
    assert report["sources"] == ["human", "human:b"] and report["n_labels"] == 48 and report["n_maps"] == 32
    _, saved = C.load_model(tmp_path / "two.pt")
    split = pd.DataFrame(saved["split"])
    parts = split.groupby(["example", "layer", "head"])["part"].nunique()
    assert (parts == 1).all()  # both labels of a map on the same side
    assert set(split["source"]) == {"human", "human:b"}
    with pytest.raises(InvalidArgumentError, match="no pattern labels from source 'human:nobody'"):
        S.train_from_store(store, tmp_path / "x.pt", sources=["human", "human:nobody"], epochs=1, size=16, width=8, members=1)


@pytest.mark.one_backend
def test_the_crossfit_script_scores_held_out_maps_of_a_labeller_who_did_not_train_it(store, make_run, tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "scripts" / "pattern_crossfit.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    _, rows = labelled_run(store, make_run, 8, seed=11, name="pair")
    store.save_pattern_labels(rows[rows["example"] < 4], source="human")  # the first labeller: other maps
    store.save_pattern_labels(rows[rows["example"] >= 4], source="human:c")  # a pair labels the same 16 maps
    other = rows[rows["example"] >= 4].copy()
    other.loc[other.index[:2], "label"] = "heterogeneous"  # ... and disagrees on two of them
    store.save_pattern_labels(other, source="human:d")
    out = tmp_path / "crossfit.json"
    where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    args = [*where, "--source", "human", "--pair", "human:c", "human:d", "--members", "1", "--epochs", "2", "--output", str(out)]
    for pair, message in ((["human:c", "human:c"], "two labellers other than"), (["human:c", "human:nobody"], "no pattern labels")):
        with pytest.raises(SystemExit, match=message):
            script.main([*where, "--source", "human", "--pair", *pair, "--members", "1", "--epochs", "1"])
    assert script.main(args) == 0
    result = json.loads(out.read_text())
    assert result["n_shared_maps"] == 16 and [(d["train"], d["test"]) for d in result["directions"]] == [
        ("human:c", "human:d"),
        ("human:d", "human:c"),
    ]
    for direction in result["directions"]:
        assert direction["n"] == 16  # every shared map tested once, in one of the two halves
        assert np.array(direction["cnn"]["confusion"]).sum() == 16
        assert direction["labeller " + direction["train"]]["accuracy"] == pytest.approx(14 / 16)  # the pair agree on 14 of 16
