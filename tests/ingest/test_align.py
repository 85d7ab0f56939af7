"""Word <-> wordpiece alignment on hard cases, with the default model's real tokenizer."""

import pytest

from attnstore.ingest.align import encode
from attnstore.store.records import StoredExample

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from attnstore.ingest.model import resolve_source

    return AutoTokenizer.from_pretrained(resolve_source("all-MiniLM-L6-v2")[1])


def example(words_a, words_b=()):
    words, position = [], 0
    for segment, forms in ((0, words_a), (1, words_b)):
        cursor = 0
        for form in forms:
            words.append(dict(position=position, segment=segment, form=form, char_start=cursor, char_end=cursor + len(form)))
            cursor += len(form) + 1
            position += 1
    return StoredExample(id=1, position=0, text_a=" ".join(words_a), text_b=" ".join(words_b) or None, words=tuple(words))


def aligned(tokenizer, words_a, words_b=(), max_length=512, truncation="truncate"):
    enc = encode(tokenizer, example(words_a, words_b), max_length, truncation)
    return enc, [(t["token"], t["word_position"]) for t in enc.tokens]


def test_contraction_pieces_map_to_their_syntactic_words(tokenizer):
    _, pairs = aligned(tokenizer, ["I", "do", "n't", "know"])
    assert pairs == [("[CLS]", None), ("i", 0), ("do", 1), ("n", 2), ("'", 2), ("t", 2), ("know", 3), ("[SEP]", None)]


def test_hyphenated_words_and_numbers_keep_all_pieces(tokenizer):
    _, pairs = aligned(tokenizer, ["long-term", "303-832-8160", "3.5%"])
    assert pairs[1:-1] == [
        ("long", 0),
        ("-", 0),
        ("term", 0),
        ("303", 1),
        ("-", 1),
        ("83", 1),
        ("##2", 1),
        ("-", 1),
        ("81", 1),
        ("##60", 1),
        ("3", 2),
        (".", 2),
        ("5", 2),
        ("%", 2),
    ]


def test_non_ascii_words_and_char_spans(tokenizer):
    enc, pairs = aligned(tokenizer, ["café", "Iran’s", "東京"])
    assert pairs[1:-1] == [("cafe", 0), ("iran", 1), ("’", 1), ("s", 1), ("東", 2), ("京", 2)]
    text = "café Iran’s 東京"
    spans = [text[t["char_start"] : t["char_end"]] for t in enc.tokens[1:-1]]
    assert spans == ["café", "Iran", "’", "s", "東", "京"]


def test_pairs_get_segments_and_continuing_word_positions(tokenizer):
    enc, pairs = aligned(tokenizer, ["Hi", "there"], ["Bye", "."])
    assert pairs == [("[CLS]", None), ("hi", 0), ("there", 1), ("[SEP]", None), ("bye", 2), (".", 3), ("[SEP]", None)]
    assert [t["segment"] for t in enc.tokens] == [0, 0, 0, 0, 1, 1, 1]
    assert enc.token_type_ids == [0, 0, 0, 0, 1, 1, 1]


def test_special_tokens_come_from_the_tokenizer(tokenizer):
    enc, _ = aligned(tokenizer, ["[CLS]", "is", "text"])
    special_ids = set(tokenizer.all_special_ids)
    flags = [t["is_special"] for t in enc.tokens]
    # a literal "[CLS]" typed in the text is a word, not the special token of the sequence
    assert flags == [True, False, False, False, True]
    assert all(t["token_id"] in special_ids for t in enc.tokens if t["is_special"])


def test_word_with_no_pieces_is_kept_out_of_tokens(tokenizer):
    _, pairs = aligned(tokenizer, ["a", "\u200b", "b"])
    assert pairs == [("[CLS]", None), ("a", 0), ("b", 2), ("[SEP]", None)]


def test_truncation_policy(tokenizer):
    words = ["word"] * 20
    enc, pairs = aligned(tokenizer, words, max_length=8)
    assert enc.truncated and enc.full_length == 22 and enc.length == 8
    assert pairs[-1] == ("[SEP]", None) and pairs[-2] == ("word", 5)
    skipped, _ = encode(tokenizer, example(words), 8, "skip"), None
    assert skipped.input_ids == [] and skipped.full_length == 22
