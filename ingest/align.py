"""Explicit word <-> wordpiece alignment.

Words are given to the tokenizer already split (`is_split_into_words=True`), as
Clark et al. do, so each wordpiece knows its word: `word_ids()` plus the segment
from `sequence_ids()`. Special tokens come from the tokenizer (no word, flagged
`is_special`), never from hard-coded strings. A word may get no pieces (e.g. a
lone control character) or lose them to truncation; it still exists in `words`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..store.records import StoredExample
from .errors import InvalidArgumentError

TRUNCATION_POLICIES = ("truncate", "skip")


@dataclass
class Encoded:
    example_id: int
    position: int
    input_ids: list[int]
    token_type_ids: list[int] | None
    tokens: list[dict]
    truncated: bool
    full_length: int

    @property
    def length(self) -> int:
        return len(self.input_ids)


def _segments(example: StoredExample) -> tuple[list[dict], list[dict]]:
    a = [w for w in example.words if w["segment"] == 0]
    b = [w for w in example.words if w["segment"] == 1]
    if not a:
        raise InvalidArgumentError(f"example {example.position} has no words to tokenize")
    return a, b


def encode(tokenizer, example: StoredExample, max_length: int, truncation: str) -> Encoded | None:
    """Tokenize one example from its words; None when it is too long and the policy is `skip`."""
    if not getattr(tokenizer, "is_fast", False):
        raise InvalidArgumentError(f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer; word alignment needs one")
    words_a, words_b = _segments(example)
    forms_a = [w["form"] for w in words_a]
    forms_b = [w["form"] for w in words_b] if words_b else None
    kwargs = dict(is_split_into_words=True, return_offsets_mapping=True, add_special_tokens=True)
    enc = tokenizer(forms_a, forms_b, truncation=False, **kwargs)
    full_length = len(enc["input_ids"])
    truncated = full_length > max_length
    if truncated:
        if truncation == "skip":
            return Encoded(example.id, example.position, [], None, [], True, full_length)
        enc = tokenizer(forms_a, forms_b, truncation="longest_first" if forms_b else True, max_length=max_length, **kwargs)
    by_segment = (words_a, words_b)
    tokens = []
    segment = 0
    for i, (token_id, word_idx, seq_id, (start, end)) in enumerate(
        zip(enc["input_ids"], enc.word_ids(), enc.sequence_ids(), enc["offset_mapping"])
    ):
        # Special tokens have no sequence id; they belong to the segment they close/open.
        segment = seq_id if seq_id is not None else segment
        word = by_segment[seq_id][word_idx] if word_idx is not None and seq_id is not None else None
        tokens.append(dict(
            token=tokenizer.convert_ids_to_tokens(token_id),
            token_id=int(token_id),
            word_position=None if word is None else word["position"],
            segment=segment,
            is_special=word is None,
            char_start=None if word is None or word["char_start"] is None else word["char_start"] + start,
            char_end=None if word is None or word["char_start"] is None else word["char_start"] + end,
        ))
    return Encoded(example.id, example.position, list(enc["input_ids"]), enc.get("token_type_ids"), tokens, truncated, full_length)
