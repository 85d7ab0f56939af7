"""The Q/K tier: a run that keeps, instead of its maps, each layer's post-RoPE queries and keys and each row's
log-sum-exp, and rebuilds any block of the maps on read.

For example e (tokens t0 .. t0+L-1 in storage order), layer l, query head h with key/value head g = h // (H / H_kv):

    A[l, h, i, j] = exp(q[t0+i, l, h] . k[t0+j, l, g] * scale[l] - lse[t0+i, l, h])   for j <= i (and i - j < window[l])
    A[l, h, i, j] = 0                                                                  otherwise

with three per-token arrays in the run's group, tokens in storage order as token_id's:

    qk_query (token, layer, head, dim)      the stored dtype (float16 by default, or float32)
    qk_key   (token, layer, kv_head, dim)   the stored dtype
    qk_lse   (token, layer, head)           float32, computed at ingest from the stored (rounded) Q/K, so rows sum to 1

Each array's attributes say this too, so plain zarr/xarray can rebuild maps without attnstore. Bytes per token per
layer: (H + H_kv) d s + 4 H (s: bytes of the stored dtype) against H L 2 for dense float16 maps: the tier is smaller
above L = (H + H_kv) d s / (2 H) + 2 tokens, before compression (docs/DECODERS.md measures it after).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any

import numpy as np
import zarr

from . import arrays

QK_FLAG = "qk"  # the run manifest's entry of a Q/K run: what qk_entry returns
QUERY, KEY, LSE = "qk_query", "qk_key", "qk_lse"
DTYPES = ("float16", "float32")
CHUNK_TOKENS = 512  # one chunk: 512 tokens of one layer (SmolLM2: 9 x 64 float16 = 576 KiB of queries)
FORMULA = (
    "A[l, h, i, j] = exp(qk_query[t0+i, l, h] . qk_key[t0+j, l, h // (n_heads / n_kv_heads)] * scale[l] - qk_lse[t0+i, l, h]) "
    "for j <= i and i - j < window[l] (no window: null), else 0; t0: the example's first token in storage order "
    "(the run's token_start index array)"
)


def qk_entry(*, dtype: str, n_kv_heads: int, head_dim: int, scales: list[float], windows: list[int | None]) -> dict:
    """The run manifest's `qk` entry: everything a rebuild needs besides the arrays."""
    if dtype not in DTYPES:
        raise ValueError(f"Q/K dtype must be one of {DTYPES}, not {dtype!r}")
    return {
        "dtype": dtype,
        "n_kv_heads": int(n_kv_heads),
        "head_dim": int(head_dim),
        "scale": [float(s) for s in scales],
        "window": [None if w is None else int(w) for w in windows],
        "arrays": {"query": QUERY, "key": KEY, "lse": LSE},
        "formula": FORMULA,
    }


def create_arrays(root: str, cells_path: str, n_layers: int, n_heads: int, entry: dict) -> None:
    """The three empty per-token arrays of a Q/K run, chunked by CHUNK_TOKENS tokens and one layer."""
    store = arrays.open_root(root, read_only=False)
    group = arrays.group_path_of(cells_path)
    kv, dim, dtype = entry["n_kv_heads"], entry["head_dim"], entry["dtype"]
    described = {"formula": FORMULA, "scale": entry["scale"], "window": entry["window"]}
    for name, trailing, array_dtype, dims in (
        (QUERY, (n_layers, n_heads, dim), dtype, ("token", "layer", "head", "dim")),
        (KEY, (n_layers, kv, dim), dtype, ("token", "layer", "kv_head", "dim")),
        (LSE, (n_layers, n_heads), "float32", ("token", "layer", "head")),
    ):
        zarr.create_array(
            store=store,
            name=f"{group}/{name}",
            shape=(0, *trailing),
            chunks=(CHUNK_TOKENS, 1, *trailing[1:]),
            dtype=array_dtype,
            compressors=arrays.make_codec(arrays.INDEX_CODEC, array_dtype),
            fill_value=0,
            config=arrays.ARRAY_CONFIG,
            dimension_names=dims,
            attributes=described,
            overwrite=True,
        )


def open_arrays(root: str, array_path: str, read_only: bool = True) -> tuple[arrays.TokenArray, arrays.TokenArray, arrays.TokenArray]:
    return tuple(arrays.TokenArray(root, array_path, name, read_only=read_only) for name in (QUERY, KEY, LSE))  # type: ignore[return-value]


def stored_bytes(n_tokens: int, n_layers: int, n_heads: int, entry: dict) -> int:
    """Raw (uncompressed) bytes the tier keeps for `n_tokens` tokens."""
    width = np.dtype(entry["dtype"]).itemsize
    return n_tokens * n_layers * ((n_heads + entry["n_kv_heads"]) * entry["head_dim"] * width + 4 * n_heads)


REBUILD_ROWS = 256  # query rows rebuilt at once per head: 256 x 8,192 float32 = 8 MiB


class _OneBlasThread:
    """numpy's BLAS (OpenBLAS) on one thread while any rebuild runs its heads on every core, restored when the last
    ends: BLAS's own threads beside the heads' spin for the same cores (the first whole-run `entropy` over a 2,048-token
    Q/K run: 15.0 CPU s and 9.4 s wall with them, 8.3 CPU s and 7.0 s on one thread, `python benchmarks/decoder_capture.py`,
    docs/PERFORMANCE.md 2026-11-30 (late)). Counted, so that rebuilds in several threads at once (the query engine's
    reduce threads) leave the setting as they found it."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._inside = 0
        self._limit: Any = None

    def __enter__(self) -> None:
        with self._lock:
            if self._inside == 0:
                from threadpoolctl import threadpool_limits

                with self._controlling():
                    self._limit = threadpool_limits(limits=1, user_api="blas")
            self._inside += 1

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                with self._controlling():
                    self._limit.restore_original_limits()
                self._limit = None

    @staticmethod
    @contextmanager
    def _controlling():
        """This thread sets OpenBLAS's process-wide pool: threadpoolctl lets only the first thread that set it set it
        again (others do nothing), and the rebuild that ends last may run in another thread than the first."""
        from threadpoolctl import OpenBLASController

        OpenBLASController.clear_controlling_thread(force=True)
        try:
            yield
        finally:
            OpenBLASController.clear_controlling_thread()


_one_blas_thread = _OneBlasThread()


def rebuild(
    q: np.ndarray,
    k: np.ndarray,
    lse: np.ndarray,
    entry: dict,
    layers: list[int],
    heads: list[int],
    rows: range | None = None,
    n_keys: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Maps (layer, head, row, key) float32 of one example from its slices of the three arrays, for `layers` x `heads`
    and query rows `rows` (default all): q and lse hold those rows ((rows, layer, head, d), (rows, layer, head)), k the
    example's keys up to the last row ((keys, layer, kv_head, d)); `n_keys`: the example's length (the result's last
    axis; default the keys given); `out`: a float32 buffer of the result's shape to rebuild into (default a new one).
    A causal row sees no key past itself, so keys past the last row are never read."""
    rows = rows if rows is not None else range(q.shape[0])
    n_keys = n_keys if n_keys is not None else k.shape[0]
    keys = rows.stop
    group = q.shape[2] // k.shape[2]
    d = q.shape[-1]
    reused = out is not None  # its cells outside each block's keys are zeroed here (a new buffer's are zero already)
    if out is None:
        out = np.zeros((len(layers), len(heads), len(rows), n_keys), dtype=np.float32)
    elif out.shape != (len(layers), len(heads), len(rows), n_keys) or out.dtype != np.float32:
        raise ValueError(f"out: float32 of shape {(len(layers), len(heads), len(rows), n_keys)} expected, not {out.dtype} {out.shape}")
    jobs = []
    for a, layer in enumerate(layers):
        # each key/value head's keys as float32 once per layer, not once per query head reading them (GQA: 3x here),
        # with a row of ones: logit * scale - lse is then one matmul of the scaled queries and a -lse column
        kv = {}
        for g in {h // group for h in heads}:
            kv[g] = np.ones((d + 1, keys), dtype=np.float32)
            kv[g][:d] = k[:keys, layer, g].T
        jobs += [(a, b, layer, head, kv[head // group]) for b, head in enumerate(heads)]

    def one(job) -> None:
        a, b, layer, head, keys_t = job
        window, scale = entry["window"][layer], np.float32(entry["scale"][layer])
        queries = np.empty((len(rows), d + 1), dtype=np.float32)
        queries[:, :d] = q[:, layer, head]
        queries[:, :d] *= scale
        queries[:, d] = -lse[:, layer, head]
        # Row blocks, each against the keys its rows may see only (a causal block's rows see none past its last row; a
        # window's, none before its first row's window): about half the products and exponentials of whole rows, and
        # the mask is a block's corner (`python benchmarks/decoder_capture.py`, "entropy over the Q/K run").
        for r0 in range(0, len(rows), REBUILD_ROWS):
            r1 = min(r0 + REBUILD_ROWS, len(rows))
            first, last = rows.start + r0, rows.start + r1
            lo = 0 if window is None else max(0, first - window + 1)
            if reused:
                out[a, b, r0:r1, :lo] = 0
                out[a, b, r0:r1, last:] = 0
            logits = out[a, b, r0:r1, lo:last]
            np.matmul(queries[r0:r1], keys_t[:, lo:last], out=logits)
            i = np.arange(first, last)[:, None]
            j = np.arange(lo, last)[None, :]
            if window is None:  # only the block's last r1 - r0 keys can lie past a row
                corner = logits[:, first - lo :]
                corner[j[:, first - lo :] > i] = -np.inf
            else:
                logits[(j > i) | (i - j >= window)] = -np.inf
            np.exp(logits, out=logits)  # exp(-inf) = 0: what a row does not see; keys outside the block stay 0

    # numpy's matmul and exp release the GIL: the heads on every core
    workers = min(len(jobs), os.cpu_count() or 1)
    if workers > 1:
        from concurrent.futures import ThreadPoolExecutor

        with _one_blas_thread, ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, jobs))
    else:
        for job in jobs:
            one(job)
    return out


class LayerMaps:
    """One example's maps (layer, head, row, key), rebuilt from its queries, keys and log-sum-exps a layer at a time
    (`layer(i)`), for reduces that go layer by layer: the whole example's maps are never held (4.5 GiB for SmolLM2 at
    2,048 tokens, where a layer is 151 MiB), and every layer is rebuilt into one buffer. `np.asarray` rebuilds them
    all. q, k and lse hold the example's tokens ((tokens, layer, head, d), (tokens, layer, kv_head, d), (tokens,
    layer, head))."""

    def __init__(self, q: np.ndarray, k: np.ndarray, lse: np.ndarray, entry: dict):
        self._q, self._k, self._lse, self._entry = q, k, lse, entry
        length, n_layers, n_heads = lse.shape
        self.shape = (n_layers, n_heads, length, length)
        self.ndim = 4
        self.size = n_layers * n_heads * length * length
        self.dtype = np.dtype(np.float32)
        self._buffer: np.ndarray | None = None

    def layer(self, index: int) -> np.ndarray:
        """Layer `index`'s maps (head, row, key) float32, in a buffer the next call rebuilds into."""
        if self._buffer is None:
            self._buffer = np.empty((1, *self.shape[1:]), np.float32)
        heads = list(range(self.shape[1]))
        return rebuild(self._q, self._k, self._lse, self._entry, [index], heads, out=self._buffer)[0]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        maps = rebuild(self._q, self._k, self._lse, self._entry, list(range(self.shape[0])), list(range(self.shape[1])))
        return maps if dtype is None else maps.astype(dtype, copy=False)


def describe(entry: dict[str, Any]) -> str:
    return f"Q/K tier ({entry['dtype']} queries and keys, {entry['n_kv_heads']} key/value heads of {entry['head_dim']})"


# Rows of logits at once: 128 x 8,192 float32 = 4 MiB, which the allocator hands back to the next chunk where 32 MiB
# (1,024 rows) came from fresh pages each time: an 8,192-token map pooled by 8 took 61-82 ms against 82-221
# (docs/PERFORMANCE.md, 2026-11-29 (late); the page's own time: `pytest tests/api/test_long_map_browser.py -s`).
POOL_CHUNK_ROWS = 128


def max_pool(values: np.ndarray, factor: int, fill: float = 0.0) -> np.ndarray:
    """(rows, keys) -> (ceil(rows / factor), ceil(keys / factor)): the maximum of each factor x factor block, the part
    past the edges taken as `fill`."""
    if factor == 1:
        return values
    n_rows, n_cols = -(-values.shape[0] // factor), -(-values.shape[1] // factor)
    if values.shape != (n_rows * factor, n_cols * factor):
        padded = np.full((n_rows * factor, n_cols * factor), fill, dtype=values.dtype)
        padded[: values.shape[0], : values.shape[1]] = values
        values = padded
    # Elementwise maxima of whole slices, rows then keys: numpy's .max over a short inner axis of a reshaped view was 16x
    # slower (48 ms against 2.9 for 1,024 x 8,192 by 8) and most of a long map's first overview
    # (`pytest tests/api/test_long_map_browser.py -s`).
    blocks = values.reshape(n_rows, factor, n_cols * factor)
    rows = blocks[:, 0].copy()
    for i in range(1, factor):
        np.maximum(rows, blocks[:, i], out=rows)
    keys = rows.reshape(n_rows, n_cols, factor)
    pooled = keys[..., 0].copy()
    for i in range(1, factor):
        np.maximum(pooled, keys[..., i], out=pooled)
    return pooled


def rebuild_pooled(
    q: np.ndarray, k: np.ndarray, lse: np.ndarray, entry: dict, layer: int, head: int, rows: range, n_keys: int, factor: int
) -> np.ndarray:
    """One head's map over query rows `rows` max-pooled by `factor` over rows and keys, (ceil(len(rows) / factor),
    ceil(n_keys / factor)) float32, as `max_pool(rebuild(...))` gives it, without the map: the weight exp(logit - lse)
    grows with the logit, so a block's largest weight is exp of its largest logit - lse, and only the pooled values are
    exponentiated (`rows` starts on a multiple of `factor`; q and lse hold those rows, k the keys up to the last one).
    What a row does not see is -inf: masked only in the blocks the diagonal or the layer's window crosses."""
    group = q.shape[2] // k.shape[2]
    window = entry["window"][layer]
    scale = np.float32(entry["scale"][layer])
    # logit * scale - lse as one matmul: the queries scaled, with -lse as one more column against a row of ones
    keys_t = np.ones((k.shape[-1] + 1, rows.stop), dtype=np.float32)
    keys_t[:-1] = k[: rows.stop, layer, head // group].T
    queries = np.empty((len(rows), q.shape[-1] + 1), dtype=np.float32)
    queries[:, :-1] = q[:, layer, head]
    queries[:, :-1] *= scale
    queries[:, -1] = -lse[:, layer, head]
    n_cols = -(-n_keys // factor)
    pooled = np.full((-(-len(rows) // factor), n_cols), -np.inf, dtype=np.float32)
    chunk = max(factor, POOL_CHUNK_ROWS // factor * factor)

    def pool_chunk(a: int) -> None:
        b = min(len(rows), a + chunk)
        first, last = rows.start + a, rows.start + b  # the example's rows; they see keys up to `last` only
        width = -(-last // factor) * factor
        logits = np.empty((-(-(b - a) // factor) * factor, width), dtype=np.float32)
        logits[b - a :] = -np.inf  # the padding past the last row and past the last key
        logits[:, last:] = -np.inf
        block = logits[: b - a, :last]
        np.matmul(queries[a:b], keys_t[:, :last], out=block)
        i = np.arange(first, last)[:, None]
        if window is None:
            corner = block[:, first:last]  # the only keys a row of the chunk may not see: those past it
            corner[np.arange(first, last)[None, :] > i] = -np.inf
        else:
            block[(np.arange(last)[None, :] > i) | (i - np.arange(last)[None, :] >= window)] = -np.inf
        pooled[a // factor : a // factor + len(logits) // factor, : width // factor] = max_pool(logits, factor)

    starts = range(0, len(rows), chunk)
    if len(starts) > 1:  # numpy's matmul and reductions release the GIL: the chunks on every core
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(len(starts), os.cpu_count() or 1)) as pool:
            list(pool.map(pool_chunk, starts))
    else:
        pool_chunk(0)
    return np.exp(pooled, out=pooled)
