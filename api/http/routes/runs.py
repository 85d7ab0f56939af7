"""/api/info, and the runs and their examples: every run, one run's settings and manifest, a page of a run's
examples (filtered), one example and its tokens."""

import numpy as np
from fastapi import APIRouter, Query
from fastapi.responses import Response

from ..encoding import dumps, json_value, records
from ..lane import EXAMPLE, RUN, Lane, flag, integer, text
from ..responses import answers, ok
from ..settings import ServeSettings, server_version
from ..state import Server, cut_texts, inline_only
from . import Example, Offset, Run, Srv, answer_here_or_on_a_thread
from .scratch import scratch_available

# ------------------------------------------------------------------ the endpoints' work, one function each


def list_runs(srv: Server) -> dict:
    return {"runs": records(srv.store.runs())}


def run_detail(srv: Server, run: str) -> dict:
    return {"run": json_value(srv.info(run).as_dict())}


def list_examples(
    srv: Server,
    run: str,
    offset: int,
    limit: int,
    q: str | None,
    label: str | None,
    min_length: int | None,
    max_length: int | None,
    truncated: bool | None,
    skipped: bool | None,
) -> dict:
    """A filtered page of the run's examples (an unfiltered page: `examples_answer`, from kept texts)."""
    info = srv.info(run)
    inline_only()  # filtering scans the run's rows: on the thread pool
    frame = srv.examples(info)
    keep = np.ones(len(frame), dtype=bool)
    if q:
        text = frame["text_a"].fillna("") + "\n" + frame["text_b"].fillna("")
        keep &= text.str.contains(q, case=False, regex=False).to_numpy(bool)
    if label is not None:
        keep &= (frame["label"].astype(str) == label).to_numpy(bool)
    if min_length is not None:
        keep &= (frame["length"] >= min_length).to_numpy(bool)
    if max_length is not None:
        keep &= (frame["length"] <= max_length).to_numpy(bool)
    if truncated is not None:
        keep &= (frame["truncated"].astype(bool) == truncated).to_numpy(bool)
    if skipped is not None:
        keep &= (frame["skipped"].astype(bool) == skipped).to_numpy(bool)
    chosen = frame[keep]
    items = records(chosen.iloc[offset : offset + limit])
    for item in items:
        cut_texts(item, srv.settings.max_text_chars)
    return {"run": info.name, "n_examples": len(frame), "total": len(chosen), "offset": offset, "limit": limit, "items": items}


def example_detail(srv: Server, run: str, example: int) -> dict:
    info = srv.info(run)
    row = srv.example_row(info, example)
    tokens = records(srv.store.tokens(info.id, example))
    return {"run": info.name, "n_layers": info.n_layers, "n_heads": info.n_heads, "example": row, "tokens": tokens}


def example_answer(srv: Server, run: str, example: int) -> bytes:
    """`example_detail` as JSON bytes, kept while the store is unchanged (its text, not a dictionary per token): a kept
    answer is one look-up; a first one costs `store.tokens`, 4-7 ms of SQL and pandas."""
    info = srv.info(run)
    key = (info.id, info.status, info.n_stored, info.n_skipped, example)
    return srv.kept("example answers", key, lambda: dumps(example_detail(srv, run, example)).encode(), 4096)


def examples_answer(
    srv: Server,
    run: str,
    offset: int = 0,
    limit: int | None = None,
    q: str | None = None,
    label: str | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    truncated: bool | None = None,
    skipped: bool | None = None,
) -> Response:
    """The examples endpoint's answer (its parameters' defaults are the endpoint's; limit: the server's page). An
    unfiltered page is a join of the rows' kept JSON texts: the bytes `ok` gives for the same page as a dictionary."""
    limit = srv.settings.default_page if limit is None else limit
    if all(v is None for v in (label, min_length, max_length, truncated, skipped)) and not q:
        info = srv.info(run)
        texts = srv.example_texts(info)
        head = dumps({"run": info.name, "n_examples": len(texts), "total": len(texts), "offset": offset, "limit": limit, "items": None})
        assert head.endswith('"items":null}')
        return Response(head[: -len("null}")] + "[" + ",".join(texts[offset : offset + limit]) + "]}", media_type="application/json")
    return ok(list_examples(srv, run, offset, limit, q, label, min_length, max_length, truncated, skipped))


def example_response(srv: Server, run: str, example: int) -> Response:
    return Response(example_answer(srv, run, example), media_type="application/json")


def lanes(settings: ServeSettings) -> list[Lane]:
    """The examples page's and one example's plain requests, for the fast lane (lane.py), bounded as the endpoints."""
    page = {
        "offset": integer(0),
        "limit": integer(1, settings.max_page),
        "q": text(500),
        "label": text(200),
        "min_length": integer(0),
        "max_length": integer(0),
        "truncated": flag,
        "skipped": flag,
    }
    return [Lane(rf"/api/runs/{RUN}/examples", page, examples_answer), Lane(rf"/api/runs/{RUN}/examples/{EXAMPLE}", {}, example_response)]


# ------------------------------------------------------------------ the endpoints


def router(settings: ServeSettings) -> APIRouter:
    api = APIRouter()

    @api.get("/api/health", tags=["store"])
    async def health() -> Response:
        """Whether the server answers: `{"status": "ok"}`, with no store read (the cheapest request; the load bench's
        ceiling)."""
        return Response(b'{"status":"ok"}', media_type="application/json")

    @api.get("/api/info", tags=["store"])
    def info(s: Server = Srv) -> Response:
        """The store, whether this server can write, and the bounds of every response."""
        return ok(
            {
                "store": s.store.locations.describe(),
                "read_only": not settings.allow_save,
                "version": server_version(),
                "limits": settings.public(),
                "scratch": scratch_available(settings),
            }
        )

    @api.get("/api/runs", tags=["runs"])
    def runs(s: Server = Srv) -> Response:
        """Every run: name, id, model, dataset, split, status, counts and settings."""
        return ok(list_runs(s))

    @api.get("/api/runs/{run}", tags=["runs"], responses=answers(404))
    def run_info(run: str = Run, s: Server = Srv) -> Response:
        """One run's settings and provenance manifest."""
        return ok(run_detail(s, run))

    @api.get("/api/runs/{run}/examples", tags=["examples"], responses=answers(404))
    async def examples(
        run: str = Run,
        offset: int = Offset,
        limit: int = Query(settings.default_page, ge=1, le=settings.max_page, description="Rows per page."),
        q: str | None = Query(None, max_length=500, description="Text contained in text_a or text_b (case-insensitive)."),
        label: str | None = Query(None, max_length=200),
        min_length: int | None = Query(None, ge=0, description="Tokens, at least."),
        max_length: int | None = Query(None, ge=0, description="Tokens, at most."),
        truncated: bool | None = Query(None),
        skipped: bool | None = Query(None),
        s: Server = Srv,
    ) -> Response:
        """A page of the run's examples (position, texts, label, length, flags), filtered."""
        return await answer_here_or_on_a_thread(
            s, lambda: examples_answer(s, run, offset, limit, q, label, min_length, max_length, truncated, skipped)
        )

    @api.get("/api/runs/{run}/examples/{example}", tags=["examples"], responses=answers(404))
    async def example(run: str = Run, example: int = Example, s: Server = Srv) -> Response:
        """One example and its tokens with word alignment, POS, dependency head and relation."""
        return await answer_here_or_on_a_thread(s, lambda: example_response(s, run, example))

    return api
