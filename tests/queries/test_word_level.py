import numpy as np
import pytest

from attnstore.queries import run_query
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


@pytest.mark.parametrize("cells", [None, 2 * 7 * 7])  # the default parts, then one layer a part (three parts)
def test_float16_maps_a_few_layers_at_a_time_equal_the_whole_products(monkeypatch, cells):
    from attnstore.queries import summary
    from attnstore.store.float16 import as_float32

    if cells is not None:
        monkeypatch.setattr(summary, "SCRATCH_CELLS", cells)
    units = units_of([None, 0, 0, 1, 2, 2, None])
    raw = np.random.default_rng(7).random((3, 2, 7, 7)) ** 3
    maps = (raw / raw.sum(-1, keepdims=True)).astype(np.float16)
    mean_rows = units.assign / units.assign.sum(axis=1, keepdims=True)
    whole = mean_rows @ as_float32(maps) @ units.assign.T  # before session 38: the example at once
    got = word_level(maps, units)
    assert got.dtype == whole.dtype == np.float32
    np.testing.assert_array_equal(got, whole)
