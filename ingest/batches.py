"""How an ingest forms its batches: tokenized as they are planned, of similar length within windows of a few batches,
capped so that a batch's maps (or, for a Q/K run, its queries and keys) fit in memory whatever the corpus's lengths.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Set
from itertools import islice
from typing import TYPE_CHECKING

from .align import Encoded, can_use_text, encode_batch
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..store.records import StoredExample
    from .model import LoadedModel


# A batch's attention is batch x layers x heads x T x T floats: cap batch x T^2 so long
# inputs get smaller batches and peak memory does not depend on the corpus's lengths.
MAX_BATCH_PAIRS = 32 * 128 * 128
# A Q/K run's batch keeps batch x T x layers x (heads + kv heads) x d values: linear in T, so its batches are filled to a
# token budget instead (one 8,192-token document, or four of 2,048).
MAX_BATCH_TOKENS = 8192


def plan_batches(
    encoded: Iterable[Encoded],
    batch_size: int,
    window_batches: int = 8,
    max_pairs: int = MAX_BATCH_PAIRS,
    max_tokens: int | None = None,
) -> Iterator[list[Encoded]]:
    """Batches of similar length (sorted within windows of a few batches), at most `batch_size`
    examples and `max_pairs` (batch x longest length squared) token pairs each, or with `max_tokens` (the Q/K tier) at
    most that many tokens (batch x longest length) instead."""
    it = iter(encoded)
    while window := list(islice(it, batch_size * window_batches)):
        window.sort(key=lambda e: e.length)
        batch: list[Encoded] = []
        for e in window:
            size = (len(batch) + 1) * (e.length if max_tokens is not None else e.length**2)
            if batch and (len(batch) == batch_size or size > (max_tokens if max_tokens is not None else max_pairs)):
                yield batch
                batch = []
            batch.append(e)
        if batch:
            yield batch


def _checked(group, tokenization: str):
    if tokenization == "text" and not can_use_text(group):
        raise InvalidArgumentError(
            "--tokenize text needs each word's character offsets, which this dataset's words lack "
            "(gold-tokenized corpora): use --tokenize words"
        )
    return group


def planned_batches(
    examples: Iterator[StoredExample],
    loaded: LoadedModel,
    tokenization,
    max_length,
    truncation,
    batch_size,
    max_tokens: int | None = None,
    generate: int = 0,
    done: Set[int] = frozenset(),
    aligned: bool = True,
) -> Iterator[list[Encoded]]:
    """The batches of a dataset's `examples` (all of them, in corpus order), tokenized as they are
    planned (already-stored examples included, see `run_batches`). `generate`: each example continued by the model's
    greedy generation of up to that many tokens (ingest/generation.py), except those in `done` (stored already: the
    batch that holds them is not run). `aligned=False`: ids without tokens (`encode_batch`)."""
    pending = examples
    encoded = (
        enc
        for group in iter(lambda: list(islice(pending, 256)), [])
        for enc in encode_batch(
            loaded.tokenizer_for(tokenization), _checked(group, tokenization), max_length, truncation, tokenization, aligned
        )
    )
    if generate:
        from .generation import with_generation

        encoded = (e if e.example_id in done else with_generation(loaded, e, generate, max_length) for e in encoded)
    return plan_batches(encoded, batch_size, max_tokens=max_tokens)
