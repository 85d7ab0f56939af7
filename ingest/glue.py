"""GLUE tasks for fine-tuning and evaluation: their data (the built-in datasets), labels and metrics.

Texts are fed to the model as raw text through its own tokenizer (pairs as two segments),
the way Kovaleva et al. fine-tuned and evaluated; labels come from the datasets' readers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .datasets import dataset_path, find_dataset, resolve_data_dir
from .errors import InvalidArgumentError


@dataclass(frozen=True)
class GlueTask:
    name: str
    train: str | None  # built-in dataset key, None where ../shared/data has no train split
    dev: str
    labels: tuple[str, ...]  # label strings in class order; () for regression (STS-B)
    metrics: tuple[str, ...]  # the first is the task's headline metric (used for ablations)

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        return 1 if self.is_regression else len(self.labels)


TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask("MRPC", "glue/MRPC:train", "glue/MRPC:dev", ("0", "1"), ("f1", "accuracy")),
        GlueTask("RTE", "glue/RTE:train", "glue/RTE:dev", ("entailment", "not_entailment"), ("accuracy",)),
        GlueTask("STS-B", "glue/STS-B:train", "glue/STS-B:dev", (), ("pearson", "spearman")),
        GlueTask("SST-2", "glue/SST-2:train", "glue/SST-2:dev", ("0", "1"), ("accuracy",)),
        GlueTask("QNLI", None, "glue/QNLI:dev", ("entailment", "not_entailment"), ("accuracy",)),
        GlueTask("MNLI", None, "glue/MNLI:dev-matched-sample", ("entailment", "neutral", "contradiction"), ("accuracy",)),
    )
}


def get_task(name: str) -> GlueTask:
    key = name.upper() if name.upper() in TASKS else name
    if key not in TASKS:
        raise InvalidArgumentError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[key]


def require_train(task: GlueTask) -> str:
    if task.train is None:
        raise InvalidArgumentError(
            f"{task.name} has no train split in the data directory (only {task.dev}); attnstore does not fine-tune on "
            f"dev data, so its dev scores stay honest: fine-tune on MRPC, RTE, STS-B or SST-2"
        )
    return task.train


@dataclass(frozen=True)
class LabelledPair:
    text_a: str
    text_b: str | None
    label: float | int


def read_split(task: GlueTask, key: str, data_dir: str | None = None, limit: int | None = None, seed: int = 0) -> list[LabelledPair]:
    """Examples of one split with numeric labels (class index, or the STS-B score); `limit` draws a seeded sample."""
    spec = find_dataset(key)
    path: Path = dataset_path(spec, resolve_data_dir(data_dir))
    rows = list(_labelled(task, spec.reader(path, **spec.options), path))
    if limit is not None and limit < len(rows):
        rng = np.random.default_rng(seed)
        rows = [rows[i] for i in sorted(rng.choice(len(rows), size=limit, replace=False))]
    return rows


def _labelled(task: GlueTask, examples, path: Path) -> Iterator[LabelledPair]:
    for e in examples:
        if e.label is None:
            raise InvalidArgumentError(f"{path}: example {e.position} has no label; {task.name} needs labelled data")
        if task.is_regression:
            label: float | int = float(e.label)
        else:
            if e.label not in task.labels:
                raise InvalidArgumentError(f"{path}: example {e.position} has label {e.label!r}, not one of {task.labels}")
            label = task.labels.index(e.label)
        yield LabelledPair(e.text_a, e.text_b, label)


def compute_metrics(task: GlueTask, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """GLUE metrics in percent: accuracy; F1 of the positive class (MRPC); Pearson and Spearman r (STS-B)."""
    out: dict[str, float] = {}
    if task.is_regression:
        from scipy.stats import pearsonr, spearmanr

        constant = np.ptp(predictions) == 0  # correlation undefined: report 0, as a model that ranks nothing
        out["pearson"] = 0.0 if constant else 100 * float(pearsonr(predictions, labels)[0])
        out["spearman"] = 0.0 if constant else 100 * float(spearmanr(predictions, labels)[0])
        return out
    predictions = np.asarray(predictions).astype(int)
    labels = np.asarray(labels).astype(int)
    out["accuracy"] = 100 * float((predictions == labels).mean())
    if "f1" in task.metrics:
        tp = int(((predictions == 1) & (labels == 1)).sum())
        fp = int(((predictions == 1) & (labels == 0)).sum())
        fn = int(((predictions == 0) & (labels == 1)).sum())
        out["f1"] = 0.0 if tp == 0 else 100 * 2 * tp / (2 * tp + fp + fn)
    return {m: out[m] for m in task.metrics}
