"""Engine and session handling: one `session_scope()` that commits, rolls back and translates errors."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from .config import redact
from .errors import AttnStoreError, InvalidArgumentError


def create_engine(url: str) -> sa.Engine:
    """Create an engine; SQLite gets foreign keys on and a busy timeout for concurrent readers."""
    try:
        if url.startswith("sqlite"):
            engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

            @event.listens_for(engine, "connect")
            def _sqlite_pragmas(dbapi_conn, _record):
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA foreign_keys=ON")
                cur.execute("PRAGMA journal_mode=WAL")
                cur.close()

            return engine
        return sa.create_engine(url, pool_pre_ping=True)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise InvalidArgumentError(
            f"cannot use database URL {redact(url)!r}: {exc}; use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
        ) from None


def check_connection(engine: sa.Engine) -> None:
    try:
        with engine.connect():
            pass
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise AttnStoreError(f"cannot connect to database {redact(str(engine.url))}: {reason}") from None


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
