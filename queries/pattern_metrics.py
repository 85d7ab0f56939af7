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


def cohen_kappa(first, second, classes=CLASSES) -> float:
    """Cohen's kappa of two labellers' labels of the same maps: (p_o - p_e) / (1 - p_e), p_o the share of maps they
    agree on, p_e the agreement expected from their marginals. scikit-learn's cohen_kappa_score where it is installed,
    else the same arithmetic here (NaN where p_e is 1: both gave one and the same class throughout)."""
    first, second = list(first), list(second)
    if len(first) != len(second):
        raise InvalidArgumentError(f"kappa needs the same maps from both labellers: {len(first)} and {len(second)} labels")
    if not first:
        return float("nan")
    try:
        from sklearn.metrics import cohen_kappa_score
    except ImportError:
        return _kappa(confusion_matrix(first, second, classes))
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(cohen_kappa_score(first, second, labels=list(classes)))


def _kappa(matrix: np.ndarray) -> float:
    m = np.asarray(matrix, dtype=np.float64)
    n = m.sum()
    observed = np.trace(m) / n
    expected = float((m.sum(0) * m.sum(1)).sum() / n**2)
    return float("nan") if expected == 1 else float((observed - expected) / (1 - expected))


def corrected_shares(predicted: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Class shares (..., K) a classifier predicted, corrected by its confusion matrix (rows true, columns predicted):
    share of true class i = sum_j P(true i | predicted j) * predicted share j. A class never predicted in `matrix`
    keeps its predicted share (its column is taken as the identity)."""
    m = np.asarray(matrix, dtype=np.float64)
    column = m.sum(0)
    given = np.where(column > 0, m / np.where(column > 0, column, 1), np.eye(len(m)))  # P(true i | predicted j)
    return np.asarray(predicted, dtype=np.float64) @ given.T


def share_intervals(predicted: np.ndarray, matrix: np.ndarray, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Per-class uncertainty of class shares from a classifier's held-out confusion matrix: the held-out (true,
    predicted) pairs are resampled with replacement (default_rng(seed), n_boot times) and the predicted shares
    (T, K) corrected by each resample (`corrected_shares`). Returns corrected (T, K) from the matrix itself, and
    low, high (T, K): the central `level` interval of the resampled corrections."""
    m = np.asarray(matrix, dtype=np.int64)
    k = len(m)
    pairs = np.repeat(np.arange(k * k), m.ravel())
    if len(pairs) == 0:
        raise InvalidArgumentError("the confusion matrix is empty: no held-out maps to resample")
    rng = np.random.default_rng(seed)
    draws = np.empty((n_boot, *np.shape(predicted)))
    for b in range(n_boot):
        sample = np.bincount(rng.choice(pairs, size=len(pairs)), minlength=k * k).reshape(k, k)
        draws[b] = corrected_shares(predicted, sample)
    tail = (1 - level) / 2 * 100
    return dict(
        corrected=corrected_shares(predicted, m),
        low=np.percentile(draws, tail, axis=0),
        high=np.percentile(draws, 100 - tail, axis=0),
    )
