"""Type a sentence and look (issue 29): `attention_for_text` returns the tokens and maps an ingest stores for the same
sentence, bit for bit where the sentence is alone in its batch, and a run's model and settings through
`attention_for_run`; without torch it says so in one line."""

from __future__ import annotations

import sys

import numpy as np
import pytest

pytest.importorskip("torch")

from attnstore.ingest import scratch  # noqa: E402
from attnstore.ingest.runner import ingest  # noqa: E402
from attnstore.store.errors import InvalidArgumentError  # noqa: E402

pytestmark = pytest.mark.one_backend

SENTENCE = "the cat sat on the mat, and it purred."
SECOND = "a dog ran home."
TOKEN_COLUMNS = ("token", "token_id", "segment", "is_special")


def stored_tokens(store, run, example=0) -> list[tuple]:
    frame = store.tokens(run, example)
    return [tuple(row) for row in frame[list(TOKEN_COLUMNS)].itertuples(index=False, name=None)]


def scratch_tokens(maps) -> list[tuple]:
    return [tuple(t[c] for c in TOKEN_COLUMNS) for t in maps.tokens]


def test_a_typed_sentence_equals_its_ingested_maps_bit_for_bit(store, tmp_path, tiny_bert):
    corpus = tmp_path / "one.txt"
    corpus.write_text(SENTENCE + "\n", encoding="utf-8")
    run = ingest(store, corpus=str(corpus), fmt="text", model=tiny_bert, annotator="whitespace", name="one", progress=False).run
    typed = scratch.attention_for_text(tiny_bert, SENTENCE)
    stored = store.attention("one", 0)
    assert typed.attention.dtype == stored.dtype == np.float16
    assert typed.attention.shape == stored.shape == (2, 4, len(typed.tokens), len(typed.tokens))
    np.testing.assert_array_equal(typed.attention, stored)
    assert scratch_tokens(typed) == stored_tokens(store, "one")
    # through the run: its model (the manifest's directory), tokenization, max_length, dtype
    via_run = scratch.attention_for_run(store, run.name, "  " + SENTENCE + " ")
    np.testing.assert_array_equal(via_run.attention, stored)
    assert via_run.settings["weights_match"] is True and via_run.tokenization == "text"


def test_a_typed_pair_equals_its_ingested_pair(store, tmp_path, tiny_bert):
    corpus = tmp_path / "pair.tsv"
    corpus.write_text(f"sentence1\tsentence2\tlabel\n{SENTENCE}\t{SECOND}\t1\n", encoding="utf-8")
    ingest(store, corpus=str(corpus), fmt="pairs-tsv", model=tiny_bert, annotator="whitespace", name="pair", progress=False)
    typed = scratch.attention_for_text(tiny_bert, SENTENCE, SECOND)
    np.testing.assert_array_equal(typed.attention, store.attention("pair", 0))
    assert scratch_tokens(typed) == stored_tokens(store, "pair")
    assert {t["segment"] for t in typed.tokens} == {0, 1}


def test_in_a_batch_beside_longer_examples_the_maps_agree_to_float16_rounding(store, tmp_path, tiny_bert):
    lines = [SENTENCE, "short one.", "a much longer sentence that pads the first two in their batch of three."]
    corpus = tmp_path / "three.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ingest(store, corpus=str(corpus), fmt="text", model=tiny_bert, annotator="whitespace", name="three", progress=False)
    for example, line in enumerate(lines):
        typed = scratch.attention_for_text(tiny_bert, line)
        np.testing.assert_allclose(typed.attention.astype(np.float32), store.attention("three", example).astype(np.float32), atol=2e-3)
        assert scratch_tokens(typed) == stored_tokens(store, "three", example)


def test_the_real_model_on_a_typed_sentence_equals_its_ingest(store, tmp_path, loaded_model):
    corpus = tmp_path / "real.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog.\n", encoding="utf-8")
    ingest(store, corpus=str(corpus), fmt="text", loaded=loaded_model, annotator="whitespace", name="real", progress=False)
    typed = scratch.attention_for_text(loaded_model, "The quick brown fox jumps over the lazy dog.")
    assert typed.attention.shape[:2] == (6, 12)
    np.testing.assert_array_equal(typed.attention, store.attention("real", 0))
    assert scratch_tokens(typed) == stored_tokens(store, "real")


def test_bad_input_and_truncation(tiny_bert):
    with pytest.raises(InvalidArgumentError, match="empty"):
        scratch.attention_for_text(tiny_bert, "   ")
    cut = scratch.attention_for_text(tiny_bert, "abcdefghij klmnop", max_length=8)
    assert cut.truncated and cut.full_length > 8 and cut.attention.shape[-1] == 8
    with pytest.raises(InvalidArgumentError, match="longer than the 8"):
        scratch.attention_for_text(tiny_bert, "abcdefghij klmnop", max_length=8, truncation="skip")
    assert scratch.cached_model(tiny_bert) is scratch.cached_model(tiny_bert)  # loaded once per process


def test_without_the_ingest_extra_it_says_so_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails as if not installed
    with pytest.raises(scratch.ModelRuntimeMissingError) as caught:
        scratch.attention_for_text("all-MiniLM-L6-v2", SENTENCE)
    assert str(caught.value) == (
        "running a model on typed text needs the 'ingest' extra (transformers is not installed): "
        "pip install torch==2.13.0 'attnstore[ingest]'"
    )
