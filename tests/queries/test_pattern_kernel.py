"""queries/_patterns.c (queries/patterns.py `_raw_scores`): the raw pattern scores equal numpy's computation of them
(the implementation it replaced) for float16 and float64 maps, any segment labels, and the edge cases of the rules."""

import numpy as np
import pytest

from attnstore.queries.engine import kernel
from attnstore.queries.patterns import RAW_SCORES, _raw_scores, pattern_scores


def numpy_raw_scores(maps, special, segment):
    """The numpy `_raw_scores` before the compiled reduce (at 71855b4, 2026-11-28), on the maps cast to float64."""
    maps = maps.astype(np.float64)
    vertical = maps[..., special].sum(-1).mean(-1)
    diagonal = (
        np.diagonal(maps, offset=-1, axis1=-2, axis2=-1).sum(-1) + np.diagonal(maps, offset=1, axis1=-2, axis2=-1).sum(-1)
    ) / maps.shape[-1]
    self_ = np.diagonal(maps, axis1=-2, axis2=-1).mean(-1)
    plain = ~special
    stripe = maps[..., plain].mean(-2).max(-1) if plain.any() else np.zeros(maps.shape[:-2])
    if plain.any() and np.unique(segment[plain]).size >= 2:
        own = (segment[:, None] == segment[None, :]) & plain[None, :]
        to_own, to_plain = (maps * own).sum(-1)[..., plain], maps[..., plain].sum(-1)[..., plain]
        with np.errstate(invalid="ignore", divide="ignore"):
            block = np.where(to_plain > 0, to_own / np.where(to_plain > 0, to_plain, 1), 0.0).mean(-1)
    else:
        block = np.full(maps.shape[:-2], np.nan)
    return dict(vertical=vertical, diagonal=diagonal, self=self_, block=block, stripe=stripe)


def maps_of(length, dtype, seed=0):
    a = np.random.default_rng(seed).random((2, 3, length, length)) ** 3
    a[..., -1, :] = 0  # a row of zeros: its block share is 0
    return (a / np.maximum(a.sum(-1, keepdims=True), 1e-12)).astype(dtype)


LAYOUTS = {  # (special, segment) of a length
    "pair": lambda n: (np.isin(np.arange(n), [0, n // 2, n - 1]), (np.arange(n) > n // 2).astype(np.int64)),
    "one segment": lambda n: (np.isin(np.arange(n), [0, n - 1]), np.zeros(n, np.int64)),
    "three segments": lambda n: (np.arange(n) == 0, np.arange(n) % 3),
    "no special": lambda n: (np.zeros(n, bool), (np.arange(n) >= n // 2).astype(np.int64)),
    "all special": lambda n: (np.ones(n, bool), np.zeros(n, np.int64)),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("length", [1, 2, 3, 4, 7, 30])  # odd and even: the loop takes two cells at a time
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_raw_scores_equal_numpys(layout, length, dtype):
    maps = maps_of(length, dtype, seed=length)
    special, segment = LAYOUTS[layout](length)
    got, want = _raw_scores(maps, special, segment), numpy_raw_scores(maps, special, segment)
    for name in RAW_SCORES:
        assert got[name].shape == (2, 3), name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-13, atol=1e-15, equal_nan=True, err_msg=name)


def test_hand_built_map_scores_exactly():
    # [CLS] a b [SEP] c [SEP]: segments 0 0 0 0 1 1; query 1 splits its plain attention 0.25 / 0.25 between its own
    # segment (key 2) and the other (key 4); every other row attends to one key.
    maps = np.zeros((6, 6), np.float16)
    maps[0, 0] = maps[2, 3] = maps[3, 3] = maps[4, 5] = maps[5, 5] = 1
    maps[1, [0, 2, 4]] = [0.5, 0.25, 0.25]
    special, segment = np.isin(np.arange(6), [0, 3, 5]), np.array([0, 0, 0, 0, 1, 1])
    got = {name: float(v) for name, v in _raw_scores(maps, special, segment).items()}
    # vertical: to special keys 1 + 0.5 + 1 + 1 + 1 + 1; diagonal: (1,0) (1,2) (2,3) (4,5) = 0.5 + 0.25 + 1 + 1; self: (0,0) (3,3) (5,5)
    # block: plain queries 1, 2, 4 share 0.5, 0 (no plain key), 0 (its plain key 5 is special: none); stripe: key 2 and 4 get 0.25
    assert got == dict(vertical=5.5 / 6, diagonal=2.75 / 6, self=3 / 6, block=0.5 / 3, stripe=0.25 / 6)


def test_segment_labels_of_any_kind_and_float32_or_strided_maps_score_alike():
    maps = maps_of(9, np.float32, seed=3)
    special, segment = LAYOUTS["pair"](9)
    want = pattern_scores(maps.astype(np.float64), special, segment)
    for got in (
        pattern_scores(maps, special, np.where(segment == 1, "b", "a")),  # str labels
        pattern_scores(np.asfortranarray(maps), special, segment.astype(np.int8)),  # not C-contiguous
    ):
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_the_kernel_refuses_buffers_of_the_wrong_size():
    raw_scores = kernel("_patterns").raw_scores
    maps, plain, segment = np.zeros((2, 3, 3)), np.ones(3), np.zeros(3, np.int64)
    with pytest.raises(ValueError, match="maps holds 144 bytes, not 216"):
        raw_scores(maps, 3, 3, plain, segment, np.zeros(0, np.float32), np.empty((5, 3)), False, True)
    with pytest.raises(ValueError, match="maps of no token"):
        raw_scores(np.zeros(0), 3, 0, np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.float32), np.empty((5, 3)), False, True)
    with pytest.raises(ValueError, match="segment holds 24 bytes, not 16"):
        raw_scores(maps[:, :2, :2].copy(), 2, 2, plain[:2], segment, np.zeros(0, np.float32), np.empty((5, 2)), False, True)
