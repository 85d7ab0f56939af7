"""store/float16.py: the float16 lookups equal numpy's cast and row_entropy's float32 arithmetic bit for bit."""

import tracemalloc

import numpy as np
import pytest

from attnstore.queries.clark import row_entropy
from attnstore.store.float16 import LOOKUP_BLOCK, _tables, as_float32, plogp

EVERY_FLOAT16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)


def computed_plogp(values: np.ndarray) -> np.ndarray:
    """row_entropy's summand as computed on float16 values cast to float32 (its arithmetic before the tables)."""
    m = values.astype(np.float32)
    logs = np.maximum(m, np.finfo(np.float32).tiny)
    with np.errstate(invalid="ignore", over="ignore"):
        np.log(logs, out=logs)
        logs *= m
    return logs


def random_maps(rng, shape) -> np.ndarray:
    maps = rng.random(shape, dtype=np.float32) ** 4
    if shape[-1] > 1:
        maps[..., 0] = 0  # exact zeros: 0 log 0 = 0
    return (maps / maps.sum(-1, keepdims=True)).astype(np.float16)


def test_every_float16_value_casts_as_numpy_casts_it():
    assert as_float32(EVERY_FLOAT16).dtype == np.float32
    np.testing.assert_array_equal(as_float32(EVERY_FLOAT16), EVERY_FLOAT16.astype(np.float32))
    out = np.empty((1 << 16,), np.float32)
    assert as_float32(EVERY_FLOAT16, out=out) is out
    np.testing.assert_array_equal(out, EVERY_FLOAT16.astype(np.float32))


def test_every_float16_value_has_the_computed_p_log_p():
    finite = np.isfinite(EVERY_FLOAT16)
    table, computed = plogp(EVERY_FLOAT16), computed_plogp(EVERY_FLOAT16)
    assert np.array_equal(table[finite], computed[finite])
    assert np.array_equal(np.isnan(table), np.isnan(computed))  # NaN in, NaN out (and +inf log +inf = +inf)
    assert plogp(np.zeros(3, np.float16)).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("shape", [(2, 3, 7, 7), (6, 12, 54, 54), (1, 1, 1, 1), (4, 5, 129)])
def test_row_entropy_of_float16_maps_is_that_of_their_float32_cast(shape):
    maps = random_maps(np.random.default_rng(len(shape) + shape[-1]), shape)
    np.testing.assert_array_equal(row_entropy(maps), row_entropy(maps.astype(np.float32)))
    out = np.empty(shape, np.float32)
    np.testing.assert_array_equal(row_entropy(maps, out=out), row_entropy(maps.astype(np.float32)))


def test_strided_float16_maps_are_looked_up_element_by_element():
    maps = random_maps(np.random.default_rng(5), (6, 12, 20, 20))
    view = maps[1::2, ::3]  # not contiguous
    np.testing.assert_array_equal(as_float32(view), view.astype(np.float32))
    np.testing.assert_array_equal(row_entropy(view), row_entropy(view.astype(np.float32)))


@pytest.mark.parametrize("cells", [LOOKUP_BLOCK - 1, LOOKUP_BLOCK, LOOKUP_BLOCK + 1, 3 * LOOKUP_BLOCK + LOOKUP_BLOCK // 2])
def test_lookups_in_blocks_equal_one_take_at_every_block_edge(cells):
    maps = random_maps(np.random.default_rng(cells), (1, 1, 1, cells))
    values, summands = _tables()
    for lookup, table in ((as_float32, values), (plogp, summands)):
        whole = np.take(table, maps.view(np.uint16), mode="wrap")
        np.testing.assert_array_equal(lookup(maps), whole)
        out = np.full(maps.shape, np.nan, np.float32)
        assert lookup(maps, out=out) is out
        np.testing.assert_array_equal(out, whole)
    with pytest.raises(ValueError):  # np.take's own check of `out`, as before
        as_float32(maps, out=np.empty(cells + 1, np.float32))


def test_a_lookup_allocates_no_cell_sized_temporary():
    # np.take converts its indices to a fresh intp array; a whole example's (8 bytes a cell) lay above the CLI's 1 MiB
    # mmap threshold (store/heap.py), so every lookup was an mmap and its page faults. Now at most one block of indices
    # (a buffer the thread keeps) is allocated.
    maps = random_maps(np.random.default_rng(3), (6, 12, 128, 128))  # 1.2 M cells: 9.4 MB of indices in one take
    out = np.empty(maps.shape, np.float32)
    tracemalloc.start()
    try:
        as_float32(maps, out=out)
        plogp(maps, out=out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 8 * LOOKUP_BLOCK + (64 << 10), peak


def test_other_dtypes_are_cast_by_numpy_and_plogp_refuses_them():
    maps = np.random.default_rng(1).random((3, 4), dtype=np.float64)
    np.testing.assert_array_equal(as_float32(maps), maps.astype(np.float32))
    out = np.empty((3, 4), np.float32)
    np.testing.assert_array_equal(as_float32(maps, out=out), maps.astype(np.float32))
    with pytest.raises(TypeError, match="float16 table looks up float16 values, not float64"):
        plogp(maps)
