"""Evaluate a model on a GLUE task's dev set, with or without disabled heads (Kovaleva et al. K4, K7).

Every score is a row of `ablation_results`: config "none" is the plain evaluation (the
baseline), other configs name the disabled heads ("layer:3", "heads:0:1,2:5"). A sweep skips
configurations already stored and claims each one with a lease, so an interrupted sweep
resumes and two processes sweeping the same model share the work without duplicates.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..store.errors import BusyError, InvalidArgumentError, NotFoundError
from .classifier import Encoded, HeadDisabler, config_name, encode, parse_heads, predict
from .finetune import build_classifier
from .glue import GlueTask, compute_metrics, get_task, read_split
from .model import load_model, models_folder

if TYPE_CHECKING:
    from ..store import Store

SPLIT = "dev"
NO_FINETUNING_SEED = 0


@dataclass
class Evaluator:
    """A classifier loaded once, its dev set encoded once, and the hooks that disable heads."""

    model_name: str
    model_id: int
    task: GlueTask
    classifier: Any  # a transformers sequence-classification model (torch, imported lazily)
    items: list[Encoded]
    labels: np.ndarray
    pad_id: int
    n_layers: int
    n_heads: int
    description: str
    tokenizer: Any = None  # encodes other data for the model (pruning's importance on the training set)
    max_length: int = 128
    data_dir: str | None = None
    _disabler: HeadDisabler | None = None

    @property
    def disabler(self) -> HeadDisabler:
        if self._disabler is None:
            self._disabler = HeadDisabler(self.classifier, self.n_layers, self.n_heads)
            self._probe()
        return self._disabler

    def _probe(self) -> None:
        """One forward pass: every layer's hook must run once, or this architecture is refused."""
        disabler = self._disabler
        assert disabler is not None
        disabler.calls = 0
        predict(self.classifier, self.items[:1], self.pad_id, self.task.is_regression)
        if disabler.calls != self.n_layers:
            disabler.remove()
            raise InvalidArgumentError(
                f"cannot disable heads of {self.model_name!r}: its attention hooks ran {disabler.calls} "
                f"times for {self.n_layers} layers (eager BERT-family self-attention is supported)"
            )

    def scores(self, heads=(), mode: str = "uniform", progress: bool = False) -> dict[str, float]:
        from tqdm.auto import tqdm

        if heads and mode == "mean" and self.disabler.means is None:
            with (
                tqdm(
                    total=len(self.items), desc=f"{self.task.name}: mean head outputs", unit="ex", disable=not progress, leave=False
                ) as bar,
                self.disabler.fitting_means(),
            ):
                predict(self.classifier, self.items, self.pad_id, self.task.is_regression, progress=bar)
        with tqdm(
            total=len(self.items), desc=f"{self.task.name} {config_name(heads, self.n_heads)}", unit="ex", disable=not progress, leave=False
        ) as bar:
            if heads:
                with self.disabler.disabled(heads, mode):
                    predictions = predict(self.classifier, self.items, self.pad_id, self.task.is_regression, progress=bar)
            else:
                predictions = predict(self.classifier, self.items, self.pad_id, self.task.is_regression, progress=bar)
        return compute_metrics(self.task, predictions, self.labels)


def open_evaluator(
    store: Store, *, model: str, task: str, data_dir: str | None = None, max_length: int = 128, dev_limit: int | None = None
) -> Evaluator:
    """Load `model` as a classifier for `task`: a fine-tuned model of the store, or a base model with an
    untrained, seeded classifier head ("no fine-tuning", Table 1's first column)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    spec = get_task(task)
    row = store.model_row(model)
    if row is not None and row.get("task"):
        if row["task"] != spec.name:
            raise InvalidArgumentError(f"model {model!r} was fine-tuned on {row['task']}, not {spec.name}")
        folder = models_folder(store) / row["training"]["checkpoint"]
        if not folder.is_dir():
            raise NotFoundError(
                f"checkpoint of model {model!r} not found at {folder}; is the store's models folder "
                f"({store.locations.models_root}) copied with it? (or set ATTNSTORE_MODELS)"
            )
        classifier = AutoModelForSequenceClassification.from_pretrained(folder, attn_implementation="eager")
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model_id, n_layers, n_heads = row["id"], row["n_layers"], row["n_heads"]
        description = f"{model} (fine-tuned on {spec.name} from {'pre-trained weights' if row['init'] == 'finetuned' else 'random init'})"
    else:
        base = load_model(model)
        classifier = build_classifier(base.source, spec, "pretrained", NO_FINETUNING_SEED)
        tokenizer = base.tokenizer
        model_id = store.writer.find_or_create_model(**base.record())
        n_layers, n_heads = base.n_layers, base.n_heads
        description = (
            f"{base.name} without fine-tuning (pre-trained encoder, classifier head initialised with seed "
            f"{NO_FINETUNING_SEED} and never trained)"
        )
    classifier.eval()
    pairs = read_split(spec, spec.dev, data_dir, dev_limit)
    items = encode(tokenizer, pairs, max_length)
    return Evaluator(
        model,
        model_id,
        spec,
        classifier,
        items,
        np.array([p.label for p in pairs]),
        tokenizer.pad_token_id or 0,
        n_layers,
        n_heads,
        description,
        tokenizer,
        max_length,
        data_dir,
    )


def _rows(ev: Evaluator, config: str, heads, mode: str, scores: dict, baseline: dict | None) -> list[dict]:
    return [
        dict(
            model_id=ev.model_id,
            task=ev.task.name,
            split=SPLIT,
            mode=mode if heads else "none",
            config=config,
            disabled_heads=[list(h) for h in heads],
            metric=m,
            score=v,
            baseline_score=None if baseline is None else baseline[m],
            n_examples=len(ev.items),
        )
        for m, v in scores.items()
    ]


def stored_scores(store: Store, ev: Evaluator, config: str, mode: str) -> dict[str, float] | None:
    frame = store.ablation_results(model=ev.model_name, task=ev.task.name)
    frame = frame[(frame["config"] == config) & (frame["mode"] == mode) & (frame["split"] == SPLIT)]
    return None if frame.empty else dict(zip(frame["metric"], frame["score"]))


def evaluate(store: Store, ev: Evaluator, progress: bool = False) -> dict[str, float]:
    """The model's dev scores (config "none"): stored once, then read back."""
    stored = stored_scores(store, ev, "none", "none")
    if stored is not None:
        return stored
    scores = ev.scores(progress=progress)
    if not store.writer.add_ablation_results(_rows(ev, "none", (), "none", scores, None)):
        return stored_scores(store, ev, "none", "none") or scores
    return scores


def configurations(spec: str, n_layers: int, n_heads: int) -> list[list[tuple[int, int]]]:
    """--heads each | layers | L:H,L:H,... -> the disabled sets to evaluate, one per configuration."""
    if spec == "each":
        return [[(layer, head)] for layer in range(n_layers) for head in range(n_heads)]
    if spec == "layers":
        return [[(layer, head) for head in range(n_heads)] for layer in range(n_layers)]
    return [parse_heads(spec, n_layers, n_heads)]


def ablate(store: Store, ev: Evaluator, heads: str = "each", mode: str = "uniform", progress: bool = True) -> pd.DataFrame:
    """Evaluate every configuration of `heads` not yet stored; returns their stored rows (with the baseline)."""
    from tqdm.auto import tqdm

    configs = configurations(heads, ev.n_layers, ev.n_heads)  # a bad --heads fails before the baseline's evaluation
    baseline = evaluate(store, ev, progress=progress)
    names = [config_name(c, ev.n_heads) for c in configs]
    done = store.writer.ablation_configs(ev.model_id, ev.task.name, SPLIT, mode)
    busy = []
    todo = [(n, c) for n, c in zip(names, configs) if n not in done]
    with tqdm(
        total=len(todo),
        desc=f"ablating {ev.model_name} on {ev.task.name} ({mode})",
        unit="config",
        disable=not progress,
        dynamic_ncols=True,
    ) as bar:
        for name, heads_ in todo:
            try:
                lease = store.writer.lease(f"ablation:{ev.model_id}:{ev.task.name}:{SPLIT}:{mode}:{name}", f"configuration {name}")
            except BusyError:
                busy.append(name)  # another process is evaluating it
                bar.update(1)
                continue
            with lease:
                if name not in store.writer.ablation_configs(ev.model_id, ev.task.name, SPLIT, mode):
                    store.writer.add_ablation_results(_rows(ev, name, heads_, mode, ev.scores(heads_, mode), baseline))
            bar.update(1)
    if busy and progress:
        print(f"{len(busy)} configuration(s) were being evaluated by another process; run again to fill any it left", file=sys.stderr)
    frame = store.ablation_results(model=ev.model_name, task=ev.task.name)
    return frame[frame["config"].isin(names) & (frame["mode"] == mode)].reset_index(drop=True)


def checkpoint_path(store: Store, model: str) -> Path | None:
    """The checkpoint folder of a fine-tuned model registered in the store, or None."""
    row = store.model_row(model)
    if row is None or not (row.get("training") or {}).get("checkpoint"):
        return None
    return models_folder(store) / row["training"]["checkpoint"]
