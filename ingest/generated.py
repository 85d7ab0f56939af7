"""Generated datasets: inputs built from a model's own vocabulary, reproducible from a seed.

`generated/repeated_tokens:T20,50,200` is Olsson et al. 2022's test for induction heads: a first token, then T random
tokens, then the same T tokens again; a head that attends from each second-copy token to the token after its first
occurrence is an induction head (queries/induction_heads.py). Each example is stored as text, so it is a dataset of
the store like any corpus (tokens, words, SQL), and its options record what makes it: the seed, the lengths, the
number of examples per length, the first token and the candidate tokens.

The random tokens are drawn from the tokenizer's vocabulary entries that decode to ASCII letters and that a space and
those letters encode to, alone (" cat"), so the stored text tokenizes to exactly the ids drawn; every example is
checked for that before anything is stored.

`generated/needle:L1000,2000` is Wu et al. 2024's needle-in-a-haystack test for retrieval heads: a real corpus's
documents cut to L tokens with a needle sentence at five depths, then the question; ingested with the model's own
answer (`--generate`, ingest/generation.py) for queries/retrieval_heads.py.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterator
from typing import Any

from ..store.records import ExampleInput
from .errors import InvalidArgumentError

REPEATED_TOKENS = "generated/repeated_tokens"
NEEDLE = "generated/needle"
GENERATED = (REPEATED_TOKENS, NEEDLE)
PER_LENGTH = 16  # examples per T (TransformerLens' head detector uses a batch of 10 to 20)
FIRST_WORD = "The"  # no BOS is added by SmolLM2's tokenizer: the first token is an ordinary word, the same in all
WORD = re.compile(r"[A-Za-z]{2,}")


def is_generated(dataset: str | None) -> bool:
    return dataset is not None and dataset.split(":", 1)[0] in GENERATED


def parse_lengths(split: str) -> list[int]:
    """`T20,50,200` -> [20, 50, 200]."""
    if not re.fullmatch(r"T\d+(,\d+)*", split):
        raise InvalidArgumentError(
            f"{REPEATED_TOKENS}:{split}: name the lengths as T followed by numbers, e.g. {REPEATED_TOKENS}:T20,50,200"
        )
    lengths = [int(t) for t in split[1:].split(",")]
    if any(t < 2 for t in lengths) or len(set(lengths)) != len(lengths):
        raise InvalidArgumentError(f"{REPEATED_TOKENS}:{split}: each length T must be at least 2 and given once")
    return lengths


def candidate_tokens(tokenizer) -> list[int]:
    """The vocabulary ids that decode to two or more ASCII letters and that a space and those letters encode to, alone
    (byte-level BPE's " cat", WordPiece's "cat", SentencePiece's "▁cat")."""
    vocab = tokenizer.get_vocab()
    specials = set(tokenizer.all_special_ids)
    ids = sorted(i for i in vocab.values() if i not in specials)
    words = [tokenizer.decode([i]).strip() for i in ids]
    chosen = [(i, w) for i, w in zip(ids, words, strict=True) if WORD.fullmatch(w)]
    encoded = tokenizer([" " + w for _, w in chosen], add_special_tokens=False)["input_ids"]
    return [i for (i, _), e in zip(chosen, encoded, strict=True) if e == [i]]


class RepeatedTokens:
    """The examples of `generated/repeated_tokens:T...` for one tokenizer: `per_length` examples for each T, in the
    order example 0 of every T, then example 1, ... (so `--limit` keeps every length)."""

    def __init__(
        self, tokenizer, split: str, *, model: str = "", seed: int = 0, per_length: int = PER_LENGTH, max_length: int | None = None
    ):
        self.lengths = parse_lengths(split)
        self.model = model or type(tokenizer).__name__
        self.seed, self.per_length, self.tokenizer = seed, per_length, tokenizer
        first = tokenizer(FIRST_WORD, add_special_tokens=False)["input_ids"]
        if len(first) != 1:
            raise InvalidArgumentError(f"this tokenizer splits {FIRST_WORD!r} into {len(first)} tokens: the generator needs it as one")
        self.first = first[0]
        self.added = len(tokenizer(FIRST_WORD)["input_ids"]) - 1  # special tokens the tokenizer adds (a BOS, an EOS)
        self.candidates = candidate_tokens(tokenizer)
        if len(self.candidates) < max(self.lengths):
            raise InvalidArgumentError(f"this tokenizer has {len(self.candidates)} single-word tokens, fewer than T={max(self.lengths)}")
        longest = max(self.lengths)
        needed = self.added + 1 + 2 * longest
        if max_length is not None and needed > max_length:
            raise InvalidArgumentError(
                f"{REPEATED_TOKENS}:{split}: T={longest} makes {needed} tokens, over the limit of {max_length}; "
                f"use T up to {(max_length - 1 - self.added) // 2}"
            )

    @property
    def options(self) -> dict[str, Any]:
        """What makes the examples, stored as the dataset's options."""
        return {
            "lengths": self.lengths,
            "per_length": self.per_length,
            "seed": self.seed,
            "first_token": self.first,
            "first_word": FIRST_WORD,
            "candidates": f"{len(self.candidates)} ids in [{self.candidates[0]}, {self.candidates[-1]}]: "
            "ASCII letters that a space and the letters encode to",
            "tokenizer": self.model,  # the model whose tokenizer drew them (a path on this machine would differ elsewhere)
        }

    def token_ids(self) -> Iterator[tuple[int, list[int]]]:
        """(T, the T random ids) for every example, in dataset order: one generator per T, seeded with (seed, T)."""
        streams = {t: random.Random(f"{self.seed}:{t}") for t in self.lengths}
        for _ in range(self.per_length):
            for t in self.lengths:
                yield t, streams[t].sample(self.candidates, t)  # no id twice in a copy: each first occurrence is unique

    def read(self) -> Iterator[ExampleInput]:
        for position, (t, ids) in enumerate(self.token_ids()):
            copy = "".join(" " + self.tokenizer.decode([i]).strip() for i in ids)
            text = FIRST_WORD + copy * 2
            got = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if got != [self.first, *ids, *ids]:  # candidate_tokens' check holds for each alone: this, for the sequence
                raise InvalidArgumentError(f"{REPEATED_TOKENS}: example {position} does not tokenize back to the ids drawn")
            yield ExampleInput(position=position, text_a=text, doc_id=f"T{t}", label=str(t))

    def checksum(self) -> str:
        """sha256 of the options and every example's ids: what identifies the dataset in the store."""
        digest = hashlib.sha256(json.dumps(self.options, sort_keys=True).encode())
        for t, ids in self.token_ids():
            digest.update(f"{t}:{','.join(map(str, ids))};".encode())
        return digest.hexdigest()


# Wu et al. 2024's defaults (nightdessert/Retrieval_Head retrieval_head_detection.py): the needle, the question, the
# prompt of chat models, the 150-token buffer left for the prompt's other parts and the answer.
NEEDLE_TEXT = "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
QUESTION = "What is the best thing to do in San Francisco?"
DEPTHS = (0, 25, 50, 75, 100)  # percent of the context before the needle
BUFFER = 150
HAYSTACK = "gum/ontogum:dev"  # the real corpus the context is cut from: its documents' texts, in file order


def parse_context_lengths(split: str) -> list[int]:
    """`L1000,2000` -> [1000, 2000]."""
    if not re.fullmatch(r"L\d+(,\d+)*", split):
        raise InvalidArgumentError(f"{NEEDLE}:{split}: name the context lengths as L followed by numbers, e.g. {NEEDLE}:L1000,2000")
    lengths = [int(n) for n in split[1:].split(",")]
    if any(n <= BUFFER + 50 for n in lengths) or len(set(lengths)) != len(lengths):
        raise InvalidArgumentError(f"{NEEDLE}:{split}: each context length must be over {BUFFER + 50} tokens and given once")
    return lengths


class NeedleHaystack:
    """The examples of `generated/needle:L...`: for each context length L and depth d (DEPTHS), GUM's documents cut to
    L - BUFFER tokens with the needle put in at d % of them (moved back to the sentence break before), then the
    question; in the tokenizer's chat template where it has one, as the authors prompt chat models. Ingest them with
    `--generate 50` (ingest/generation.py) for `retrieval_heads`."""

    def __init__(self, tokenizer, split: str, documents: list[str], *, model: str = "", max_length: int | None = None):
        self.lengths = parse_context_lengths(split)
        self.tokenizer, self.model = tokenizer, model or type(tokenizer).__name__
        if max_length is not None and max(self.lengths) > max_length:
            raise InvalidArgumentError(f"{NEEDLE}:{split}: L={max(self.lengths)} is over the model's limit of {max_length} tokens")
        self.context = tokenizer("\n\n".join(documents), add_special_tokens=False)["input_ids"]
        if len(self.context) < max(self.lengths):
            raise InvalidArgumentError(f"{NEEDLE}:{split}: the haystack ({HAYSTACK}) has only {len(self.context)} tokens")
        self.needle_ids = tokenizer(NEEDLE_TEXT, add_special_tokens=False)["input_ids"]
        self.periods = set(tokenizer(".", add_special_tokens=False)["input_ids"])

    @property
    def options(self) -> dict[str, Any]:
        return {
            "lengths": self.lengths,
            "depths": list(DEPTHS),
            "needle": NEEDLE_TEXT,
            "question": QUESTION,
            "needle_ids": self.needle_ids,
            "haystack": HAYSTACK,
            "buffer": BUFFER,
            "chat_template": bool(getattr(self.tokenizer, "chat_template", None)),
            "tokenizer": self.model,
        }

    def prompt(self, length: int, depth: int) -> str:
        """The authors' `insert_needle`, then their prompt."""
        budget = length - BUFFER
        context = self.context[: budget - len(self.needle_ids)]
        if depth == 100:
            ids = context + self.needle_ids
        else:
            point = int(len(context) * depth / 100)
            while point > 0 and context[point - 1] not in self.periods:  # back to the sentence break before
                point -= 1
            ids = context[:point] + self.needle_ids + context[point:]
        text = self.tokenizer.decode(ids)
        if self.options["chat_template"]:
            content = f"<book>{text}</book>\nBased on the content of the book, Question: {QUESTION}\nAnswer:"
            messages = [{"role": "user", "content": content}]
            return str(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        return f"{text}Based on the content of the book, Question: {QUESTION}\nAnswer:"

    def read(self) -> Iterator[ExampleInput]:
        position = 0
        for length in self.lengths:
            for depth in DEPTHS:
                yield ExampleInput(position=position, text_a=self.prompt(length, depth), doc_id=f"L{length}-d{depth}", label=str(depth))
                position += 1

    def checksum(self) -> str:
        digest = hashlib.sha256(json.dumps(self.options, sort_keys=True).encode())
        for example in self.read():
            digest.update(example.text_a.encode())
        return digest.hexdigest()
