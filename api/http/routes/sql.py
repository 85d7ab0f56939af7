"""Read-only SQL over the metadata (docs/SQL.md), as `attnstore sql`: one statement, with a row limit, a time limit
and a byte limit (`Server.sql`)."""

from fastapi import APIRouter, Body, Query
from fastapi.responses import Response

from ....store.errors import InvalidArgumentError, TooLargeError
from ..encoding import json_value
from ..responses import answers, ok
from ..settings import ServeSettings
from ..state import Server
from . import Srv


def run_sql(srv: Server, query: str, params: dict | None, max_rows: int) -> dict:
    if len(query) > srv.settings.max_sql_chars:
        raise TooLargeError(f"SQL statement of {len(query)} characters; this server takes at most {srv.settings.max_sql_chars}")
    if not query.strip():
        raise InvalidArgumentError("SQL error: no statement given")
    columns, rows = srv.sql(query, params, max_rows=max_rows + 1)
    return {
        "columns": columns,
        "rows": [[json_value(v) for v in row] for row in rows[:max_rows]],
        "n_rows": min(len(rows), max_rows),
        "truncated": len(rows) > max_rows,
        "max_rows": max_rows,
        "timeout_s": srv.settings.sql_timeout_s,
    }


def router(settings: ServeSettings) -> APIRouter:
    api = APIRouter()
    SqlParams = Body(None, embed=True, description="Values of the statement's :name parameters.")

    @api.get("/api/sql", tags=["sql"], responses=answers(413))
    def sql_get(
        q: str = Query(..., description="One read-only statement (SELECT, WITH, VALUES, EXPLAIN)."),
        max_rows: int = Query(settings.default_sql_rows, ge=1, le=settings.max_sql_rows),
        s: Server = Srv,
    ) -> Response:
        """Read-only SQL over the metadata (tables and views of docs/SQL.md), with a row limit and a time limit."""
        with s.heavy():
            return ok(run_sql(s, q, None, max_rows))

    @api.post("/api/sql", tags=["sql"], responses=answers(413))
    def sql_post(
        query: str = Body(..., embed=True, description="One read-only statement; :name parameters."),
        params: dict[str, str | int | float | bool | None] | None = SqlParams,
        max_rows: int = Body(settings.default_sql_rows, embed=True, ge=1, le=settings.max_sql_rows),
        s: Server = Srv,
    ) -> Response:
        """Read-only SQL as JSON `{"query": ..., "params": {...}, "max_rows": N}`."""
        with s.heavy():
            return ok(run_sql(s, query, params, max_rows))

    return api
