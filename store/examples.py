"""A dataset's stored examples with their words, as ingest tokenizes them (`StoredExample`): streamed in corpus order,
or looked up by id (a worker's part of a planned run)."""

from __future__ import annotations

from collections.abc import Iterator, Set

import sqlalchemy as sa

from .errors import NotFoundError
from .records import StoredExample
from .schema import Example, Word


def dataset_examples(
    engine, dataset_id: int, exclude_ids: Set[int] = frozenset(), batch_size: int = 256, start: int = 0, stop: int | None = None
) -> Iterator[StoredExample]:
    """Stream a dataset's examples (with words) in corpus order, skipping `exclude_ids`; those at
    positions start..stop-1 only, if given. `batch_size`: examples per SQL read; 256 is one window
    of ingest's batch planning, so its first forward pass waits for no more than that."""
    last = start - 1
    while True:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(Example.id, Example.position, Example.text_a, Example.text_b)
                .where(Example.dataset_id == dataset_id, Example.position > last, *([] if stop is None else [Example.position < stop]))
                .order_by(Example.position)
                .limit(batch_size)
            ).all()
            if not rows:
                return
            last = rows[-1].position
            yield from _with_words(conn, [r for r in rows if r.id not in exclude_ids])


def examples_by_id(engine, ids: list[int]) -> list[StoredExample]:
    """The examples (with words) of these ids, in the order given; NotFoundError naming an id not stored."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(Example.id, Example.position, Example.text_a, Example.text_b).where(Example.id.in_(ids))).all()
        found = {e.id: e for e in _with_words(conn, rows)}
    missing = [i for i in ids if i not in found]
    if missing:
        raise NotFoundError(f"example id {missing[0]} is not stored (its dataset was deleted?)")
    return [found[i] for i in ids]


def _with_words(conn, rows) -> list[StoredExample]:
    """The examples of these `examples` rows, each with its words (in position order)."""
    words: dict[int, list[dict]] = {r.id: [] for r in rows}
    if words:
        for example_id, position, segment, form, char_start, char_end in conn.execute(
            sa.select(Word.example_id, Word.position, Word.segment, Word.form, Word.char_start, Word.char_end)
            .where(Word.example_id.in_(list(words)))
            .order_by(Word.example_id, Word.position)
        ):
            word = {"position": position, "segment": segment, "form": form, "char_start": char_start, "char_end": char_end}
            words[example_id].append(word)
    return [StoredExample(r.id, r.position, r.text_a, r.text_b, tuple(words[r.id])) for r in rows]
