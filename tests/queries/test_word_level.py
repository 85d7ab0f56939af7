import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.queries.engine import kernel
from attnstore.queries.word_level import units_of, word_level


def test_units_keep_specials_and_group_split_words():
    units = units_of([None, 0, 1, 1, 2, None])  # [CLS] w0 w1a w1b w2 [SEP]
    assert units.word.tolist() == [-1, 0, 1, 2, -1]
    assert units.token.tolist() == [0, 1, 2, 4, 5]
    assert units.assign.sum(axis=0).tolist() == [1] * 6


def test_to_is_summed_and_from_is_averaged_exactly():
    rng = np.random.default_rng(0)
    maps = rng.random((2, 3, 5, 5)).astype(np.float32)
    maps /= maps.sum(-1, keepdims=True)
    units = units_of([None, 0, 0, 1, None])  # word 0 has two pieces (tokens 1, 2)
    w = word_level(maps, units)
    assert w.shape == (2, 3, 4, 4)
    # to the split word: sum of its pieces' columns; from it: mean of its pieces' rows
    np.testing.assert_allclose(w[..., 0, 1], maps[..., 0, 1] + maps[..., 0, 2], rtol=1e-6)
    np.testing.assert_allclose(w[..., 1, 0], (maps[..., 1, 0] + maps[..., 2, 0]) / 2, rtol=1e-6)
    np.testing.assert_allclose(w[..., 1, 1], (maps[..., 1, 1] + maps[..., 1, 2] + maps[..., 2, 1] + maps[..., 2, 2]) / 2, rtol=1e-6)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)  # rows still sum to 1


def test_words_without_pieces_have_no_unit():
    units = units_of([None, 0, 2, None])  # word 1 lost its pieces
    assert units.index_of_words([0, 1, 2]).tolist() == [1, -1, 2]


def test_word_maps_query_rows_sum_to_one(store, make_run):
    maps = np.full((1, 1, 4, 4), 0.25, dtype=np.float32)
    run = make_run(
        store, [maps], [["[CLS]", "ab", "##c", "[SEP]"]], name="wm", token_words=[[None, 0, 0, None]], words_list=[[dict(form="abc")]]
    )
    df = run_query(store, "word_maps", run=run, example=0)
    assert len(df) == 9
    assert df.groupby("from_unit")["attention"].sum().tolist() == pytest.approx([1.0, 1.0, 1.0])
    row = df[(df["from_form"] == "abc") & (df["to_form"] == "abc")]
    assert row["attention"].item() == pytest.approx(0.5)


def test_word_maps_are_float64_sums_rounded_to_float32_for_float16_and_float64_maps():
    units = units_of([None, 0, 0, 1, 2, 2, None])
    raw = np.random.default_rng(7).random((3, 2, 7, 7)) ** 3
    maps = (raw / raw.sum(-1, keepdims=True)).astype(np.float16)
    exact = maps.astype(np.float64)
    assign = units.assign.astype(np.float64)
    want = ((assign @ exact @ assign.T) / assign.sum(1)[:, None]).astype(np.float32)  # each sum in float64, then / n
    got = word_level(maps, units)
    assert got.dtype == np.float32 and got.shape == (3, 2, 5, 5)
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=0)
    np.testing.assert_array_equal(word_level(exact, units), got)  # float16 by table: the same values
    np.testing.assert_array_equal(word_level(maps[0, 0], units), got[0, 0])  # one (L, L) map


def test_kept_units_are_the_rows_and_columns_of_the_whole_word_map():
    units = units_of([None, 0, 1, 1, None, 2, None])
    maps = np.random.default_rng(8).random((2, 3, 7, 7)).astype(np.float32)
    whole = word_level(maps, units)
    for keep in ([1, 2, 4], [4, 1], [0, 3, 5]):
        np.testing.assert_array_equal(word_level(maps, units, np.array(keep)), whole[:, :, keep][:, :, :, keep])


def test_the_word_map_kernel_refuses_units_out_of_range_and_units_without_tokens():
    word_maps = kernel("_words").word_maps
    maps, out, empty = np.zeros((1, 2, 2)), np.zeros((1, 2, 2), np.float32), np.zeros(0, np.float32)
    with pytest.raises(ValueError, match=r"token 1's unit 2 is not in \[0, 2\)"):
        word_maps(maps, 1, 2, np.array([0, 2]), 2, np.arange(2), empty, out, False)
    with pytest.raises(ValueError, match="negative n_maps, length or units"):
        word_maps(maps, 1, 2, np.array([0, 1]), -2, np.arange(2), empty, out, False)
    with pytest.raises(ValueError, match="negative n, rows or columns"):
        kernel("_words").unique_argmax(np.zeros(4), 1, -2, 2, np.zeros(2, np.int64), False, False)
    with pytest.raises(ValueError, match="unit 1 has no token"):
        word_maps(maps, 1, 2, np.array([0, 0]), 2, np.arange(2), empty, out, False)
    with pytest.raises(ValueError, match=r"kept unit 5 is not in \[0, 2\)"):
        word_maps(maps, 1, 2, np.array([0, 1]), 2, np.array([0, 5]), empty, out, False)
