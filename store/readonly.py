"""Read-only SQL for `attnstore sql` / `Store.sql`: one statement that cannot change the store.

Longer than ~500 lines on purpose: the SQLite and PostgreSQL paths share the byte budget, the value bound and the
error lines, and a change to what a statement may do is made to both at once, here.

The statement never runs on the store's own engine:

SQLite
    A separate sqlite3 connection opened with ``file:PATH?mode=ro`` (``immutable=1`` when the
    file's folder cannot be written and no -wal/-shm files exist, so ``mode=ro`` cannot open it),
    with an authorizer that allows only reads (SELECT, reading columns, functions, recursive
    CTEs and a whitelist of introspection PRAGMAs) and denies everything else: writes, DDL,
    transactions, ATTACH/DETACH -- and so also ``VACUUM INTO``, which attaches its target
    (``PRAGMA query_only`` does not stop ``VACUUM INTO`` from creating its file). Python's sqlite3
    runs one statement per call. A progress handler stops statements that run past the time limit.

PostgreSQL
    A fresh connection (closed afterwards, so nothing a statement leaves in the session -- an
    advisory lock, a setting -- outlives it) runs ``SET TRANSACTION READ ONLY``, ``SET LOCAL
    statement_timeout`` and, when connected as a superuser, ``SET LOCAL ROLE pg_read_all_data``
    (PostgreSQL >= 14) so that server-file access (COPY TO/FROM a file or program, pg_read_file,
    lo_export) is refused; then the statement, then ROLLBACK.

Both
    Before it runs, the statement must pass the allow-list of store/sql_policy.py: one query over
    the store's own tables and views calling only ordinary functions (so no system catalog such
    as pg_authid, no pg_terminate_backend, whatever role the URL has). Rows are read one at a
    time and counted in bytes: past `max_bytes` the call raises TooLargeError carrying the rows
    read so far; a value over `max_value_bytes` is refused (TooLargeError naming the limit) before
    it reaches this process. On SQLite it is never built (SQLITE_LIMIT_LENGTH; ``printf``/``format``,
    which SQLite turns into a silent NULL past that limit, are replaced by a version that raises).
    On PostgreSQL the query runs wrapped (`bounded_query`) so that the server itself checks each
    value's size (and each row's against `max_bytes`) and fails before sending it; its rows are
    streamed in chunks of as many rows as fit in `max_bytes` at their largest (`stream_rows`), so
    this process holds at most about `max_bytes` beyond the rows it keeps.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from .errors import InvalidArgumentError, TooLargeError
from .sql_policy import (
    ALLOWED_FUNCTIONS,
    PG_ONE_ARGUMENT_FUNCTIONS_SQL,
    PG_STORE_COLUMNS_SQL,
    PG_STORE_RELATIONS_SQL,
    check_pg_statement,
    function_not_allowed,
    not_a_store_relation,
    not_allowed,
    one_line,
)

ENV_TIMEOUT = "ATTNSTORE_SQL_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0
READ_ROLE = "pg_read_all_data"
DEFAULT_MAX_VALUE_BYTES = 16 * 2**20

Result = tuple[list[str] | None, list[tuple]]


def default_timeout() -> float:
    """The time limit of one statement: $ATTNSTORE_SQL_TIMEOUT seconds, else 300."""
    value = os.environ.get(ENV_TIMEOUT)
    if not value:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        raise InvalidArgumentError(f"{ENV_TIMEOUT}={value!r} is not a number of seconds") from None
    if seconds <= 0:
        raise InvalidArgumentError(f"{ENV_TIMEOUT}={value!r} must be a positive number of seconds")
    return seconds


def run_readonly_sql(
    target: sa.Engine | str,
    query: str,
    params: dict | None = None,
    max_rows: int | None = None,
    timeout_s: float | None = None,
    max_bytes: int | None = None,
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
) -> Result:
    """Run one read-only statement on the database of `target` (an engine or a database URL).

    Returns (column names, rows) -- (None, []) for a statement that returns no rows -- with at
    most `max_rows` rows (all when falsy). Raises InvalidArgumentError("SQL error: ...") for a
    statement that fails, writes, reads outside the store (store/sql_policy.py), runs past
    `timeout_s` seconds or is more than one statement; TooLargeError for a result over
    `max_bytes` (its `partial` holds the columns and the rows read before) or a value over
    `max_value_bytes`.
    """
    timeout_s = default_timeout() if timeout_s is None else float(timeout_s)
    budget = _Budget(max_rows, max_bytes, max_value_bytes)
    url = target.url if isinstance(target, sa.Engine) else make_url(target)
    backend = url.get_backend_name()
    if backend == "sqlite":
        return run_sqlite(sqlite_file(url), query, params, budget, timeout_s)
    if backend == "postgresql":
        return run_postgresql(target, query, params, budget, timeout_s)
    raise InvalidArgumentError(f"SQL error: attnstore sql supports SQLite and PostgreSQL stores, not {backend}")


def value_bytes(value: Any) -> int:
    """About the bytes `value` takes in a response (its text; 8 for a number)."""
    if value is None or isinstance(value, (bool, int, float)):
        return 8
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return len(value)
    return len(str(value))


class _Budget:
    """Rows and bytes a result may take; `take` reads a cursor's batches until one runs out."""

    def __init__(self, max_rows: int | None, max_bytes: int | None, max_value_bytes: int):
        self.max_rows = max_rows or None
        self.max_bytes = max_bytes
        self.max_value_bytes = max_value_bytes

    def take(self, columns: list[str], rows: Iterable[Any]) -> list[tuple]:
        """Read `rows` one at a time until `max_rows`; raise TooLargeError past a bound (the rows so far in `partial`
        when the whole result is too large). A `_ServerBound` raised by `rows` is the server's refusal of its next row."""
        taken: list[tuple] = []
        total = 0
        if self.max_rows is not None and self.max_rows <= 0:
            return taken
        try:
            for row in rows:
                row = tuple(row)
                sizes = [value_bytes(v) for v in row]
                for column, size in zip(columns, sizes):
                    if size > self.max_value_bytes:
                        raise self.value_too_large(column, size)
                total += sum(sizes)
                if self.max_bytes is not None and total > self.max_bytes:
                    raise self.result_too_large(columns, taken)
                taken.append(row)
                if self.max_rows is not None and len(taken) >= self.max_rows:
                    break
        except _ServerBound as bound:
            if bound.column is None:
                raise self.result_too_large(columns, taken) from None
            raise self.value_too_large(columns[bound.column], bound.size) from None
        return taken

    def result_too_large(self, columns: list[str], rows: list[tuple]) -> TooLargeError:
        exc = TooLargeError(
            f"SQL error: the result passed {self.max_bytes:,} bytes after {len(rows):,} rows "
            "(the limit of one result; select fewer rows or columns)"
        )
        exc.partial = (columns, rows)  # type: ignore[attr-defined]
        return exc

    def value_too_large(self, column: str | None = None, size: int | None = None, what: str = "a value") -> TooLargeError:
        where = f" in column {column!r}" if column else ""
        found = f"{size:,} bytes; " if size else ""
        return TooLargeError(
            f"SQL error: {what}{where} is over {self.max_value_bytes:,} bytes ({found}the limit of one value; "
            "select a part of it, e.g. substr(...))"
        )


class _ServerBound(Exception):
    """PostgreSQL refused a row of the bounded statement (`bounded_query`): a value in column `column` (an index) of
    `size` bytes, or (column None) a row larger than the whole result may be."""

    def __init__(self, column: int | None, size: int):
        super().__init__(column, size)
        self.column = column
        self.size = size


def timed_out(timeout_s: float) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"SQL error: statement stopped after {timeout_s:g} s (attnstore sql time limit; set {ENV_TIMEOUT} to change it)"
    )


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


# ------------------------------------------------------------------ SQLite

# Authorizer action codes (sqlite3.h); the sqlite3 module's names for 0-2 clash with result codes.
_ACTIONS = dict(
    enumerate(
        "CREATE_INDEX CREATE_TABLE CREATE_TEMP_INDEX CREATE_TEMP_TABLE CREATE_TEMP_TRIGGER CREATE_TEMP_VIEW CREATE_TRIGGER "
        "CREATE_VIEW DELETE DROP_INDEX DROP_TABLE DROP_TEMP_INDEX DROP_TEMP_TABLE DROP_TEMP_TRIGGER DROP_TEMP_VIEW "
        "DROP_TRIGGER DROP_VIEW INSERT PRAGMA READ SELECT TRANSACTION UPDATE ATTACH DETACH ALTER_TABLE REINDEX ANALYZE "
        "CREATE_VTABLE DROP_VTABLE FUNCTION SAVEPOINT COPY RECURSIVE".split(),
        start=1,
    )
)
_SQLITE_PRAGMA, _SQLITE_READ, _SQLITE_SELECT, _SQLITE_UPDATE = 19, 20, 21, 23
_SQLITE_FUNCTION, _SQLITE_RECURSIVE = 31, 33

# PRAGMAs that only describe the schema or the file, with or without an argument.
SQLITE_INTROSPECTION_PRAGMAS = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_list",
        "index_info",
        "index_xinfo",
        "foreign_key_list",
        "foreign_key_check",
        "collation_list",
        "database_list",
        "function_list",
        "module_list",
        "pragma_list",
        "compile_options",
        "integrity_check",
        "quick_check",
    }
)
# PRAGMAs allowed only in their reading form (no value: `PRAGMA user_version`).
SQLITE_READ_PRAGMAS = frozenset(
    {
        "user_version",
        "schema_version",
        "application_id",
        "data_version",
        "journal_mode",
        "foreign_keys",
        "page_size",
        "page_count",
        "freelist_count",
        "encoding",
        "auto_vacuum",
        "max_page_count",
        "cache_size",
        "busy_timeout",
        "query_only",
        "recursive_triggers",
        "synchronous",
        "temp_store",
        "locking_mode",
        "secure_delete",
    }
)


def sqlite_file(url: sa.URL) -> str:
    database = url.database
    if database and url.query.get("uri") in ("true", "1", "True") and database.startswith("file:"):
        database = database[len("file:") :].split("?", 1)[0]
    if not database or database == ":memory:":
        raise InvalidArgumentError("SQL error: attnstore sql reads a SQLite store from its file; this store has none (in-memory database)")
    return os.path.abspath(database)


def sqlite_readonly_uri(path: str, immutable: bool = False) -> str:
    """The URI that opens `path` read-only: mode=ro, plus immutable=1 (no locks, no -wal/-shm) if asked."""
    return f"file:{quote(os.path.abspath(path))}?mode=ro{'&immutable=1' if immutable else ''}"


def _sqlite_connect(uri: str, timeout_s: float) -> sqlite3.Connection:
    conn = sqlite3.connect(uri, uri=True, timeout=min(timeout_s, 30.0), isolation_level=None, check_same_thread=False)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchall()  # opens the file (and -wal/-shm) now
    except BaseException:
        conn.close()
        raise
    return conn


def open_sqlite_readonly(path: str, timeout_s: float = 30.0) -> sqlite3.Connection:
    """A connection that cannot write `path`: mode=ro, else immutable=1 where mode=ro cannot open it.

    mode=ro reads a live WAL store consistently but needs the -shm file: in a folder this process
    cannot write, without -wal/-shm files, it fails (SQLITE_READONLY_DIRECTORY / CANTOPEN) and the
    file is read as it is with immutable=1 (nobody can be writing it there).
    """
    if not os.path.isfile(path):
        raise InvalidArgumentError(f"SQL error: no SQLite store at {path}")
    try:
        return _sqlite_connect(sqlite_readonly_uri(path), timeout_s)
    except sqlite3.OperationalError as exc:
        code = getattr(exc, "sqlite_errorcode", None)
        if code is None or (code & 0xFF) not in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN):
            raise
        try:
            return _sqlite_connect(sqlite_readonly_uri(path, immutable=True), timeout_s)
        except sqlite3.Error:
            raise exc from None


class _Authorizer:
    """sqlite3 authorizer: reads of the store's tables and views and ordinary functions only.

    Remembers the first thing it denied, as the error to raise."""

    def __init__(self):
        self.denied: InvalidArgumentError | None = None
        self.statement_denied = False

    def __call__(self, action: int, arg1: str | None, arg2: str | None, _db: str | None, _source: str | None) -> int:
        refusal: InvalidArgumentError
        if action in (_SQLITE_SELECT, _SQLITE_RECURSIVE):
            return sqlite3.SQLITE_OK
        if action == _SQLITE_READ:
            # Every table and view of the file is the store's (SQLite reports CTEs as tables too);
            # the temp schema is not (db None: count(*) reads no column).
            if _db in ("main", None):
                return sqlite3.SQLITE_OK
            refusal = not_a_store_relation(f"{_db}.{arg1}" if _db not in (None, "main") else str(arg1))
        elif action == _SQLITE_FUNCTION:
            if (arg2 or "").lower() in ALLOWED_FUNCTIONS:
                return sqlite3.SQLITE_OK
            refusal = function_not_allowed(str(arg2))
        elif action == _SQLITE_UPDATE and arg1 == "sqlite_master" and _db == "main":
            # SQLite's own check when a statement first uses a pragma_* table-valued function; a user's
            # UPDATE of sqlite_master is refused by SQLite itself (writable_schema is off, and the file is mode=ro).
            return sqlite3.SQLITE_OK
        elif action == _SQLITE_PRAGMA and (
            (arg1 or "").lower() in SQLITE_INTROSPECTION_PRAGMAS or ((arg1 or "").lower() in SQLITE_READ_PRAGMAS and arg2 is None)
        ):
            return sqlite3.SQLITE_OK
        else:
            self.statement_denied = True  # a write, DDL, ATTACH...: the message names the statement
            refusal = not_allowed(" ".join(str(a) for a in (_ACTIONS.get(action, action), arg1, arg2) if a is not None))
        if self.denied is None:
            self.denied = refusal
        return sqlite3.SQLITE_DENY


def run_sqlite(path: str, query: str, params: dict | Sequence | None, budget: _Budget, timeout_s: float) -> Result:
    try:
        conn = open_sqlite_readonly(path, timeout_s)
    except sqlite3.Error as exc:
        raise InvalidArgumentError(f"SQL error: cannot open {path} read-only: {first_line(exc)}") from None
    deadline = time.monotonic() + timeout_s
    authorizer: _Authorizer | None = None
    helper: sqlite3.Connection | None = None
    printf_over: list[str] = []  # the name of a printf/format call whose result passed the limit
    try:
        authorizer = _Authorizer()
        conn.set_authorizer(authorizer)
        conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)
        # No string or blob over the value limit is ever built (zeroblob(10**9) fails at once).
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, budget.max_value_bytes)
        helper = _bounded_printf(conn, budget.max_value_bytes, printf_over)
        cur = conn.execute(query, params if params is not None else {})
        if cur.description is None:
            return None, []
        columns = [d[0] for d in cur.description]
        return columns, budget.take(columns, cur)  # a row at a time: counted before the next is built
    except sqlite3.Error as exc:
        if authorizer is not None and authorizer.statement_denied:
            raise not_allowed(one_line(query)) from None
        if authorizer is not None and authorizer.denied is not None:
            raise authorizer.denied from None
        if printf_over:
            raise budget.value_too_large(what=f"the result of {printf_over[0]}()") from None
        if isinstance(exc, sqlite3.OperationalError) and time.monotonic() > deadline and "interrupt" in str(exc):
            raise timed_out(timeout_s) from None
        if isinstance(exc, sqlite3.DataError) or "too big" in str(exc):
            raise budget.value_too_large() from None
        raise InvalidArgumentError(f"SQL error: {first_line(exc)}") from None
    finally:
        conn.close()
        if helper is not None:
            helper.close()


def _bounded_printf(conn: sqlite3.Connection, limit: int, over: list[str]) -> sqlite3.Connection:
    """Replace `conn`'s printf() and format() (SQLite's name for it) with SQLite's own, run on an in-memory helper
    connection, that raise where SQLite's would return NULL because the result passed SQLITE_LIMIT_LENGTH (`over` gets
    the function's name). The helper allows one byte more, to tell an empty result (also NULL) from one too long:
    'x' || format gives NULL only for the latter (and a result of limit + 1 bytes is measured here). Returns the
    helper, for the caller to close."""
    helper = sqlite3.connect(":memory:", check_same_thread=False)
    helper.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limit + 1)

    def bounded(name: str):
        def call(*args: Any) -> Any:
            marks = ", ".join("?" * len(args))
            value = helper.execute(f"SELECT printf({marks})", args).fetchone()[0]
            if value is None and args and args[0] is not None:
                rest = "".join(", ?" for _ in args[1:])
                too_long = helper.execute(f"SELECT printf('x' || ?{rest})", args).fetchone()[0] is None
            else:
                too_long = isinstance(value, str) and len(value) > limit // 4 and len(value.encode("utf-8", "surrogatepass")) > limit
            if too_long:
                over.append(name)
                raise OverflowError(f"{name}() result over {limit} bytes")
            return value

        return call

    for name in ("printf", "format"):
        conn.create_function(name, -1, bounded(name), deterministic=True)
    return helper


# ------------------------------------------------------------------ PostgreSQL

_PSYCOPG_PLACEHOLDER = re.compile(r"%(?:\(([^)]+)\))?(.)", re.S)


_QUOTED = re.compile(
    r"""
      (?P<estr>[eE]'(?:[^'\\]|\\.|'')*')      # E'...' : backslash escapes
    | (?P<str>'(?:[^']|'')*')                    # '...'  : standard-conforming string
    | (?P<ident>"(?:[^"]|"")*")                  # "..."  : quoted identifier
    | (?P<dollar>\$(?P<tag>[A-Za-z_]\w*|)\$.*?\$(?P=tag)\$)   # $tag$...$tag$
    | (?P<line>--[^\n]*)                          # -- comment
    | (?P<block>/\*.*?\*/)                        # /* comment */
""",
    re.VERBOSE | re.DOTALL,
)


def escape_quoted_colons(query: str) -> str:
    """Escape ':' inside string literals, quoted identifiers and comments for `sa.text`, which would
    read 'dev[:20]' or ':x' there as bind parameters; `:name` outside them stays a parameter."""
    return _QUOTED.sub(lambda m: m.group(0).replace(":", "\\:"), query)


def _as_sent(compiled_sql: str) -> str:
    """The text psycopg sends for `compiled_sql` (pyformat): %% -> %, %(name)s / %s -> $n."""
    count = 0

    def sub(m: re.Match) -> str:
        nonlocal count
        if m.group(1) is None and m.group(2) == "%":
            return "%"
        count += 1
        return f"${count}"

    return _PSYCOPG_PLACEHOLDER.sub(sub, compiled_sql)


def _pg_engine(target: sa.Engine | str) -> tuple[sa.Engine, bool]:
    """An engine whose DBAPI is psycopg 3 (its prepared statements are what refuse several statements)."""
    if isinstance(target, sa.Engine) and target.dialect.driver == "psycopg":
        return target, False
    url = target.url if isinstance(target, sa.Engine) else make_url(target)
    return sa.create_engine(url.set(drivername="postgresql+psycopg"), poolclass=NullPool), True


def run_postgresql(
    target: sa.Engine | str, query: str, params: dict | None, budget: _Budget | None, timeout_s: float, check: bool = True
) -> Result:
    """Run `query` as described in the module docstring (`budget` None: no bound). `check=False`
    skips the allow-list (tests use it to see that the server-side guards hold on their own)."""
    import psycopg

    budget = budget or _Budget(None, None, DEFAULT_MAX_VALUE_BYTES)
    engine, own_engine = _pg_engine(target)
    try:
        stmt = sa.text(escape_quoted_colons(query))
        compiled = stmt.compile(dialect=engine.dialect)
        try:
            args = compiled.construct_params(params or {})
        except sa.exc.SQLAlchemyError as exc:
            raise InvalidArgumentError(f"SQL error: {first_line(exc)}") from None
        sql_text = compiled.string
        try:
            conn = engine.connect()
        except sa.exc.DBAPIError as exc:
            raise InvalidArgumentError(f"SQL error: cannot connect: {first_line(exc.orig or exc)}") from None
        try:
            raw: Any = conn.connection.dbapi_connection  # a psycopg connection (server-side cursors)
            raw.rollback()
            cur = raw.cursor()
            try:
                cur.execute("SET TRANSACTION READ ONLY")
                cur.execute("SET LOCAL standard_conforming_strings = on")
                cur.execute(f"SET LOCAL statement_timeout = {max(1, int(timeout_s * 1000))}")
                cur.execute(PG_STORE_RELATIONS_SQL)
                relations = frozenset(name for name, _ in cur.fetchall())
                cur.execute("SELECT pg_catalog.current_schema()")
                schema = cur.fetchone()[0]
                cur.execute(PG_ONE_ARGUMENT_FUNCTIONS_SQL)
                functions = frozenset(name for (name,) in cur.fetchall())
                cur.execute(PG_STORE_COLUMNS_SQL)
                store_columns = frozenset(name for (name,) in cur.fetchall())
                # check=False (tests only) runs the statement as given, prepared, on a client-side cursor.
                is_query = (
                    check_pg_statement(_as_sent(sql_text), relations, schema or "public", functions=functions, columns=store_columns)
                    if check
                    else False
                )
                cur.execute(
                    "SELECT current_setting('is_superuser') = 'on', EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s)",
                    (READ_ROLE,),
                )
                superuser, has_read_role = cur.fetchone()
                if superuser and has_read_role:
                    # Keep the schemas the login user resolves ("$user" would name the new role).
                    cur.execute(
                        "SELECT pg_catalog.set_config('search_path', coalesce(pg_catalog.string_agg("
                        "pg_catalog.quote_ident(s), ', ' ORDER BY o), ''), true) "
                        "FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS t(s, o)"
                    )
                    cur.execute(f"SET LOCAL ROLE {READ_ROLE}")
                as_read_role = bool(superuser and has_read_role)
                if not is_query:  # EXPLAIN's few rows come whole; check=False runs the statement as given
                    try:
                        cur.execute(sql_text, args, prepare=True)
                    except psycopg.Error as exc:
                        raise _pg_error(exc, query, timeout_s, as_read_role) from None
                    if cur.description is None:
                        return None, []
                    columns = [d.name for d in cur.description]
                    try:
                        return columns, budget.take(columns, cur)
                    except psycopg.Error as exc:
                        raise _pg_error(exc, query, timeout_s, as_read_role) from None
                # A query's columns first (DECLARE plans it, runs nothing), then the query wrapped so that the server
                # refuses a value over the limit (or a row over the result's) before it is sent, read a row at a time.
                described = raw.cursor(name="attnstore_describe")
                try:
                    described.execute(sql_text, args)
                    columns = [d.name for d in described.description or []]
                    types = [d.type_code for d in described.description or []]
                    described.close()
                except psycopg.Error as exc:
                    raise _pg_error(exc, query, timeout_s, as_read_role) from None
                bounded = bounded_query(statement_body(sql_text), types, budget)
                if bounded != sql_text:  # the wrapper is checked too: what runs is what was allowed
                    check_pg_statement(_as_sent(bounded), relations, schema or "public", functions=functions, columns=store_columns)
                stream = cur.stream(bounded, args, size=stream_rows(types, budget))
                try:
                    return columns, budget.take(columns, _server_bounded(stream))
                except psycopg.Error as exc:
                    raise _pg_error(exc, query, timeout_s, as_read_role) from None
                finally:
                    stream.close()  # stopped early (max_rows, a bound): psycopg cancels the rest
            except psycopg.Error as exc:
                raise InvalidArgumentError(f"SQL error: {first_line(exc)}") from None
            finally:
                try:
                    raw.rollback()
                except psycopg.Error:
                    pass
        finally:
            conn.invalidate()  # a fresh connection next time: nothing the statement left in the session survives
            conn.close()
    finally:
        if own_engine:
            engine.dispose()


# Types whose values are a few bytes (counted as 8, as `value_bytes` counts numbers): bool, "char", int8, int2, int4,
# oid, float4, float8, money, date, time, timestamp, timestamptz, interval, timetz, uuid.
_PG_FIXED_TYPES = frozenset({16, 18, 20, 21, 23, 26, 700, 701, 790, 1082, 1083, 1114, 1184, 1186, 1266, 2950})
# Types measured as they are (octet_length of the value: no copy, not even of a TOASTed one): bytea, text, varchar,
# bpchar, name. Any other type is measured as its text, the form a client reads.
_PG_RAW_TYPES = frozenset({17, 19, 25, 1042, 1043})
BOUND_MARK = "attnstore-bound"
_BOUND_ERROR = re.compile(BOUND_MARK + r":(value|row):(\d+):(\d+)")


def statement_body(sql_text: str) -> str:
    """`sql_text` without what follows its last token (a `;`, comments, blanks), to be used as a subquery."""
    from pglast.parser import scan

    tokens = [t for t in scan(sql_text) if t.name not in ("SQL_COMMENT", "C_COMMENT")]
    while tokens and tokens[-1].name == "ASCII_59":  # ;
        tokens.pop()
    return sql_text[: tokens[-1].end + 1] if tokens else sql_text


def bounded_query(body: str, types: Sequence[int], budget: _Budget) -> str:
    """`body` (one query) wrapped so that PostgreSQL itself refuses a value over `budget.max_value_bytes` (and a row
    over `budget.max_bytes`) before sending it: the error names BOUND_MARK, the column and the size (`_server_bounded`).
    The query is a fenced subquery (OFFSET 0), so the checks see its rows, in its order, after its own filters."""
    if not types:
        return body
    sizes, checks = [], []
    for i, oid in enumerate(types):
        if oid in _PG_FIXED_TYPES:
            sizes.append("8")
            continue
        size = f"pg_catalog.octet_length(u.c{i}{'' if oid in _PG_RAW_TYPES else '::text'})"
        sizes.append(f"coalesce({size}, 8)")
        checks.append(f"CASE WHEN {size} > {int(budget.max_value_bytes)} THEN ('{BOUND_MARK}:value:{i}:' || {size})::boolean ELSE true END")
    if budget.max_bytes is not None:
        total = " + ".join(sizes)
        checks.append(f"CASE WHEN {total} > {int(budget.max_bytes)} THEN ('{BOUND_MARK}:row:0:' || ({total}))::boolean ELSE true END")
    if not checks:
        return body
    names = ", ".join(f"c{i}" for i in range(len(types)))
    return f"SELECT u.* FROM (SELECT * FROM (\n{body}\n) AS q({names}) OFFSET 0) AS u WHERE {' AND '.join(checks)}"


STREAM_ROWS = 256  # rows per chunk from the server where no bound on the result says fewer


def stream_rows(types: Sequence[int], budget: _Budget) -> int:
    """Rows per chunk of a bounded query's stream: as many as fit in `max_bytes` when each row may be as large as the
    server lets it be (1 for a text column under the CLI's limits), at most STREAM_ROWS; 1 without libpq's chunked
    mode (libpq < 17)."""
    import psycopg

    if psycopg.pq.version() < 170000:
        return 1
    if budget.max_bytes is None:
        return STREAM_ROWS
    row = sum(8 if oid in _PG_FIXED_TYPES else budget.max_value_bytes for oid in types)
    return max(1, min(STREAM_ROWS, budget.max_bytes // max(1, min(row, budget.max_bytes))))


def _server_bounded(rows: Iterable[Any]) -> Iterator[Any]:
    """The rows of a `bounded_query`; its server-side refusal becomes `_ServerBound`."""
    import psycopg

    try:
        yield from rows
    except psycopg.Error as exc:
        found = _BOUND_ERROR.search(str(exc)) if getattr(exc, "sqlstate", None) == "22P02" else None
        if found is None:
            raise
        kind, column, size = found.groups()
        raise _ServerBound(int(column) if kind == "value" else None, int(size)) from None


def _pg_error(exc: Any, query: str, timeout_s: float, as_read_role: bool) -> InvalidArgumentError:
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate == "25006":  # read_only_sql_transaction
        return not_allowed(one_line(query))
    if sqlstate == "57014" and "statement timeout" in str(exc):
        return timed_out(timeout_s)
    if sqlstate == "42601" and "multiple commands" in str(exc):
        return InvalidArgumentError(f"SQL error: attnstore sql runs one statement at a time: {first_line(exc)}")
    if sqlstate == "42501" and as_read_role:
        return InvalidArgumentError(f"SQL error: {first_line(exc)} (attnstore sql runs as {READ_ROLE})")
    return InvalidArgumentError(f"SQL error: {first_line(exc)}")
