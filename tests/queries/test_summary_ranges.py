"""One process builds a summary range by range (queries/summary.py, SUMMARY_RANGE), so a kind's per-range tables stay small:
the result equals one pass over the whole run exactly, for every kind this run can have."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attnstore.queries import load_all, summary
from attnstore.queries.summary import KINDS, kept, summarise_examples
from attnstore.store.errors import AttnStoreError

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
    for name, kind in sorted(KINDS.items()):
        try:
            whole = summarise_examples(store, info, kind)
        except AttnStoreError:
            continue  # a kind this run cannot have (no words, no frames, no mentions)
        ranged = kept(store, info, kind)
        assert ranged is not None and ranged.keys() == whole.keys(), name
        for field in whole:
            np.testing.assert_array_equal(ranged[field], whole[field], err_msg=f"{name}.{field}")
        compared.append(name)
    return compared


def test_a_summary_built_in_ranges_equals_one_pass(store, make_run, monkeypatch):
    load_all()
    run = make_run(store, [random_maps(t, i) for i, t in enumerate(TOKENS)], TOKENS, name="ranged", dtype="float16")
    monkeypatch.setattr(summary, "SUMMARY_RANGE", 2)  # 9 examples: 5 ranges, the last of one
    compared = compare_kinds(store, run)
    assert "clark" in compared and len(compared) >= 4, compared


@pytest.mark.model
def test_ranges_of_real_runs_with_words_and_mentions_equal_one_pass(store, loaded_model, monkeypatch):
    """Gold UD words (dependency edges, Kovaleva's features and relations) and GUM mentions: each kind's prepare
    reads one range's tokens, words and mentions."""
    from attnstore.ingest import ingest

    load_all()
    monkeypatch.setattr(summary, "SUMMARY_RANGE", 3)
    ud = ingest(store, dataset="ud/en_ewt:dev", data_dir=DATA, loaded=loaded_model, progress=False).run.name
    gum = ingest(store, dataset="gum/ontogum:dev", data_dir=DATA, window_words=40, loaded=loaded_model, progress=False).run.name
    assert len(store.examples(ud)) > 3 and len(store.examples(gum)) > 3
    assert {"word_argmax", "kovaleva_features", "kovaleva_relations", "clark"} <= set(compare_kinds(store, ud))
    assert "mention_argmax" in compare_kinds(store, gum)
