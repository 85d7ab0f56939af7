"""`attnstore serve`'s app: an HTTP API and a web viewer over one store (FastAPI + uvicorn: the `serve` extra).

`create_app(store_locations, settings)` builds the app: runs, examples (paginated, filtered),
one example's tokens and maps (JSON for small slices, `.npy` for binary), a typed sentence's tokens and maps
(the run's model run on it at once, the ingest extra needed: routes/scratch.py), per-head metrics
(saved, or computed on request for a few cheap queries), the registered queries, a corpus
search over tokens, words, POS and dependency relations, and read-only SQL; plus the viewer
(api/web/, static files, no build step) at `/`, a page to label attention-pattern classes at `/label`,
and a local API reference at `/docs`.

Everything is read through the Store API; nothing is written unless the app was made with
`allow_save` (then `POST .../save` stores a query's per-head results and `POST /api/label` a
labeller's pattern class). Every response is
bounded (ServeSettings): page sizes, cells per maps response, rows per table, examples per
computed query, a time limit and a byte limit per SQL statement. Errors are JSON `{"error": "..."}`
with a 4xx status for bad input (attnstore's NotFoundError 404, InvalidArgumentError 400, a slice
over the cell budget 413, a write to a read-only server 403, a query that would read maps this
server cannot keep 409 unless asked with `scan=1`); anything unexpected is logged here and
answered 500 with a one-line JSON error, never a traceback. The OpenAPI schema lists them.

Only requests whose Host header names the bound host (`allowed_hosts`) are answered, against DNS
rebinding. A run is addressed by its id or its name, a "/" in the name sent as %2F: the run's path
segment is kept encoded until the endpoint (`keep_run_segment`), since servers decode %2F before
routing.

Endpoints are plain `def`s: FastAPI runs them in its thread pool. The store's SQLAlchemy
engine is thread-safe and every read takes its own connection; the server's in-memory caches
are guarded by locks, queries computed on request run one at a time, and at most
`max_heavy_requests` heavy requests (SQL, queries, maps, search) at once: past that, 503.

The package, along its seams:

| module | what |
|---|---|
| `settings.py` | `ServeSettings`, the Host names a server answers (`allowed_hosts_for`), its errors and `status_for` |
| `encoding.py` | pandas / numpy / SQL values as JSON |
| `state.py` | `Server`: the store, its caches, the heavy-request slots; `MapsReading` (409 / progress of a query's map reads) |
| `middleware.py` | `AllowedHosts` (the Host header), `RunSegment` (a run's path segment kept encoded) |
| `lane.py` | `FastLane`: plain GET requests of maps, examples, search, queries and metrics answered before FastAPI's routing |
| `protocol.py` | `serve --workers N`: TCP_NODELAY on every connection, a listening socket per worker |
| `responses.py` | JSON answers, `{"error": ...}` for every error, the error answers of the OpenAPI schema |
| `routes/` | one `APIRouter` per resource: runs, maps, scratch (typed text), metrics, queries, search, sql, labels, web |

The corpus search's SQL is the store's (store/search.py); the `attnstore serve` command is api/serve.py.
Importing this package does not import FastAPI (the command's `--help` works without the extra):
`create_app` does, when called.
"""

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .settings import LOOPBACK, LOOPBACK_HOSTS, WILDCARD, ServeSettings, allowed_hosts_for, host_of, log, server_version, status_for
from .state import Server

if TYPE_CHECKING:
    from ...store import Store
    from ...store.config import Locations

__all__ = [
    "LOOPBACK",
    "LOOPBACK_HOSTS",
    "WILDCARD",
    "ServeSettings",
    "Server",
    "allowed_hosts_for",
    "create_app",
    "host_of",
    "status_for",
]


def create_app(
    store_locations: "Locations | Store",
    settings: ServeSettings | None = None,
    log_requests: bool = False,
    allowed_hosts: "Sequence[str] | None" = None,
):
    """The FastAPI app over one store: `Locations` (opened at startup, read-only unless `settings.allow_save`,
    closed at shutdown) or an open `Store` (used as it is). `allowed_hosts` (default `settings.allowed_hosts`):
    the Host header names answered, "*" for any (a test client's host is `testserver`)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request

    from ...store import Store
    from .lane import FastLane
    from .middleware import AllowedHosts, RequestGuard, RunSegment
    from .responses import add_error_handlers, answers, without_validation_answers
    from .routes import labels, maps, metrics, queries, runs, scratch, search, sql, tiles, web

    settings = settings or ServeSettings()
    if allowed_hosts is not None:
        settings = dataclasses.replace(settings, allowed_hosts=tuple(allowed_hosts))

    @asynccontextmanager
    async def lifespan(app):
        import anyio.to_thread

        # Sync endpoints run in anyio's thread pool; more threads than this only contend for the GIL.
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.threads
        if isinstance(store_locations, Store):
            app.state.server = Server(store_locations, settings)
            yield
            return
        locations = dataclasses.replace(store_locations, read_only=store_locations.read_only or not settings.allow_save)
        store = Store(locations)
        if settings.allow_save:
            store.writer.require_writable()
        app.state.server = Server(store, settings)  # the endpoints' `Srv` (routes/__init__.py)
        try:
            yield
        finally:
            store.close()

    app = FastAPI(
        title="attnstore",
        summary="Stored transformer attention maps: runs, examples, maps, per-head metrics, queries, search, read-only SQL.",
        version=server_version(),
        lifespan=lifespan,
        docs_url=None,  # /docs is a local page (api/web/docs.html): no CDN
        redoc_url=None,
        responses=answers(400, 500, 503),
    )
    if settings.fast_lane:  # inside RunSegment and AllowedHosts (lane.py)
        lanes = [lane for resource in (runs, maps, metrics, queries, search) for lane in resource.lanes(settings)]
        app.add_middleware(FastLane, lanes=lanes)
    # inside RunSegment (a run's segment as the routes match it) and the Host check
    app.add_middleware(RequestGuard, max_body_bytes=settings.max_body_bytes, routes=app.router.routes)
    app.add_middleware(RunSegment)
    app.add_middleware(AllowedHosts, allowed_hosts=list(settings.allowed_hosts), www_redirect=False)  # outermost: first
    without_validation_answers(app)
    add_error_handlers(app)

    if log_requests:

        @app.middleware("http")
        async def timing(request: Request, call_next):
            response = await call_next(request)
            log.info("%s %s -> %s", request.method, request.url.path, response.status_code)
            return response

    # ---- API (in this order: the schema lists the paths as they are added)
    for resource in (runs, maps, tiles, scratch, metrics, queries, search, sql, labels):
        app.include_router(resource.router(settings))

    # ---- the viewer and the API reference (static files, no build step, nothing from outside)
    app.include_router(web.router())
    web.mount_static(app)
    return app
