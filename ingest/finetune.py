"""Fine-tune a model on a GLUE task (Kovaleva et al. K4), on CPU, resumable at epoch boundaries.

The checkpoint is saved in the store's models folder (`Locations.models_root`), and the
model is registered in `models` with its parent, task, initialisation (`init`:
"finetuned" = fine-tuned from the pre-trained weights, "random" = fine-tuned from a normal
initialisation), and in `training`: hyper-parameters, seed, data used, loss per epoch,
seconds, and the checkpoint folder relative to the models root.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..store.errors import ConflictError, InvalidArgumentError
from .classifier import accepted, collate, encode, length_batches
from .glue import GlueTask, get_task, read_split, require_train
from .model import DEFAULT_MODEL, load_model, models_folder, weights_digest
from .progress import progress_bar

if TYPE_CHECKING:
    from ..store import Store

INITS = ("pretrained", "random")
STATE_FILE = "training-state.pt"


@dataclass(frozen=True)
class FinetuneResult:
    name: str
    model_id: int
    path: str
    epochs_run: int
    seconds: float
    already_done: bool


def build_classifier(source: str, task: GlueTask, init: str, seed: int):
    """A sequence classifier (regressor for STS-B) from `source`'s weights or, for init="random", its config only."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "newly initialized: classifier.weight" is expected here
    config = AutoConfig.from_pretrained(
        source, num_labels=task.num_labels, problem_type="regression" if task.is_regression else "single_label_classification"
    )
    torch.manual_seed(seed)  # the new classifier head (and, for random init, every weight) is seeded
    if init == "random":
        return AutoModelForSequenceClassification.from_config(config, attn_implementation="eager")
    return AutoModelForSequenceClassification.from_pretrained(source, config=config, attn_implementation="eager")


def finetune(
    store: Store,
    *,
    task: str,
    model: str = DEFAULT_MODEL,
    init: str = "pretrained",
    epochs: int = 3,
    batch_size: int = 32,
    lr: float = 2e-5,
    seed: int = 0,
    train_limit: int | None = None,
    max_length: int = 128,
    warmup: float = 0.1,
    weight_decay: float = 0.01,
    name: str | None = None,
    data_dir: str | None = None,
    progress: bool = True,
) -> FinetuneResult:
    """Fine-tune `model` on `task`'s train split; resume an interrupted run of the same name at its last epoch."""
    import torch

    spec = get_task(task)
    train_key = require_train(spec)
    if init not in INITS:
        raise InvalidArgumentError(f"--init must be one of {INITS}, not {init!r}")
    if epochs < 1 or batch_size < 1 or lr <= 0 or (train_limit is not None and train_limit < 1) or not 0 <= warmup < 1:
        raise InvalidArgumentError("--epochs, --batch-size, --lr and --train-limit must be positive, --warmup in [0, 1)")
    store.writer.require_writable()
    base = load_model(model)
    run_name = name or f"{base.name}-{spec.name}-{init}-seed{seed}" + (f"-n{train_limit}" if train_limit else "")
    folder = models_folder(store) / run_name
    hparams = dict(
        base=base.name,
        base_sha256=base.weights_sha256,
        task=spec.name,
        init=init,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        train_limit=train_limit,
        max_length=max_length,
        warmup=warmup,
        weight_decay=weight_decay,
        optimizer="torch.optim.AdamW",
        schedule="linear warmup + linear decay",
    )
    with store.writer.lease(f"model:{run_name}", f"fine-tuning of {run_name!r}"):
        existing = store.model_row(run_name)
        if existing is not None and (existing.get("training") or {}).get("complete"):
            if {k: existing["training"]["hparams"].get(k) for k in hparams} != hparams:
                raise ConflictError(f"model {run_name!r} was fine-tuned with other settings; pick another --name")
            return FinetuneResult(run_name, existing["id"], str(folder), 0, 0.0, True)
        pairs = read_split(spec, train_key, data_dir, train_limit, seed)
        tokenizer = base.tokenizer
        items = encode(tokenizer, pairs, max_length)
        classifier = build_classifier(base.source, spec, init, seed)
        optimizer = torch.optim.AdamW(classifier.parameters(), lr=lr, weight_decay=weight_decay)
        steps_per_epoch = -(-len(items) // batch_size)
        from transformers import get_linear_schedule_with_warmup

        scheduler = get_linear_schedule_with_warmup(optimizer, int(warmup * steps_per_epoch * epochs), steps_per_epoch * epochs)
        start_epoch, losses, seconds = 0, [], 0.0
        state_path = folder / STATE_FILE
        if state_path.exists():
            state = torch.load(state_path, weights_only=False)
            if state["hparams"] != hparams:
                raise ConflictError(
                    f"{folder} holds an interrupted fine-tuning with other settings; pick another --name or delete that folder"
                )
            classifier.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            start_epoch, losses, seconds = state["epoch"] + 1, state["losses"], state["seconds"]
        folder.mkdir(parents=True, exist_ok=True)
        pad = tokenizer.pad_token_id or 0
        for epoch in range(start_epoch, epochs):
            started = time.perf_counter()
            classifier.train()
            torch.manual_seed(seed * 1000 + epoch)  # dropout: the same masks whether or not the run was resumed
            rng = np.random.default_rng([seed, epoch])
            total, n = 0.0, 0
            with progress_bar(steps_per_epoch, f"fine-tuning {run_name} epoch {epoch + 1}/{epochs}", progress, "batch") as bar:
                for batch in length_batches(items, batch_size, rng):
                    inputs, labels = collate([items[i] for i in batch], pad, spec.is_regression)
                    loss = classifier(**accepted(classifier, inputs), labels=labels).loss
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(classifier.parameters(), 1.0)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
                    total += float(loss.detach()) * len(batch)
                    n += len(batch)
                    bar.update(1)
            losses.append(total / max(n, 1))
            seconds += time.perf_counter() - started
            tmp = folder / (STATE_FILE + ".tmp")
            torch.save(
                dict(
                    hparams=hparams,
                    epoch=epoch,
                    losses=losses,
                    seconds=seconds,
                    model=classifier.state_dict(),
                    optimizer=optimizer.state_dict(),
                    scheduler=scheduler.state_dict(),
                ),
                tmp,
            )
            os.replace(tmp, state_path)  # an epoch is either fully saved or not at all
        classifier.eval()
        classifier.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        parent_id = store.writer.find_or_create_model(**base.record())
        with torch.no_grad():
            digest = weights_digest(classifier)
        training = dict(
            hparams=hparams,
            complete=True,
            checkpoint=run_name,
            train_dataset=train_key,
            n_train=len(items),
            loss_per_epoch=losses,
            seconds=seconds,
            torch=torch.__version__,
        )
        model_id = store.writer.register_finetuned_model(
            name=run_name,
            source=f"models/{run_name}",
            weights_sha256=digest,
            architecture=type(classifier).__name__,
            n_layers=base.n_layers,
            n_heads=base.n_heads,
            max_length=base.max_length,
            tokenizer=type(tokenizer).__name__,
            special_tokens=base.special_tokens,
            parent_id=parent_id,
            causal=base.causal,
            init="finetuned" if init == "pretrained" else "random",
            task=spec.name,
            training=training,
        )
        state_path.unlink(missing_ok=True)
    return FinetuneResult(run_name, model_id, str(folder), epochs - start_epoch, seconds, False)
