"""K1 (Kovaleva et al. 2019, Sec 4.1): scoring pattern classifiers against labels, and labellers against each other.

Confusion matrices and F1 as scikit-learn computes them (`f1_scores` follows its zero_division=0), a seeded
stratified held-out split, Cohen's kappa between two labellers, and per-class shares with bootstrap
uncertainty from a classifier's held-out confusion matrix. Hand-written on purpose: scikit-learn is no
dependency (the tests compare with it where it is installed). numpy only; queries/patterns.py re-exports
the names the rules use.
"""

from __future__ import annotations

import numpy as np

from .errors import InvalidArgumentError

CLASSES = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")


def confusion_matrix(true, predicted, classes=CLASSES) -> np.ndarray:
    """Counts (len(classes), len(classes)): rows the true class, columns the predicted one."""
    index = {c: i for i, c in enumerate(classes)}
    out = np.zeros((len(classes), len(classes)), dtype=np.int64)
    for t, p in zip(true, predicted):
        if t not in index or p not in index:
            raise InvalidArgumentError(f"unknown class {t if t not in index else p!r}; classes: {', '.join(classes)}")
        out[index[t], index[p]] += 1
    return out


def f1_scores(matrix: np.ndarray) -> dict[str, np.ndarray | float]:
    """Per-class precision, recall, F1 and support from a confusion matrix (rows true), and their averages.

    As scikit-learn with zero_division=0: a class never predicted has precision 0, one never
    true recall 0. `macro_f1` averages F1 over the classes that are true or predicted at least
    once (scikit-learn's default label set); `weighted_f1` weights by support; `accuracy`.
    """
    m = np.asarray(matrix, dtype=np.float64)
    tp = np.diag(m)
    predicted, support = m.sum(0), m.sum(1)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    recall = np.divide(tp, support, out=np.zeros_like(tp), where=support > 0)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(tp), where=total > 0)
    present = (predicted > 0) | (support > 0)
    n = m.sum()
    return dict(
        precision=precision,
        recall=recall,
        f1=f1,
        support=support.astype(np.int64),
        macro_f1=float(f1[present].mean()) if present.any() else 0.0,
        weighted_f1=float((f1 * support).sum() / n) if n else 0.0,
        accuracy=float(tp.sum() / n) if n else 0.0,
    )


def evaluate(true, predicted, classes=CLASSES) -> dict:
    """Confusion matrix and F1 scores of predicted against true labels."""
    matrix = confusion_matrix(true, predicted, classes)
    return dict(confusion=matrix, classes=tuple(classes), n=int(matrix.sum()), **f1_scores(matrix))


def stratified_split(labels, test_fraction: float = 0.25, seed: int = 0) -> np.ndarray:
    """Boolean mask of the held-out part: per class, round(n * test_fraction) items drawn with default_rng(seed).

    A class with at least two items keeps at least one on each side. Give labels in a fixed
    order (e.g. sorted by run, example, layer, head) for a split that does not depend on the database.
    """
    if not 0 < test_fraction < 1:
        raise InvalidArgumentError(f"test_fraction must be between 0 and 1, not {test_fraction}")
    labels = np.asarray(labels, dtype=object)
    rng = np.random.default_rng(seed)
    held_out = np.zeros(len(labels), dtype=bool)
    for cls in sorted(set(labels.tolist())):
        members = np.flatnonzero(labels == cls)
        k = int(round(len(members) * test_fraction))
        if len(members) >= 2:
            k = min(max(k, 1), len(members) - 1)
        held_out[rng.permutation(members)[:k]] = True
    return held_out


def _macro_f1_rows(true: np.ndarray, preds: np.ndarray, k: int) -> np.ndarray:
    """Macro-F1 (classes true or predicted) of each row of preds (m, n) against true (n,)."""
    m = preds.shape[0]
    cells = (true[None, :] * k + preds + (np.arange(m) * k * k)[:, None]).ravel()
    conf = np.bincount(cells, minlength=m * k * k).reshape(m, k, k).astype(np.float64)
    tp = np.diagonal(conf, axis1=1, axis2=2)
    predicted, support = conf.sum(1), conf.sum(2)
    denom = predicted + support
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)  # = 2PR/(P+R)
    present = denom > 0
    return (f1 * present).sum(1) / np.maximum(present.sum(1), 1)
