"""psycopg is the `postgres` extra, not a core dependency (SQLite is the default): a PostgreSQL URL without
it fails in one line naming the extra. The missing module is simulated (sys.modules[name] = None) in a
fresh interpreter."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a Python process per test, with psycopg hidden: not in make test-fast

ROOT = Path(__file__).parents[1]
EXTRA = "pip install 'attnstore[postgres]'"


def without(modules: tuple[str, ...], code: str) -> subprocess.CompletedProcess:
    blocked = "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    return subprocess.run([sys.executable, "-c", f"import sys\n{blocked}{code}"], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/none"],
        ["db", "upgrade", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/none"],
        ["db", "current", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/none"],
    ],
)
def test_a_postgresql_url_without_psycopg_is_one_line_naming_the_extra(args, tmp_path):
    done = without(("psycopg",), f"from attnstore.api.cli import main\nmain({args!r}, prog_name='attnstore')")
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0] == f"Error: PostgreSQL needs the 'postgres' extra (psycopg is not installed): {EXTRA}"


def test_the_python_api_says_the_same():
    code = (
        "from attnstore import open_store, InvalidArgumentError\n"
        "try:\n    open_store(db='postgresql+psycopg://nobody@127.0.0.1:1/none')\n"
        "except InvalidArgumentError as exc:\n    print(exc)\n"
    )
    done = without(("psycopg",), code)
    assert done.stdout.strip() == f"PostgreSQL needs the 'postgres' extra (psycopg is not installed): {EXTRA}", done.stderr


def test_a_bare_postgresql_url_names_the_extra_too():
    # SQLAlchemy 2.1 reads postgresql:// with psycopg 3, 2.0 with psycopg2: either way one line ending in the extra
    done = without(("psycopg", "psycopg2"), "from attnstore.api.cli import main\nmain(['runs', '--db', 'postgresql://u@h/db'])")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].endswith(EXTRA) and ("'postgres' extra" in lines[0] or "write the URL as postgresql+psycopg://" in lines[0])


def test_the_psycopg2_default_of_older_sqlalchemy_is_explained():
    from attnstore.store.db import missing_driver_message

    exc = ModuleNotFoundError("No module named 'psycopg2'", name="psycopg2")
    assert missing_driver_message("postgresql://u:secret@h/db", exc) == (
        "database URL 'postgresql://u:***@h/db' asks for the psycopg2 driver, which is not installed: write the URL as "
        f"postgresql+psycopg://... and install psycopg 3 with {EXTRA}"
    )


def test_sqlite_needs_no_psycopg(tmp_path):
    db = f"sqlite:///{tmp_path / 'meta.sqlite'}"
    code = f"from attnstore.api.cli import main\nmain(['db', 'upgrade', '--db', {db!r}, '--root', {str(tmp_path / 'z')!r}])"
    done = without(("psycopg",), code)
    assert done.returncode == 0, done.stderr
    assert "upgraded from empty" in done.stdout and not done.stderr


def test_psycopg_is_the_postgres_extra_not_a_core_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert not [d for d in project["dependencies"] if d.startswith("psycopg")]
    assert project["optional-dependencies"]["postgres"] == ["psycopg[binary]>=3.1", "pglast>=7"]  # pglast: the SQL allow-list
    extras = re.search(r'pip install -q -e "\.\[([a-z0-9,-]+)\]"', (ROOT / "Makefile").read_text(encoding="utf-8"))
    assert extras and "postgres" in extras.group(1).split(",")  # the development install has it
