"""Pieces every command shares: store options, one-line errors, output formats, lazily loaded commands.

Imports nothing heavy (no pandas, numpy, zarr or SQLAlchemy at import time): `attnstore --help`
and `--version` load this module and api/cli.py only.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os

import click

from ..store.config import resolve_locations
from ..store.errors import AttnStoreError

FORMATS = ("table", "csv", "json")


class LazyGroup(click.Group):
    """A group whose commands in `lazy` are imported only when one is run (or asked for its own --help).

    `lazy` maps a command name to ("module:attribute", short help), the module relative to
    attnstore.api; the group's --help lists those commands with that short help without
    importing them (click's LazyGroup recipe, plus the listing).
    """

    def __init__(self, *args, lazy: dict[str, tuple[str, str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            path, short_help = self.lazy[cmd_name]
            module, attribute = path.split(":")
            command = getattr(importlib.import_module(module, __package__), attribute)
            command.short_help = short_help  # what the listing says, whichever module defines the command
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def listed_help(self, cmd_name: str, limit: int) -> str | None:
        """The listed help of a command (None: hidden), importing nothing."""
        if cmd_name in self.lazy:
            return self.lazy[cmd_name][1]
        command = self.commands[cmd_name]
        return None if command.hidden else command.get_short_help_str(limit)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(map(len, names))
        rows = [(name, text) for name in names if (text := self.listed_help(name, limit)) is not None]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def store_options(func):
    """--db / --root / --home / --read-only, resolved as option > environment variable > default."""

    @click.option(
        "--read-only",
        "read_only",
        is_flag=True,
        default=False,
        help="Open the store for reading only: commands that write fail before doing anything (env ATTNSTORE_READ_ONLY=1). "
        "Needed for object storage with read-only credentials; read-only SQLite files, local folders and "
        "SELECT-only PostgreSQL roles are detected without it.",
    )
    @click.option("--home", default=None, help="Store directory for the embedded default (env ATTNSTORE_HOME; default ./attnstore-data).")
    @click.option(
        "--root",
        default=None,
        help="Zarr root for attention arrays: a path or fsspec URL (env ATTNSTORE_ROOT; default HOME/attention.zarr).",
    )
    @click.option(
        "--db",
        default=None,
        help="Metadata database URL, e.g. postgresql+psycopg://user@host/db (env ATTNSTORE_DB; default sqlite HOME/meta.sqlite).",
    )
    @functools.wraps(func)
    def wrapper(*args, db=None, root=None, home=None, read_only=False, **kwargs):
        try:
            locations = resolve_locations(db=db, root=root, home=home, read_only=True if read_only else None)
        except AttnStoreError as exc:  # a bad ATTNSTORE_READ_ONLY value
            raise click.ClickException(str(exc)) from None
        return func(*args, locations=locations, **kwargs)

    return wrapper


def friendly_errors(func):
    """Turn attnstore errors into one-line CLI errors with a non-zero exit."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except AttnStoreError as exc:
            raise click.ClickException(str(exc)) from None
        except ModuleNotFoundError as exc:
            raise click.ClickException(missing_extra_message(exc)) from None

    return wrapper


# Optional dependencies -> the extra (pyproject.toml) that installs them.
EXTRAS = {
    "torch": "ingest",
    "transformers": "ingest",
    "spacy": "ingest",
    "scipy": "ingest",
    "matplotlib": "report",
    "fsspec": "s3",
    "s3fs": "s3",
    "fastapi": "serve",
    "uvicorn": "serve",
}
EXTRA_HINTS = {
    "ingest": "pip install torch==2.13.0 'attnstore[ingest]'",
    "report": "pip install 'attnstore[report]'",
    "s3": "pip install fsspec s3fs",
    "serve": "pip install 'attnstore[serve]'",
}


def require_extra(extra: str) -> None:
    """Fail in one line, before anything is done, when a package of `extra` is not installed."""
    import importlib.util

    for module, needed_by in EXTRAS.items():
        if needed_by == extra and importlib.util.find_spec(module) is None:
            raise click.ClickException(missing_extra_message(ModuleNotFoundError(f"No module named {module!r}", name=module)))


def missing_extra_message(exc: ModuleNotFoundError) -> str:
    """One line naming the optional extra a missing module belongs to (or the module itself)."""
    module = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(module)
    if extra is None:
        return f"missing Python package {module!r} ({exc}); install it, or reinstall attnstore"
    return f"this command needs the {extra!r} extra ({module} is not installed): {EXTRA_HINTS[extra]}"


def _local_path(url_or_path: str) -> str | None:
    if url_or_path.startswith("sqlite:///"):
        return url_or_path[len("sqlite:///") :]
    if url_or_path.startswith("file://"):
        return url_or_path[len("file://") :]
    return None if "://" in url_or_path else url_or_path


def create_store(locations) -> str:
    """Create or upgrade the schema, and create a local array root (check a remote one); returns what
    `db upgrade` prints. A store this user may not write is refused before anything is written."""
    from ..store import migrate, remote
    from ..store.config import redact
    from ..store.db import write_denied_at
    from ..store.errors import ReadOnlyStoreError

    refused = "opened with --read-only / ATTNSTORE_READ_ONLY" if locations.read_only else write_denied_at(locations.db_url)
    if refused:
        raise ReadOnlyStoreError(
            f"store {locations.describe()} is read-only for this user ({refused}); `db upgrade` writes: run it as the store's owner"
        )
    remote.check_writable(locations.array_root)  # object storage: the bucket exists and these credentials may write
    db_file = _local_path(locations.db_url)
    if db_file and locations.db_url.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(db_file) or ".", exist_ok=True)
    before, after = migrate.upgrade(locations.db_url)
    root = _local_path(locations.array_root)
    if root:
        os.makedirs(root, exist_ok=True)
    state = "already at" if before == after else f"upgraded from {before or 'empty'} to"
    return f"{redact(locations.db_url)}: {state} revision {after}; arrays in {root or locations.array_root}"


@contextlib.contextmanager
def reading_progress(desc: str, total: int | None = None):
    """A progress bar on stderr counting the examples a command reads (`store.progress`); shown on a
    terminal only, so piped output and logs stay clean."""
    from tqdm.auto import tqdm

    from ..store.progress import reporting

    with tqdm(total=total, desc=desc, unit="ex", disable=None, dynamic_ncols=True, leave=False) as bar, reporting(bar.update):
        yield bar


def open_store(locations, create: bool = False, write: bool | None = None):
    """The store at `locations`. With `create` (commands that write, like ingest), a SQLite store whose file
    does not exist yet is created first, so the embedded default just works; PostgreSQL keeps an explicit
    `attnstore db upgrade`.

    With `write` (default: `create`), a store this user may not write (read-only SQLite file or folder,
    SELECT-only PostgreSQL role, read-only object-store credentials, --read-only) fails here, in one
    line saying it is read-only, before the command loads a model or computes anything."""
    from ..store import Store

    write = create if write is None else write
    db_file = _local_path(locations.db_url) if locations.db_url.startswith("sqlite:///") else None
    if create and db_file and not os.path.exists(db_file):
        click.echo(f"creating a new store: {create_store(locations)}", err=True)
    store = Store(locations)
    if write:
        store.require_writable()
    return store


def store_exists(locations) -> bool:
    """Whether the store's database is there to open (a server database is assumed to be)."""
    db_file = _local_path(locations.db_url) if locations.db_url.startswith("sqlite:///") else None
    return db_file is None or os.path.exists(db_file)


TABLE_CELL_WIDTH = 60  # longer text cells are cut in table output (csv and json keep them whole)


def _whole_numbers(frame):
    """Integer columns that pandas turned into floats because of missing values, back to integers."""
    import pandas as pd

    out = frame.copy()
    for name in out.columns:
        col = out[name]
        if pd.api.types.is_float_dtype(col) and col.isna().any() and col.notna().any():
            values = col.dropna()
            if (values == values.round()).all() and values.abs().max() < 2**53:
                out[name] = col.astype("Int64")
    return out


def _json_value(value):
    import math

    import numpy as np
    import pandas as pd

    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # NaN, inf: JSON has no such numbers
    if value is pd.NA or value is pd.NaT or value is None:
        return None
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def to_json_records(frame) -> str:
    """Records as JSON: numbers as numbers, missing values as null, text unescaped (no `glue\\/MRPC`)."""
    import json

    records = [{str(k): _json_value(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]
    return json.dumps(records, indent=2, ensure_ascii=False, default=str)


def to_table(frame) -> str:
    """A plain-text table: text left-aligned, numbers right-aligned, floats to 4 places, integers as integers,
    missing values blank, long text cut to TABLE_CELL_WIDTH characters."""
    import pandas as pd
    from tabulate import tabulate

    shown = _whole_numbers(frame)
    for name in shown.columns:
        if shown[name].dtype == object or pd.api.types.is_string_dtype(shown[name]):
            shown[name] = shown[name].map(
                lambda v: v if not isinstance(v, str) or len(v) <= TABLE_CELL_WIDTH else v[: TABLE_CELL_WIDTH - 1] + "…"
            )
    rows = shown.astype(object).where(shown.notna(), None).values.tolist()
    return tabulate(rows, headers=[str(c) for c in shown.columns], floatfmt=".4f", missingval="", tablefmt="simple")


def emit(frame, fmt: str, output: str | None = None) -> None:
    """Print (or write to `output`) a DataFrame as a table, CSV or JSON records; an empty table says so."""
    if fmt == "csv":
        text = frame.to_csv(index=False)
    elif fmt == "json":
        text = to_json_records(frame)
    elif frame.empty:
        text = f"(no rows; columns: {', '.join(map(str, frame.columns))})" if len(frame.columns) else "(no rows)"
    else:
        text = to_table(frame)
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        click.echo(f"wrote {len(frame)} rows to {output}", err=True)
    else:
        click.echo(text)


def scheduler_option(what: str):
    """--scheduler: run `what` on Dask distributed (store/cluster.py)."""
    return click.option(
        "--scheduler",
        default=None,
        metavar="local[:N]|tcp://HOST:PORT",
        help=f"Run {what} on Dask distributed: `local` (a worker process per core), `local:N`, or a running "
        "scheduler's address (env ATTNSTORE_SCHEDULER). Needs the `dask` extra.",
    )
