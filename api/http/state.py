"""The server's state: one store with the caches and locks the endpoints share (`Server`), and what a query computed
on request does as it reads maps (`MapsReading`: refuse where nothing read is kept, else log its progress).

Endpoints run in FastAPI's thread pool: the caches below sit behind a lock, queries computed on request run one at a
time, and at most `max_heavy_requests` heavy requests (SQL, queries, maps, search) at once: past that, 503.

The endpoints that are asked most (maps, examples, cached queries and metrics, search) first try to answer on the event loop
from what is kept (`answer_here_or_on_a_thread`): inside `inline()` a cache miss, a heavy slot not free at once, or
a read the endpoint deems too large raises `NeedsThread`, and the request is answered on the thread pool as before.
The hop to a thread and back cost more than the answer itself (py-spy, one head's maps as .npy: 16 % of the server's
GIL time in `run_in_threadpool`, the endpoint's own work 5 %).
"""

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ...store import search
from ...store.errors import NotFoundError, TooLargeError
from ...store.lru import LRU
from ...store.remote import is_remote
from .encoding import dumps, records
from .settings import PREPARING, RETRY_AFTER_S, ScanNeededError, ServerBusyError, ServeSettings, log

if TYPE_CHECKING:
    import pandas as pd

    from ...store import Store
    from ...store.records import RunInfo


class NeedsThread(Exception):
    """What the server keeps does not answer this request on the event loop: answer it on the thread pool."""


# True while an endpoint tries to answer on the event loop (`Server.inline`): nothing there may wait for SQL, a lock
# held by a thread, or a read of unknown size.
INLINE: ContextVar[bool] = ContextVar("attnstore_inline", default=False)


def cut_texts(row: dict, limit: int) -> None:
    """An example's record with each text of more than `limit` characters cut to its first `limit` (and `texts_cut`:
    true), so that a page of examples is bounded in bytes whatever a corpus or a bundle stored (the whole text is the
    store's: `attnstore sql`, `store.examples`)."""
    for name in ("text_a", "text_b"):
        text = row.get(name)
        if isinstance(text, str) and len(text) > limit:
            row[name] = text[:limit]
            row["texts_cut"] = True


def inline_only() -> None:
    """Raise NeedsThread when called on the event loop's try (before SQL, a computation, a read that may be large)."""
    if INLINE.get():
        raise NeedsThread


# Cells of maps read on the event loop at most (2 MiB of float16: about 1 ms where no block of them is cached); more,
# or any read of a remote store, is done on the thread pool.
INLINE_READ_CELLS = 1 << 20


class Server:
    """One store with the caches and locks the endpoints share."""

    def __init__(self, store: "Store", settings: ServeSettings):
        self.store = store
        self.settings = settings
        self._lock = threading.Lock()  # guards the caches
        self._compute = threading.Lock()  # one query computed at a time
        self._heavy = threading.BoundedSemaphore(settings.max_heavy_requests)  # SQL, queries, maps, search
        self._heavy_running = 0  # under _lock
        self._examples: LRU[tuple, pd.DataFrame] = LRU(8)
        self._results: LRU[tuple, pd.DataFrame] = LRU(settings.cache_entries)
        self._facets: LRU[tuple, dict] = LRU(16)
        self._example_rows: LRU[tuple, tuple[list[dict], dict[int, int]]] = LRU(4)
        self._example_texts: LRU[tuple, list[str]] = LRU(4)
        # Kept between requests while the store's metadata is unchanged (`version`): runs' info, the rows of the
        # examples' table as JSON values and texts, and (`kept`) encoded answers: examples with their tokens, search
        # hits and answers, small answers of maps, cached queries and metrics.
        self._infos: LRU[str, tuple[tuple, RunInfo]] = LRU(256)
        self._kept: dict[str, LRU[tuple, Any]] = {}
        url = store.locations.db_url
        path = url[len("sqlite:///") :].split("?", 1)[0] if url.startswith("sqlite:///") else ""
        self._db_files = (path, path + "-wal") if path and path != ":memory:" else ()

    # ---- caches keyed by the run's state, so a run still being written is read afresh as it grows

    @staticmethod
    def _state(info: "RunInfo") -> tuple:
        return (info.id, info.status, info.n_stored, info.n_skipped)

    @staticmethod
    def _cached(cache: LRU, key: tuple, make: Callable[[], Any]) -> Any:
        """`make()` kept in `cache` under `key` (its bounds: store/lru.py); made outside any lock, so two requests
        may make the same value at once (the later one is kept)."""
        value = cache.get(key, _MISSING)
        if value is not _MISSING:
            return value
        inline_only()
        value = make()
        cache.put(key, value)
        return value

    def version(self) -> tuple:
        """What changes whenever the store's metadata may have changed, so what was read from it can be kept until then:
        for a SQLite file, its and its write-ahead log's size, modification time and inode (every commit, by any
        process, changes one of them); for a server database, the current period of `info_ttl_s` seconds (what is kept
        is read again at most that much later)."""
        if not self._db_files:
            return ("period", int(time.monotonic() / self.settings.info_ttl_s))
        out: list = []
        for path in self._db_files:
            try:
                st = os.stat(path)
                out.append((st.st_size, st.st_mtime_ns, st.st_ino))
            except OSError:
                out.append(None)
        return tuple(out)

    def kept(self, kind: str, key: tuple, make: Callable[[], Any], size: int = 1024, max_bytes: int | None = None) -> Any:
        """`make()`, kept per `kind` and `key` while the store's metadata is unchanged (`version`), `size` entries (and
        at most `max_bytes` of answers' bodies)."""
        cache = self._kept.get(kind)
        if cache is None:  # each kind's bounds are those of its first use
            with self._lock:
                cache = self._kept.setdefault(kind, LRU(size, max_bytes, _body_bytes if max_bytes is not None else None))
        return self._cached(cache, (self.version(), *key), make)

    @contextmanager
    def inline(self) -> Iterator[None]:
        """The event loop's try at a request (`INLINE`): what is not kept raises NeedsThread instead of being read."""
        token = INLINE.set(True)
        try:
            yield
        finally:
            INLINE.reset(token)

    @contextmanager
    def heavy(self) -> Iterator[None]:
        """One of `max_heavy_requests` slots for a request that may read much (SQL, a query, maps), waited for at most
        `heavy_wait_s`; ServerBusyError (503, Retry-After) when none frees up. On the event loop's try, a slot that is
        not free at once raises NeedsThread (the loop never waits for one)."""
        if INLINE.get():
            if not self._heavy.acquire(blocking=False):
                raise NeedsThread
        elif not self._heavy.acquire(timeout=self.settings.heavy_wait_s):
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

    def reading(self, cells: int) -> None:
        """Before reading `cells` cells of maps: on the event loop's try, NeedsThread where the read may take long (a
        remote store, more than INLINE_READ_CELLS)."""
        if INLINE.get() and (cells > INLINE_READ_CELLS or is_remote(self.store.locations.array_root)):
            raise NeedsThread

    def info(self, run: str) -> "RunInfo":
        """The run's info (`store.run_info`), kept while the store's metadata is unchanged (`version`)."""
        version = self.version()
        hit = self._infos.get(run)
        if hit is not None and hit[0] == version:
            return hit[1]
        inline_only()
        info = self.store.run_info(run)
        self._infos.put(run, (version, info))
        return info

    def fresh_info(self, info: "RunInfo") -> "RunInfo":
        """The run's info read now, kept in place of `info` where it changed: before a "no such example" is answered
        about a run being ingested, since what this process keeps may be behind what another worker (or a PostgreSQL
        read within `info_ttl_s`) has already answered the same client; an answer must not go backwards."""
        inline_only()
        fresh = self.store.run_info(info.id)
        if self._state(fresh) != self._state(info):
            version = self.version()
            for key in self._infos.keys():
                kept = self._infos.get(key, touch=False)
                if kept is not None and kept[1].id == fresh.id:
                    self._infos.put(key, (version, fresh))
        return fresh

    def examples(self, info: "RunInfo") -> "pd.DataFrame":
        """The run's examples (store.examples), cached while the run does not change."""
        return self._cached(self._examples, self._state(info), lambda: self.store.examples(info.id))

    def example_records(self, info: "RunInfo") -> tuple[list[dict], dict[int, int]]:
        """The run's examples as JSON records (`records(examples)`), with each example's row, kept like `examples`."""

        def make() -> tuple[list[dict], dict[int, int]]:
            frame = self.examples(info)
            rows = records(frame)
            for row in rows:
                cut_texts(row, self.settings.max_text_chars)
            where: dict[int, int] = {}
            for i, e in enumerate(frame["example"].tolist()):
                where.setdefault(int(e), i)
            return rows, where

        return self._cached(self._example_rows, self._state(info), make)

    def example_texts(self, info: "RunInfo") -> list[str]:
        """Each of `example_records`' rows as its JSON text (`dumps`), kept like them: a page of examples is a join of
        kept texts, not an encoding of its rows (a page of 50: ~0.1 ms of the json module per request)."""
        return self._cached(self._example_texts, self._state(info), lambda: [dumps(row) for row in self.example_records(info)[0]])

    def example_row(self, info: "RunInfo", example: int) -> dict:
        rows, where = self.example_records(info)
        if example not in where:
            fresh = self.fresh_info(info)
            if self._state(fresh) != self._state(info):
                return self.example_row(fresh, example)
            raise NotFoundError(f"run {info.name!r} has no example {example} (it stores {info.n_stored} examples)")
        row = dict(rows[where[example]])
        if row["skipped"]:
            raise NotFoundError(f"example {example} of run {info.name!r} was skipped (longer than {info.max_length} tokens)")
        return row

    def stored_positions(self, info: "RunInfo") -> list[int]:
        frame = self.examples(info)
        return [int(e) for e in frame.loc[~frame["skipped"].astype(bool), "example"]]

    def annotation_counts(self, info: "RunInfo") -> dict:
        """The UPOS tags and dependency relations of the run's words with their counts (store/search.py), cached while
        the run does not change."""
        return self._cached(self._facets, self._state(info), lambda: search.annotation_counts(self.sql, info.id))

    def sql(self, query: str, params: dict | None = None, max_rows: int | None = None) -> tuple[list[str], list[tuple]]:
        """One read-only statement (store/readonly.py, as `Store.sql`) under this server's time and byte limits
        (TooLargeError, 413, past `max_sql_bytes` in all or `max_sql_value_bytes` in one value)."""
        from ...store.readonly import run_readonly_sql

        inline_only()
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
        read is kept for the next time (summaries on a writable store) it is done; where not (a read-only store) only
        when `scan`, else ScanNeededError (409) at the first example read."""
        from ...queries import run_query
        from ...store import progress

        key = (*self._state(info), name, json.dumps(kwargs, sort_keys=True, default=str))
        kept = self._results.get(key)
        if kept is not None:
            return kept
        inline_only()
        with self._compute:
            kept = self._results.get(key)
            if kept is not None:
                return kept
            reading = MapsReading(self, info, name, n_examples, refuse=not scan and self.store.read_only)
            with progress.reporting(reading.advance):
                frame = run_query(self.store, name, run=info.id, **kwargs)
            reading.done()
            self._results.put(key, frame)
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
                raise ScanNeededError(scan_message(self.info, self.name, self.n))
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


def scan_message(info: "RunInfo", name: str, n: int | None) -> str:
    """Why a query's read of the maps was refused (the server's store is read-only, so nothing read would be kept), and
    what prepares the store for it."""
    if name == "run_similarity":
        prepare = f"run it once on a writable store: `attnstore query run_similarity --run {info.name} --param other=OTHER`"
    else:
        prepare = f"summarise the run first: `attnstore summarize --run {info.name}`"
    return (
        f"{name} over run {info.name!r} must read the maps of {'up to ' + str(n) if n else 'all its'} examples "
        f"({info.n_layers} layers x {info.n_heads} heads each): nothing it can read instead is kept for this run, and "
        "this server's store is read-only, "
        f"so nothing read now would be kept and every restart would read them again; {prepare} ({PREPARING}), "
        "or ask again with scan=1 to read them now"
    )


_MISSING = object()


def _body_bytes(value: Any) -> int:
    """A kept answer's body size, or a kept array's (a map's pooled band); 0 for what has neither. A byte budget sums
    them when one is added (a miss costs milliseconds anyway)."""
    return len(getattr(value, "body", b"")) or int(getattr(value, "nbytes", 0))
