"""Read-only SQL for `attnstore sql` / `Store.sql`: one statement that cannot change the store.

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
    lo_export) is refused; then the statement through the extended protocol (a prepared
    statement, so a string holding several statements is refused by the server), then ROLLBACK.
    Because a superuser session may switch back to its own role from inside a statement
    (``set_config('role', ...)``, ``SET ROLE`` in a ``DO`` block), the statement is also checked
    before it is sent: one statement, starting with SELECT, WITH, VALUES, TABLE, EXPLAIN or SHOW,
    naming none of the functions that change settings or run SQL given as text
    (set_config, query_to_xml*, ts_stat, ts_rewrite, dblink*), and no U&"..." escapes.
    Below PostgreSQL 14 (no pg_read_all_data) a superuser's statement runs in the read-only
    transaction with these checks only.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from .errors import InvalidArgumentError

ENV_TIMEOUT = "ATTNSTORE_SQL_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0
READ_ROLE = "pg_read_all_data"
WRITE_HINT = "use a SQLite/PostgreSQL client with write access to change the store"

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
    target: sa.Engine | str, query: str, params: dict | None = None, max_rows: int | None = None, timeout_s: float | None = None
) -> Result:
    """Run one read-only statement on the database of `target` (an engine or a database URL).

    Returns (column names, rows) -- (None, []) for a statement that returns no rows -- with at
    most `max_rows` rows (all when falsy). Raises InvalidArgumentError("SQL error: ...") for a
    statement that fails, writes, runs past `timeout_s` seconds or is more than one statement.
    """
    timeout_s = default_timeout() if timeout_s is None else float(timeout_s)
    url = target.url if isinstance(target, sa.Engine) else make_url(target)
    backend = url.get_backend_name()
    if backend == "sqlite":
        return run_sqlite(sqlite_file(url), query, params, max_rows, timeout_s)
    if backend == "postgresql":
        return run_postgresql(target, query, params, max_rows, timeout_s)
    raise InvalidArgumentError(f"SQL error: attnstore sql supports SQLite and PostgreSQL stores, not {backend}")


def one_line(query: str, width: int = 60) -> str:
    text = " ".join(query.split()).rstrip(";").strip()
    return text if len(text) <= width else text[: width - 3] + "..."


def not_allowed(what: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"SQL error: not allowed in attnstore sql (read-only): {what}; {WRITE_HINT}")


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
SQLITE_DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "writefile", "edit"})


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
    """sqlite3 authorizer: reads only. Remembers the first thing it denied, for the message."""

    def __init__(self):
        self.denied: str | None = None

    def __call__(self, action: int, arg1: str | None, arg2: str | None, _db: str | None, _source: str | None) -> int:
        if action in (_SQLITE_READ, _SQLITE_SELECT, _SQLITE_RECURSIVE):
            return sqlite3.SQLITE_OK
        if action == _SQLITE_FUNCTION and (arg2 or "").lower() not in SQLITE_DENIED_FUNCTIONS:
            return sqlite3.SQLITE_OK
        if action == _SQLITE_UPDATE and arg1 == "sqlite_master" and _db == "main":
            # SQLite's own check when a statement first uses a pragma_* table-valued function; a user's
            # UPDATE of sqlite_master is refused by SQLite itself (writable_schema is off, and the file is mode=ro).
            return sqlite3.SQLITE_OK
        if action == _SQLITE_PRAGMA:
            name = (arg1 or "").lower()
            if name in SQLITE_INTROSPECTION_PRAGMAS or (name in SQLITE_READ_PRAGMAS and arg2 is None):
                return sqlite3.SQLITE_OK
        if self.denied is None:
            self.denied = " ".join(str(a) for a in (_ACTIONS.get(action, action), arg1, arg2) if a is not None)
        return sqlite3.SQLITE_DENY


def run_sqlite(path: str, query: str, params: dict | Sequence | None, max_rows: int | None, timeout_s: float) -> Result:
    try:
        conn = open_sqlite_readonly(path, timeout_s)
    except sqlite3.Error as exc:
        raise InvalidArgumentError(f"SQL error: cannot open {path} read-only: {first_line(exc)}") from None
    authorizer = _Authorizer()
    deadline = time.monotonic() + timeout_s
    try:
        conn.set_authorizer(authorizer)
        conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)
        cur = conn.execute(query, params if params is not None else {})
        if cur.description is None:
            return None, []
        columns = [d[0] for d in cur.description]
        rows = cur.fetchmany(max_rows) if max_rows else cur.fetchall()
        return columns, [tuple(r) for r in rows]
    except sqlite3.Error as exc:
        if authorizer.denied is not None:
            raise not_allowed(one_line(query)) from None
        if isinstance(exc, sqlite3.OperationalError) and time.monotonic() > deadline and "interrupt" in str(exc):
            raise timed_out(timeout_s) from None
        raise InvalidArgumentError(f"SQL error: {first_line(exc)}") from None
    finally:
        conn.close()


# ------------------------------------------------------------------ PostgreSQL

PG_STATEMENTS = frozenset({"select", "with", "values", "table", "explain", "show"})
# Functions that change the session (set_config can switch back to a superuser role) or run
# SQL given as text (and could call set_config there); extensions' dblink* too.
PG_DENIED_FUNCTIONS = frozenset(
    {
        "set_config",
        "query_to_xml",
        "query_to_xmlschema",
        "query_to_xml_and_xmlschema",
        "cursor_to_xml",
        "cursor_to_xmlschema",
        "ts_stat",
        "ts_rewrite",
    }
)
PG_DENIED_PREFIXES = ("dblink",)

_PG_SPACE = " \t\n\r\f\v"
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_\x80-\U0010ffff][A-Za-z_0-9\x80-\U0010ffff]*)?\$")
_PARAM = re.compile(r"\$[0-9]+")


def _digit(c: str) -> bool:
    return "0" <= c <= "9"


def _ident_start(c: str) -> bool:
    return c.isascii() and (c.isalpha() or c == "_") or not c.isascii()


def _ident_cont(c: str) -> bool:
    return _ident_start(c) or _digit(c) or c == "$"


def pg_tokens(text: str) -> list[tuple[str, str]]:
    """PostgreSQL's lexical structure, as far as checking a statement needs it.

    Returns (kind, value) with kind in ident (lower-cased; quoted ones too), string, param,
    number, ';' and op. Raises InvalidArgumentError for what it will not read (U& escapes,
    unterminated strings or comments). Assumes standard_conforming_strings=on (set by run_postgresql).
    """
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)

    def refuse(why: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"SQL error: attnstore sql cannot check this statement: {why}")

    def quoted(start: int, quote_char: str, backslash: bool) -> int:
        """Index after the closing quote of the literal opened at `start`."""
        j = start + 1
        while j < n:
            c = text[j]
            if backslash and c == "\\":
                j += 2
                continue
            if c == quote_char:
                if j + 1 < n and text[j + 1] == quote_char:
                    j += 2
                    continue
                return j + 1
            j += 1
        raise refuse(f"unterminated {'identifier' if quote_char == chr(34) else 'string'}")

    while i < n:
        c = text[i]
        if c in _PG_SPACE:
            i += 1
        elif text.startswith("--", i):
            j = min((k for k in (text.find("\n", i), text.find("\r", i)) if k >= 0), default=n)
            i = j + 1
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while depth and j < n:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            if depth:
                raise refuse("unterminated /* comment")
            i = j
        elif c == "'":
            j = quoted(i, "'", False)
            out.append(("string", text[i:j]))
            i = j
        elif c == '"':
            j = quoted(i, '"', False)
            out.append(("ident", text[i + 1 : j - 1].replace('""', '"').lower()))
            i = j
        elif c == "$":
            m = _DOLLAR_TAG.match(text, i)
            p = _PARAM.match(text, i)
            if m:
                end = text.find(m.group(0), m.end())
                if end < 0:
                    raise refuse("unterminated $-quoted string")
                out.append(("string", text[i : end + len(m.group(0))]))
                i = end + len(m.group(0))
            elif p:
                out.append(("param", p.group(0)))
                i = p.end()
            else:
                out.append(("op", c))
                i += 1
        elif _ident_start(c):
            j = i + 1
            while j < n and _ident_cont(text[j]):
                j += 1
            word = text[i:j].lower()
            nxt = text[j] if j < n else ""
            if word == "u" and nxt == "&":
                raise refuse("U&\"...\" / U&'...' escapes are not supported")
            if word in ("e", "b", "x", "n") and nxt == "'":
                k = quoted(j, "'", word == "e")
                out.append(("string", text[i:k]))
                i = k
            else:
                out.append(("ident", word))
                i = j
        elif _digit(c) or (c == "." and i + 1 < n and _digit(text[i + 1])):
            j = i + 1
            while j < n and (_digit(text[j]) or text[j] == "."):
                j += 1
            out.append(("number", text[i:j]))
            i = j
        elif c == ";":
            out.append((";", c))
            i += 1
        else:
            out.append(("op", c))
            i += 1
    return out


def check_pg_statement(text: str) -> None:
    """Refuse (InvalidArgumentError) anything but one SELECT/WITH/VALUES/TABLE/EXPLAIN/SHOW statement
    that calls none of PG_DENIED_FUNCTIONS. `text` is the statement as the server will receive it."""
    tokens = pg_tokens(text)
    statements: list[list[tuple[str, str]]] = [[]]
    for token in tokens:
        if token[0] == ";":
            statements.append([])
        else:
            statements[-1].append(token)
    statements = [s for s in statements if s]
    if not statements:
        raise InvalidArgumentError("SQL error: empty statement")
    if len(statements) > 1:
        raise InvalidArgumentError(f"SQL error: attnstore sql runs one statement at a time (found {len(statements)}): {one_line(text)}")
    words = [value for kind, value in statements[0] if kind != "op" or value != "("]
    if not words or words[0] not in PG_STATEMENTS:
        raise not_allowed(one_line(text))
    for kind, value in statements[0]:
        if kind == "ident" and (value in PG_DENIED_FUNCTIONS or value.startswith(PG_DENIED_PREFIXES)):
            raise not_allowed(f"{value}() (it can change the session's role or settings, or run other SQL)")


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
    target: sa.Engine | str, query: str, params: dict | None, max_rows: int | None, timeout_s: float, check: bool = True
) -> Result:
    """Run `query` as described in the module docstring. `check=False` skips the statement check
    (tests use it to see that the server-side guards hold on their own)."""
    import psycopg

    engine, own_engine = _pg_engine(target)
    try:
        stmt = sa.text(escape_quoted_colons(query))
        compiled = stmt.compile(dialect=engine.dialect)
        try:
            args = compiled.construct_params(params or {})
        except sa.exc.SQLAlchemyError as exc:
            raise InvalidArgumentError(f"SQL error: {first_line(exc)}") from None
        sql_text = compiled.string
        if check:
            check_pg_statement(_as_sent(sql_text))
        try:
            conn = engine.connect()
        except sa.exc.DBAPIError as exc:
            raise InvalidArgumentError(f"SQL error: cannot connect: {first_line(exc.orig or exc)}") from None
        try:
            raw: Any = conn.connection.dbapi_connection  # a psycopg connection (cursor(...).execute(prepare=...))
            raw.rollback()
            cur = raw.cursor()
            try:
                cur.execute("SET TRANSACTION READ ONLY")
                cur.execute("SET LOCAL standard_conforming_strings = on")
                cur.execute(f"SET LOCAL statement_timeout = {max(1, int(timeout_s * 1000))}")
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
                try:
                    cur.execute(sql_text, args, prepare=True)
                except psycopg.Error as exc:
                    raise _pg_error(exc, query, timeout_s, superuser and has_read_role) from None
                if cur.description is None:
                    return None, []
                columns = [d.name for d in cur.description]
                rows = cur.fetchmany(max_rows) if max_rows else cur.fetchall()
                return columns, [tuple(r) for r in rows]
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
