"""Table 1 averages seeds of one fine-tuning setting and never pools another setting (e.g. another lr) into it."""

from __future__ import annotations

import uuid

import pytest


def _model(store, name, init, task, lr, seed):
    hparams = dict(lr=lr, batch_size=32, epochs=3, seed=seed, train_limit=None, max_length=128, warmup=0.1, weight_decay=0.01)
    return store.writer.register_finetuned_model(
        name=name,
        source=f"models/{name}",
        weights_sha256=uuid.uuid4().hex,
        architecture="X",
        n_layers=1,
        n_heads=1,
        max_length=128,
        tokenizer="t",
        special_tokens={},
        parent_id=None,
        init=init,
        task=task,
        training=dict(hparams=hparams, complete=True, checkpoint=name),
    )


def _score(store, model_id, task, value):
    row = dict(
        model_id=model_id,
        task=task,
        split="dev",
        mode="none",
        config="none",
        disabled_heads=[],
        metric="accuracy",
        score=value,
        baseline_score=None,
        n_examples=10,
    )
    assert store.writer.add_ablation_results([row])


@pytest.mark.one_backend
def test_seeds_are_averaged_and_other_settings_kept_apart(store):
    from attnstore.api.ablation_report import table1

    for seed, value in ((0, 50.0), (1, 60.0)):
        _score(store, _model(store, f"rte-s{seed}", "finetuned", "RTE", 2e-5, seed), "RTE", value)
    _score(store, _model(store, "rte-fast", "finetuned", "RTE", 1e-4, 0), "RTE", 90.0)
    _score(store, _model(store, "rte-random", "random", "RTE", 2e-5, 0), "RTE", 52.0)
    long, shaped = table1(store)
    row = shaped[shaped["task"] == "RTE"].iloc[0]
    assert row["fine-tuned from pre-trained"] == "55.0 ± 7.1 (n=2)"  # 90.0 (lr 1e-4) is not pooled in
    assert row["fine-tuned from random init"] == "52.0"
    fast = long[long["model"] == "rte-fast"].iloc[0]
    assert not fast["in_table"] and fast["setting"].startswith("lr=0.0001")
