"""`store.run(name_or_id)`: a handle bound to one run; and the Store API the reader/writer split keeps."""

import numpy as np
import pandas as pd
import pytest

import attnstore
from attnstore.queries import run_query
from attnstore.store import RunHandle, Store
from attnstore.store.errors import NotFoundError
from attnstore.store.writer import StoreWriter

TOKENS = [["[CLS]", "x", "y", "[SEP]"], ["[CLS]", "z", "[SEP]"], ["[CLS]", "p", "q", "r", "s", "[SEP]"]]


def ragged_maps(length, seed):
    rng = np.random.default_rng(seed)
    maps = rng.random((3, 2, length, length)).astype(np.float32)
    return maps / maps.sum(-1, keepdims=True)


@pytest.fixture
def run(store, make_run):
    return make_run(store, [ragged_maps(len(t), i) for i, t in enumerate(TOKENS)], TOKENS, name="ragged")


def test_handle_reads_what_the_store_reads(store, run):
    handle = store.run(run)
    assert isinstance(handle, RunHandle)
    assert handle.info == store.run_info(run) and handle.name == "ragged" and handle.id == handle.info.id
    pd.testing.assert_frame_equal(handle.examples(), store.examples(run))
    for example, toks in enumerate(TOKENS):
        pd.testing.assert_frame_equal(handle.tokens(example), store.tokens(run, example))
        pd.testing.assert_frame_equal(handle.words(example), store.words(run, example))
        np.testing.assert_array_equal(handle.attention(example), ragged_maps(len(toks), example))
    np.testing.assert_array_equal(handle.attention(2, layer=[0, 2], head=1), ragged_maps(6, 2)[[0, 2]][:, [1]])
    streamed = dict(handle.iter_attention([0, 2]))
    assert sorted(streamed) == [0, 2]
    np.testing.assert_array_equal(streamed[2], ragged_maps(6, 2))
    assert "ragged" in repr(handle)


def test_examples_without_texts_keep_what_reading_maps_needs(store, run):
    full, bare = store.examples(run), store.examples(run, texts=False)
    assert list(bare.columns) == ["example", "example_id", "length", "offset", "truncated", "skipped"]
    pd.testing.assert_frame_equal(bare, full[bare.columns])
    assert {"text_a", "text_b", "label", "doc_id", "sent_id"} <= set(full.columns)


def test_streaming_a_subset_reads_only_its_examples_rows(store, run, monkeypatch):
    read = []
    original = type(store)._frame

    def recording(self, query):
        frame = original(self, query)
        if "offset" in frame.columns:  # the examples' rows
            read.append(len(frame))
        return frame

    monkeypatch.setattr(type(store), "_frame", recording)
    assert [e for e, _ in store.iter_attention(run, [1])] == [1]
    assert read == [1]  # not the whole run's rows (a long run is streamed range by range, each range reading its own)
    with pytest.raises(NotFoundError, match=r"has no stored example\(s\) \[9\]"):
        list(store.iter_attention(run, [1, 9]))


def test_handle_by_id_as_int_or_text(store, run):
    info = store.run_info(run)
    assert store.run(info.id).info == info
    assert store.run(str(info.id)).info == info  # the id `attnstore runs` shows, given as text


def test_handle_runs_queries_and_reads_saved_metrics(store, run):
    handle = store.run(run)
    frame = handle.query("relative_position")
    pd.testing.assert_frame_equal(frame, run_query(store, "relative_position", run=run))
    assert frame.attrs["run_state"] == "complete" and frame.attrs["n_examples"] == 3
    pd.testing.assert_frame_equal(
        handle.query("relative_position", average="token"), run_query(store, "relative_position", run=run, average="token")
    )
    assert handle.head_metrics().empty
    store.save_head_metrics(run, frame, prefix="relative_position")
    saved = handle.head_metrics()
    assert len(saved) == 3 * 2 * 3 and set(saved["run"]) == {"ragged"}
    pd.testing.assert_frame_equal(handle.head_metrics("relative_position.to_self"), store.head_metrics(run, "relative_position.to_self"))


def test_missing_run_raises_as_run_info_does(store, run):
    with pytest.raises(NotFoundError) as from_info:
        store.run_info("nope")
    with pytest.raises(NotFoundError, match="no run 'nope'.*known runs: ragged") as from_handle:
        store.run("nope")
    assert str(from_handle.value) == str(from_info.value)
    with pytest.raises(NotFoundError, match="run 'ragged' has no example 7"):
        store.run(run).tokens(7)


# What a user calls: reads, the user's writes (saved results, summaries, probe results, pattern labels), run handles.
STORE_METHODS = {
    "ablation_results",
    "attention",
    "dependency_relations",
    "close",
    "example_rows",
    "examples",
    "head_matches",
    "head_metrics",
    "iter_attention",
    "iter_value_norms",
    "iter_saliency",
    "saliency_info",
    "has_value_norms",
    "has_token_loss",
    "token_loss",
    "iter_token_loss",
    "iter_hidden_peaks",
    "iter_row_stats",
    "pooled_attention",
    "require_value_norms",
    "value_norms",
    "labelled_attention",
    "labelled_run",
    "mention_table",
    "model_row",
    "models",
    "n_committed",
    "pattern_labels",
    "pinned",
    "plot",
    "probe_results",
    "run",
    "save_head_matches",
    "run_info",
    "run_state",
    "runs",
    "save_head_metrics",
    "save_pattern_labels",
    "save_probe_result",
    "session",
    "set_read_cache",
    "sql",
    "storage_order",
    "summaries",
    "token_roles",
    "token_table",
    "tokens",
    "word_counts",
    "word_table",
    "words",
}

# The writer side (`store.writer`, issue 25): what ingest, fine-tuning, evaluation, checks and bundles call.
WRITER_METHODS = {
    "ablation_configs",
    "add_ablation_results",
    "add_examples",
    "block_steps",
    "complete_dataset",
    "dataset_examples",
    "examples_by_id",
    "done_example_ids",
    "fail_run",
    "find_dataset",
    "find_or_create_dataset",
    "find_or_create_model",
    "lease",
    "register_finetuned_model",
    "require_writable",
    "run_writer",
    "start_run",
    "stored_positions",
}


def test_store_keeps_its_public_api(store):
    assert attnstore.Store is Store and attnstore.open_store is attnstore.store.open_store
    assert isinstance(store, Store) and repr(store).startswith("Store(")
    public = {n for n in dir(Store) if not n.startswith("_") and callable(getattr(Store, n))}
    assert public == STORE_METHODS
    writer = store.writer
    assert writer is store.writer and writer.store is store and isinstance(writer, StoreWriter)
    assert {n for n in dir(writer) if not n.startswith("_") and callable(getattr(writer, n))} == WRITER_METHODS
    assert not WRITER_METHODS & set(dir(Store))  # the writer side is not the user's API
    with store as same:
        assert same is store
