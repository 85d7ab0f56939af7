"""Schema migrations (Alembic): the only way the schema is built or changed."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from .config import redact
from .db import check_connection, create_engine
from .errors import SchemaOutOfDateError


def migrations_dir() -> Path:
    return Path(str(resources.files("attnstore") / "migrations"))


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # ConfigParser interpolation: a literal % in a URL (escaped passwords) must be doubled.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None, "attnstore ships its migrations"
    return head


def current_revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def known_revisions() -> set[str]:
    return {rev.revision for rev in ScriptDirectory.from_config(alembic_config("sqlite://")).walk_revisions()}


def refuse_newer(url: str, current: str | None) -> None:
    """A database migrated by a newer attnstore cannot be used (or "upgraded") by this one."""
    if current is not None and current not in known_revisions():
        raise SchemaOutOfDateError(
            f"database {redact(url)} is at revision {current}, newer than this attnstore (head {head_revision()}); "
            "upgrade attnstore (pip install -U attnstore) to use it"
        )


def upgrade(url: str, revision: str = "head") -> tuple[str | None, str | None]:
    """Upgrade the database at `url`; returns (revision before, revision after)."""
    engine = create_engine(url)
    check_connection(engine)
    before = current_revision(engine)
    engine.dispose()
    refuse_newer(url, before)
    command.upgrade(alembic_config(url), revision)
    engine = create_engine(url)
    after = current_revision(engine)
    engine.dispose()
    return before, after


def upgrade_command(url: str) -> str:
    return f"attnstore db upgrade --db '{redact(url)}'"


def verify_schema(engine: sa.Engine) -> None:
    """Refuse a database whose schema is not at this version's head, naming the fix."""
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return
    url = str(engine.url.render_as_string(hide_password=False))
    if current is None:
        raise SchemaOutOfDateError(f"database {redact(url)} has no attnstore schema; create it with: {upgrade_command(url)}")
    refuse_newer(url, current)
    raise SchemaOutOfDateError(f"database {redact(url)} is at revision {current}, expected {head}; run: {upgrade_command(url)}")
