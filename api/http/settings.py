"""The server's settings and the Host names it answers, its own errors and the HTTP status of every attnstore error.

Imported by the `attnstore serve` command before its extra is checked, so nothing here imports FastAPI.
"""

import dataclasses
import logging
import re

from ...store.errors import (
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

log = logging.getLogger("attnstore.serve")

# The Host header names of a server bound to a loopback address (IPv6 literals in brackets, as in a URL).
LOOPBACK_HOSTS: tuple[str, ...] = ("127.0.0.1", "localhost", "[::1]")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARD = ("0.0.0.0", "::", "")  # every interface: the names clients use are not known here
RETRY_AFTER_S = 5  # Retry-After of a 503 "server busy"
PREPARING = "docs/SERVE.md#preparing-a-store-for-serving"


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
    info_ttl_s: float = 1.0  # a server database's runs, tokens, hits are read again at most this late (SQLite: on change)
    threads: int = 4  # requests served at once (the rest wait in line): more only contend for the GIL on 2 cores
    allow_save: bool = False  # POST .../save writes a query's per-head results to head_metrics
    max_sql_bytes: int = 8_000_000  # bytes of one SQL result (store/readonly.py stops a statement past it: 413)
    max_sql_value_bytes: int = 1_000_000  # bytes of one value in an SQL result
    max_heavy_requests: int = 2  # SQL, queries, maps and search served at once; more answer 503 with Retry-After
    heavy_wait_s: float = 2.0  # how long a heavy request waits for a free slot before that 503
    scratch: bool = True  # POST /api/runs/RUN/scratch runs the run's model on typed text (needs the ingest extra)
    max_scratch_tokens: int = 128  # tokens of a typed text the model is run on (more: 413)
    max_scratch_chars: int = 2000  # characters of a typed text (each segment)
    max_text_chars: int = 10_000  # of each text of an example answered (cut past it: `texts_cut`); a page stays bounded
    max_body_bytes: int = 256 * 1024  # a request's body (SQL, typed text, a label: a few KB); more: 413 before it is parsed
    fast_lane: bool = True  # the most asked GET requests answered before FastAPI's routing (api/http/lane.py)
    # Host headers answered (the rest: 400), against DNS rebinding; "*" answers any. `attnstore serve` sets the
    # bound host's names (plus --allowed-host); the default is the loopback names, with or without a port.
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS

    def public(self) -> dict:
        return dataclasses.asdict(self)


class NotAvailableError(AttnStoreError):
    """What this server cannot do as installed or started (typed text without the ingest extra): answered 501."""


class ServerBusyError(AttnStoreError):
    """Every heavy-request slot stayed taken for `heavy_wait_s`: answered 503 with a Retry-After header."""


class ScanNeededError(ConflictError):
    """A query would read the maps of many examples on a store that cannot keep what it reads (409; `scan=1` asks anyway)."""


# ------------------------------------------------------------------ Host names


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


# ------------------------------------------------------------------ errors


def status_for(exc: BaseException) -> int:
    """The HTTP status of an attnstore error."""
    if isinstance(exc, ServerBusyError):
        return 503
    if isinstance(exc, NotAvailableError):
        return 501
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


# What each error status of the API means (the OpenAPI schema's responses; every one has the body {"error": "..."}).
ERROR_STATUS = {
    400: "Bad input (a parameter, layer, head, page size or SQL statement), or a Host header this server does not answer",
    403: "A write asked of a read-only server (started without --allow-save)",
    404: "No such run, example, query, metric or endpoint",
    409: "The query must read the maps of many examples and this server cannot keep what it reads (ask again with "
    "scan=1, or prepare the store: docs/SERVE.md); or, for a save, the run is incomplete",
    413: "Over a bound: cells per maps response, examples per query, SQL statement length or result size",
    500: "Damaged stored data (the message names the run, example, chunk), or an unexpected error (in the server's log)",
    501: "Not available on this server: running a model on typed text needs the ingest extra (torch, transformers), "
    "or the server was started with --no-scratch",
    503: "The store is not open or its storage failed; or, with a Retry-After header, every heavy-request slot is taken",
}


def server_version() -> str:
    """attnstore's version, as installed (the API's version in /openapi.json and /api/info)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnstore")
    except PackageNotFoundError:
        return "0"
