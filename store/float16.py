"""float16 maps to float32 numbers by table: a float16 has 65,536 values, so any function of one value is a lookup.

numpy's float16 -> float32 cast runs at ~5 ns a cell on this project's machines (numpy 2.4, no F16C path used), a
lookup in a 256 KiB table (`np.take(..., mode="wrap")`, unbuffered: uint16 indices are always in range, so "wrap"
and "clip" take the same entries; "wrap" measured 1.1-1.25 ns a cell against 1.3-2.2 for "clip", and 0.7-0.9 against
0.9-1.3 with two threads looking up at once; docs/PERFORMANCE.md, 2026-11-27) at ~1.1:
`as_float32` is that cast, equal bit for bit (every float16 is a float32). `plogp` is the summand of a row's entropy,
p log p, computed once per float16 value by the same float32 arithmetic `queries.clark.row_entropy` uses on maps cast
to float32, so a sum of its values is that of the computed ones bit for bit (tests/store/test_float16.py), at ~1.1 ns
a cell against ~9 (`python benchmarks/reduce.py --home H --run RUN --kinds clark`; docs/PERFORMANCE.md, 2026-11-27 "the
first whole-run pass by table lookups")."""

from __future__ import annotations

import threading
from functools import cache

import numpy as np

TINY = np.finfo(np.float32).tiny  # 0 is raised to it before the log: 0 x log(tiny) = 0, so 0 log 0 = 0


@cache
def _tables() -> tuple[np.ndarray, np.ndarray]:
    """(each float16's float32 value, its p log p in float32), indexed by the float16's bits."""
    values = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and inf bit patterns: NaN / inf, as when computed
        plogp = np.maximum(values, TINY)
        np.log(plogp, out=plogp)
        plogp *= values
    values.flags.writeable = plogp.flags.writeable = False
    return values, plogp


def value_table() -> np.ndarray:
    """(65,536,) float32: each float16's value, indexed by its bits (read only), for the compiled reduces (queries/engine/kernels.py)."""
    return _tables()[0]


@cache
def value_plogp_table() -> np.ndarray:
    """(65,536, 2) float32: each float16's value and its p log p side by side, indexed by its bits, for a compiled
    reduce that wants both numbers of a cell from one cache line (queries/_clark.c)."""
    values, logs = _tables()
    table = np.ascontiguousarray(np.stack([values, logs], axis=1))
    table.flags.writeable = False
    return table


# Cells looked up per `np.take` call. np.take first converts its indices to a fresh intp array (8 bytes a cell), and a
# whole example's (~1.4 MB for an MRPC pair) lay above the 1 MiB mmap threshold that `store.heap.for_reading` sets for
# the CLI's commands (`attnstore serve` with one worker too): an mmap, its page faults and a munmap per lookup, 2.2 ns
# a cell instead of 0.9 (docs/PERFORMANCE.md, 2026-11-28 "the CLI's heap and the reduces' temporaries"). Here the
# indices are converted into a buffer each thread keeps (LOOKUP_BLOCK cells: 2 MiB), so np.take allocates nothing.
LOOKUP_BLOCK = 1 << 18
_INDICES = threading.local()


def _indices(n: int) -> np.ndarray:
    buf = getattr(_INDICES, "buf", None)
    if buf is None or buf.size < n:
        buf = _INDICES.buf = np.empty(n, np.intp)
    return buf[:n]


def _lookup(table: np.ndarray, maps: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if maps.dtype != np.float16:
        raise TypeError(f"a float16 table looks up float16 values, not {maps.dtype}")
    codes = maps.view(np.uint16)
    if out is None:
        out = np.empty(maps.shape, np.float32)
    if out.shape != maps.shape or not (codes.flags.c_contiguous and out.flags.c_contiguous):
        return np.take(table, codes, out=out, mode="wrap")  # strided (np.take checks `out`'s shape)
    flat_codes, flat_out = codes.reshape(-1), out.reshape(-1)  # views: both are contiguous
    indices = _indices(min(flat_codes.size, LOOKUP_BLOCK))
    for start in range(0, flat_codes.size, LOOKUP_BLOCK):
        part = flat_codes[start : start + LOOKUP_BLOCK]
        np.copyto(indices[: part.size], part)
        np.take(table, indices[: part.size], out=flat_out[start : start + part.size], mode="wrap")
    return out


def as_float32(maps: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float16 `maps` as float32 (into `out`, of their shape, if given); other dtypes cast by numpy."""
    if maps.dtype != np.float16:
        if out is None:
            return maps.astype(np.float32)
        np.copyto(out, maps)
        return out
    return _lookup(_tables()[0], maps, out)


def plogp(maps: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """p log p of every float16 value p, in float32 (0 log 0 = 0; into `out` if given)."""
    return _lookup(_tables()[1], maps, out)
