"""Head confidence and roles (Voita et al. 2019) on hand-built maps, values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from attnstore.queries import run_query

# make_run gives a plain token the id 1000 + its length: "a" and "bb" occur twice in the run, "ccc" and "dddd" once,
# so the rarest token is at position 3 in both examples.
TOKENS = [["[CLS]", "a", "bb", "ccc", "[SEP]"], ["[CLS]", "a", "bb", "dddd", "[SEP]"]]


def designed(length: int = 5) -> np.ndarray:
    """1 layer, 2 heads. Head 0: each row on the previous token (row 0 on itself). Head 1: each row 0.6 on token 3
    (the rarest), 0.4 on the last ([SEP])."""
    maps = np.zeros((1, 2, length, length), dtype=np.float32)
    for i in range(length):
        maps[0, 0, i, max(i - 1, 0)] = 1
    maps[0, 1, :, 3] = 0.6
    maps[0, 1, :, length - 1] = 0.4
    return maps


def test_confidence_offsets_and_rare_words_by_hand(store, make_run):
    run = make_run(store, [designed(), designed()], TOKENS, name="roles")
    frame = run_query(store, "head_roles", run=run).set_index("head")
    # head 0: every largest weight is 1; rows 1-4 of each example point one back, and row 0 has no previous token:
    # 8 of the 8 rows where offset -1 exists
    assert frame.loc[0, "confidence"] == pytest.approx(1.0)
    assert (frame.loc[0, "top_offset"], frame.loc[0, "offset_share"], frame.loc[0, "positional"]) == (-1, pytest.approx(1.0), True)
    assert frame.loc[0, "rare_share"] == pytest.approx(2 / 10)  # only row 4 of each example points at token 3
    # head 1: 0.6 on token 3 is the largest weight once [SEP]'s 0.4 is left out; every row points at the rarest token;
    # its offsets 3, 2, 1, 0, -1 each once per example, over the rows where each exists (2, 3, 4, 5, 4 of 5):
    # +3 has the largest share, 2 of 4
    assert frame.loc[1, "confidence"] == pytest.approx(0.6)
    assert (frame.loc[1, "top_offset"], frame.loc[1, "offset_share"]) == (3, pytest.approx(0.5))
    assert frame.loc[1, "rare_share"] == pytest.approx(1.0) and frame.loc[1, "rare_chance"] == pytest.approx(0.2)


def test_a_previous_token_head_over_long_rows_is_positional(store, make_run):
    tokens = ["[CLS]", *(f"{'x' * (k + 1)}" for k in range(10)), "[SEP]"]
    run = make_run(store, [designed(12)], [tokens], name="positional")
    frame = run_query(store, "head_roles", run=run).set_index("head")
    assert frame.loc[0, "offset_share"] == pytest.approx(1.0) and bool(frame.loc[0, "positional"])
    assert not bool(frame.loc[1, "positional"])


def test_a_perfect_previous_token_head_on_short_inputs_is_positional(store, make_run):
    """Three 3-token inputs: counting row 0 (no previous token) capped the share at 2/3, under the 90 % rule; over the
    rows where offset -1 exists it is 6/6. A next-token head likewise leaves the last row out."""
    maps = np.zeros((1, 2, 3, 3), dtype=np.float32)
    maps[0, 0, [0, 1, 2], [0, 0, 1]] = 1  # previous token; row 0 on itself
    maps[0, 1, [0, 1, 2], [1, 2, 2]] = 1  # next token; the last row on itself
    tokens = [["[CLS]", "a", "[SEP]"], ["[CLS]", "bb", "[SEP]"], ["[CLS]", "ccc", "[SEP]"]]
    frame = run_query(store, "head_roles", run=make_run(store, [maps] * 3, tokens, name="short")).set_index("head")
    assert (frame.loc[0, "top_offset"], frame.loc[0, "offset_share"], frame.loc[0, "positional"]) == (-1, 1.0, True)
    assert (frame.loc[1, "top_offset"], frame.loc[1, "offset_share"], frame.loc[1, "positional"]) == (1, 1.0, True)


def test_offset_rows_leave_out_the_rows_without_that_offset():
    from attnstore.queries.head_roles import offset_rows

    assert offset_rows(5).tolist() == [2, 3, 4, 5, 4, 3, 2]  # offsets -3..3
    assert offset_rows(2).tolist() == [0, 0, 1, 2, 1, 0, 0]


def test_tied_rarest_tokens_go_to_the_leftmost(store, make_run):
    """Every plain token occurs once in the run ("a", "ccc", "dddd" tie as rarest): the rarest is the leftmost, "a" at
    position 1. Head 0 attends to "dddd" (equally rare, not counted), head 1 to "a"."""
    from attnstore.queries.head_roles import rarest_token

    special = np.array([True, False, False, False, True])
    assert rarest_token(np.array([0, 1001, 1003, 1004, 1]), special, {1001: 1, 1003: 1, 1004: 1}) == 1
    assert rarest_token(np.array([0, 1001, 1003, 1004, 1]), special, {1001: 2, 1003: 1, 1004: 1}) == 2
    maps = np.zeros((1, 2, 5, 5), dtype=np.float32)
    maps[0, 0, :, 3] = 1
    maps[0, 1, :, 1] = 1
    run = make_run(store, [maps], [["[CLS]", "a", "ccc", "dddd", "[SEP]"]], name="ties")
    frame = run_query(store, "head_roles", run=run).set_index("head")
    assert frame["rare_share"].tolist() == [0.0, 1.0]


def numpy_role_counts(maps: np.ndarray, sep: np.ndarray, rare: int):
    """The reduce's numbers as numpy computed them on a float64 copy of the maps (before 07bca0d and d169872, 2026-11-28)."""
    from attnstore.queries.head_roles import OFFSETS

    values = np.asarray(maps, dtype=np.float64)
    outside = values[..., ~sep] if (~sep).any() else np.zeros((*values.shape[:-1], 1))
    best = values.argmax(-1)
    offsets = best - np.arange(values.shape[-1])
    counts = np.stack([(offsets == k).sum(-1) for k in OFFSETS], axis=-1)
    return outside.max(-1).sum(-1), counts, (best == rare).sum(-1)


def same_as_numpy(maps, sep, rare):
    from attnstore.queries.head_roles import role_counts

    got, want = role_counts(maps, sep, rare), numpy_role_counts(maps, sep, rare)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)  # bit for bit: the same float64 values summed, the same argmaxes counted


@pytest.mark.parametrize("seps", ["none", "some", "all"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_role_counts_equal_numpys_on_float64_copies(seps, dtype):
    rng = np.random.default_rng(len(seps))
    raw = rng.random((3, 4, 9, 9)) ** 6  # many small weights, subnormal in float16
    maps = (raw / raw.sum(-1, keepdims=True)).astype(dtype)
    maps[0, 0, 0] = 0  # a row of zeros: its argmax is its first key
    maps[0, 1, 2, 3] = maps[0, 1, 2, 5] = 0.5  # a tie: the first wins
    sep = {"none": np.zeros(9, bool), "some": np.arange(9) % 4 == 0, "all": np.ones(9, bool)}[seps]
    for rare in (-1, 0, 4):
        same_as_numpy(maps, sep, rare)


@pytest.mark.parametrize("odd", [-0.0, -0.25, np.inf, np.nan])
@pytest.mark.parametrize("where", [(1, 2), (1, 0), (0, 0), (2, 2)])  # before and after the row's maximum, on a separator
def test_signs_and_non_finite_values_follow_numpy(odd, where):
    maps = np.full((1, 2, 3, 3), 1 / 3, np.float16)
    maps[0, 1, where[0], where[1]] = odd
    maps[0, 0, 1, 2] = odd
    same_as_numpy(maps, np.array([False, False, True]), 2)
