"""The registered queries (queries/engine/registry.py): listed with their parameters, run over a run on request (cached per
run state and parameters, bounded in examples read and rows returned), and saved to head_metrics (`--allow-save`)."""

import json
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from fastapi.responses import Response

from ....store.errors import ConflictError, InvalidArgumentError, ReadOnlyStoreError
from ..encoding import dumps, json_value, table
from ..lane import RUN, Lane
from ..responses import answers, ok
from ..settings import ServeSettings
from ..state import Server
from . import Run, Scan, Srv, answer_here_or_on_a_thread

if TYPE_CHECKING:
    from ....store.records import RunInfo


def list_queries() -> dict:
    import inspect

    from ....queries import QUERIES, load_all
    from ....queries.engine.registry import param_type

    load_all()
    out = []
    for spec in sorted(QUERIES.values(), key=lambda s: s.name):
        params = []
        for name, p in spec.parameters().items():
            kind, nullable = param_type(spec, name)
            required = p.default is inspect.Parameter.empty
            params.append(
                {
                    "name": name,
                    "type": "examples" if name == "examples" else kind.__name__,
                    "nullable": nullable,
                    "required": required,
                    "default": None if required else json_value(p.default),
                }
            )
        out.append({"name": spec.name, "summary": spec.summary, "per_head": spec.per_head, "parameters": params})
    return {"queries": out}


def prepare_query(srv: Server, run: str, name: str, raw: dict[str, str]) -> tuple["RunInfo", Any, dict, int]:
    """(run, query, its typed parameters, how many examples it may read)."""
    from ....queries.engine import get_query
    from ....queries.engine.registry import coerce_params

    spec = get_query(name)
    kwargs = coerce_params(spec, raw)
    info = srv.info(run)
    n = srv.check_query_size(info, name, spec.parameters(), kwargs)
    return info, spec, kwargs, n


def run_query_table(srv: Server, run: str, name: str, raw: dict[str, str], max_rows: int, scan: bool = False) -> dict:
    info, spec, kwargs, n = prepare_query(srv, run, name, raw)
    frame = srv.query_frame(info, name, kwargs, n_examples=n, scan=scan)
    shown = frame.head(max_rows)
    return {
        "query": name,
        "run": info.name,
        "per_head": spec.per_head,
        "params": json_value(kwargs),
        **table(shown),
        "n_rows": len(frame),
        "truncated": len(frame) > max_rows,
        "run_state": frame.attrs.get("run_state"),
        "n_examples": json_value(frame.attrs.get("n_examples")),
        "note": frame.attrs.get("note"),
    }


def query_answer(srv: Server, run: str, name: str, raw: dict[str, str], max_rows: int, scan: bool = False) -> str:
    """`run_query_table`'s answer as JSON text, kept (like the result it encodes) while the store is unchanged."""
    info = srv.info(run)
    key = (info.id, info.status, info.n_stored, info.n_skipped, name, json.dumps(raw, sort_keys=True), max_rows)
    return srv.kept("query answers", key, lambda: dumps(run_query_table(srv, run, name, raw, max_rows, scan)), 64)


def save_query(srv: Server, run: str, name: str, raw: dict[str, str], scan: bool = False) -> dict:
    if not srv.settings.allow_save:
        raise ReadOnlyStoreError("this server is read-only; start it with `attnstore serve --allow-save` to save query results")
    info, spec, kwargs, n = prepare_query(srv, run, name, raw)
    if not spec.per_head and spec.save is None:
        raise InvalidArgumentError(f"query {name!r} is not per head (one row per layer and head), so it cannot be saved to head_metrics")
    frame = srv.query_frame(info, name, kwargs, n_examples=n, scan=scan)
    if frame.attrs.get("run_state") != "complete":
        raise ConflictError(f"not saved: run {info.name!r} is incomplete; save its results once its ingest completes")
    if spec.save is not None:  # a query with a table of its own (head_match: head_matches)
        return {"query": name, "run": info.name, "saved": len(frame), "message": spec.save(srv.store, info.name, frame, kwargs)}
    n = srv.store.save_head_metrics(info.id, frame, prefix=name, params=kwargs)
    return {"query": name, "run": info.name, "saved": n, "metric_prefix": f"{name}."}


def query_response(s: Server, run: str, name: str, raw: dict[str, str], max_rows: int, scan: bool = False) -> Response:
    """The query endpoint's answer, in one of the heavy slots."""
    with s.heavy():
        return Response(query_answer(s, run, name, raw, max_rows, scan), media_type="application/json")


def lanes(settings: ServeSettings) -> list[Lane]:
    """A query asked with no parameters (its defaults), for the fast lane (lane.py); with any, FastAPI parses them."""

    def plain_query(s: Server, run: str, name: str) -> Response:
        return query_response(s, run, name, {}, settings.max_query_rows)

    return [Lane(rf"/api/runs/{RUN}/queries/(?P<name>[^/]+)", {}, plain_query)]


def router(settings: ServeSettings) -> APIRouter:
    api = APIRouter()

    @api.get("/api/queries", tags=["queries"])
    def queries() -> Response:
        """The registered queries with their parameters (type, default)."""
        return ok(list_queries())

    def query_params(request: Request) -> tuple[dict[str, str], int]:
        raw = dict(request.query_params)
        if len(raw) != len(request.query_params.multi_items()):
            raise InvalidArgumentError("give each query parameter once")
        raw.pop("scan", None)  # the endpoint's own (Scan), not the query's
        max_rows = settings.max_query_rows
        if "max_rows" in raw:
            try:
                max_rows = int(raw.pop("max_rows"))
            except ValueError:
                raise InvalidArgumentError("max_rows must be an integer") from None
            if not 1 <= max_rows <= settings.max_query_rows:
                raise InvalidArgumentError(f"max_rows must be between 1 and {settings.max_query_rows}")
        return raw, max_rows

    @api.get("/api/runs/{run}/queries/{name}", tags=["queries"], responses=answers(404, 409, 413))
    async def query(
        request: Request, run: str = Run, name: str = PathParam(description="A query of /api/queries."), scan: bool = Scan, s: Server = Srv
    ) -> Response:
        """Run a registered query (its parameters as query-string values, e.g. ?average=token); cached; at most
        `max_query_examples` examples read and `max_query_rows` rows returned (`max_rows` to return fewer)."""
        raw, max_rows = query_params(request)
        return await answer_here_or_on_a_thread(s, lambda: query_response(s, run, name, raw, max_rows, scan))

    @api.post("/api/runs/{run}/queries/{name}/save", tags=["queries"], responses=answers(403, 404, 409, 413))
    def save(
        request: Request, run: str = Run, name: str = PathParam(description="A per-head query."), scan: bool = Scan, s: Server = Srv
    ) -> Response:
        """Save a per-head query's results to head_metrics (only on a server started with --allow-save)."""
        raw, _ = query_params(request)
        with s.heavy():
            return ok(save_query(s, run, name, raw, scan))

    return api
