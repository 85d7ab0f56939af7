"""One process builds a summary range by range (queries/engine/, SUMMARY_RANGE), so a kind's per-range tables stay small:
the result equals one pass over the whole run exactly, for every kind this run can have."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from attnstore.queries import clark, load_all
from attnstore.queries import engine as summary
from attnstore.queries.engine import KINDS, concatenate, keep, run_kinds, summarise_examples, summary_parts
from attnstore.queries.engine import passes as engine_passes
from attnstore.store import summaries
from attnstore.store.errors import AttnStoreError, StorageIOError

# The analysis, not the database: SQLite only (kept summaries are Zarr; each query's SQL meets PostgreSQL in test_conformance.py).
pytestmark = pytest.mark.one_backend

DATA = str(Path(__file__).parents[1] / "fixtures" / "data")
TOKENS = [["[CLS]", *(["a", ",", "b", "."] * (1 + i % 3))[: 2 + i % 5], "[SEP]"] for i in range(9)]


def random_maps(tokens, seed):
    rng = np.random.default_rng(seed)
    raw = rng.random((3, 2, len(tokens), len(tokens)), dtype=np.float32) ** 3 + 1e-3
    return (raw / raw.sum(-1, keepdims=True)).astype(np.float16)


def compare_kinds(store, run: str) -> list[str]:
    """Each kind's summary kept range by range against one pass over the run: exactly equal. Returns the kinds compared."""
    info = store.run_info(run)
    compared = []
    for name, kind in run_kinds().items():
        try:
            whole = summarise_examples(store, info, kind)
        except AttnStoreError:
            continue  # a kind this run cannot have (no words, no frames, no mentions)
        ranged = summary.summary(store, info, kind)
        assert ranged.keys() == whole.keys(), name
        for field in whole:
            np.testing.assert_array_equal(ranged[field], whole[field], err_msg=f"{name}.{field}")
        compared.append(name)
    return compared


def compare_threads(store, run: str, monkeypatch) -> list[str]:
    """Each kind's one pass with its reduce on a pool of 3 threads against on the reading thread: exactly equal."""
    info = store.run_info(run)
    compared = []
    for name, kind in run_kinds().items():
        monkeypatch.setenv(engine_passes.REDUCE_THREADS_ENV, "1")
        try:
            one = summarise_examples(store, info, kind)
        except AttnStoreError:
            continue
        monkeypatch.setenv(engine_passes.REDUCE_THREADS_ENV, "3")
        pooled = summarise_examples(store, info, kind)
        assert pooled.keys() == one.keys(), name
        for field in one:
            np.testing.assert_array_equal(pooled[field], one[field], err_msg=f"{name}.{field} on 3 threads")
        compared.append(name)
    monkeypatch.delenv(engine_passes.REDUCE_THREADS_ENV)
    return compared


def test_a_summary_built_in_ranges_equals_one_pass(store, make_run, monkeypatch):
    load_all()
    run = make_run(store, [random_maps(t, i) for i, t in enumerate(TOKENS)], TOKENS, name="ranged", dtype="float16")
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 2)  # 9 examples: 5 ranges, the last of one
    compared = compare_kinds(store, run)
    assert "clark" in compared and len(compared) >= 4, compared
    assert compare_threads(store, run, monkeypatch) == compared


@pytest.mark.model
def test_ranges_of_real_runs_with_words_and_mentions_equal_one_pass(store, loaded_model, monkeypatch):
    """Gold UD words (dependency edges, Kovaleva's features and relations) and GUM mentions: each kind's prepare
    reads one range's tokens, words and mentions."""
    from attnstore.ingest import ingest

    load_all()
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 3)
    ud = ingest(store, dataset="ud/en_ewt:dev", data_dir=DATA, loaded=loaded_model, progress=False).run.name
    gum = ingest(store, dataset="gum/ontogum:dev", data_dir=DATA, window_words=40, loaded=loaded_model, progress=False).run.name
    assert len(store.examples(ud)) > 3 and len(store.examples(gum)) > 3
    assert {"word_argmax", "kovaleva_features", "kovaleva_relations", "clark"} <= set(compare_kinds(store, ud))
    assert "mention_argmax" in compare_kinds(store, gum)
    threaded = set(compare_threads(store, ud, monkeypatch))
    assert {"word_argmax", "kovaleva_features", "kovaleva_relations", "head_trees", "clark"} <= threaded, threaded
    assert "mention_argmax" in compare_threads(store, gum, monkeypatch)


def test_a_summary_is_kept_part_by_part_and_read_back_in_parts(store, make_run, monkeypatch):
    """The build hands each range's part to the store as soon as it is made (the next range is summarised only after
    the previous one is written), the arrays are chunked by whole ranges, and a query reads it back range by range."""
    load_all()
    run = make_run(store, [random_maps(t, i) for i, t in enumerate(TOKENS)], TOKENS, name="parts", dtype="float16")
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 4)  # 9 examples: parts of 4, 4 and 1
    monkeypatch.setattr(summaries, "SUMMARY_CHUNK_ROWS", 4)
    info = store.run_info(run)
    kind = KINDS["word_argmax"]  # ragged fields: their offsets continue across the parts
    written_before_each_part = []
    original = summary.summarise_examples

    def summarise_one_range(store_, info_, kind_, examples, params=None):
        group = zarr.open_group(store.locations.array_root, path=f"runs/parts/summary/{kind.name}", mode="r")
        written_before_each_part.append(group["example"].shape[0] if "example" in group else 0)
        return original(store_, info_, kind_, examples, params)

    monkeypatch.setattr("attnstore.queries.engine.passes.summarise_examples", summarise_one_range)
    saved = keep(store, info, kind)
    assert written_before_each_part == [0, 4, 8] and saved is not None and saved.n == 9
    group = zarr.open_group(store.locations.array_root, path=f"runs/parts/summary/{kind.name}", mode="r")
    assert group["argmax"].chunks[0] >= 4 and group["example"].chunks == (4,)
    whole = original(store, info, kind)
    for field in whole:
        np.testing.assert_array_equal(group[field][:], whole[field], err_msg=field)
    parts = list(summary_parts(store, info, kind))
    assert [len(p["example"]) for p in parts] == [4, 4, 1] and all(p["word_start"][0] == 0 for p in parts)
    for field, values in concatenate(kind, parts).items():
        np.testing.assert_array_equal(values, whole[field], err_msg=field)
    assert [p["example"].tolist() for p in summary_parts(store, info, kind, [8, 1, 5])] == [[1], [5], [8]]
    # some examples' rows: a part per range that holds some (read together), in storage order, each with its own words
    some = list(summary_parts(store, info, kind, [8, 1, 5, 0, 2, 3]))
    order = summary.in_storage_order(store, info).tolist()
    by_range = ([e for e in order[i : i + 4] if e in {8, 1, 5, 0, 2, 3}] for i in (0, 4, 8))
    assert [p["example"].tolist() for p in some] == [r for r in by_range if r]
    whole = {e: i for i, e in enumerate(order)}
    full = concatenate(kind, parts)
    for p in some:
        assert p["word_start"][0] == 0 and p["word_start"][-1] == len(p["argmax"])
        for j, e in enumerate(p["example"].tolist()):
            lo, hi = full["word_start"][whole[e]], full["word_start"][whole[e] + 1]
            np.testing.assert_array_equal(p["argmax"][p["word_start"][j] : p["word_start"][j + 1]], full["argmax"][lo:hi])


def test_a_build_cut_off_part_way_is_never_read_and_is_built_again(store, make_run, monkeypatch):
    load_all()
    run = make_run(store, [random_maps(t, i) for i, t in enumerate(TOKENS)], TOKENS, name="cutoff", dtype="float16")
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 4)
    info = store.run_info(run)
    original = summary.summarise_examples
    calls = []

    def fails_on_the_third_range(*args):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(5, "Input/output error")
        return original(*args)

    monkeypatch.setattr("attnstore.queries.engine.passes.summarise_examples", fails_on_the_third_range)
    with pytest.raises(StorageIOError, match="cannot save the summary of run 'cutoff'"):
        keep(store, info, clark.CLARK)
    group = zarr.open_group(store.locations.array_root, path="runs/cutoff/summary/clark", mode="r")
    assert group.attrs["stamp"] is None and group["example"].shape == (8,)  # two parts written, never stamped
    assert store.summaries(info.id).parts("clark", clark.CLARK.stamp(9)) is None
    monkeypatch.setattr("attnstore.queries.engine.passes.summarise_examples", original)
    saved = keep(store, info, clark.CLARK)
    assert saved is not None and saved.n == 9
    np.testing.assert_array_equal(saved.part(0, 9)["entropy"], original(store, info, clark.CLARK)["entropy"])
