"""One example's Clark sums (the `clark` summary kind, queries/summary.py), by the compiled reduce in queries/_clark.c.

The reduce reads each cell once: its float32 value and p log p looked up together for float16 maps (store/float16.py
`value_plogp_table`), and every field summed in double, without the GIL, so the reduce threads of a pass share the
cores. numpy needed five passes and two lookups a cell (~3.4 ns a cell on one thread; `python benchmarks/reduce.py
--home H --run MRPC-dev --kinds clark`, docs/PERFORMANCE.md, 2026-11-28 "the heaviest reduces compiled"). float32 maps
(stores written with --dtype float32, maps built by hand) have their p log p computed by numpy first,
with `row_entropy`'s float32 arithmetic, and go through the same loop.
"""

from __future__ import annotations

import numpy as np

from ..store.float16 import TINY, value_plogp_table
from .kernels import kernel

KEY_CLS, KEY_SEP, KEY_PUNCT = 1, 2, 4  # a key token's bits (queries/_clark.c KEY_*)

CLARK_FIELDS = (
    *("to_previous", "to_self", "to_next"),
    *(f"received_{k}" for k in ("cls", "sep", "punct", "other")),
    *("sep_from_sep", "sep_from_other", "entropy", "entropy_from_cls"),
)


def example_sums(maps: np.ndarray, cls: np.ndarray, sep: np.ndarray, punct: np.ndarray) -> dict[str, np.ndarray]:
    """One example's (layer, head) sums over its query tokens, as `relative_position`, `special_tokens` and `entropy`
    use them: maps (layer, head, query, key); cls / sep / punct: boolean masks of the keys. Each field is float64 of
    shape (layer, head), summed over the example's query tokens (`received_*` over its keys of that kind as well;
    `received_other` over keys of none of the three; `sep_from_*` over separator / other query tokens)."""
    n_layers, n_heads, length = maps.shape[0], maps.shape[1], maps.shape[-1]
    keys = (np.asarray(cls, np.uint8) * KEY_CLS) | (np.asarray(sep, np.uint8) * KEY_SEP)
    keys |= np.asarray(punct, np.uint8) * KEY_PUNCT
    out = np.empty((len(CLARK_FIELDS), n_layers, n_heads), np.float64)
    n_maps = n_layers * n_heads
    if maps.dtype == np.float16:
        codes = np.ascontiguousarray(maps).view(np.uint16)
        kernel("_clark").sums(codes, n_maps, length, keys, value_plogp_table(), out, True)
    else:
        values = np.ascontiguousarray(maps, dtype=np.float32)
        logs = np.maximum(values, TINY)  # row_entropy's float32 p log p (queries/summary.py), 0 log 0 = 0
        np.log(logs, out=logs)
        logs *= values
        kernel("_clark").sums(values, n_maps, length, keys, logs, out, False)
    return dict(zip(CLARK_FIELDS, out, strict=True))
