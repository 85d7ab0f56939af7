"""The generated repeated-token dataset (ingest/generated.py): reproducible from its seed, tokenizing back to the ids
drawn, every length kept by --limit, and T over the model's limit refused in one line."""

import pytest

from attnstore.ingest.errors import InvalidArgumentError
from attnstore.ingest.generated import RepeatedTokens, parse_lengths


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from attnstore.ingest.model import resolve_source

    return AutoTokenizer.from_pretrained(resolve_source("all-MiniLM-L6-v2")[1])


@pytest.fixture(scope="module", autouse=True)
def candidates_once():
    """candidate_tokens (decoding the whole vocabulary, ~1 s on MiniLM's) once per tokenizer in this module: a pure
    function of the tokenizer, so every RepeatedTokens below draws from the same list it would compute again."""
    from attnstore.ingest import generated

    computed: dict[int, list[int]] = {}
    real = generated.candidate_tokens

    def once(tokenizer) -> list[int]:
        if id(tokenizer) not in computed:
            computed[id(tokenizer)] = real(tokenizer)
        return computed[id(tokenizer)]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(generated, "candidate_tokens", once)
        yield


def test_examples_repeat_their_ids_and_the_seed_reproduces_them(tokenizer):
    made = RepeatedTokens(tokenizer, "T5,8", model="all-MiniLM-L6-v2", seed=3, per_length=2)
    examples = list(made.read())
    assert [e.doc_id for e in examples] == ["T5", "T8", "T5", "T8"] and [e.label for e in examples] == ["5", "8", "5", "8"]
    for example, (t, ids) in zip(examples, made.token_ids(), strict=True):
        got = tokenizer(example.text_a)["input_ids"]  # with [CLS] ... [SEP]
        assert got[1:-1] == [made.first, *ids, *ids] and len(set(ids)) == t
    again = RepeatedTokens(tokenizer, "T5,8", model="all-MiniLM-L6-v2", seed=3, per_length=2)
    assert [e.text_a for e in again.read()] == [e.text_a for e in examples] and again.checksum() == made.checksum()
    other = RepeatedTokens(tokenizer, "T5,8", model="all-MiniLM-L6-v2", seed=4, per_length=2)
    assert other.checksum() != made.checksum() and next(other.read()).text_a != examples[0].text_a
    assert made.options["lengths"] == [5, 8] and made.options["seed"] == 3 and made.options["tokenizer"] == "all-MiniLM-L6-v2"
    assert made.added == 2  # [CLS] and [SEP]


def test_bad_lengths_get_one_line(tokenizer):
    with pytest.raises(InvalidArgumentError, match=r"^generated/repeated_tokens:T20,x: name the lengths as T followed by numbers"):
        parse_lengths("T20,x")
    with pytest.raises(InvalidArgumentError, match="at least 2 and given once"):
        parse_lengths("T5,5")
    with pytest.raises(InvalidArgumentError, match=r"T=300 makes 603 tokens, over the limit of 512; use T up to 254"):
        RepeatedTokens(tokenizer, "T20,300", max_length=512)
