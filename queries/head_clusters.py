"""C9 (Clark et al. 2019, Sec. 6, Fig. 6): distances between heads and a 2-D map of them.

The distance between two heads is the sum, over every query token of the run, of the
Jensen-Shannon divergence (nats) between their attention distributions. The 2-D
embedding is classical (Torgerson) multidimensional scaling of that distance matrix;
Clark et al. used scikit-learn's iterative (SMACOF) MDS, which gives a similar layout
up to rotation and reflection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.records import RunInfo
from .common import iter_maps
from .registry import register

if TYPE_CHECKING:
    from ..store import Store


def xlogx_ratio(p: np.ndarray, log_p: np.ndarray, log_m: np.ndarray) -> np.ndarray:
    """p * (log p - log m) with 0 where p == 0."""
    with np.errstate(invalid="ignore"):
        return np.where(p > 0, p * (log_p - log_m), 0.0)


def js_distance_matrix(maps: np.ndarray) -> np.ndarray:
    """(heads, L, L) distributions -> (heads, heads) sums over query rows of the JS divergence."""
    p = maps.astype(np.float64)
    n = p.shape[0]
    with np.errstate(divide="ignore"):
        log_p = np.log(p)
    out = np.zeros((n, n))
    for a in range(n - 1):
        q, log_q = p[a + 1 :], log_p[a + 1 :]
        m = 0.5 * (p[a] + q)
        with np.errstate(divide="ignore"):
            log_m = np.log(m)
        js = 0.5 * (xlogx_ratio(p[a], log_p[a], log_m) + xlogx_ratio(q, log_q, log_m)).sum(axis=(1, 2))
        out[a, a + 1 :] = out[a + 1 :, a] = js
    return out


def classical_mds(distances: np.ndarray, dims: int = 2) -> np.ndarray:
    """Torgerson MDS: coordinates whose Euclidean distances approximate `distances`."""
    n = distances.shape[0]
    centre = np.eye(n) - np.ones((n, n)) / n
    gram = -0.5 * centre @ (distances**2) @ centre
    values, vectors = np.linalg.eigh(gram)
    top = np.argsort(values)[::-1][:dims]
    return vectors[:, top] * np.sqrt(np.clip(values[top], 0, None))


def head_distance_sum(store: Store, run, examples=None) -> tuple[RunInfo, np.ndarray, int]:
    info = store.run_info(run)
    total = np.zeros((info.n_layers * info.n_heads,) * 2)
    n_tokens = 0
    for _, maps in iter_maps(store, info, examples):
        total += js_distance_matrix(maps.reshape(-1, *maps.shape[2:]))
        n_tokens += maps.shape[-1]
    return info, total, n_tokens


@register("head_distances", per_head=False)
def head_distances(store: Store, *, run, examples=None) -> pd.DataFrame:
    """Distance between every pair of heads: summed Jensen-Shannon divergence of their attention.

    Columns: layer_a, head_a, layer_b, head_b, distance (sum over all query tokens, nats),
    mean_distance (per query token). One row per ordered pair, including a head with itself (0).
    """
    info, total, n_tokens = head_distance_sum(store, run, examples)
    n = info.n_layers * info.n_heads
    a, b = (grid.ravel() for grid in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
    return pd.DataFrame(
        {
            "layer_a": a // info.n_heads,
            "head_a": a % info.n_heads,
            "layer_b": b // info.n_heads,
            "head_b": b % info.n_heads,
            "distance": total.ravel(),
            "mean_distance": total.ravel() / max(n_tokens, 1),
        }
    )


@register("head_clusters")
def head_clusters(store: Store, *, run, examples=None) -> pd.DataFrame:
    """2-D multidimensional scaling of the heads by summed Jensen-Shannon distance (Fig. 6).

    Columns: layer, head, x, y (coordinates; only relative positions mean anything).
    """
    info, total, _ = head_distance_sum(store, run, examples)
    xy = classical_mds(total)
    n = info.n_layers * info.n_heads
    return pd.DataFrame({"layer": np.arange(n) // info.n_heads, "head": np.arange(n) % info.n_heads, "x": xy[:, 0], "y": xy[:, 1]})
