"""`attnstore serve`: an HTTP API and a web viewer over one store (FastAPI + uvicorn: the `serve` extra).

This module is the command (`serve`, loaded lazily by api/cli.py) and the import path of the app's public names:
`create_app` and `ServeSettings` (docs/SERVE.md), `allowed_hosts_for`. The app itself is the package api/http/
(settings, state, middleware, one router per resource; its docstring says what is where), and the corpus search's
SQL is the store's (store/search.py). Importing this module does not import FastAPI, so `attnstore serve --help`
works without the extra and the command fails in one line naming it.
"""

import dataclasses
import json
import logging
import os

import click

from .common import friendly_errors, open_store, require_extra, store_options
from .http import LOOPBACK, WILDCARD, ServeSettings, allowed_hosts_for, create_app
from .http.settings import log

__all__ = ["ServeSettings", "allowed_hosts_for", "create_app", "serve", "worker_app"]

# `attnstore serve --workers N` (N > 1) hands each uvicorn worker process its store and settings in this variable (JSON).
WORKER_ENV = "ATTNSTORE_SERVE_WORKER"
MAX_DEFAULT_WORKERS = 8
NODELAY_PROTOCOL = "attnstore.api.http.protocol:NoDelayProtocol"


def default_workers() -> int:
    """The CPUs this process may run on, at most MAX_DEFAULT_WORKERS: one worker process per core."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_DEFAULT_WORKERS))


def worker_app():
    """The app of one of `attnstore serve --workers N`'s processes (uvicorn's factory): its store and settings are the
    command's, from WORKER_ENV; the store is opened at startup, read-only unless --allow-save, as with one process."""
    from ..store.config import Locations

    given = json.loads(os.environ[WORKER_ENV])
    settings = given["settings"]
    settings["allowed_hosts"] = tuple(settings["allowed_hosts"])
    show_server_log()
    return create_app(Locations(**given["locations"]), ServeSettings(**settings))


# ------------------------------------------------------------------ the command


class ServerLog(logging.Handler):
    """This module's log lines (a query's progress through the maps, errors with their tracebacks) on the current
    stderr, in uvicorn's style: `attnstore serve` shows them; an app made by `create_app` leaves logging to its host."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(levelname)-9s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(self.format(record), err=True)
        except Exception:  # noqa: BLE001 (logging must not fail a request)
            self.handleError(record)


def show_server_log() -> None:
    if not any(isinstance(h, ServerLog) for h in log.handlers):
        log.addHandler(ServerLog())
    if log.level == logging.NOTSET or log.level > logging.INFO:
        log.setLevel(logging.INFO)


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (the API has no authentication).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free port).")
@click.option("--allow-save", is_flag=True, help="Let POST /api/runs/RUN/queries/NAME/save write per-head results (default: read-only).")
@click.option(
    "--sql-timeout",
    default=ServeSettings.sql_timeout_s,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds per SQL statement.",
)
@click.option(
    "--max-query-examples",
    default=ServeSettings.max_query_examples,
    show_default=True,
    type=click.IntRange(min=1),
    help="Examples a query computed on request may read.",
)
@click.option(
    "--threads",
    default=ServeSettings.threads,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Requests served at once by each worker process (the rest wait).",
)
@click.option(
    "--workers",
    default=None,
    type=click.IntRange(1, 64),
    help="Server processes, each with its own --threads, caches and --max-heavy-requests (Python runs one thread at a "
    f"time per process). Default: the number of CPUs, at most {MAX_DEFAULT_WORKERS}.",
)
@click.option(
    "--max-heavy-requests",
    default=ServeSettings.max_heavy_requests,
    show_default=True,
    type=click.IntRange(1, 64),
    help="SQL, query, maps and search requests served at once (more answer 503 with Retry-After).",
)
@click.option(
    "--scratch/--no-scratch",
    default=True,
    show_default=True,
    help="Run the run's model on text typed in the viewer (POST /api/runs/RUN/scratch; needs the ingest extra).",
)
@click.option(
    "--max-scratch-tokens",
    default=ServeSettings.max_scratch_tokens,
    show_default=True,
    type=click.IntRange(3, 4096),
    help="Tokens of a typed text the model is run on (more: 413).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests whose Host header names NAME (repeatable; '*': any). Default: only the --host's names "
    "(127.0.0.1, localhost, [::1] for a loopback host), against DNS rebinding.",
)
@click.option("--access-log/--no-access-log", default=True, show_default=True, help="Log every request.")
@click.option(
    "--fast-lane/--no-fast-lane",
    default=True,
    show_default=True,
    help="Answer the most asked GET requests (maps, examples, search, queries, metrics) from what is kept before FastAPI's routing "
    "(the same answers; docs/SERVE.md).",
)
@store_options
@friendly_errors
def serve(
    locations,
    host: str,
    port: int,
    allow_save: bool,
    sql_timeout: float,
    max_query_examples: int,
    threads: int,
    workers: int | None,
    max_heavy_requests: int,
    scratch: bool,
    max_scratch_tokens: int,
    allowed_hosts: tuple[str, ...],
    access_log: bool,
    fast_lane: bool,
):
    """Serve the store over HTTP: a JSON API (reference at /docs) and a web viewer at /.

    Read-only unless --allow-save; every response is bounded (docs/SERVE.md). Ctrl-C stops it.
    """
    require_extra("serve")
    import uvicorn

    from .http import protocol

    settings = ServeSettings(
        allow_save=allow_save,
        sql_timeout_s=sql_timeout,
        max_query_examples=max_query_examples,
        threads=threads,
        max_heavy_requests=max_heavy_requests,
        scratch=scratch,
        max_scratch_tokens=max_scratch_tokens,
        allowed_hosts=allowed_hosts_for(host, allowed_hosts),
        fast_lane=fast_lane,
    )
    locations = dataclasses.replace(locations, read_only=locations.read_only or not allow_save)
    store = open_store(locations, write=allow_save)  # a missing or out-of-date store fails here, in one line
    workers = workers or default_workers()
    show_server_log()
    if host not in LOOPBACK:
        click.echo(f"warning: listening on {host}: anyone who can reach it can read the store (no authentication)", err=True)
    if host.strip() in WILDCARD and not allowed_hosts:
        click.echo(
            f"note: listening on every interface but answering only the Host names {', '.join(settings.allowed_hosts)}; "
            "add the names clients use with --allowed-host NAME",
            err=True,
        )
    shown = f"[{host}]" if ":" in host else host
    try:  # before anything starts: a port in use is one line, not a second server beside the first (protocol.claim_port)
        port = protocol.claim_port(host, port)
    except OSError as exc:
        store.close()
        raise click.ClickException(f"cannot listen on {shown}:{port}: {_why(exc)}; pick another --port") from None
    click.echo(
        f"attnstore serve: {store.locations.describe()} ({'writable: --allow-save' if allow_save else 'read-only'}) "
        f"at http://{shown}:{port}/ (API reference: /docs), {workers} worker process{'es' if workers > 1 else ''} "
        f"of {threads} thread{'s' if threads > 1 else ''}; Ctrl-C stops it",
        err=True,
    )
    if workers == 1:
        try:
            uvicorn.run(create_app(store, settings), host=host, port=port, log_level="info", access_log=access_log)
        finally:
            store.close()
        return
    # Several processes: uvicorn starts each from an import path; each opens the store itself (a pool of connections
    # and file handles per process) and listens on its own socket of the port (api/http/protocol.py).
    store.close()
    os.environ[WORKER_ENV] = json.dumps({"locations": dataclasses.asdict(locations), "settings": settings.public()})
    try:
        protocol.run_workers(
            "attnstore.api.serve:worker_app",
            workers,
            host,
            port,
            factory=True,
            http=NODELAY_PROTOCOL,  # connections without Nagle's 40 ms waits (api/http/protocol.py)
            log_level="info",
            access_log=access_log,
        )
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {shown}:{port}: {_why(exc)}; pick another --port") from None


def _why(exc: OSError) -> str:
    import errno

    if exc.errno == errno.EADDRINUSE:
        return "the port is in use (another server, perhaps another `attnstore serve`, listens there)"
    return exc.strerror or str(exc)
