import numpy as np
import pytest

from attnstore.store.errors import ConflictError, InvalidArgumentError, NotFoundError


def ragged_maps(length, seed):
    rng = np.random.default_rng(seed)
    maps = rng.random((3, 2, length, length)).astype(np.float32)
    return maps / maps.sum(-1, keepdims=True)


TOKENS = [["[CLS]", "x", "y", "[SEP]"], ["[CLS]", "z", "[SEP]"], ["[CLS]", "p", "q", "r", "s", "[SEP]"]]


@pytest.fixture
def run(store, make_run):
    return make_run(store, [ragged_maps(len(t), i) for i, t in enumerate(TOKENS)], TOKENS, name="ragged")


def test_attention_round_trips_unpadded(store, run):
    for i, toks in enumerate(TOKENS):
        got = store.attention(run, i)
        assert got.shape == (3, 2, len(toks), len(toks))
        np.testing.assert_array_equal(got, ragged_maps(len(toks), i))


def test_attention_selects_layers_and_heads_keeping_four_axes(store, run):
    full = ragged_maps(4, 0)
    np.testing.assert_array_equal(store.attention(run, 0, layer=2), full[[2]])
    np.testing.assert_array_equal(store.attention(run, 0, layer=[0, 2], head=1), full[[0, 2]][:, [1]])
    with pytest.raises(InvalidArgumentError, match="layer 3 is out of range: the model has 3 layers"):
        store.attention(run, 0, layer=3)
    with pytest.raises(InvalidArgumentError, match="head 5"):
        store.attention(run, 0, head=5)


def test_no_storage_wasted_on_padding(store, run):
    info = store.run_info(run)
    ex = store.examples(run)
    # offsets are back to back within the run (each example starts where the last ended)
    order = ex.sort_values("offset")
    ends = (order["offset"] + info.n_layers * info.n_heads * order["length"] ** 2).to_numpy()
    assert (order["offset"].to_numpy()[1:] == ends[:-1]).all()


def test_runs_examples_tokens_frames(store, run):
    runs = store.runs()
    assert runs.loc[0, "run"] == "ragged" and runs.loc[0, "status"] == "complete" and runs.loc[0, "n_stored"] == 3
    ex = store.examples(run)
    assert ex["example"].tolist() == [0, 1, 2] and ex["length"].tolist() == [4, 3, 6]
    toks = store.tokens(run, 1)
    assert toks["token"].tolist() == ["[CLS]", "z", "[SEP]"]
    assert toks["is_special"].tolist() == [True, False, True]
    assert toks["word_position"].tolist()[1] == 0 and toks["word"].tolist()[1] == "z"
    assert list(store.words(run, 2)["form"]) == ["p", "q", "r", "s"]


def test_iter_attention_streams_everything(store, run):
    seen = dict(store.iter_attention(run))
    assert sorted(seen) == [0, 1, 2]
    np.testing.assert_array_equal(seen[2], ragged_maps(6, 2))


def test_unknown_run_and_example_are_clear(store, run):
    with pytest.raises(NotFoundError, match="no run 'nope'.*known runs: ragged"):
        store.attention("nope", 0)
    with pytest.raises(NotFoundError, match="run 'ragged' has no example 7"):
        store.attention(run, 7)
    with pytest.raises(InvalidArgumentError, match="integer position"):
        store.attention(run, "0")
    with pytest.raises(NotFoundError, match=r"no stored example\(s\) \[9\]"):
        list(store.iter_attention(run, [0, 9]))


def test_run_name_cannot_be_reused_for_other_settings(store, run):
    info = store.run_info(run)
    with pytest.raises(ConflictError, match="already exists with other settings"):
        store.writer.start_run(
            name=run,
            model_id=info.model_id,
            dataset_id=info.dataset_id,
            dtype="float16",
            codec=info.codec,
            chunk_cells=64,
            max_length=512,
            truncation="truncate",
            attn_implementation="eager",
            batch_size=1,
            code_version="t",
            corpus_checksum="x",
            manifest={},
        )
