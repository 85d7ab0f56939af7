"""Fine-tuning, evaluation and head disabling (Kovaleva et al. K4, K7) on a tiny random BERT and the GLUE fixtures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attnstore.ingest.glue import compute_metrics, get_task

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FIXTURES = str(Path(__file__).parents[1] / "fixtures" / "data")


# ---------------------------------------------------------------- metrics


def test_glue_metrics_exact():
    mrpc = get_task("MRPC")
    # tp=2, fp=1, fn=1, tn=1: F1 = 2*2 / (2*2 + 1 + 1) = 2/3; accuracy 3/5
    got = compute_metrics(mrpc, np.array([1, 1, 1, 0, 0]), np.array([1, 1, 0, 1, 0]))
    assert got == pytest.approx({"f1": 200 / 3, "accuracy": 60.0})
    stsb = get_task("STS-B")
    got = compute_metrics(stsb, np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 4.0, 6.0, 7.0]))
    # deviations (-1.5, -.5, .5, 1.5) and (-2.75, -.75, 1.25, 2.25): r = 8.5 / sqrt(5 * 14.75)
    assert got["spearman"] == pytest.approx(100.0) and got["pearson"] == pytest.approx(100 * 8.5 / np.sqrt(5 * 14.75))
    assert compute_metrics(stsb, np.ones(3), np.array([1.0, 2.0, 3.0])) == {"pearson": 0.0, "spearman": 0.0}
    assert compute_metrics(get_task("rte"), np.array([0, 1]), np.array([0, 0])) == {"accuracy": 50.0}


def test_tasks_without_train_split_are_refused(store, tiny_bert):
    from attnstore.ingest.finetune import finetune
    from attnstore.store.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="QNLI has no train split in the data directory"):
        finetune(store, task="QNLI", model=tiny_bert, data_dir=FIXTURES, progress=False)


# ---------------------------------------------------------------- the head-disabling hook


@pytest.fixture
def tiny_classifier(tiny_bert):
    from attnstore.ingest.finetune import build_classifier

    return build_classifier(tiny_bert, get_task("SST-2"), "pretrained", seed=0).eval()


def _batch(tiny_bert):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    return tokenizer(["a long enough sentence", "short"], padding=True, return_tensors="pt")


def test_disabled_head_attends_uniformly_to_real_tokens_only(tiny_classifier, tiny_bert):
    from attnstore.ingest.classifier import HeadDisabler

    inputs = _batch(tiny_bert)
    real = inputs["attention_mask"].sum(-1)  # lengths without padding
    with torch.inference_mode():
        plain = tiny_classifier(**inputs, output_attentions=True)
    disabler = HeadDisabler(tiny_classifier, n_layers=2, n_heads=4)
    with torch.inference_mode(), disabler.disabled([(1, 3)], "uniform"):
        ablated = tiny_classifier(**inputs, output_attentions=True)
    for k, length in enumerate(real.tolist()):
        rows = ablated.attentions[1][k, 3]
        expected = torch.zeros_like(rows)
        expected[:, :length] = 1.0 / length
        assert torch.equal(rows, expected)
    # every other head (the disabled one is in the last layer) is exactly unchanged
    assert torch.equal(ablated.attentions[0], plain.attentions[0])
    assert torch.equal(ablated.attentions[1][:, :3], plain.attentions[1][:, :3])
    assert not torch.equal(ablated.logits, plain.logits)
    with torch.inference_mode(), disabler.disabled([], "uniform"):
        empty = tiny_classifier(**inputs, output_attentions=True)
    assert torch.equal(empty.logits, plain.logits)
    with torch.inference_mode(), disabler.disabled([(0, 0), (0, 2)], "zero"):
        zeroed = tiny_classifier(**inputs, output_attentions=True)
    assert torch.count_nonzero(zeroed.attentions[0][:, [0, 2]]) == 0
    assert torch.equal(zeroed.attentions[0][:, [1, 3]], plain.attentions[0][:, [1, 3]])
    disabler.remove()
    with torch.inference_mode():
        assert torch.equal(tiny_classifier(**inputs).logits, plain.logits)


def test_mean_ablation_replaces_a_heads_output_by_its_mean_over_real_tokens(tiny_classifier, tiny_bert):
    from attnstore.ingest.classifier import HeadDisabler, self_attentions
    from attnstore.store.errors import InvalidArgumentError

    inputs = _batch(tiny_bert)
    real = inputs["attention_mask"].bool()
    captured = {}

    def keep(layer):
        def hook(_module, _inputs, output):
            captured[layer] = output[0].detach().clone()

        return hook

    disabler = HeadDisabler(tiny_classifier, n_layers=2, n_heads=4)
    # registered after the disabler's hooks, so they see what the next layer sees
    taps = [m.register_forward_hook(keep(i)) for i, m in enumerate(self_attentions(tiny_classifier))]
    with torch.inference_mode():
        plain = tiny_classifier(**inputs)
    outputs = {layer: out.view(*out.shape[:2], 4, -1) for layer, out in captured.items()}  # (batch, token, head, size)
    with pytest.raises(InvalidArgumentError, match="mean output first"):
        with disabler.disabled([(1, 2)], "mean"):
            pass
    with torch.inference_mode(), disabler.fitting_means():
        assert torch.equal(tiny_classifier(**inputs).logits, plain.logits)  # fitting changes nothing
    # the mean over the real tokens of the batch only (padding excluded), per layer and head
    expected = outputs[1][real].double().mean(0).float()
    assert torch.allclose(disabler.means[1], expected, atol=1e-6)
    with torch.inference_mode(), disabler.disabled([(1, 2)], "mean"):
        ablated = tiny_classifier(**inputs)
    got = captured[1].view(*captured[1].shape[:2], 4, -1)
    assert torch.equal(got[:, :, 2][real], disabler.means[1][2].expand(int(real.sum()), -1))
    assert torch.equal(got[:, :, [0, 1, 3]], outputs[1][:, :, [0, 1, 3]])  # other heads of the layer untouched
    assert torch.equal(captured[0], outputs[0].flatten(2))  # the layer before untouched
    assert not torch.equal(ablated.logits, plain.logits)
    with torch.inference_mode(), disabler.disabled([], "mean"):
        assert torch.equal(tiny_classifier(**inputs).logits, plain.logits)
    disabler.remove()
    for tap in taps:
        tap.remove()


def test_head_specs_and_config_names():
    from attnstore.ingest.classifier import config_name, parse_heads
    from attnstore.ingest.evaluate import configurations
    from attnstore.store.errors import InvalidArgumentError

    assert parse_heads("1:2, 0:3,1:2", 2, 4) == [(0, 3), (1, 2)]
    with pytest.raises(InvalidArgumentError, match="2:0 is outside the model's 2 layers x 4 heads"):
        parse_heads("2:0", 2, 4)
    with pytest.raises(InvalidArgumentError, match="write each head as LAYER:HEAD"):
        parse_heads("1-2", 2, 4)
    assert config_name([], 4) == "none" and config_name([(1, h) for h in range(4)], 4) == "layer:1"
    assert config_name([(1, 2), (0, 3)], 4) == "heads:0:3,1:2"
    assert len(configurations("each", 2, 4)) == 8 and len(configurations("layers", 2, 4)) == 2


# ---------------------------------------------------------------- fine-tuning, evaluation, sweeps (stored)


def test_finetune_registers_the_model_and_resumes_at_an_epoch_boundary(store, tiny_bert, monkeypatch, tmp_path):
    from attnstore.ingest import finetune as ft

    kwargs = dict(task="SST-2", model=tiny_bert, epochs=2, batch_size=2, lr=1e-3, seed=3, data_dir=FIXTURES, progress=False)
    real_replace = ft.os.replace
    calls = []

    def interrupt_after_first_epoch(src, dst):
        real_replace(src, dst)
        calls.append(dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(ft.os, "replace", interrupt_after_first_epoch)
    with pytest.raises(KeyboardInterrupt):
        ft.finetune(store, **kwargs)
    monkeypatch.setattr(ft.os, "replace", real_replace)
    assert store.model_row(Path(calls[0]).parent.name) is None  # not registered until complete
    resumed = ft.finetune(store, **kwargs)
    assert resumed.epochs_run == 1 and not resumed.already_done
    row = store.model_row(resumed.name)
    assert row["init"] == "finetuned" and row["task"] == "SST-2" and row["parent_id"] is not None
    training = row["training"]
    assert training["complete"] and training["n_train"] == 5 and len(training["loss_per_epoch"]) == 2
    assert training["hparams"]["seed"] == 3 and training["checkpoint"] == resumed.name
    assert (Path(store.locations.models_root) / resumed.name / "config.json").exists()
    assert ft.finetune(store, **kwargs).already_done

    # the same fine-tuning, uninterrupted, in another store: identical weights
    from attnstore.store import migrate, open_store

    other_url = f"sqlite:///{tmp_path / 'other' / 'meta.sqlite'}"
    (tmp_path / "other").mkdir()
    migrate.upgrade(other_url)
    other = open_store(db=other_url, root=str(tmp_path / "other" / "attention.zarr"))
    clean = ft.finetune(other, **kwargs)
    assert other.model_row(clean.name)["weights_sha256"] == row["weights_sha256"]


def test_evaluate_and_sweep_store_each_configuration_once(store, tiny_bert):
    from attnstore.ingest.evaluate import ablate, evaluate, open_evaluator
    from attnstore.ingest.finetune import finetune

    tuned = finetune(store, task="SST-2", model=tiny_bert, epochs=1, batch_size=2, seed=0, data_dir=FIXTURES, progress=False)
    ev = open_evaluator(store, model=tuned.name, task="SST-2", data_dir=FIXTURES)
    from attnstore.store.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="9:9 is outside the model's 2 layers"):
        ablate(store, ev, heads="9:9", mode="uniform", progress=False)
    assert store.ablation_results(model=tuned.name).empty  # refused before the baseline was evaluated (and stored)
    base = evaluate(store, ev)
    assert set(base) == {"accuracy"} and base["accuracy"] in {0.0, 20.0, 40.0, 60.0, 80.0, 100.0}
    frame = ablate(store, ev, heads="layers", mode="uniform", progress=False)
    assert sorted(frame["config"]) == ["layer:0", "layer:1"]
    assert (frame["baseline_score"] == base["accuracy"]).all() and (frame["n_examples"] == 5).all()
    # a configuration claimed by a live process elsewhere is left to it; stored ones are skipped
    from datetime import timedelta

    import sqlalchemy as sa

    from attnstore.store.schema import Lease, utcnow

    now = utcnow() - timedelta(seconds=1)
    with store.engine.begin() as conn:
        conn.execute(
            sa.insert(Lease).values(
                resource=f"ablation:{ev.model_id}:SST-2:dev:uniform:heads:0:0",
                token="z" * 32,
                host="elsewhere",
                pid=1,
                acquired_at=now,
                heartbeat_at=now,
            )
        )
    each = ablate(store, ev, heads="each", mode="uniform", progress=False)
    assert len(each) == 7 and "heads:0:0" not in set(each["config"])
    again = ablate(store, ev, heads="each", mode="uniform", progress=False)
    assert again.equals(each)
    all_rows = store.ablation_results(model=tuned.name)
    assert not all_rows.duplicated(["task", "split", "mode", "config", "metric"]).any()
    # the unique key refuses a duplicate whoever writes it
    row = dict(
        model_id=ev.model_id,
        task="SST-2",
        split="dev",
        mode="uniform",
        config="layer:0",
        disabled_heads=[],
        metric="accuracy",
        score=0.0,
        baseline_score=None,
        n_examples=5,
    )
    assert store.writer.add_ablation_results([row]) is False


def test_no_finetuning_baseline_is_a_seeded_untrained_head(store, tiny_bert):
    from attnstore.ingest.evaluate import evaluate, open_evaluator

    ev = open_evaluator(store, model=tiny_bert, task="SST-2", data_dir=FIXTURES)
    assert "without fine-tuning" in ev.description
    first = evaluate(store, ev)
    assert open_evaluator(store, model=tiny_bert, task="SST-2", data_dir=FIXTURES).scores() == first


@pytest.mark.slow  # fine-tuning and a report's figures, from the command line
def test_command_line_finetune_evaluate_ablate_report_and_ingest(tmp_path, tiny_bert, monkeypatch):
    """The whole workflow through the CLI on SQLite: fine-tune, evaluate, ablate, both reports, ingest the fine-tuned model."""
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from attnstore.api.cli import main
    from attnstore.store import open_store

    monkeypatch.setenv("ATTNSTORE_DATA", FIXTURES)
    home = ["--home", str(tmp_path / "store")]
    runner = CliRunner()

    def ok(*args):
        result = runner.invoke(main, [*args, *home])
        assert result.exit_code == 0, (args, result.output)
        return result.output

    ok("db", "upgrade")
    out = ok(
        "finetune", "--task", "sst-2", "--model", tiny_bert, "--epochs", "1", "--batch-size", "2", "--name", "tiny-sst2", "--no-progress"
    )
    assert "fine-tuned 'tiny-sst2': 1 epoch(s)" in out
    assert (tmp_path / "store" / "models" / "tiny-sst2" / "config.json").exists()
    assert "accuracy" in ok("evaluate", "--model", "tiny-sst2", "--task", "SST-2", "--no-progress")
    ok("evaluate", "--model", tiny_bert, "--task", "SST-2", "--no-progress")  # no fine-tuning
    assert "heads:0:1,1:2" in ok("ablate", "--model", "tiny-sst2", "--task", "SST-2", "--heads", "1:2,0:1", "--no-progress")
    ok("ablate", "--model", "tiny-sst2", "--task", "SST-2", "--heads", "layers", "--no-progress")
    assert "layer:1" in ok("ablate", "--model", "tiny-sst2", "--task", "SST-2", "--heads", "layers", "--mode", "mean", "--no-progress")
    ok("report", "table1", "--out", str(tmp_path / "t1"))
    table = (tmp_path / "t1" / "table1.md").read_text()
    assert "SST-2" in table and "no fine-tuning" in table and "fine-tuned from pre-trained" in table
    ok("report", "ablation", "--out", str(tmp_path / "ab"))
    assert (tmp_path / "ab" / "fig9_SST-2_tiny-sst2.png").exists() and (tmp_path / "ab" / "ablation_uniform.md").exists()
    ok("report", "ablation", "--mode", "mean", "--out", str(tmp_path / "ab-mean"))
    assert "layer:1" in (tmp_path / "ab-mean" / "ablation_mean.csv").read_text()
    assert (tmp_path / "ab-mean" / "fig9_SST-2_tiny-sst2_mean.png").exists()
    assert "tiny-sst2" in ok("models")
    corpus = tmp_path / "c.txt"
    corpus.write_text("a good film\nnot a good film\n", encoding="utf-8")
    ok(
        "ingest",
        "--corpus",
        str(corpus),
        "--format",
        "text",
        "--annotate",
        "whitespace",
        "--model",
        "tiny-sst2",
        "--name",
        "tuned-run",
        "--no-progress",
    )
    store = open_store(home=str(tmp_path / "store"))
    assert store.run_info("tuned-run").model_id == store.model_row("tiny-sst2")["id"]
    refused = runner.invoke(main, ["evaluate", "--model", "tiny-sst2", "--task", "RTE", *home])
    assert refused.exit_code == 1 and "was fine-tuned on SST-2, not RTE" in refused.output
