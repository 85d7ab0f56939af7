"""Head importance (Michel et al. 2019) on a tiny random BERT and the GLUE fixtures: the gate's gradient equals the one
transformers' own head_mask gives, example by example; normalised by layer; saved beside a run; bad input refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

FIXTURES = str(Path(__file__).parents[1] / "fixtures" / "data")


@pytest.mark.one_backend
def test_importance_is_the_mean_absolute_head_mask_gradient(store, tiny_bert):
    from attnstore.ingest.classifier import accepted, collate
    from attnstore.ingest.evaluate import open_evaluator
    from attnstore.ingest.importance import head_importance

    ev = open_evaluator(store, model=tiny_bert, task="SST-2", data_dir=FIXTURES)
    frame = head_importance(ev, max_examples=4)
    assert list(frame.columns) == ["layer", "head", "importance", "importance_raw", "n_examples"] and (frame["n_examples"] == 4).all()
    # the reference: transformers' head_mask (it scales each head's attention, hence its output), one example at a time
    expected = np.zeros((2, 4))
    model = ev.classifier.eval()
    for item in ev.items[:4]:
        mask = torch.ones(2, 4, requires_grad=True)
        inputs, labels = collate([item], ev.pad_id, False)
        loss = model(**accepted(model, inputs), labels=labels, head_mask=mask).loss
        loss.backward()
        expected += mask.grad.abs().numpy()
    raw = frame["importance_raw"].to_numpy().reshape(2, 4)
    np.testing.assert_allclose(raw, expected / 4, rtol=1e-5, atol=1e-9)
    assert (raw > 0).all()
    normalised = frame["importance"].to_numpy().reshape(2, 4)
    np.testing.assert_allclose(np.linalg.norm(normalised, axis=1), 1.0)  # l2-normalised by layer
    np.testing.assert_allclose(normalised, raw / np.linalg.norm(raw, axis=1, keepdims=True))
    with pytest.raises(Exception, match="max_examples must be at least 1"):
        head_importance(ev, max_examples=0)


@pytest.mark.slow  # the command fine-tunes nothing but computes gradients over the data
def test_the_command_saves_beside_a_run_of_the_model(tmp_path, tiny_bert):
    from click.testing import CliRunner

    from attnstore.api.cli import main
    from attnstore.store import open_store

    home = ["--home", str(tmp_path / "home")]
    runner = CliRunner()
    assert runner.invoke(main, ["db", "upgrade", *home]).exit_code == 0
    ingest = runner.invoke(
        main,
        ["ingest", "--dataset", "glue/SST-2:dev", "--data-dir", FIXTURES, "--model", tiny_bert, "--name", "tiny", "--no-progress", *home],
    )
    assert ingest.exit_code == 0, ingest.output
    args = [
        "importance",
        "--model",
        tiny_bert,
        "--task",
        "SST-2",
        "--data-dir",
        FIXTURES,
        "--max-examples",
        "4",
        "--no-progress",
    ]
    wrong = runner.invoke(main, [*args, "--save-to-run", "nope", *home])
    assert wrong.exit_code != 0 and "no run 'nope'" in wrong.output
    result = runner.invoke(main, [*args, "--save-to-run", "tiny", "--format", "csv", *home])
    assert result.exit_code == 0, result.output
    assert "saved 16 values to head_metrics of run 'tiny' (metric 'importance.*')" in result.output
    with open_store(db=f"sqlite:///{tmp_path / 'home' / 'meta.sqlite'}", root=str(tmp_path / "home" / "attention.zarr")) as store:
        saved = store.head_metrics("tiny")
    assert set(saved["metric"]) == {"importance.importance", "importance.importance_raw"} and len(saved) == 16


@pytest.mark.one_backend
def test_pruning_removes_the_least_important_heads_step_by_step_and_resumes(store, tiny_bert, tmp_path):
    from attnstore.ingest.evaluate import open_evaluator
    from attnstore.ingest.importance import head_importance, prune

    ev = open_evaluator(store, model=tiny_bert, task="SST-2", data_dir=FIXTURES)
    # the other procedure: importance on the dev set, re-estimated before each step
    frame = prune(store, ev, mode="zero", fraction=0.25, max_examples=3, progress=False, importance_data="dev", reestimate=True)
    steps = frame[frame["n_pruned"] > 0].drop_duplicates("n_pruned")  # 8 heads, 2 per step: 2, 4, 6
    key = "prune[importance=dev,reestimate,fraction=0.25,max_examples=3]:"  # the sweep's parameters are in its key
    assert steps["config"].tolist() == [f"{key}2", f"{key}4", f"{key}6"] and set(steps["mode"]) == {"zero"}
    masks = [[tuple(h) for h in m] for m in steps["disabled_heads"]]
    assert all(set(a) < set(b) for a, b in zip(masks, masks[1:]))  # each step adds to the last
    first = head_importance(ev, max_examples=3).sort_values(["importance", "layer", "head"], kind="stable")
    assert masks[0] == [(int(a), int(b)) for a, b in zip(first["layer"][:2], first["head"][:2])]  # the two least important
    second = head_importance(ev, max_examples=3, disabled=masks[0], mode="zero")  # re-estimated with those removed
    second = second[[(int(a), int(b)) not in masks[0] for a, b in zip(second["layer"], second["head"])]]
    second = second.sort_values(["importance", "layer", "head"], kind="stable")
    assert masks[1][2:] == [(int(a), int(b)) for a, b in zip(second["layer"][:2], second["head"][:2])]
    for mask, (_, row) in zip(masks, steps.iterrows()):
        assert row["score"] == pytest.approx(ev.scores(mask, "zero")[row["metric"]])
    assert set(steps["importance_split"]) == {"dev"} and set(steps["importance_examples"]) == {3}
    assert set(steps["importance_schedule"]) == {"iterative"}
    n_rows = len(store.ablation_results())
    again = prune(store, ev, mode="zero", fraction=0.25, max_examples=3, progress=False, importance_data="dev", reestimate=True)
    assert len(store.ablation_results()) == n_rows and again["config"].tolist() == frame["config"].tolist()
    with pytest.raises(Exception, match="fraction=1.5: give a share"):
        prune(store, ev, fraction=1.5, progress=False)


@pytest.mark.one_backend
def test_pruning_by_default_estimates_once_on_the_training_data_and_records_it(store, tiny_bert):
    """Issue item 2: the authors' script estimates the importance on the training data, once (re-estimating only with
    --exact_pruning); that is the default, and every step's rows say how its importance was estimated."""
    from attnstore.ingest.classifier import encode
    from attnstore.ingest.evaluate import open_evaluator
    from attnstore.ingest.glue import read_split
    from attnstore.ingest.importance import head_importance, importance_items, prune

    ev = open_evaluator(store, model=tiny_bert, task="SST-2", data_dir=FIXTURES)
    items, available = importance_items(store, ev, "train", 3)
    again, _ = importance_items(store, ev, "train", 3)
    assert available == 5 and len(items) == 3 and [i.input_ids for i in items] == [i.input_ids for i in again]  # seeded
    train = encode(ev.tokenizer, read_split(ev.task, "glue/SST-2:train", FIXTURES), ev.max_length)
    assert all(any(i.input_ids == t.input_ids for t in train) for i in items)  # training sentences, not dev ones
    assert not any(i.input_ids == d.input_ids for i in items for d in ev.items)
    frame = prune(store, ev, mode="zero", fraction=0.25, max_examples=3, progress=False)
    steps = frame[frame["n_pruned"] > 0].drop_duplicates("n_pruned")
    key = "prune[fraction=0.25,max_examples=3]:"  # the default procedure is not named in the key
    assert steps["config"].tolist() == [f"{key}2", f"{key}4", f"{key}6"]
    rows = store.ablation_results()
    rows = rows[rows["config"].str.startswith(key)]
    assert set(rows["importance_split"]) == {"train"} and set(rows["importance_examples"]) == {3}
    assert set(rows["importance_schedule"]) == {"once"}
    base = store.ablation_results()
    assert base.loc[base["config"] == "none", "importance_split"].isna().all()  # the plain evaluation has no procedure
    # one estimate, of the whole model, orders every step
    once = head_importance(ev, items=items).sort_values(["importance", "layer", "head"], kind="stable")
    order = [(int(a), int(b)) for a, b in zip(once["layer"], once["head"])]
    masks = [[tuple(h) for h in m] for m in steps["disabled_heads"]]
    assert masks == [order[:2], order[:4], order[:6]]
    # a model fine-tuned in this store is estimated on the examples it was trained on: its seeded --train-limit sample
    real = store.model_row
    store.model_row = lambda name: {"task": "SST-2", "training": {"hparams": {"train_limit": 4, "seed": 3}}}
    try:
        own, n_own = importance_items(store, ev, "train")
    finally:
        store.model_row = real
    sample = encode(ev.tokenizer, read_split(ev.task, "glue/SST-2:train", FIXTURES, 4, 3), ev.max_length)
    assert n_own == 4 and [i.input_ids for i in own] == [i.input_ids for i in sample]
    with pytest.raises(Exception, match="importance data 'test': use 'train'"):
        prune(store, ev, importance_data="test", progress=False)


@pytest.mark.slow  # pruning from the command line and its figure
def test_the_prune_command_draws_the_curve(tmp_path, tiny_bert):
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from attnstore.api.cli import main

    home = ["--home", str(tmp_path / "home")]
    assert CliRunner().invoke(main, ["db", "upgrade", *home]).exit_code == 0
    args = ["prune", "--model", tiny_bert, "--task", "SST-2", "--data-dir", FIXTURES, "--fraction", "0.5", "--max-examples", "2"]
    result = CliRunner().invoke(main, [*args, "--figure", str(tmp_path / "curve.png"), "--no-progress", *home])
    assert result.exit_code == 0, result.output
    assert "prune[fraction=0.5,max_examples=2]:4" in result.output and (tmp_path / "curve.png").stat().st_size > 1000
    other = ["--importance-data", "dev", "--reestimate"]
    result = CliRunner().invoke(main, [*args, *other, "--no-progress", "--format", "csv", *home])
    assert result.exit_code == 0, result.output
    assert "prune[importance=dev,reestimate,fraction=0.5,max_examples=2]:4" in result.output


def test_sweeps_with_other_parameters_are_kept_apart(store, tiny_bert):
    """Issue 49 item 7: `prune` again with another --fraction or --max-examples extended the stored sweep (its key,
    `prune:N`, recorded neither): now each sweep has its own key, and steps stored under a key by an attnstore that did
    not name the parameters, which do not fit this --fraction, are refused in one line instead of extended."""
    import sqlalchemy as sa

    from attnstore.ingest.evaluate import open_evaluator
    from attnstore.ingest.importance import prune, prune_config

    assert prune_config() == "prune:" and prune_config(0.1, None) == "prune:" and prune_config(0.1, None, "train", False) == "prune:"
    assert prune_config(0.25, 3) == "prune[fraction=0.25,max_examples=3]:" and prune_config(0.2) == "prune[fraction=0.2]:"
    assert prune_config(0.1, None, "dev", True) == "prune[importance=dev,reestimate]:"
    assert prune_config(0.25, 3, "dev") == "prune[importance=dev,fraction=0.25,max_examples=3]:"
    ev = open_evaluator(store, model=tiny_bert, task="SST-2", data_dir=FIXTURES)
    quarter = prune(store, ev, fraction=0.25, max_examples=2, progress=False)  # 2 heads a step: 2, 4, 6
    quarter_rows = store.ablation_results().sort_values(["config", "metric"]).reset_index(drop=True)
    half = prune(store, ev, fraction=0.5, max_examples=2, progress=False)  # 4 a step: 4
    other_sample = prune(store, ev, fraction=0.25, max_examples=1, progress=False)  # another importance: its own 2, 4, 6
    assert sorted(set(half["n_pruned"])) == [0, 4] and set(half["config"]) == {"none", "prune[fraction=0.5,max_examples=2]:4"}
    assert sorted(set(other_sample["n_pruned"])) == [0, 2, 4, 6]
    assert set(other_sample["config"]) - {"none"} == {f"prune[fraction=0.25,max_examples=1]:{n}" for n in (2, 4, 6)}
    again = prune(store, ev, fraction=0.25, max_examples=2, progress=False)  # the first sweep, read back unchanged
    assert again["config"].tolist() == quarter["config"].tolist() and again["score"].tolist() == quarter["score"].tolist()
    everything = store.ablation_results()
    first = everything[everything["config"].isin(quarter_rows["config"])].sort_values(["config", "metric"]).reset_index(drop=True)
    assert first[["config", "metric", "score"]].equals(quarter_rows[["config", "metric", "score"]])
    # max_examples at least the training set's size is every example: the default sweep's key
    assert set(prune(store, ev, fraction=0.5, max_examples=1000, progress=False)["config"]) == {"none", "prune[fraction=0.5]:4"}
    # steps an older attnstore stored as prune:N with --fraction 0.25 are not extended by a default (10 %) sweep
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE ablation_results SET config = replace(config, 'prune[fraction=0.25,max_examples=1]:', 'prune:')"))
    n_rows = len(store.ablation_results())
    with pytest.raises(Exception, match=r"stored pruning steps prune:N of .* prune \[2, 4, 6\] heads, not 1 more a step") as err:
        prune(store, ev, progress=False)
    assert "\n" not in str(err.value) and "DELETE FROM ablation_results" in str(err.value)
    assert len(store.ablation_results()) == n_rows
