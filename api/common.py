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
    "psycopg": "postgres",
}
EXTRA_HINTS = {
    "ingest": "pip install torch==2.13.0 'attnstore[ingest]'",
    "report": "pip install 'attnstore[report]'",
    "s3": "pip install fsspec s3fs",
    "serve": "pip install 'attnstore[serve]'",
    "postgres": "pip install 'attnstore[postgres]'",
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
        store.writer.require_writable()
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


INTEGER_COLUMNS = ("layer", "head", "example", "position", "word_position", "n")  # and n_*: counts and indexes


def _integer_columns(frame):
    """Index and count columns (layer, head, n_*, ...) that pandas made floats (a missing value), as integers in
    every format: layer 3, never 3.0."""
    import pandas as pd

    out = frame
    for name in frame.columns:
        col = frame[name]
        if (str(name) in INTEGER_COLUMNS or str(name).startswith("n_")) and pd.api.types.is_float_dtype(col):
            values = col.dropna()
            if (values == values.round()).all() and (values.empty or values.abs().max() < 2**53):
                out = out.copy() if out is frame else out
                out[name] = col.astype("Int64")
    return out


def select_columns(frame, columns: str | None):
    """`--columns a,b,c`: those columns, in that order; an unknown name is a one-line error listing the columns."""
    if not columns:
        return frame
    names = [c.strip() for c in columns.split(",") if c.strip()]
    unknown = [c for c in names if c not in frame.columns]
    if unknown or not names:
        raise click.ClickException(
            f"--columns: no column {', '.join(map(repr, unknown)) or '(none given)'}; columns: {', '.join(map(str, frame.columns))}"
        )
    return frame[list(dict.fromkeys(names))]


def columns_option(func):
    """--columns a,b,c: print only these columns (any format)."""
    return click.option(
        "--columns",
        default=None,
        metavar="A,B,...",
        help="Only these columns, in this order (every format). Tables wider than the terminal are otherwise summarised.",
    )(func)


def terminal_width() -> int | None:
    """Columns of the terminal that tables must fit: $COLUMNS, else the terminal's width when stdout is one;
    None (no limit) when output goes to a pipe or file, so nothing is left out there."""
    import shutil
    import sys

    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        if sys.stdout.isatty():
            return shutil.get_terminal_size().columns
    except (AttributeError, ValueError, OSError):
        pass
    return None


def _column_widths(table: str) -> list[int]:
    """The widths of a tabulate "simple" table's columns, read from its rule line of dashes."""
    rule = table.splitlines()[1]
    return [len(part) for part in rule.split("  ") if part]


def _per_head_summary(frame):
    """One row per value column of a per-head frame: its mean, min and max over heads and the head with the max."""
    import pandas as pd

    rows = []
    for name in frame.columns:
        if name in ("layer", "head"):
            continue
        values = pd.to_numeric(frame[name], errors="coerce").astype(float)
        best = values.idxmax() if values.notna().any() else None
        rows.append(
            dict(
                column=str(name),
                mean=values.mean(),
                min=values.min(),
                max=values.max(),
                max_layer=None if best is None else int(frame.loc[best, "layer"]),
                max_head=None if best is None else int(frame.loc[best, "head"]),
            )
        )
    out = pd.DataFrame(rows, columns=["column", "mean", "min", "max", "max_layer", "max_head"])
    return out.astype({"max_layer": "Int64", "max_head": "Int64"})


def _is_per_head(frame) -> bool:
    import pandas as pd

    if "layer" not in frame.columns or "head" not in frame.columns or frame[["layer", "head"]].duplicated().any():
        return False
    others = [c for c in frame.columns if c not in ("layer", "head")]
    return bool(others) and all(pd.api.types.is_numeric_dtype(frame[c]) for c in others)


def fit_table(frame, width: int) -> tuple[str, str | None]:
    """The table of `frame`, and a note, so that it fits `width` characters: a per-head frame (one row per layer and
    head, numeric columns) too wide is summarised per column; any other keeps its leading columns that fit."""
    text = to_table(frame)
    if max(map(len, text.splitlines())) <= width:
        return text, None
    how = "--columns A,B to pick columns, --format csv or json for all of them"
    if _is_per_head(frame):
        summary = _per_head_summary(frame)
        note = (
            f"{len(frame.columns) - 2} columns x {len(frame)} heads are wider than the terminal ({width} characters): "
            f"each column's mean, min and max over the heads, and the head with the max ({how})"
        )
        text = to_table(summary)
        if max(map(len, text.splitlines())) <= width:
            return text, note
        frame = summary  # still too wide (a long column name): cut its columns below
    widths = _column_widths(text)
    keep, used = 1, widths[0]
    while keep < len(widths) and used + 2 + widths[keep] <= width:
        used += 2 + widths[keep]
        keep += 1
    hidden = [str(c) for c in frame.columns[keep:]]
    note = f"{len(hidden)} more column(s) do not fit in {width} characters: {', '.join(hidden)} ({how})"
    return to_table(frame[frame.columns[:keep]]), note


def _fold_constant(frame, names) -> tuple[object, list[str]]:
    """Drop each column of `names` whose non-missing values are all one value; a note says what it was."""
    notes = []
    for name in names:
        if name in frame.columns and len(frame) > 1:
            values = frame[name].dropna().unique()
            if len(values) == 1:
                where = "every row" if frame[name].notna().all() else "every row that has one"
                frame = frame.drop(columns=[name])
                notes.append(f"{name} is {values[0]} on {where} (column left out; --columns to show it)")
    return frame, notes


def emit(frame, fmt: str, output: str | None = None, columns: str | None = None, constant: tuple[str, ...] = ()) -> None:
    """Print (or write to `output`) a DataFrame as a table, CSV or JSON records; an empty table says so.

    `columns` ("a,b,c", --columns) keeps those columns in every format. Otherwise csv and json keep every
    column; a table printed to a terminal that is wider than it is summarised (a per-head frame: each
    column's mean, min, max and best head) or cut to its leading columns, with a note on stderr saying
    so, and the columns of `constant` that hold one value on every row become a note. Index and count
    columns (layer, head, n_*) print as integers in every format.
    """
    frame = _integer_columns(select_columns(frame, columns))
    notes: list[str] = []
    if fmt == "csv":
        text = frame.to_csv(index=False)
    elif fmt == "json":
        text = to_json_records(frame)
    elif frame.empty:
        text = f"(no rows; columns: {', '.join(map(str, frame.columns))})" if len(frame.columns) else "(no rows)"
    else:
        if not columns:
            frame, notes = _fold_constant(frame, constant)
        width = None if output or columns else terminal_width()
        if width is None:
            text = to_table(frame)
        else:
            text, note = fit_table(frame, width)
            notes += [note] if note else []
    if output:
        write_output(output, text + "\n")
        click.echo(f"wrote {len(frame)} rows to {output}", err=True)
    else:
        click.echo(text)
    for note in notes:
        click.echo(f"note: {note}", err=True)


def prepare_output(path: str | None) -> None:
    """An --output file checked before the work that fills it: its folder made where missing (as `view --out` and
    `export --to` make theirs); a path that cannot be written is one Error line naming it, before any work is lost."""
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(f"cannot write --output {path}: {exc.strerror or exc}; give a file in a writable folder") from None
    if os.path.isdir(path):
        raise click.ClickException(f"cannot write --output {path}: it is a folder; give a file name")
    if not os.access(folder, os.W_OK):
        raise click.ClickException(f"cannot write --output {path}: no write permission on {folder}; give a file in a writable folder")


def write_output(path: str, text: str) -> None:
    """`text` written to the --output file `path` (`prepare_output` first); an OSError is one Error line."""
    prepare_output(path)
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise click.ClickException(f"cannot write --output {path}: {exc.strerror or exc}") from None


def scheduler_option(what: str):
    """--scheduler: run `what` on Dask distributed (store/cluster.py)."""
    return click.option(
        "--scheduler",
        default=None,
        metavar="local[:N]|tcp://HOST:PORT",
        help=f"Run {what} on Dask distributed: `local` (a worker process per core), `local:N`, or a running "
        "scheduler's address (env ATTNSTORE_SCHEDULER). Needs the `dask` extra.",
    )
