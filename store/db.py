"""Engine and session handling: one `session_scope()` that commits, rolls back and translates errors."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from .config import redact
from .errors import AttnStoreError, InvalidArgumentError

SUPPORTED = ("sqlite", "postgresql")


def sqlite_path(url: str) -> str | None:
    """The file of a sqlite:///PATH URL (None for other URLs and in-memory databases)."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///") :].split("?", 1)[0]
    return path or None


def sqlite_writable(path: str) -> bool:
    """Whether this process can write the SQLite file (and create its -wal/-shm files beside it)."""
    folder = os.path.dirname(os.path.abspath(path))
    return os.access(folder, os.W_OK) and (not os.path.exists(path) or os.access(path, os.W_OK))


def _readonly_sqlite_creator(path: str):
    # mode=ro reads a live store safely but needs to create the -shm file; on a folder we
    # cannot write, immutable=1 reads the file as it is (no locking: nobody else may write it).
    flag = "mode=ro" if os.access(os.path.dirname(os.path.abspath(path)), os.W_OK) else "immutable=1"
    uri = f"file:{quote(os.path.abspath(path))}?{flag}"
    return lambda: sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False)


def create_engine(url: str, read_only: bool = False) -> sa.Engine:
    """Create an engine; SQLite gets foreign keys on and a busy timeout for concurrent readers.

    `read_only` opens a SQLite file without ever writing to it (for stores on read-only
    shares and mounts), and makes every PostgreSQL transaction READ ONLY.
    """
    scheme = url.split(":", 1)[0].split("+", 1)[0]
    if scheme not in SUPPORTED:
        raise InvalidArgumentError(
            f"cannot use database URL {redact(url)!r}: attnstore keeps metadata in SQLite or PostgreSQL; "
            "use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
        )
    try:
        if scheme == "sqlite":
            path = sqlite_path(url)
            if read_only and path:
                # A pool of file connections: "sqlite://" alone would pick SingletonThreadPool (meant for :memory:),
                # which closes other threads' connections under concurrent readers (attnstore serve) and crashes.
                engine = sa.create_engine("sqlite://", creator=_readonly_sqlite_creator(path), poolclass=sa.pool.QueuePool)
            else:
                engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

            @event.listens_for(engine, "connect")
            def _sqlite_pragmas(dbapi_conn, _record):
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA foreign_keys=ON")
                if not read_only:
                    cur.execute("PRAGMA journal_mode=WAL")
                cur.close()

            return engine
        if read_only:  # the server refuses every write of this engine's sessions, whatever the role may do
            return sa.create_engine(url, pool_pre_ping=True, connect_args={"options": "-c default_transaction_read_only=on"})
        return sa.create_engine(url, pool_pre_ping=True)
    except ImportError as exc:  # the URL's driver is not installed (SQLAlchemy imports it here)
        raise InvalidArgumentError(missing_driver_message(url, exc)) from None
    except (ArgumentError, NoSuchModuleError) as exc:
        raise InvalidArgumentError(
            f"cannot use database URL {redact(url)!r}: {exc}; use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
        ) from None


POSTGRES_EXTRA = "pip install 'attnstore[postgres]'"


def missing_driver_message(url: str, exc: ImportError) -> str:
    """One line for a database URL whose driver is not installed: PostgreSQL's is the `postgres` extra (psycopg 3)."""
    scheme, _, driver = url.split(":", 1)[0].partition("+")
    module = (getattr(exc, "name", None) or "").split(".")[0] or driver or "its driver"
    if scheme != "postgresql":
        return f"cannot use database URL {redact(url)!r}: its driver {module} is not installed ({exc})"
    if driver in ("", "psycopg2") and module == "psycopg2":  # SQLAlchemy's default for postgresql:// is psycopg2
        return (
            f"database URL {redact(url)!r} asks for the psycopg2 driver, which is not installed: write the URL as "
            f"postgresql+psycopg://... and install psycopg 3 with {POSTGRES_EXTRA}"
        )
    return f"PostgreSQL needs the 'postgres' extra ({module} is not installed): {POSTGRES_EXTRA}"


def check_connection(engine: sa.Engine) -> None:
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                conn.exec_driver_sql("SELECT count(*) FROM sqlite_master").scalar()  # reads the header
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        hint = "; is it an attnstore SQLite store (meta.sqlite)?" if engine.dialect.name == "sqlite" else ""
        raise AttnStoreError(f"cannot open database {redact(str(engine.url))}: {reason}{hint}") from None


# Tables every writer inserts into, updates and deletes from: without these privileges the store is read-only.
WRITE_TABLES = ("runs", "leases")


def sql_write_denied(engine: sa.Engine) -> str | None:
    """Why this PostgreSQL user cannot write the store (None: it can; SQLite: see `sqlite_writable`).

    A role granted SELECT only, or a server in read-only mode (a standby, or
    default_transaction_read_only for this role), cannot write: the store opens read-only.
    """
    if engine.dialect.name != "postgresql":
        return None
    with engine.connect() as conn:
        user, transaction_read_only, schema, has_tables = conn.exec_driver_sql(
            "SELECT current_user, current_setting('transaction_read_only'), current_schema(), to_regclass('runs') IS NOT NULL"
        ).one()
        if transaction_read_only == "on":
            return f"PostgreSQL user {user}'s transactions are read-only (a standby server, or default_transaction_read_only)"
        if not has_tables:  # a database `db upgrade` has not created yet: it needs to create tables
            if not conn.exec_driver_sql("SELECT has_schema_privilege(current_schema(), 'CREATE')").scalar():
                return f"PostgreSQL user {user} may not create tables in schema {schema}"
            return None
        checks = ", ".join(f"has_table_privilege('{t}', '{p}')" for t in WRITE_TABLES for p in ("INSERT", "UPDATE", "DELETE"))
        allowed = conn.exec_driver_sql(f"SELECT {checks}").one()
    if not all(allowed):
        return f"PostgreSQL user {user} may not write its tables (no INSERT, UPDATE or DELETE on {', '.join(WRITE_TABLES)})"
    return None


def write_denied_at(url: str) -> str | None:
    """Why this user cannot write the database at `url` (before `db upgrade`): a SQLite file or folder it
    cannot write, a SELECT-only PostgreSQL role, a read-only server. None: it can (or it does not exist yet)."""
    path = sqlite_path(url)
    if path:
        return None if sqlite_writable(path) or not os.path.exists(path) else f"no write permission on its SQLite file {path}"
    engine = create_engine(url)
    try:
        check_connection(engine)
        return sql_write_denied(engine)
    finally:
        engine.dispose()


@contextmanager
def session_scope(factory: sessionmaker) -> Iterator[Session]:
    """Yield a session; commit on success, roll back on any error, always close."""
    session = factory()
    try:
        yield session
        session.commit()
    except SQLAlchemyError as exc:
        session.rollback()
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise AttnStoreError(f"database error: {reason}") from exc
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
