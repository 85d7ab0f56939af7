"""Schema migrations (Alembic): the only way the schema is built or changed.

Opening a store only compares the database's revision (its `alembic_version` row, read with SQLAlchemy) with
`HEAD_REVISION`, so Alembic is imported only to migrate, to list the known revisions, or to read the scripts'
head: importing it cost ~0.2 s of every command's start-up (`attnstore runs` 1.28 -> 1.07 s; docs/PERFORMANCE.md,
2026-11-28, 1ab279f)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from .config import redact
from .db import check_connection, create_engine
from .errors import SchemaOutOfDateError

if TYPE_CHECKING:
    from alembic.config import Config

# The newest script in migrations/versions. A new migration changes it too: tests/store/test_migrations.py checks it
# against Alembic's own reading of the scripts (`script_head`).
HEAD_REVISION = "0012"
VERSION_TABLE = "alembic_version"  # Alembic's default, which migrations/env.py keeps


def migrations_dir() -> Path:
    return Path(str(resources.files("attnstore") / "migrations"))


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # ConfigParser interpolation: a literal % in a URL (escaped passwords) must be doubled.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    """The schema revision this attnstore builds and reads."""
    return HEAD_REVISION


def script_head() -> str:
    """The head revision as Alembic reads it from the scripts (imports Alembic; `HEAD_REVISION` must equal it)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None, "attnstore ships its migrations"
    return head


def current_revision(engine: sa.Engine) -> str | None:
    """The database's revision (None: no attnstore schema), read from Alembic's version table as Alembic reads it."""
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table(VERSION_TABLE):
            return None
        versions = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(versions) > 1:  # Alembic refuses such a table too; attnstore's migrations have one line of descent
        url = engine.url.render_as_string(hide_password=False)
        raise SchemaOutOfDateError(
            f"database {redact(url)} has {len(versions)} rows in {VERSION_TABLE} ({', '.join(sorted(versions))}); "
            "it must hold one: restore the database from a backup or bundle"
        )
    return versions[0] if versions else None


def known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

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
    from alembic import command

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
