"""The SQL of the corpus search (`attnstore serve`: /api/runs/RUN/search and /api/runs/RUN/annotations).

Tokens found by word form, token text, UPOS tag and dependency relation, in corpus order; the tokens
of the examples they are in; and the UPOS tags and relations of a run's words, with their counts.
Every function takes `sql`, a callable that runs one read-only statement and returns its columns and
rows: the server passes its own (`Server.sql`, under its time and byte limits, api/http/state.py), so
the statements live here, beside the schema they read, and the limits stay the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class SqlRunner(Protocol):
    """One read-only statement with its :name parameters, at most `max_rows` rows -> (columns, rows)."""

    def __call__(self, query: str, params: dict | None = None, max_rows: int | None = None) -> tuple[list[str], list[tuple]]: ...


# The tags and relations of a run's words ({column}: upos or deprel), most frequent first.
ANNOTATION_SQL = (
    "SELECT w.{column} AS value, count(*) AS n FROM words w "
    "JOIN sequences s ON s.example_id = w.example_id "
    "WHERE s.run_id = :run_id AND w.{column} IS NOT NULL GROUP BY w.{column} ORDER BY n DESC, value"
)
ANNOTATION_COLUMNS = ("upos", "deprel")

SEARCH_SQL = """
SELECT e.position AS example, t.position AS position, t.token AS token, t.is_special AS is_special,
       t.word_position AS word_position, w.form AS word, w.upos AS upos, w.deprel AS deprel, w.head AS head,
       count(*) OVER () AS total
FROM tokens t
JOIN examples e ON e.id = t.example_id
LEFT JOIN words w ON w.example_id = t.example_id AND w.position = t.word_position{join}
WHERE t.run_id = :run_id{where}
ORDER BY e.position, t.position
LIMIT :limit OFFSET :offset
"""
# A word's pieces are consecutive tokens: its first piece is one whose previous token belongs to another word.
FIRST_PIECE_JOIN = "\nLEFT JOIN tokens p ON p.run_id = t.run_id AND p.example_id = t.example_id AND p.position = t.position - 1"
FIRST_PIECE = " AND (p.word_position IS NULL OR p.word_position <> t.word_position)"
CONTEXT_SQL = """
SELECT e.position AS example, t.token AS token, t.is_special AS is_special, t.word_position AS word_position
FROM examples e
JOIN tokens t ON t.run_id = :run_id AND t.example_id = e.id
WHERE e.dataset_id = :dataset_id AND e.position IN ({positions})
ORDER BY e.position, t.position
"""


def annotation_counts(sql: SqlRunner, run_id: Any, max_rows: int = 300) -> dict[str, list[dict]]:
    """The UPOS tags and dependency relations of the run's words, most frequent first (at most `max_rows` of each):
    {"upos": [{"value": "NOUN", "n": 12}, ...], "deprel": [...]}."""
    out = {}
    for column in ANNOTATION_COLUMNS:
        _, rows = sql(ANNOTATION_SQL.format(column=column), {"run_id": run_id}, max_rows=max_rows)
        out[column] = [{"value": v, "n": int(n)} for v, n in rows]
    return out


def find_tokens(
    sql: SqlRunner,
    run_id: Any,
    word: str | None,
    token: str | None,
    upos: str | None,
    deprel: str | None,
    first_piece: bool,
    limit: int,
    offset: int,
) -> tuple[list[dict[str, Any]], int]:
    """The run's tokens matching every criterion given (word form and token text compared in lower case, the UPOS tag,
    the relation), in corpus order, `limit` of them from `offset`; with `first_piece`, only the first piece of each word.

    Returns the hits, each a dict of SEARCH_SQL's columns as read (example, position, token, is_special, word_position,
    word, upos, deprel, head), and how many tokens match in all."""
    where: list[str] = []
    params: dict[str, Any] = {"run_id": run_id, "limit": limit, "offset": offset}
    if word:
        where.append("lower(w.form) = :word")
        params["word"] = word.strip().lower()
    if token:
        where.append("lower(t.token) = :token")
        params["token"] = token.strip().lower()
    if upos:
        where.append("w.upos = :upos")
        params["upos"] = upos.strip()
    if deprel:
        where.append("w.deprel = :deprel")
        params["deprel"] = deprel.strip()
    statement = SEARCH_SQL.format(
        join=FIRST_PIECE_JOIN if first_piece else "",
        where="".join(" AND " + c for c in where) + (FIRST_PIECE if first_piece else ""),
    )
    columns, rows = sql(statement, params, max_rows=limit)
    hits = [dict(zip(columns, row)) for row in rows]
    total = int(hits[0]["total"]) if hits else 0
    for hit in hits:
        hit.pop("total")
    if not hits and offset:  # a page past the last hit: no row to read the total from
        _, counted = sql(f"SELECT count(*) FROM ({statement.split('ORDER BY')[0]}) found", params)
        total = int(counted[0][0])
    return hits, total


def example_tokens(sql: SqlRunner, run_id: Any, dataset_id: Any, examples: Sequence[int]) -> list[tuple]:
    """The tokens of the run's examples at these positions (at least one), in one statement: rows of
    (example, token, is_special, word_position) in corpus order."""
    positions = {f"e{i}": e for i, e in enumerate(examples)}
    _, rows = sql(
        CONTEXT_SQL.format(positions=", ".join(f":{k}" for k in positions)),
        {"run_id": run_id, "dataset_id": dataset_id, **positions},
    )
    return rows
