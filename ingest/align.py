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


def encode(tokenizer, example: StoredExample, max_length: int, truncation: str) -> Encoded:
    """Tokenize one example from its words (see `encode_batch`)."""
    return encode_batch(tokenizer, [example], max_length, truncation)[0]


def encode_batch(tokenizer, examples: list[StoredExample], max_length: int, truncation: str) -> list[Encoded]:
    """Tokenize examples from their words, in one tokenizer call per kind (single / pair).

    An example longer than `max_length` is truncated (longest segment first) or, with
    `truncation="skip"`, returned with no input ids and `truncated=True`.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise InvalidArgumentError(f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer; word alignment needs one")
    out: dict[int, Encoded] = {}
    segments = [_segments(e) for e in examples]
    for pair in (False, True):
        idx = [i for i, (_, b) in enumerate(segments) if bool(b) == pair]
        if not idx:
            continue
        forms_a = [[w["form"] for w in segments[i][0]] for i in idx]
        forms_b = [[w["form"] for w in segments[i][1]] for i in idx] if pair else None
        enc = tokenizer(forms_a, forms_b, truncation=False, **_KWARGS)
        for j, i in enumerate(idx):
            full_length = len(enc["input_ids"][j])
            if full_length <= max_length:
                out[i] = _build(tokenizer, examples[i], segments[i], enc, j, False, full_length)
            elif truncation == "skip":
                out[i] = Encoded(examples[i].id, examples[i].position, [], None, [], True, full_length)
            else:
                one = tokenizer([forms_a[j]], [forms_b[j]] if pair else None, max_length=max_length,
                                truncation="longest_first" if pair else True, **_KWARGS)
                out[i] = _build(tokenizer, examples[i], segments[i], one, 0, True, full_length)
    return [out[i] for i in range(len(examples))]


_KWARGS = dict(is_split_into_words=True, return_offsets_mapping=True, add_special_tokens=True)


def _build(tokenizer, example: StoredExample, segments, enc, j: int, truncated: bool, full_length: int) -> Encoded:
    ids = enc["input_ids"][j]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    tokens = []
    segment = 0
    for token, token_id, word_idx, seq_id, (start, end) in zip(pieces, ids, enc.word_ids(j), enc.sequence_ids(j), enc["offset_mapping"][j]):
        # Special tokens have no sequence id; they belong to the segment they close/open.
        segment = seq_id if seq_id is not None else segment
        word = segments[seq_id][word_idx] if word_idx is not None and seq_id is not None else None
        has_chars = word is not None and word["char_start"] is not None
        tokens.append(dict(
            token=token,
            token_id=int(token_id),
            word_position=None if word is None else word["position"],
            segment=segment,
            is_special=word is None,
            char_start=word["char_start"] + start if has_chars else None,
            char_end=word["char_start"] + end if has_chars else None,
        ))
    type_ids = enc["token_type_ids"][j] if "token_type_ids" in enc else None
    return Encoded(example.id, example.position, list(ids), type_ids, tokens, truncated, full_length)
