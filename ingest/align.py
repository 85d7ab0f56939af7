"""Explicit word <-> wordpiece alignment, for the two ways a model can be fed.

- `tokenization="text"` (default for corpora without gold tokenization: GLUE, plain
  text): the tokenizer sees the raw text, exactly what the model normally sees (and what
  fine-tuning and evaluation use). Each token is aligned to the word whose characters
  contain the token's first non-space character (offset mapping: GPT-2's "Ġcat" starts at
  the space before "cat"; a lone space piece belongs to the word after it); a token that
  starts between words (none in practice) has no word. Where the tokenizer and the word
  annotator split differently ("don't": spaCy "do" + "n't", WordPiece "don" + "'" + "t"),
  a token goes to the word it starts in.
- `tokenization="words"` (gold-tokenized corpora: CoNLL-U, as Clark et al. did): words
  are given already split (`is_split_into_words=True`), so each wordpiece knows its word
  from `word_ids()`. Byte-level BPE tokenizers get each word with a leading space there
  (`add_prefix_space=True`, `LoadedModel.tokenizer_for("words")`), as in running text.

Either way the segment comes from `sequence_ids()`, and special tokens come from the
tokenizer (no word, flagged `is_special`), never from hard-coded strings. A word may get
no pieces (e.g. a lone control character) or lose them to truncation; it still exists in
`words`.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from ..store.records import StoredExample
from .errors import InvalidArgumentError

TRUNCATION_POLICIES = ("truncate", "skip")
TOKENIZATIONS = ("text", "words")


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


def encode(tokenizer, example: StoredExample, max_length: int, truncation: str, tokenization: str = "words") -> Encoded:
    """Tokenize one example (see `encode_batch`)."""
    return encode_batch(tokenizer, [example], max_length, truncation, tokenization)[0]


def encode_batch(
    tokenizer, examples: list[StoredExample], max_length: int, truncation: str, tokenization: str = "words", aligned: bool = True
) -> list[Encoded]:
    """Tokenize examples from their raw text or their words, in one tokenizer call per kind (single / pair).

    An example longer than `max_length` is truncated (longest segment first) or, with
    `truncation="skip"`, returned with no input ids and `truncated=True`. `aligned=False`: the ids alone, with no
    tokens (no offsets, no word alignment): what a plan for worker processes keeps, each worker aligning its own
    part's examples (ingest/workers.py); the ids are the same.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise InvalidArgumentError(f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer; word alignment needs one")
    if tokenization not in TOKENIZATIONS:
        raise InvalidArgumentError(f"tokenization must be one of {TOKENIZATIONS}, not {tokenization!r}")
    from_text = tokenization == "text"
    kwargs = _TEXT_KWARGS if from_text else _WORD_KWARGS
    if not aligned:
        kwargs = {k: v for k, v in kwargs.items() if k != "return_offsets_mapping"}
    build = _build if aligned else _ids_only
    out: dict[int, Encoded] = {}
    segments = [_segments(e) for e in examples]
    for pair in (False, True):
        idx = [i for i, (_, b) in enumerate(segments) if bool(b) == pair]
        if not idx:
            continue
        if from_text:
            inputs_a: list = [_text(examples[i], 0) for i in idx]
            inputs_b: list | None = [_text(examples[i], 1) for i in idx] if pair else None
        else:
            inputs_a = [[w["form"] for w in segments[i][0]] for i in idx]
            inputs_b = [[w["form"] for w in segments[i][1]] for i in idx] if pair else None
        try:
            enc = tokenizer(inputs_a, inputs_b, truncation=False, **kwargs)
        except AssertionError as exc:  # e.g. a byte-level BPE tokenizer without add_prefix_space (see model.word_tokenizer_for)
            raise InvalidArgumentError(
                f"tokenizer {type(tokenizer).__name__} cannot encode words given already split "
                f"({str(exc).strip() or 'AssertionError'}); use --tokenize text"
            ) from None
        for j, i in enumerate(idx):
            full_length = len(enc["input_ids"][j])
            if full_length <= max_length:
                out[i] = build(tokenizer, examples[i], segments[i], enc, j, False, full_length, from_text)
            elif truncation == "skip":
                out[i] = Encoded(examples[i].id, examples[i].position, [], None, [], True, full_length)
            else:
                one = tokenizer(
                    [inputs_a[j]],
                    [inputs_b[j]] if inputs_b is not None else None,
                    max_length=max_length,
                    truncation="longest_first" if pair else True,
                    **kwargs,
                )
                out[i] = build(tokenizer, examples[i], segments[i], one, 0, True, full_length, from_text)
    return [out[i] for i in range(len(examples))]


_WORD_KWARGS = dict(is_split_into_words=True, return_offsets_mapping=True, add_special_tokens=True)
_TEXT_KWARGS = dict(return_offsets_mapping=True, add_special_tokens=True)


def _text(example: StoredExample, segment: int) -> str:
    text = example.text_a if segment == 0 else example.text_b
    if text is None:
        raise InvalidArgumentError(f"example {example.position} has no text for segment {segment}")
    return text


def _word_at(words: list[dict], starts: list[int], char: int) -> dict | None:
    """The word whose characters contain `char` (`starts`: the segment's word starts, ascending)."""
    k = bisect_right(starts, char) - 1
    return words[k] if k >= 0 and char < words[k]["char_end"] else None


def _skip_space(text: str, start: int, end: int) -> tuple[int, int]:
    """(the token's start without leading whitespace, the first non-space character at or after it).

    Byte-level BPE (GPT-2) and SentencePiece tokens such as "Ġcat" / "▁cat" may have offsets
    that include the space before the word: the token belongs to the word after the space. A
    token of whitespace only (a lone "Ġ" before "ran") keeps its start and belongs to the
    next word, as it does when words are given already split.
    """
    first = start
    while first < len(text) and text[first].isspace():
        first += 1
    return (first if first < end else start), first


def can_use_text(examples: list[StoredExample]) -> bool:
    """Raw-text input needs every word's character offsets in its segment's text."""
    return all(w["char_start"] is not None for e in examples for w in e.words)


def _build(tokenizer, example: StoredExample, segments, enc, j: int, truncated: bool, full_length: int, from_text: bool = False) -> Encoded:
    ids = enc["input_ids"][j]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    # read only when aligning raw text by character offsets (`from_text`)
    special = tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True) if from_text else []
    starts = [[w["char_start"] for w in seg] for seg in segments] if from_text else []
    texts = [_text(example, k) if seg else "" for k, seg in enumerate(segments)] if from_text else []
    tokens = []
    segment = 0
    rows = zip(pieces, ids, enc.word_ids(j), enc.sequence_ids(j), enc["offset_mapping"][j])
    for k, (token, token_id, word_idx, seq_id, (start, end)) in enumerate(rows):
        # Special tokens have no sequence id; they belong to the segment they close/open.
        segment = seq_id if seq_id is not None else segment
        if from_text:
            is_special = seq_id is None or bool(special[k])
            if not is_special:
                start, first = _skip_space(texts[seq_id], start, end)
            word = None if is_special else _word_at(segments[seq_id], starts[seq_id], first)
            tokens.append(
                dict(
                    token=token,
                    token_id=int(token_id),
                    word_position=None if word is None else word["position"],
                    segment=segment,
                    is_special=is_special,
                    char_start=None if is_special else start,
                    char_end=None if is_special else end,
                )
            )
            continue
        word = segments[seq_id][word_idx] if word_idx is not None and seq_id is not None else None
        word_start = None if word is None else word["char_start"]  # None: the word has no character offsets
        tokens.append(
            dict(
                token=token,
                token_id=int(token_id),
                word_position=None if word is None else word["position"],
                segment=segment,
                is_special=word is None,
                char_start=None if word_start is None else word_start + start,
                char_end=None if word_start is None else word_start + end,
            )
        )
    type_ids = enc["token_type_ids"][j] if "token_type_ids" in enc else None
    return Encoded(example.id, example.position, list(ids), type_ids, tokens, truncated, full_length)


def _ids_only(tokenizer, example: StoredExample, segments, enc, j: int, truncated: bool, full_length: int, from_text=False) -> Encoded:
    type_ids = enc["token_type_ids"][j] if "token_type_ids" in enc else None
    return Encoded(example.id, example.position, list(enc["input_ids"][j]), type_ids, [], truncated, full_length)


def pad_inputs(items, pad_id: int) -> dict:
    """Model inputs for one batch, padded to its longest item (dynamic padding): input_ids,
    attention_mask, and token_type_ids when the tokenizer gives them."""
    import torch

    width = max(e.length for e in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    types = torch.zeros((len(items), width), dtype=torch.long)
    for k, e in enumerate(items):
        ids[k, : e.length] = torch.tensor(e.input_ids)
        mask[k, : e.length] = 1
        if e.token_type_ids is not None:
            types[k, : e.length] = torch.tensor(e.token_type_ids)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if items[0].token_type_ids is not None:
        inputs["token_type_ids"] = types
    return inputs
