"""C9 (Clark et al. 2019, Sec. 6, Fig. 6): distances between heads and a 2-D map of them.

The distance between two heads is the sum, over every query token of the run, of the
Jensen-Shannon divergence (nats) between their attention distributions, each first smoothed
towards uniform as the authors' head_distances.py does (p' = s / L + (1 - s) p with s = 0.001;
`smoothing=0` for the raw maps; docs/QUERIES.md gives the size of the difference). The 2-D
embedding is classical (Torgerson) multidimensional scaling of that distance matrix;
Clark et al. used scikit-learn's iterative (SMACOF) MDS, which gives a similar layout
up to rotation and reflection.

Each example's sums for every pair of heads (and its number of query tokens) are the `head_js`
summary (queries/engine/), kept with the run, so only the first query on a run decodes its
maps; they are added in storage order in float64.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.records import RunInfo
from .engine import MAP_SOURCES, SummaryKind, register, register_kind, summary_totals
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..store import Store

BLOCK_BYTES = 1 << 19  # head pairs handled at once: a few (pairs, L, L) float64 buffers of about this size, in cache
PARALLEL_CELLS = 1 << 22  # head pairs x L x L from which the pairs are shared among threads
MAX_THREADS = 8
TINY = 1e-300  # stands for 0.5 * 0 in m; below half an ulp of any value > 1e-284 (any float16 or float32 one)


def default_threads(work: int) -> int:
    """Threads for `work` (pairs x L x L) cells: the usable cores (at most MAX_THREADS) in the main thread, else 1.

    A Dask worker (queries/engine/passes.py) runs its tasks outside the main thread, one worker per core: it gets 1.
    """
    if work < PARALLEL_CELLS or threading.current_thread() is not threading.main_thread():
        return 1
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    return max(1, min(cores, MAX_THREADS))


def pair_offset(a: int, b: int, n: int) -> int:
    """Index of head pair (a, b), a < b, in the upper-triangle order of np.triu_indices(n, 1)."""
    return a * n - a * (a + 1) // 2 + (b - a - 1)


# Hand-written on purpose: scipy's jensenshannon is one pair at a time (and sqrt'd); this sums all pairs bit-identically.
def js_upper(maps: np.ndarray, *, threads: int | None = None, block_bytes: int = BLOCK_BYTES) -> np.ndarray:
    """(heads, L, L) distributions -> the sums over query rows of the JS divergence of every pair of heads a < b,
    as a 1-D float64 array in np.triu_indices(heads, 1) order.

    Each cell gives the textbook form's value, 0.5 * [p (log p - log m) + q (log q - log m)] with m = (p + q) / 2
    and 0 log 0 = 0, rounded as the one-pair-at-a-time loop rounds it, and each pair's cells are summed the same way:
    the values are the same to the last bit whatever `threads` and `block_bytes` are (tests/queries/
    test_head_clusters.py). The pairs of one head are done a block at a time in reused buffers (no large temporaries;
    the log of m is most of the cost) and the blocks are shared among threads.
    """
    p = np.ascontiguousarray(maps, dtype=np.float64)
    n, length = p.shape[0], p.shape[-1]
    out = np.zeros(n * (n - 1) // 2)
    if n < 2:
        return out
    zero = p == 0
    with np.errstate(divide="ignore"):
        log_p = np.log(p)
    log_p[zero] = 0.0  # so p * (log p - log m) is 0 where p == 0, log m being finite:
    half = 0.5 * p  # m = 0.5 * p + 0.5 * q, which is 0.5 * (p + q) exactly (a power of 2) ...
    half[zero] = TINY  # ... where p or q > 0 (adding TINY changes nothing), and 2 * TINY, not 0, where both are 0
    del zero
    cells = length * length
    k = max(1, block_bytes // (8 * max(cells, 1)))
    blocks = [(a, s, min(n, s + k)) for a in range(n - 1) for s in range(a + 1, n, k)]

    def work(mine: list[tuple[int, int, int]]) -> None:
        m_buf, x_buf, y_buf = (np.empty((min(k, n - 1), length, length)) for _ in range(3))
        for a, s, e in mine:
            r = e - s
            m, x, y = m_buf[:r], x_buf[:r], y_buf[:r]
            q, log_q = p[s:e], log_p[s:e]
            np.add(half[a], half[s:e], out=m)
            np.log(m, out=m)
            np.subtract(log_p[a], m, out=x)
            np.multiply(x, p[a], out=x)
            np.subtract(log_q, m, out=y)
            np.multiply(y, q, out=y)
            np.add(x, y, out=x)
            start = pair_offset(a, s, n)
            out[start : start + r] = 0.5 * x.sum(axis=(1, 2))

    threads = default_threads(len(out) * cells) if threads is None else max(1, threads)
    threads = min(threads, len(blocks))
    if threads == 1:
        work(blocks)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, [blocks[i::threads] for i in range(threads)]))
    return out


def square(upper: np.ndarray, n: int) -> np.ndarray:
    """The symmetric (n, n) matrix with zero diagonal whose upper triangle is `upper` (np.triu_indices(n, 1) order)."""
    out = np.zeros((n, n))
    rows, cols = np.triu_indices(n, 1)
    out[rows, cols] = upper
    out[cols, rows] = upper
    return out


def js_distance_matrix(maps: np.ndarray, *, threads: int | None = None) -> np.ndarray:
    """(heads, L, L) distributions -> (heads, heads) sums over query rows of the JS divergence."""
    return square(js_upper(maps, threads=threads), maps.shape[0])


# Clark et al.'s head_distances.py mixes each map with the uniform distribution before the divergences:
# 0.001 / L + 0.999 * attention (L keys), so no probability is 0.
SMOOTHING = 0.001


def check_smoothing(smoothing: float) -> float:
    if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0 <= smoothing < 1:
        raise InvalidArgumentError(f"smoothing={smoothing!r}: give a number from 0 (the raw maps) up to but not 1; the authors' is 0.001")
    return float(smoothing)


def smoothed(maps: np.ndarray, smoothing: float) -> np.ndarray:
    """(..., L, L) maps mixed with the uniform distribution over the L keys: s / L + (1 - s) a, in float64."""
    maps = np.asarray(maps, dtype=np.float64)
    return maps if smoothing == 0 else smoothing / maps.shape[-1] + (1 - smoothing) * maps


def _head_js_prepare(store: Store, info: RunInfo, examples=None, smoothing: float = SMOOTHING) -> float:
    return smoothing


def _head_js_reduce(smoothing: float, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    """One example's JS sums of every pair of heads (layer-major, upper triangle) and its number of query tokens."""
    heads = smoothed(maps.reshape(-1, *maps.shape[2:]), smoothing)
    return {"js": js_upper(heads), "length": np.asarray(maps.shape[-1], np.int64)}


def _head_js_totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A range's reduction, what `head_distances` adds: the JS sums over its examples, and the query tokens. At 8 M
    examples the per-example rows are ~660 GB (10,296 float64 each for 144 heads); the ranges ~160 MB."""
    return {"js": part["js"].sum(0), "length": part["length"].sum(dtype=np.int64)}


# js: (example, n_pairs) float64, pair (a, b) with a < b over layer * n_heads + head in np.triu_indices order.
# version 2: the maps are smoothed first (the authors'), by default
HEAD_JS = register_kind(
    SummaryKind("head_js", 2, _head_js_prepare, _head_js_reduce, defaults={"smoothing": SMOOTHING}, totals=_head_js_totals, threads=True)
)


# Hand-written around np.linalg.eigh on purpose: scikit-learn is no dependency, and its MDS is iterative SMACOF, not classical.
def classical_mds(distances: np.ndarray, dims: int = 2) -> np.ndarray:
    """Torgerson MDS: coordinates whose Euclidean distances approximate `distances`."""
    n = distances.shape[0]
    centre = np.eye(n) - np.ones((n, n)) / n
    gram = -0.5 * centre @ (distances**2) @ centre
    values, vectors = np.linalg.eigh(gram)
    top = np.argsort(values)[::-1][:dims]
    return vectors[:, top] * np.sqrt(np.clip(values[top], 0, None))


def head_distance_sum(store: Store, run, smoothing: float = SMOOTHING) -> tuple[RunInfo, np.ndarray, int]:
    """(run, summed JS matrix of every pair of heads, number of query tokens) over the asked-for examples."""
    smoothing = check_smoothing(smoothing)
    info = store.run_info(run)
    n = info.n_layers * info.n_heads
    # per-example sums kept with the run (queries/engine/); the whole run adds their kept range reductions
    totals = summary_totals(store, info, HEAD_JS, smoothing=smoothing)
    return info, square(totals["js"], n), int(totals["length"])


@register("head_distances", per_head=False, sources=MAP_SOURCES)
def head_distances(store: Store, *, run, smoothing: float = SMOOTHING) -> pd.DataFrame:
    """Distance between every pair of heads: summed Jensen-Shannon divergence of their attention.

    Columns: layer_a, head_a, layer_b, head_b, distance (sum over all query tokens, nats),
    mean_distance (per query token). One row per ordered pair, including a head with itself (0).
    smoothing: each map is first mixed with the uniform distribution, s / L + (1 - s) a, as the
      authors' code does (default 0.001); 0 compares the raw maps.
    Each example's sums are kept with the run (summary head_js): only the first call decodes the maps.
    """
    info, total, n_tokens = head_distance_sum(store, run, smoothing)
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


@register("head_clusters", sources=MAP_SOURCES)
def head_clusters(store: Store, *, run, smoothing: float = SMOOTHING) -> pd.DataFrame:
    """2-D multidimensional scaling of the heads by summed Jensen-Shannon distance (Fig. 6).

    Columns: layer, head, x, y (coordinates; only relative positions mean anything).
    smoothing: as in head_distances (default 0.001, the authors'; 0 for the raw maps).
    """
    info, total, _ = head_distance_sum(store, run, smoothing)
    xy = classical_mds(total)
    n = info.n_layers * info.n_heads
    return pd.DataFrame({"layer": np.arange(n) // info.n_heads, "head": np.arange(n) % info.n_heads, "x": xy[:, 0], "y": xy[:, 1]})
