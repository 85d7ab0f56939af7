"""Pieces every command shares: store options, one-line errors, output formats."""

from __future__ import annotations

import functools

import click

from ..store.config import resolve_locations
from ..store.errors import AttnStoreError

FORMATS = ("table", "csv", "json")


def store_options(func):
    """--db / --root / --home, resolved as option > environment variable > default."""

    @click.option("--home", default=None, help="Store directory for the embedded default (env ATTNSTORE_HOME; default ./attnstore-data).")
    @click.option("--root", default=None,
                  help="Zarr root for attention arrays: a path or fsspec URL (env ATTNSTORE_ROOT; default HOME/attention.zarr).")
    @click.option("--db", default=None,
                  help="Metadata database URL, e.g. postgresql+psycopg://user@host/db (env ATTNSTORE_DB; default sqlite HOME/meta.sqlite).")
    @functools.wraps(func)
    def wrapper(*args, db=None, root=None, home=None, **kwargs):
        return func(*args, locations=resolve_locations(db=db, root=root, home=home), **kwargs)

    return wrapper


def friendly_errors(func):
    """Turn attnstore errors into one-line CLI errors with a non-zero exit."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except AttnStoreError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


def open_store(locations):
    from ..store import Store

    return Store(locations)


def emit(frame, fmt: str, output: str | None = None) -> None:
    if fmt == "csv":
        text = frame.to_csv(index=False)
    elif fmt == "json":
        text = frame.to_json(orient="records", indent=2, date_format="iso")
    else:
        text = frame.to_string(index=False, float_format=lambda v: f"{v:.4f}")
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        click.echo(f"wrote {len(frame)} rows to {output}", err=True)
    else:
        click.echo(text)
