"""`attnstore --help` and `--version` start in a fraction of a second: importing the command line loads
click and api/common.py, not pandas, numpy, zarr, SQLAlchemy, Alembic or torch; a command's module is
imported when that command runs (api/common.py LazyGroup)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import click
import numpy as np
import pytest
from click.testing import CliRunner

from attnstore.api.cli import main

HEAVY = ("pandas", "numpy", "zarr", "sqlalchemy", "alembic", "torch", "transformers", "spacy", "psycopg", "tqdm", "fastapi")


def loaded_after(code: str) -> dict:
    """Run `code` in a fresh interpreter; which HEAVY modules it loaded and what it printed."""
    probe = f"""
import contextlib, io, json, sys
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
{chr(10).join("        " + line for line in code.strip().splitlines())}
    except SystemExit:
        pass
print(json.dumps({{"heavy": [m for m in {HEAVY!r} if m in sys.modules], "out": out.getvalue()}}))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_the_command_line_loads_no_heavy_package():
    assert loaded_after("import attnstore.api.cli")["heavy"] == []


def test_import_attnstore_loads_no_heavy_package_until_used():
    assert loaded_after("import attnstore\nattnstore.AttnStoreError")["heavy"] == []
    used = loaded_after("import attnstore\nprint(attnstore.open_store.__name__, attnstore.run_query.__name__)")
    assert used["out"].split() == ["open_store", "run_query"] and "sqlalchemy" in used["heavy"]


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["report", "--help"], ["db", "--help"]])
def test_help_and_version_load_no_heavy_package(args):
    result = loaded_after(f"from attnstore.api.cli import main\nmain({args!r}, prog_name='attnstore')")
    assert result["heavy"] == [], args
    assert result["out"].strip()


def test_help_lists_every_command():
    out = loaded_after("from attnstore.api.cli import main\nmain(['--help'], prog_name='attnstore')")["out"]
    listed = out.split("Commands:", 1)[1].split()
    for name in (
        "ablate check datasets db evaluate examples export finetune gradients import ingest models patterns probe "
        "queries query report runs serve show sql summarize tokens view"
    ).split():
        assert name in listed, name


def test_version_is_the_installed_distribution_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"attnstore, version {importlib.metadata.version('attnstore')}"


def walk(group: click.Group, ctx: click.Context, path=()):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, (*path, name)
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from walk(command, click.Context(command, info_name=name, parent=ctx), (*path, name))


def test_every_lazy_command_loads_under_its_listed_name():
    ctx = click.Context(main, info_name="attnstore")
    found = dict(walk(main, ctx))
    assert ("ingest",) in found and ("report", "table1") in found and ("probe", "train") in found
    for path, command in found.items():
        assert command.name == path[-1], path


@pytest.mark.parametrize("command", ["ingest", "probe", "finetune", "patterns", "serve", "export", "models"])
def test_a_lazy_command_runs_its_own_help(command):
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: ") and f" {command} [OPTIONS]" in result.output.splitlines()[0]


SQL_ONLY = [
    ["runs"],
    ["show", "hand"],
    ["examples", "--run", "hand"],
    ["tokens", "--run", "hand", "--example", "1"],
    ["sql", "SELECT count(*) FROM tokens"],
]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # what is imported does not depend on the backend
def test_commands_that_read_sql_only_do_not_import_zarr(store, make_run):
    """zarr (with numcodecs and fsspec, ~0.12-0.15 s) is imported by the first use of an array (store/lazy.py), so the
    commands that only read SQL start without it; a command that reads maps still gets it."""
    rng = np.random.default_rng(0)
    maps = [rng.dirichlet(np.ones(n), size=(2, 3, n)) for n in (4, 5)]
    run = make_run(store, maps, [["[CLS]", "a", "b", "[SEP]"], ["[CLS]", "c", "d", "e", "[SEP]"]])
    where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    calls = "\n".join(
        f"try:\n    main({[*args, *where]!r}, prog_name='attnstore')\nexcept SystemExit as e:\n    assert not e.code, {args!r}"
        for args in SQL_ONLY
    )
    sql_only = loaded_after(f"from attnstore.api.cli import main\n{calls}")
    assert "zarr" not in sql_only["heavy"] and "sqlalchemy" in sql_only["heavy"]
    assert all(word in sql_only["out"] for word in ("hand", "count")), sql_only["out"]
    maps_read = loaded_after(
        f"from attnstore.api.cli import main\nmain({['query', 'entropy', '--run', run, *where]!r}, prog_name='attnstore')"
    )
    assert "zarr" in maps_read["heavy"] and "entropy" in maps_read["out"]
