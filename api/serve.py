"""`attnstore serve`: an HTTP API and a web viewer over one store (FastAPI + uvicorn: the `serve` extra).

`create_app(store_locations, settings)` builds the app: runs, examples (paginated, filtered),
one example's tokens and maps (JSON for small slices, `.npy` for binary), per-head metrics
(saved, or computed on request for a few cheap queries), the registered queries, a corpus
search over tokens, words, POS and dependency relations, and read-only SQL; plus the viewer
(api/web/, static files, no build step) at `/` and a local API reference at `/docs`.

Everything is read through the Store API; nothing is written unless the app was made with
`allow_save` (then `POST .../save` stores a query's per-head results). Every response is
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
engine is thread-safe and every read takes its own connection; the in-memory caches below
are guarded by locks, queries computed on request run one at a time, and at most
`max_heavy_requests` heavy requests (SQL, queries, maps, search) at once: past that, 503.

No `from __future__ import annotations` here: FastAPI reads the endpoints' annotations,
which name classes imported inside `create_app`.
"""

import dataclasses
import io
import json
import logging
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import click
import numpy as np

from ..store.errors import (
    AttnStoreError,
    ConflictError,
    CorruptInputError,
    InvalidArgumentError,
    NotFoundError,
    ReadOnlyStoreError,
    SchemaOutOfDateError,
    StorageIOError,
    TooLargeError,
)
from .common import friendly_errors, open_store, require_extra, store_options

if TYPE_CHECKING:
    import pandas as pd

    from ..store import Store
    from ..store.config import Locations
    from ..store.records import RunInfo

log = logging.getLogger("attnstore.serve")

WEB_DIR = Path(__file__).parent / "web"

# The Host header names of a server bound to a loopback address (IPv6 literals in brackets, as in a URL).
LOOPBACK_HOSTS: tuple[str, ...] = ("127.0.0.1", "localhost", "[::1]")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARD = ("0.0.0.0", "::", "")  # every interface: the names clients use are not known here
RETRY_AFTER_S = 5  # Retry-After of a 503 "server busy"
PREPARING = "docs/SERVE.md#preparing-a-store-for-serving"

# Per-head metrics the server computes on request when none are saved (cheap, one pass over the maps).
COMPUTABLE: dict[str, tuple[str, ...]] = {
    "entropy": ("entropy", "entropy_from_cls", "uniform_entropy", "uniform_entropy_from_cls"),
    "special_tokens": ("to_cls", "to_sep", "to_punct", "to_other", "sep_from_sep", "sep_from_other"),
    "relative_position": ("to_previous", "to_self", "to_next"),
}


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """The bounds of every response (see docs/SERVE.md)."""

    max_page: int = 500  # rows per page of examples
    default_page: int = 50
    max_cells: int = 2_000_000  # attention cells per maps response as .npy (4 MB of float16)
    max_json_cells: int = 250_000  # ... and as JSON (about 5 MB of text)
    max_sql_rows: int = 5000
    default_sql_rows: int = 1000
    max_sql_chars: int = 20_000
    sql_timeout_s: float = 10.0  # per SQL statement: user SQL, search, annotation counts
    max_query_examples: int = 2000  # examples a query computed on request may read
    max_query_rows: int = 10_000  # rows of a query result in one response
    max_search_page: int = 100  # hits per page of a corpus search (each reads one head of its example)
    max_top_k: int = 20
    cache_entries: int = 32  # computed query results kept in memory
    threads: int = 4  # requests served at once (the rest wait in line): more only contend for the GIL on 2 cores
    allow_save: bool = False  # POST .../save writes a query's per-head results to head_metrics
    max_sql_bytes: int = 8_000_000  # bytes of one SQL result (store/readonly.py stops a statement past it: 413)
    max_sql_value_bytes: int = 1_000_000  # bytes of one value in an SQL result
    max_heavy_requests: int = 2  # SQL, queries, maps and search served at once; more answer 503 with Retry-After
    heavy_wait_s: float = 2.0  # how long a heavy request waits for a free slot before that 503
    # Host headers answered (the rest: 400), against DNS rebinding; "*" answers any. `attnstore serve` sets the
    # bound host's names (plus --allowed-host); the default is the loopback names, with or without a port.
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS

    def public(self) -> dict:
        return dataclasses.asdict(self)


class ServerBusyError(AttnStoreError):
    """Every heavy-request slot stayed taken for `heavy_wait_s`: answered 503 with a Retry-After header."""


class ScanNeededError(ConflictError):
    """A query would read the maps of many examples on a store that cannot keep what it reads (409; `scan=1` asks anyway)."""


def allowed_hosts_for(host: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The Host header names a server bound to `host` answers: the loopback names for a loopback address, the
    address itself otherwise (an IPv6 literal in brackets), the loopback names for a wildcard address (0.0.0.0,
    ::) whose public names only the user knows, plus `extra` (--allowed-host); ("*",) when `extra` has "*"."""
    if "*" in extra:
        return ("*",)
    bound = host.strip().lower()
    if bound in LOOPBACK or bound in WILDCARD:
        names: tuple[str, ...] = LOOPBACK_HOSTS
    else:
        names = (f"[{bound.strip('[]')}]",) if ":" in bound else (bound,)
    for given in extra:
        name = given.strip().lower()
        if name.count(":") >= 2 and not name.startswith("["):
            name = f"[{name}]"  # a bare IPv6 address, as a Host header writes it
        elif not name.startswith("*"):
            name = host_of(name) or ""  # without a port: the port is not compared
        if not name or "*" in name[1:] or (name.startswith("*") and not name.startswith("*.")):
            raise InvalidArgumentError(f"--allowed-host {given!r}: give a host name, an address, '*.domain' or '*'")
        if name not in names:
            names = (*names, name)
    return names


def host_of(header: str | None) -> str | None:
    """The host of a Host header, without its port, lower case (an IPv6 literal keeps its brackets); None if malformed."""
    if not header:
        return None
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        if end < 0 or header[end + 1 :] and not re.fullmatch(r":\d{1,5}", header[end + 1 :]):
            return None
        return header[: end + 1]
    name, colon, port = header.partition(":")
    if colon and not re.fullmatch(r"\d{1,5}", port):
        return None
    return name or None


def status_for(exc: BaseException) -> int:
    """The HTTP status of an attnstore error."""
    if isinstance(exc, ServerBusyError):
        return 503
    if isinstance(exc, TooLargeError):
        return 413
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, ReadOnlyStoreError):
        return 403
    if isinstance(exc, ConflictError):
        return 409
    if isinstance(exc, InvalidArgumentError):
        return 400
    if isinstance(exc, (StorageIOError, SchemaOutOfDateError)):
        return 503
    if isinstance(exc, CorruptInputError):  # DamagedDataError: stored data fails its checks
        return 500
    return 500


# ------------------------------------------------------------------ JSON


def json_value(value: Any) -> Any:
    """A value from pandas / numpy / SQL as JSON: numbers as numbers, NaN and missing as null, times as ISO text."""
    import pandas as pd

    if isinstance(value, np.generic):
        value = value.item()
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal):
        return json_value(float(value))
    if isinstance(value, datetime | date | pd.Timestamp):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    return str(value)


def _rows(frame: "pd.DataFrame") -> list[list]:
    """A frame's rows as JSON values, converted a column at a time (row iteration over nullable dtypes is slow)."""
    columns = [[json_value(v) for v in frame.iloc[:, i].tolist()] for i in range(frame.shape[1])]
    return [list(row) for row in zip(*columns)] if columns else [[] for _ in range(len(frame))]


def records(frame: "pd.DataFrame") -> list[dict]:
    columns = [str(c) for c in frame.columns]
    return [dict(zip(columns, row)) for row in _rows(frame)]


def table(frame: "pd.DataFrame") -> dict:
    return {"columns": [str(c) for c in frame.columns], "rows": _rows(frame)}


def dumps(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


# ------------------------------------------------------------------ reading


def parse_indices(text: str | None, name: str, size: int) -> list[int]:
    """'0,2,5-7' (or nothing / 'all': every one) -> 0-based indices, each checked against `size`."""
    if text is None or not text.strip() or text.strip().lower() == "all":
        return list(range(size))
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                first, last = (int(x) for x in part.split("-", 1))
                if last < first:
                    raise ValueError
                values = range(first, last + 1)
            else:
                values = range(int(part), int(part) + 1)
        except ValueError:
            raise InvalidArgumentError(f"{name}={text!r}: give 0-based {name}s and ranges like 0,2,5-7") from None
        for v in values:
            if not 0 <= v < size:
                raise InvalidArgumentError(f"{name} {v} is out of range: the model has {size} {name}s (0..{size - 1})")
            if v not in out:
                out.append(v)
    return out


# ------------------------------------------------------------------ run names in paths

RUNS_PATH = "/api/runs/"


def keep_run_segment(scope: dict) -> dict:
    """The scope with the run's path segment (/api/runs/RUN/...) still percent-encoded, the rest decoded.

    Servers decode %2F in the path before routing, so a run named `glue/MRPC-dev-x`, sent as `glue%2FMRPC-dev-x`,
    would span two segments and match no route. From the undecoded `raw_path` the run's segment is kept as sent
    (the endpoints decode it: `run_name`); without a raw path it is re-encoded, so decoding it gives it back.
    """
    root = scope.get("root_path", "") or ""
    path = scope.get("path", "")
    if not path.startswith(root + RUNS_PATH):
        return scope
    raw = scope.get("raw_path")
    segment = tail = None
    if raw is not None:
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            text = ""
        at = text.find(RUNS_PATH)
        if at >= 0 and unquote(text[:at]) == root:
            segment, slash, rest = text[at + len(RUNS_PATH) :].partition("/")
            tail = slash + unquote(rest)
    if segment is None:
        segment, slash, rest = path[len(root + RUNS_PATH) :].partition("/")
        segment, tail = quote(segment, safe=""), slash + rest
    return {**scope, "path": root + RUNS_PATH + segment + tail}


class RunSegment:
    """ASGI middleware: `keep_run_segment` on every HTTP request."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope = keep_run_segment(scope)
        await self.app(scope, receive, send)


def run_name(segment: str) -> str:
    """A run's path segment as `keep_run_segment` leaves it -> the run's name (or id)."""
    return unquote(segment)


# ------------------------------------------------------------------ the server's state


class Server:
    """One store with the caches and locks the endpoints share."""

    def __init__(self, store: "Store", settings: ServeSettings):
        self.store = store
        self.settings = settings
        self._lock = threading.Lock()  # guards the caches
        self._compute = threading.Lock()  # one query computed at a time
        self._heavy = threading.BoundedSemaphore(settings.max_heavy_requests)  # SQL, queries, maps, search
        self._heavy_running = 0  # under _lock
        self._examples: OrderedDict[tuple, pd.DataFrame] = OrderedDict()
        self._results: OrderedDict[tuple, pd.DataFrame] = OrderedDict()
        self._facets: OrderedDict[tuple, dict] = OrderedDict()

    # ---- caches keyed by the run's state, so a run still being written is read afresh as it grows

    @staticmethod
    def _state(info: "RunInfo") -> tuple:
        return (info.id, info.status, info.n_stored, info.n_skipped)

    def _cached(self, cache: OrderedDict, key: tuple, make: Callable[[], Any], size: int) -> Any:
        with self._lock:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]
        value = make()
        with self._lock:
            cache[key] = value
            while len(cache) > size:
                cache.popitem(last=False)
        return value

    @contextmanager
    def heavy(self) -> Iterator[None]:
        """One of `max_heavy_requests` slots for a request that may read much (SQL, a query, maps), waited for at most
        `heavy_wait_s`; ServerBusyError (503, Retry-After) when none frees up."""
        if not self._heavy.acquire(timeout=self.settings.heavy_wait_s):
            with self._lock:
                running = self._heavy_running
            raise ServerBusyError(f"server busy: {running} heavy requests running; retry in {RETRY_AFTER_S} s")
        with self._lock:
            self._heavy_running += 1
        try:
            yield
        finally:
            with self._lock:
                self._heavy_running -= 1
            self._heavy.release()

    def can_keep(self, info: "RunInfo") -> bool:
        """Whether what a query reads of this run's maps is kept (summaries beside the run) for the next time."""
        return not self.store.read_only and self.store.can_keep_summaries(info.id)

    def info(self, run: str) -> "RunInfo":
        return self.store.run_info(run)

    def examples(self, info: "RunInfo") -> "pd.DataFrame":
        """The run's examples (store.examples), cached while the run does not change."""
        return self._cached(self._examples, self._state(info), lambda: self.store.examples(info.id), 8)

    def example_row(self, info: "RunInfo", example: int) -> dict:
        frame = self.examples(info)
        rows = frame[frame["example"] == example]
        if rows.empty:
            raise NotFoundError(f"run {info.name!r} has no example {example} (it stores {info.n_stored} examples)")
        row = records(rows.head(1))[0]
        if row["skipped"]:
            raise NotFoundError(f"example {example} of run {info.name!r} was skipped (longer than {info.max_length} tokens)")
        return row

    def stored_positions(self, info: "RunInfo") -> list[int]:
        frame = self.examples(info)
        return [int(e) for e in frame.loc[~frame["skipped"].astype(bool), "example"]]

    def sql(self, query: str, params: dict | None = None, max_rows: int | None = None) -> tuple[list[str], list[tuple]]:
        """One read-only statement (store/readonly.py, as `Store.sql`) under this server's time and byte limits
        (TooLargeError, 413, past `max_sql_bytes` in all or `max_sql_value_bytes` in one value)."""
        from ..store.readonly import run_readonly_sql

        store = self.store
        target = store.locations.db_url if store.engine.dialect.name == "sqlite" else store.engine
        columns, rows = run_readonly_sql(
            target,
            query,
            params,
            max_rows,
            timeout_s=self.settings.sql_timeout_s,
            max_bytes=self.settings.max_sql_bytes,
            max_value_bytes=self.settings.max_sql_value_bytes,
        )
        return columns or [], rows

    # ---- queries

    def query_frame(self, info: "RunInfo", name: str, kwargs: dict, n_examples: int | None = None, scan: bool = True) -> "pd.DataFrame":
        """A registered query's result, computed at most once per run state and parameters, one at a time.

        Computing it may read the maps of up to `n_examples` examples (where nothing is summarised for it). Where that
        read is kept for the next time (summaries on a writable store) it is done; where not (a read-only store, a
        layout-1 run) only when `scan`, else ScanNeededError (409) at the first example read."""
        from ..queries import run_query
        from ..store import progress

        key = (*self._state(info), name, json.dumps(kwargs, sort_keys=True, default=str))
        with self._lock:
            if key in self._results:
                self._results.move_to_end(key)
                return self._results[key]
        with self._compute:
            with self._lock:
                if key in self._results:
                    return self._results[key]
            reading = MapsReading(self, info, name, n_examples, refuse=not scan and not self.can_keep(info))
            with progress.reporting(reading.advance):
                frame = run_query(self.store, name, run=info.id, **kwargs)
            reading.done()
            with self._lock:
                self._results[key] = frame
                while len(self._results) > self.settings.cache_entries:
                    self._results.popitem(last=False)
            return frame

    def check_query_size(self, info: "RunInfo", name: str, params: dict, kwargs: dict) -> int:
        """Refuse (413) a query that would read more than `max_query_examples` examples; else how many it may read."""
        n = info.n_stored
        if "examples" in params and kwargs.get("examples") is not None:
            n = min(n, len(kwargs["examples"]))
        if "max_examples" in params:
            bound = kwargs.get("max_examples", params["max_examples"].default)
            if isinstance(bound, int):
                n = min(n, bound)
        if "example" in params and "examples" not in params:
            n = 1
        cap = self.settings.max_query_examples
        if n > cap:
            hint = f"pass examples=0-{cap - 1}" if "examples" in params else f"pass max_examples={cap}" if "max_examples" in params else ""
            raise TooLargeError(
                f"query {name!r} over run {info.name!r} would read {n} examples; this server computes a query over at most "
                f"{cap} examples{': ' + hint if hint else ''} (or save its results with `attnstore query {name} --save` "
                "and read them from head_metrics)"
            )
        return n


class MapsReading:
    """Listens to a query's map reads (store/progress.py: one call per example read): refuses the read at its first
    example where it is not kept and was not asked for (`refuse`), else logs how far it got every 10 s."""

    def __init__(self, srv: Server, info: "RunInfo", name: str, n_examples: int | None, refuse: bool):
        self.srv, self.info, self.name, self.n, self.refuse = srv, info, name, n_examples, refuse
        self.read = 0
        self.started = self.logged = 0.0

    def advance(self, n: int = 1) -> None:
        now = time.monotonic()
        if not self.read:
            if self.refuse:
                raise ScanNeededError(scan_message(self.srv, self.info, self.name, self.n))
            self.started = self.logged = now
            log.info("%s over run %r: reading the maps of up to %s examples", self.name, self.info.name, self.n or "all")
        self.read += n
        if now - self.logged >= 10:
            self.logged = now
            took = now - self.started
            log.info("%s over run %r: %d of up to %s examples read (%.0f s)", self.name, self.info.name, self.read, self.n or "?", took)

    def done(self) -> None:
        if self.read:
            log.info("%s over run %r: %d examples read in %.1f s", self.name, self.info.name, self.read, time.monotonic() - self.started)


def scan_message(srv: Server, info: "RunInfo", name: str, n: int | None) -> str:
    """Why a query's read of the maps was refused, and what prepares the store for it."""
    why = (
        "this server's store is read-only"
        if srv.store.read_only
        else "this run's arrays are in layout 1 (`attnstore db upgrade-arrays` moves them to layout 2)"
    )
    if name == "run_similarity":
        prepare = f"run it once on a writable store: `attnstore query run_similarity --run {info.name} --param other=OTHER`"
    else:
        prepare = f"summarise the run first: `attnstore summarize --run {info.name}`"
    return (
        f"{name} over run {info.name!r} must read the maps of {'up to ' + str(n) if n else 'all its'} examples "
        f"({info.n_layers} layers x {info.n_heads} heads each): nothing it can read instead is kept for this run, and {why}, "
        f"so nothing read now would be kept and every restart would read them again; {prepare} ({PREPARING}), "
        "or ask again with scan=1 to read them now"
    )


# ------------------------------------------------------------------ the endpoints' work, one function each


def list_runs(srv: Server) -> dict:
    return {"runs": records(srv.store.runs())}


def run_detail(srv: Server, run: str) -> dict:
    info = srv.info(run)
    return {"run": json_value(dataclasses.asdict(info))}


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
    info = srv.info(run)
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
    return {
        "run": info.name,
        "n_examples": len(frame),
        "total": len(chosen),
        "offset": offset,
        "limit": limit,
        "items": records(chosen.iloc[offset : offset + limit]),
    }


def example_detail(srv: Server, run: str, example: int) -> dict:
    info = srv.info(run)
    row = srv.example_row(info, example)
    tokens = srv.store.tokens(info.id, example)
    return {"run": info.name, "n_layers": info.n_layers, "n_heads": info.n_heads, "example": row, "tokens": records(tokens)}


def attention_slice(srv: Server, run: str, example: int, layer: str | None, head: str | None, binary: bool) -> tuple[dict, np.ndarray]:
    """Checked layers and heads, then the maps: (description, array (layer, head, query, key))."""
    info = srv.info(run)
    layers = parse_indices(layer, "layer", info.n_layers)
    heads = parse_indices(head, "head", info.n_heads)
    length = int(srv.example_row(info, example)["length"])
    cells = len(layers) * len(heads) * length * length
    budget = srv.settings.max_cells if binary else srv.settings.max_json_cells
    if cells > budget:
        raise TooLargeError(
            f"{len(layers)} layer(s) x {len(heads)} head(s) x {length} x {length} tokens = {cells} cells, over this server's "
            f"budget of {budget} cells per {'.npy' if binary else 'JSON'} response; ask for a slice: layer=L&head=H"
            + ("" if binary else f", or format=npy (budget {srv.settings.max_cells})")
        )
    maps = srv.store.attention(info.id, example, layer=layers, head=heads)
    about = {"run": info.name, "example": example, "layers": layers, "heads": heads, "shape": list(maps.shape), "dtype": str(maps.dtype)}
    return about, maps


def head_metric_list(srv: Server, run: str) -> dict:
    info = srv.info(run)
    saved = srv.store.head_metrics(info.id)
    metrics = []
    if not saved.empty:
        for (metric, params), group in saved.groupby(["metric", "params"], sort=True):
            values = group["value"].dropna()
            metrics.append(
                {
                    "metric": metric,
                    "params": params,
                    "source": "saved",
                    "n": len(group),
                    "min": json_value(values.min()) if len(values) else None,
                    "max": json_value(values.max()) if len(values) else None,
                }
            )
    names = {m["metric"] for m in metrics}
    for query, columns in COMPUTABLE.items():
        for column in columns:
            if f"{query}.{column}" not in names:
                metrics.append({"metric": f"{query}.{column}", "params": None, "source": "on request", "n": None, "min": None, "max": None})
    return {"run": info.name, "n_layers": info.n_layers, "n_heads": info.n_heads, "metrics": metrics}


def head_metric_matrix(srv: Server, run: str, metric: str, params: str | None, scan: bool = False) -> dict:
    """A layers x heads matrix of one metric: saved values, else (entropy, special_tokens,
    relative_position) computed now over at most `max_query_examples` examples (`scan`: as `Server.query_frame`)."""
    info = srv.info(run)
    saved = srv.store.head_metrics(info.id, metric=metric)
    values = np.full((info.n_layers, info.n_heads), np.nan)
    out: dict[str, Any] = {"run": info.name, "metric": metric, "n_layers": info.n_layers, "n_heads": info.n_heads}
    if not saved.empty:
        available = sorted(saved["params"].unique().tolist(), key=lambda p: (p != "{}", p))
        if params is not None and params not in available:
            raise NotFoundError(f"metric {metric!r} of run {info.name!r} is saved with params {available}, not {params!r}")
        chosen = params if params is not None else available[0]
        rows = saved[saved["params"] == chosen]
        for layer, head_, value in zip(rows["layer"], rows["head"], rows["value"]):
            if 0 <= layer < info.n_layers and 0 <= head_ < info.n_heads:
                values[int(layer), int(head_)] = np.nan if value is None else value
        out.update(source="saved", params=chosen, params_available=available)
    else:
        query, _, column = metric.partition(".")
        if column not in COMPUTABLE.get(query, ()):
            known = ", ".join(f"{q}.*" for q in COMPUTABLE)
            raise NotFoundError(
                f"run {info.name!r} has no saved metric {metric!r} (save it with `attnstore query {query or 'NAME'} --save`); "
                f"this server computes only {known} on request"
            )
        positions = srv.stored_positions(info)
        if not positions:
            raise NotFoundError(f"run {info.name!r} has no stored examples")
        cap = srv.settings.max_query_examples
        kwargs: dict[str, Any] = {"examples": positions[:cap]} if len(positions) > cap else {}
        with srv.heavy():
            frame = srv.query_frame(info, query, kwargs, n_examples=min(cap, len(positions)), scan=scan)
        for layer, head_, value in zip(frame["layer"], frame["head"], frame[column]):
            values[int(layer), int(head_)] = value
        note = (
            f"computed now over the first {cap} of {len(positions)} examples"
            if kwargs
            else f"computed now over all {len(positions)} examples"
        )
        out.update(source="computed", params="{}", params_available=[], n_examples=min(cap, len(positions)), note=note)
    finite = values[np.isfinite(values)]
    out.update(
        values=[[json_value(v) for v in row] for row in values.tolist()],
        min=json_value(finite.min()) if finite.size else None,
        max=json_value(finite.max()) if finite.size else None,
    )
    return out


def list_queries() -> dict:
    import inspect

    from ..queries import QUERIES, load_all
    from ..queries.registry import param_type

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
    from ..queries.registry import coerce_params, get_query

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


def save_query(srv: Server, run: str, name: str, raw: dict[str, str], scan: bool = False) -> dict:
    if not srv.settings.allow_save:
        raise ReadOnlyStoreError("this server is read-only; start it with `attnstore serve --allow-save` to save query results")
    info, spec, kwargs, n = prepare_query(srv, run, name, raw)
    if not spec.per_head:
        raise InvalidArgumentError(f"query {name!r} is not per head (one row per layer and head), so it cannot be saved to head_metrics")
    frame = srv.query_frame(info, name, kwargs, n_examples=n, scan=scan)
    if frame.attrs.get("run_state") != "complete":
        raise ConflictError(f"not saved: run {info.name!r} is incomplete; save its results once its ingest completes")
    n = srv.store.save_head_metrics(info.id, frame, prefix=name, params=kwargs)
    return {"query": name, "run": info.name, "saved": n, "metric_prefix": f"{name}."}


def annotation_values(srv: Server, run: str) -> dict:
    """UPOS tags and dependency relations of the run's words, most frequent first (for the search form)."""
    info = srv.info(run)

    def count() -> dict:
        out = {}
        for column in ("upos", "deprel"):
            _, rows = srv.sql(
                f"SELECT w.{column} AS value, count(*) AS n FROM words w "
                "JOIN sequences s ON s.example_id = w.example_id "
                f"WHERE s.run_id = :run_id AND w.{column} IS NOT NULL GROUP BY w.{column} ORDER BY n DESC, value",
                {"run_id": info.id},
                max_rows=300,
            )
            out[column] = [{"value": v, "n": int(n)} for v, n in rows]
        return out

    return {"run": info.name, **srv._cached(srv._facets, srv._state(info), count, 16)}


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


def search(
    srv: Server,
    run: str,
    word: str | None,
    token: str | None,
    upos: str | None,
    deprel: str | None,
    pieces: str,
    layer: int | None,
    head: int | None,
    k: int,
    offset: int,
    limit: int,
) -> dict:
    """Tokens whose word form / token / UPOS / relation match, by example; for a chosen head, where each one attends."""
    info = srv.info(run)
    if not any(v not in (None, "") for v in (word, token, upos, deprel)):
        raise InvalidArgumentError("search needs at least one of word, token, upos, deprel")
    if pieces not in ("first", "all"):
        raise InvalidArgumentError(f"pieces={pieces!r}: give first (one hit per word) or all (every wordpiece)")
    if (layer is None) != (head is None):
        raise InvalidArgumentError("give both layer and head (0-based) to see where the hits attend, or neither")
    if layer is not None and not 0 <= layer < info.n_layers:
        raise InvalidArgumentError(f"layer {layer} is out of range: the model has {info.n_layers} layers (0..{info.n_layers - 1})")
    if head is not None and not 0 <= head < info.n_heads:
        raise InvalidArgumentError(f"head {head} is out of range: the model has {info.n_heads} heads (0..{info.n_heads - 1})")
    where: list[str] = []
    params: dict[str, Any] = {"run_id": info.id, "limit": limit, "offset": offset}
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
    first = pieces == "first" and not token
    sql = SEARCH_SQL.format(
        join=FIRST_PIECE_JOIN if first else "", where="".join(" AND " + c for c in where) + (FIRST_PIECE if first else "")
    )
    columns, rows = srv.sql(sql, params, max_rows=limit)
    hits = [dict(zip(columns, map(json_value, row))) for row in rows]
    for hit in hits:
        hit["is_special"] = bool(hit["is_special"])
    total = int(hits[0].pop("total")) if hits else 0
    for hit in hits[1:]:
        hit.pop("total")
    if not hits and offset:
        _, counted = srv.sql(f"SELECT count(*) FROM ({sql.split('ORDER BY')[0]}) found", params)
        total = int(counted[0][0])
    examples = sorted({h["example"] for h in hits})
    contexts: dict[int, dict] = {e: {"tokens": [], "is_special": [], "word_position": []} for e in examples}
    if examples:  # every listed example's tokens in one statement
        positions = {f"e{i}": e for i, e in enumerate(examples)}
        _, rows = srv.sql(
            CONTEXT_SQL.format(positions=", ".join(f":{k}" for k in positions)),
            {"run_id": info.id, "dataset_id": info.dataset_id, **positions},
        )
        for example, tok, special, word_position in rows:
            context = contexts[example]
            context["tokens"].append(str(tok))
            context["is_special"].append(bool(special))
            context["word_position"].append(json_value(word_position))
    if layer is not None:
        for example in examples:
            contexts[example]["_maps"] = srv.store.attention(info.id, example, layer=[layer], head=[head])[0, 0]
    for hit in hits:
        context = contexts[hit["example"]]
        head_word = hit.get("head")
        hit["head_positions"] = [] if head_word is None else [i for i, w in enumerate(context["word_position"]) if w == head_word]
        if layer is not None:
            row = context["_maps"][hit["position"]].astype(np.float64)
            top = np.argsort(-row, kind="stable")[:k]
            hit["attention"] = np.round(row, 4).tolist()
            hit["top"] = [{"position": int(j), "token": context["tokens"][j], "weight": round(float(row[j]), 4)} for j in top]
    for context in contexts.values():
        context.pop("_maps", None)
    return {
        "run": info.name,
        "layer": layer,
        "head": head,
        "k": k,
        "total": total,
        "offset": offset,
        "limit": limit,
        "hits": hits,
        "examples": {str(e): c for e, c in contexts.items()},
    }


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


# ------------------------------------------------------------------ the app


# What each error status of the API means (the OpenAPI schema's responses; every one has the body {"error": "..."}).
ERROR_STATUS = {
    400: "Bad input (a parameter, layer, head, page size or SQL statement), or a Host header this server does not answer",
    403: "A write asked of a read-only server (started without --allow-save)",
    404: "No such run, example, query, metric or endpoint",
    409: "The query must read the maps of many examples and this server cannot keep what it reads (ask again with "
    "scan=1, or prepare the store: docs/SERVE.md); or, for a save, the run is incomplete",
    413: "Over a bound: cells per maps response, examples per query, SQL statement length or result size",
    500: "Damaged stored data (the message names the run, example, chunk), or an unexpected error (in the server's log)",
    503: "The store is not open or its storage failed; or, with a Retry-After header, every heavy-request slot is taken",
}


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

    from fastapi import Body, Depends, FastAPI, Query, Request
    from fastapi import Path as PathParam
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, JSONResponse, Response
    from fastapi.staticfiles import StaticFiles
    from pydantic import BaseModel, Field
    from starlette.datastructures import Headers
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    from ..store import Store

    settings = settings or ServeSettings()
    if allowed_hosts is not None:
        settings = dataclasses.replace(settings, allowed_hosts=tuple(allowed_hosts))
    holder: dict[str, Server] = {}

    class ApiError(BaseModel):
        """Every error's body."""

        error: str = Field(description="One line saying what went wrong and what to do; never a traceback.")

    def answers(*statuses: int) -> dict:
        return {status: {"model": ApiError, "description": ERROR_STATUS[status]} for status in statuses}

    class AllowedHosts(TrustedHostMiddleware):
        """Starlette's TrustedHostMiddleware (Host header names, `*.domain` patterns, `*` for any; the port is not
        compared), answering a refused Host with this API's JSON error and never redirecting."""

        async def __call__(self, scope, receive, send):
            if self.allow_any or scope["type"] not in ("http", "websocket"):
                await self.app(scope, receive, send)
                return
            header = Headers(scope=scope).get("host")
            host = host_of(header)
            if host is not None and any(host == p or (p.startswith("*.") and host.endswith(p[1:])) for p in self.allowed_hosts):
                await self.app(scope, receive, send)
                return
            shown = repr(header[:100]) if header else "(none)"
            message = (
                f"Host header {shown} is not one this server answers ({', '.join(self.allowed_hosts)}): "
                "start it with `attnstore serve --allowed-host NAME` to answer another name"
            )
            await JSONResponse({"error": message}, status_code=400)(scope, receive, send)

    @asynccontextmanager
    async def lifespan(app):
        import anyio.to_thread

        # Sync endpoints run in anyio's thread pool; more threads than this only contend for the GIL.
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.threads
        if isinstance(store_locations, Store):
            holder["server"] = Server(store_locations, settings)
            yield
            return
        locations = dataclasses.replace(store_locations, read_only=store_locations.read_only or not settings.allow_save)
        store = Store(locations)
        if settings.allow_save:
            store.require_writable()
        holder["server"] = Server(store, settings)
        try:
            yield
        finally:
            store.close()

    app = FastAPI(
        title="attnstore",
        summary="Stored transformer attention maps: runs, examples, maps, per-head metrics, queries, search, read-only SQL.",
        version=_version(),
        lifespan=lifespan,
        docs_url=None,  # /docs is a local page (api/web/docs.html): no CDN
        redoc_url=None,
        responses=answers(400, 500, 503),
    )
    app.add_middleware(RunSegment)
    app.add_middleware(AllowedHosts, allowed_hosts=list(settings.allowed_hosts), www_redirect=False)  # outermost: first

    schema_of = app.openapi

    def openapi() -> dict:
        """FastAPI's schema without its 422 answers: this server answers a request that fails validation 400."""
        spec = schema_of()
        for methods in spec.get("paths", {}).values():
            for operation in methods.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            spec.get("components", {}).get("schemas", {}).pop(name, None)
        return spec

    app.openapi = openapi  # type: ignore[method-assign]

    def srv() -> Server:
        if "server" not in holder:
            raise StorageIOError("the store is not open (the server is starting or stopping)")
        return holder["server"]

    def ok(payload: Any, status: int = 200) -> Response:
        return Response(dumps(payload), status_code=status, media_type="application/json")

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(AttnStoreError)
    def attnstore_error(request: Request, exc: AttnStoreError):
        status = status_for(exc)
        if isinstance(exc, ServerBusyError):
            log.warning("%s %s: %s", request.method, request.url.path, exc)
            return JSONResponse({"error": str(exc)}, status_code=status, headers={"Retry-After": str(RETRY_AFTER_S)})
        if status >= 500:
            log.error("%s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return error(status, str(exc))

    @app.exception_handler(RequestValidationError)
    def validation_error(request: Request, exc: RequestValidationError):
        problems = []
        for e in exc.errors():
            loc = list(e.get("loc", ()))
            where = ".".join(str(x) for x in (loc[1:] if loc and loc[0] in ("query", "path", "body", "header") else loc))
            problems.append(
                f"{where or 'request'}: {e.get('msg', 'invalid')}" + (f" (got {e['input']!r})" if "input" in e and where else "")
            )
        return error(400, "; ".join(problems) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, exc: StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path} (see /docs)"
        return error(exc.status_code, message)

    @app.exception_handler(Exception)
    def unexpected(request: Request, exc: Exception):
        log.error("%s %s failed", request.method, request.url.path, exc_info=(type(exc), exc, exc.__traceback__))
        return error(500, f"internal error ({type(exc).__name__}); the server's log has the details")

    if log_requests:

        @app.middleware("http")
        async def timing(request: Request, call_next):
            response = await call_next(request)
            log.info("%s %s -> %s", request.method, request.url.path, response.status_code)
            return response

    def run_param(
        run: str = PathParam(description="Run id (`attnstore runs`), or its name with any `/` in it sent as `%2F`."),
    ) -> str:
        return run_name(run)

    Run = Depends(run_param)
    Scan = Query(
        False,
        description="Read the maps even where nothing summarised serves the query and this server cannot keep what it "
        "reads (a read-only store): without it such a query answers 409 before reading (docs/SERVE.md).",
    )
    Example = PathParam(description="Example position in the corpus (0-based).")
    Offset = Query(0, ge=0, description="Rows to skip.")
    Layers = Query(None, description="Layers, 0-based: 3, 0,2 or 0-5; default every layer.", max_length=200)
    Heads = Query(None, description="Heads, 0-based: 3, 0,2 or 0-11; default every head.", max_length=200)
    SqlParams = Body(None, embed=True, description="Values of the statement's :name parameters.")

    # ---- API

    @app.get("/api/info", tags=["store"])
    def info() -> Response:
        """The store, whether this server can write, and the bounds of every response."""
        s = srv()
        return ok(
            {
                "store": s.store.locations.describe(),
                "read_only": not settings.allow_save,
                "version": _version(),
                "limits": settings.public(),
            }
        )

    @app.get("/api/runs", tags=["runs"])
    def runs() -> Response:
        """Every run: name, id, model, dataset, split, status, counts and settings."""
        return ok(list_runs(srv()))

    @app.get("/api/runs/{run}", tags=["runs"], responses=answers(404))
    def run_info(run: str = Run) -> Response:
        """One run's settings and provenance manifest."""
        return ok(run_detail(srv(), run))

    @app.get("/api/runs/{run}/examples", tags=["examples"], responses=answers(404))
    def examples(
        run: str = Run,
        offset: int = Offset,
        limit: int = Query(settings.default_page, ge=1, le=settings.max_page, description="Rows per page."),
        q: str | None = Query(None, max_length=500, description="Text contained in text_a or text_b (case-insensitive)."),
        label: str | None = Query(None, max_length=200),
        min_length: int | None = Query(None, ge=0, description="Tokens, at least."),
        max_length: int | None = Query(None, ge=0, description="Tokens, at most."),
        truncated: bool | None = Query(None),
        skipped: bool | None = Query(None),
    ) -> Response:
        """A page of the run's examples (position, texts, label, length, flags), filtered."""
        return ok(list_examples(srv(), run, offset, limit, q, label, min_length, max_length, truncated, skipped))

    @app.get("/api/runs/{run}/examples/{example}", tags=["examples"], responses=answers(404))
    def example(run: str = Run, example: int = Example) -> Response:
        """One example and its tokens with word alignment, POS, dependency head and relation."""
        return ok(example_detail(srv(), run, example))

    @app.get(
        "/api/runs/{run}/examples/{example}/attention",
        tags=["examples"],
        responses={200: {"content": {"application/json": {}, "application/octet-stream": {}}}, **answers(404, 413)},
    )
    def attention(
        run: str = Run,
        example: int = Example,
        layer: str | None = Layers,
        head: str | None = Heads,
        format: str = Query("json", pattern="^(json|npy)$", description="json (nested lists) or npy (numpy's binary file)."),
        digits: int | None = Query(None, ge=1, le=8, description="JSON only: round to this many decimals."),
    ) -> Response:
        """One example's maps (layer, head, query, key), as JSON or .npy, within the cell budget."""
        s = srv()
        with s.heavy():
            return maps_response(s, run, example, layer, head, format, digits)

    def maps_response(s: Server, run: str, example: int, layer: str | None, head: str | None, format: str, digits: int | None) -> Response:
        about, maps = attention_slice(s, run, example, layer, head, binary=format == "npy")
        if format == "npy":
            buffer = io.BytesIO()
            np.save(buffer, maps, allow_pickle=False)
            name = re.sub(r"[^A-Za-z0-9._-]+", "_", about["run"])[:80]
            return Response(
                buffer.getvalue(),
                media_type="application/octet-stream",
                headers={
                    "Content-Disposition": f'attachment; filename="{name}-example{example}.npy"',
                    "X-Attnstore-Layers": ",".join(map(str, about["layers"])),
                    "X-Attnstore-Heads": ",".join(map(str, about["heads"])),
                },
            )
        values = maps.astype(np.float64)
        if digits is not None:
            values = np.round(values, digits)
        return ok({**about, "attention": values.tolist()})

    @app.get("/api/runs/{run}/head_metrics", tags=["head metrics"], responses=answers(404))
    def head_metrics(run: str = Run) -> Response:
        """Saved per-head metrics of the run (with their parameters), and those computed on request."""
        return ok(head_metric_list(srv(), run))

    @app.get("/api/runs/{run}/head_metrics/{metric}", tags=["head metrics"], responses=answers(404, 409))
    def head_metric(
        run: str = Run,
        metric: str = PathParam(description="query.column, e.g. entropy.entropy", max_length=200),
        params: str | None = Query(None, max_length=2000, description="The saved parameters (JSON text) when several were saved."),
        scan: bool = Scan,
    ) -> Response:
        """One metric as a layers x heads matrix: saved, else computed now (entropy, special_tokens, relative_position)."""
        return ok(head_metric_matrix(srv(), run, metric, params, scan))

    @app.get("/api/queries", tags=["queries"])
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

    @app.get("/api/runs/{run}/queries/{name}", tags=["queries"], responses=answers(404, 409, 413))
    def query(
        request: Request, run: str = Run, name: str = PathParam(description="A query of /api/queries."), scan: bool = Scan
    ) -> Response:
        """Run a registered query (its parameters as query-string values, e.g. ?average=token); cached; at most
        `max_query_examples` examples read and `max_query_rows` rows returned (`max_rows` to return fewer)."""
        raw, max_rows = query_params(request)
        s = srv()
        with s.heavy():
            return ok(run_query_table(s, run, name, raw, max_rows, scan))

    @app.post("/api/runs/{run}/queries/{name}/save", tags=["queries"], responses=answers(403, 404, 409, 413))
    def save(request: Request, run: str = Run, name: str = PathParam(description="A per-head query."), scan: bool = Scan) -> Response:
        """Save a per-head query's results to head_metrics (only on a server started with --allow-save)."""
        raw, _ = query_params(request)
        s = srv()
        with s.heavy():
            return ok(save_query(s, run, name, raw, scan))

    @app.get("/api/runs/{run}/annotations", tags=["search"], responses=answers(404))
    def annotations(run: str = Run) -> Response:
        """The UPOS tags and dependency relations of the run's words, with counts."""
        s = srv()
        with s.heavy():
            return ok(annotation_values(s, run))

    @app.get("/api/runs/{run}/search", tags=["search"], responses=answers(404))
    def search_tokens(
        run: str = Run,
        word: str | None = Query(None, max_length=200, description="Word form (case-insensitive)."),
        token: str | None = Query(None, max_length=200, description="Token (wordpiece) text (case-insensitive)."),
        upos: str | None = Query(None, max_length=32, description="Universal POS tag, e.g. NOUN."),
        deprel: str | None = Query(None, max_length=64, description="Dependency relation, e.g. nsubj."),
        pieces: str = Query("first", description="first: the first wordpiece of each matching word; all: every piece."),
        layer: int | None = Query(None, ge=0, description="With head: where each hit attends in this head."),
        head: int | None = Query(None, ge=0),
        k: int = Query(5, ge=1, le=settings.max_top_k, description="Most-attended tokens listed per hit."),
        offset: int = Offset,
        limit: int = Query(20, ge=1, le=settings.max_search_page),
    ) -> Response:
        """Corpus search: tokens by word, token, POS or relation, by example; with layer and head, each hit's
        attention row and its top-k attended tokens."""
        s = srv()
        with s.heavy():
            return ok(search(s, run, word, token, upos, deprel, pieces, layer, head, k, offset, limit))

    @app.get("/api/sql", tags=["sql"], responses=answers(413))
    def sql_get(
        q: str = Query(..., description="One read-only statement (SELECT, WITH, VALUES, EXPLAIN)."),
        max_rows: int = Query(settings.default_sql_rows, ge=1, le=settings.max_sql_rows),
    ) -> Response:
        """Read-only SQL over the metadata (tables and views of docs/SQL.md), with a row limit and a time limit."""
        s = srv()
        with s.heavy():
            return ok(run_sql(s, q, None, max_rows))

    @app.post("/api/sql", tags=["sql"], responses=answers(413))
    def sql_post(
        query: str = Body(..., embed=True, description="One read-only statement; :name parameters."),
        params: dict[str, str | int | float | bool | None] | None = SqlParams,
        max_rows: int = Body(settings.default_sql_rows, embed=True, ge=1, le=settings.max_sql_rows),
    ) -> Response:
        """Read-only SQL as JSON `{"query": ..., "params": {...}, "max_rows": N}`."""
        s = srv()
        with s.heavy():
            return ok(run_sql(s, query, params, max_rows))

    # ---- the viewer and the API reference (static files, no build step, nothing from outside)

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/docs", include_in_schema=False)
    def docs() -> FileResponse:
        return FileResponse(WEB_DIR / "docs.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnstore")
    except PackageNotFoundError:
        return "0"


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
    help="Requests served at once (the rest wait).",
)
@click.option(
    "--max-heavy-requests",
    default=ServeSettings.max_heavy_requests,
    show_default=True,
    type=click.IntRange(1, 64),
    help="SQL, query, maps and search requests served at once (more answer 503 with Retry-After).",
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
    max_heavy_requests: int,
    allowed_hosts: tuple[str, ...],
    access_log: bool,
):
    """Serve the store over HTTP: a JSON API (reference at /docs) and a web viewer at /.

    Read-only unless --allow-save; every response is bounded (docs/SERVE.md). Ctrl-C stops it.
    """
    require_extra("serve")
    import uvicorn

    settings = ServeSettings(
        allow_save=allow_save,
        sql_timeout_s=sql_timeout,
        max_query_examples=max_query_examples,
        threads=threads,
        max_heavy_requests=max_heavy_requests,
        allowed_hosts=allowed_hosts_for(host, allowed_hosts),
    )
    locations = dataclasses.replace(locations, read_only=locations.read_only or not allow_save)
    store = open_store(locations, write=allow_save)  # a missing or out-of-date store fails here, in one line
    app = create_app(store, settings)
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
    click.echo(
        f"attnstore serve: {store.locations.describe()} ({'writable: --allow-save' if allow_save else 'read-only'}) "
        f"at http://{shown}:{port}/ (API reference: /docs); Ctrl-C stops it",
        err=True,
    )
    try:
        uvicorn.run(app, host=host, port=port, log_level="info", access_log=access_log)
    finally:
        store.close()
