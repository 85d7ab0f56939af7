"""Raw-text tokenization (the default for GLUE and plain text): the model sees exactly the tokenizer's
own encoding of the text, and each token is aligned to the word its first character is in."""

from __future__ import annotations

import pytest

from attnstore.ingest.align import encode_batch
from attnstore.ingest.annotate import annotate, make_annotator
from attnstore.ingest.datasets import BUILTIN, dataset_path, resolve_data_dir
from attnstore.store.records import StoredExample

pytest.importorskip("transformers")

GLUE_DEV = [s for s in BUILTIN if s.name.startswith("glue/") and s.split != "train"]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from attnstore.ingest.model import resolve_source

    return AutoTokenizer.from_pretrained(resolve_source("all-MiniLM-L6-v2")[1])


def stored(examples) -> list[StoredExample]:
    out = []
    for e in examples:
        words = tuple(dict(w, position=i) for i, w in enumerate(e.words))
        out.append(StoredExample(id=e.position, position=e.position, text_a=e.text_a, text_b=e.text_b, words=words))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("spec", GLUE_DEV, ids=lambda s: s.key)
def test_token_ids_equal_the_tokenizers_own_on_every_glue_dev_row(spec, tokenizer):
    try:
        path = dataset_path(spec, resolve_data_dir(None))
    except FileNotFoundError:
        pytest.skip(f"{spec.key} not in the data directory")
    examples = stored(annotate(list(spec.reader(path, **spec.options)), make_annotator("whitespace")))
    assert len(examples) == spec.n_examples
    encoded = encode_batch(tokenizer, examples, 512, "truncate", tokenization="text")
    own = tokenizer(
        [e.text_a for e in examples],
        [e.text_b for e in examples] if examples[0].text_b is not None else None,
        truncation=True,
        max_length=512,
    )["input_ids"]
    mismatched = [e.position for e, enc, ids in zip(examples, encoded, own) if enc.input_ids != ids]
    assert not mismatched, f"{len(mismatched)} rows differ, first {mismatched[:5]}"
    for e, enc in zip(examples, encoded):  # every real token lies in (starts in) the word it is aligned to
        words = {w["position"]: w for w in e.words}
        for t in enc.tokens:
            if not t["is_special"] and t["word_position"] is not None:
                w = words[t["word_position"]]
                assert w["segment"] == t["segment"] and w["char_start"] <= t["char_start"] < w["char_end"]


def test_contractions_align_to_the_word_each_piece_starts_in(tokenizer):
    words = [
        dict(position=0, segment=0, form="It", char_start=0, char_end=2),
        dict(position=1, segment=0, form="does", char_start=3, char_end=7),
        dict(position=2, segment=0, form="n't", char_start=7, char_end=10),
        dict(position=3, segment=0, form=".", char_start=10, char_end=11),
    ]
    example = StoredExample(id=1, position=0, text_a="It doesn't.", text_b=None, words=tuple(words))
    enc = encode_batch(tokenizer, [example], 512, "truncate", tokenization="text")[0]
    got = [(t["token"], t["word_position"], t["is_special"]) for t in enc.tokens]
    assert got == [
        ("[CLS]", None, True),
        ("it", 0, False),
        ("doesn", 1, False),
        ("'", 2, False),
        ("t", 2, False),
        (".", 3, False),
        ("[SEP]", None, True),
    ]
    assert enc.input_ids == tokenizer("It doesn't.")["input_ids"]
    by_words = encode_batch(tokenizer, [example], 512, "truncate", tokenization="words")[0]
    assert [t["token"] for t in by_words.tokens] == ["[CLS]", "it", "does", "n", "'", "t", ".", "[SEP]"]
