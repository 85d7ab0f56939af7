"""Alembic environment for attnstore.

Works both as `attnstore db upgrade` (URL passed in the config) and as plain
`alembic upgrade head` from the repository root (URL from alembic.ini's
sqlalchemy.url, else ATTNSTORE_DB / the default store, resolved like the CLI).
"""

from alembic import context

from attnstore.store.config import resolve_locations
from attnstore.store.db import create_engine
from attnstore.store.schema import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    url = resolve_locations().db_url
    if url.startswith("sqlite:///"):
        from pathlib import Path

        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    return url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url())
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
