"""The SQL surface reads the store and nothing else (issue 24, items 1 and 2), on SQLite and PostgreSQL.

Every statement an attacker tried is fed as it was: PostgreSQL's password hashes (pg_authid,
pg_shadow), other sessions (pg_stat_activity + pg_terminate_backend), and a result of gigabytes
(zeroblob). Each must fail with one line, read no row, and leave other connections alive.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import sqlalchemy as sa

from attnstore.store import readonly
from attnstore.store.errors import InvalidArgumentError, TooLargeError

SECRETS = [
    "SELECT rolname, rolpassword FROM pg_authid",
    "SELECT usename, passwd FROM pg_shadow",
    "SELECT rolpassword FROM pg_catalog.pg_authid",
    'SELECT rolpassword FROM "pg_authid"',
    "SELECT rolpassword FROM PG_CATALOG.PG_AUTHID",
    "SELECT (SELECT rolpassword FROM pg_authid LIMIT 1) AS p",
    "SELECT t.token FROM tokens t WHERE EXISTS (SELECT 1 FROM pg_authid WHERE rolpassword IS NOT NULL)",
    "SELECT * FROM tokens, LATERAL (SELECT passwd FROM pg_shadow) s",
    "WITH x AS (SELECT * FROM pg_authid) SELECT * FROM x",
    # a CTE's name does not hide the catalog inside its own body
    "WITH pg_authid AS (SELECT * FROM pg_authid) SELECT * FROM pg_authid",
    "SELECT * FROM tokens UNION ALL SELECT * FROM pg_shadow",
    "SELECT pid, query FROM pg_stat_activity",
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid()",
    "SELECT usename FROM public.pg_user",
    "SELECT * FROM pg_catalog.pg_user_mappings",
    "TABLE pg_authid",
]
SIDE_EFFECTS = [
    "SELECT pg_terminate_backend(0)",
    "SELECT pg_cancel_backend(0)",
    "SELECT pg_catalog.pg_terminate_backend(0)",
    "SELECT pg_advisory_lock(1)",
    "SELECT pg_try_advisory_xact_lock(1)",
    "SELECT set_config('role', 'postgres', true)",
    "SELECT current_setting('data_directory')",
    "SELECT pg_read_file('/etc/hostname')",
    "SELECT pg_ls_dir('.')",
    "SELECT lo_import('/etc/hostname')",
    "SELECT lo_from_bytea(0, 'x')",
    "SELECT pg_notify('c', 'x')",
    "SELECT pg_sleep(1)",
    "SELECT nextval('x')",
    "SELECT query_to_xml('SELECT 1', true, false, '')",
    "SELECT * FROM dblink('dbname=x', 'SELECT 1') AS t(x int)",
    "SELECT zeroblob(10)",
    "SELECT load_extension('x')",
    "SELECT count(*) FROM tokens WHERE pg_terminate_backend(0)",
]


@pytest.fixture
def filled(store, make_run):
    maps = np.full((1, 2, 4, 4), 0.25, dtype=np.float32)
    make_run(store, [maps, maps], [["[CLS]", "a", "b", "[SEP]"], ["[CLS]", "c", "d", "[SEP]"]], name="ro")
    return store


def is_pg(store) -> bool:
    return store.engine.dialect.name == "postgresql"


def test_only_the_store_is_read(filled):
    """Refused in one line, on both backends (on SQLite the catalogs do not exist, and the functions are not allowed).

    One store for all statements: a store per statement cost 3.5 minutes."""
    for query in SECRETS + SIDE_EFFECTS:
        with pytest.raises(InvalidArgumentError) as err:
            filled.sql(query)
        message = str(err.value)
        assert message.startswith("SQL error:") and "\n" not in message, query
        if is_pg(filled):
            assert "reads only the store's own tables and views" in message or "does not call" in message, (query, message)


def test_other_sessions_survive(filled):
    """pg_terminate_backend over pg_stat_activity killed a live ingest's connections: now it cannot run."""
    with filled.engine.connect() as other:
        other.execute(sa.text("SELECT 1"))
        with pytest.raises(InvalidArgumentError):
            filled.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid()")
        assert other.execute(sa.text("SELECT 2")).scalar() == 2


def test_what_stays_allowed(filled):
    store = filled
    joined = store.sql(
        "WITH t AS (SELECT run_id, lower(token) AS token FROM tokens) "
        "SELECT r.name, count(*) AS n, max(length(t.token)) AS longest FROM t JOIN runs r ON r.id = t.run_id "
        "GROUP BY r.name ORDER BY n DESC"
    )
    assert joined.values.tolist() == [["ro", 8, 5]]
    assert store.sql("SELECT coalesce(NULL, 1) AS a, round(2.5) AS b, abs(-1) AS c, substr('abc', 2) AS d").shape == (1, 4)
    if is_pg(store):
        columns = store.sql("SELECT column_name FROM information_schema.columns WHERE table_name = 'tokens'")
        assert "token" in set(columns.column_name)
        assert store.sql("SELECT count(*) AS n FROM public.tokens").n[0] == 8
        assert store.sql("SELECT g FROM generate_series(1, 3) AS g").g.tolist() == [1, 2, 3]
    else:
        assert "tokens" in set(store.sql("SELECT name FROM sqlite_master").name)
        assert store.sql("SELECT value FROM json_each('[1, 2]')").value.tolist() == [1, 2]
        with pytest.raises(InvalidArgumentError, match="not temp.sqlite_temp_master"):
            store.sql("SELECT * FROM temp.sqlite_master")


def test_a_huge_value_is_refused_before_it_is_built(filled):
    """`select zeroblob(1000000000)` returned 2.0 GB after 284 s; now one line, at once."""
    # (SQLite's printf gives NULL past the limit; a concatenation fails)
    query = (
        "SELECT x || x AS big FROM (SELECT printf('%.*c', 600000, 'x') AS x)" if not is_pg(filled) else "SELECT repeat('x', 2000000) AS big"
    )
    target = filled.locations.db_url if not is_pg(filled) else filled.engine
    start = time.monotonic()
    with pytest.raises(TooLargeError, match=r"^SQL error: a value .*over 1,000,000 bytes"):
        readonly.run_readonly_sql(target, query, max_value_bytes=1_000_000)
    with pytest.raises(InvalidArgumentError):
        filled.sql("SELECT zeroblob(1000000000)")  # not an allowed function at all
    assert time.monotonic() - start < 10


def test_a_large_result_is_cut_by_bytes(filled):
    target = filled.locations.db_url if not is_pg(filled) else filled.engine
    query = "SELECT t.token, t.position FROM tokens t CROSS JOIN tokens u ORDER BY t.position, u.position"
    with pytest.raises(TooLargeError, match=r"passed 100 bytes after \d+ rows") as err:
        readonly.run_readonly_sql(target, query, max_bytes=100)
    columns, rows = err.value.partial
    assert columns == ["token", "position"] and 0 < len(rows) < 64
    assert sum(len(token) + 8 for token, _ in rows) <= 100
    # within the bound, every row comes back
    assert len(readonly.run_readonly_sql(target, query, max_bytes=10_000)[1]) == 64


def test_the_command_line_cuts_a_large_result_with_a_message(filled):
    """`attnstore sql` printing gigabytes is not useful: it prints what fits in --max-bytes and says where it cut."""
    from click.testing import CliRunner

    from attnstore.api.cli import main

    store = filled
    args = ["sql", "--db", store.locations.db_url, "--root", store.locations.array_root, "--format", "csv"]
    query = "SELECT t.token FROM tokens t CROSS JOIN tokens u"
    cut = CliRunner().invoke(main, [*args, "--max-bytes", "50", query])
    assert cut.exit_code == 0, cut.output
    printed = cut.stdout.strip().splitlines()
    assert printed[0] == "token" and 1 < len(printed) < 65
    assert "cut after" in cut.stderr and "--max-bytes 50" in cut.stderr
    whole = CliRunner().invoke(main, [*args, query])
    assert whole.exit_code == 0 and len(whole.stdout.strip().splitlines()) == 65 and "cut" not in whole.stderr
    refused = CliRunner().invoke(main, [*args, "SELECT rolpassword FROM pg_authid"])
    assert refused.exit_code == 1 and refused.output.count("\n") == 1 and "Traceback" not in refused.output


def test_the_documented_function_list_is_the_allow_list():
    """docs/CLI.md lists exactly the functions store/sql_policy.py allows."""
    import re
    from pathlib import Path

    from attnstore.store.sql_policy import COMMON_FUNCTIONS

    text = (Path(__file__).parents[2] / "docs" / "CLI.md").read_text()
    section = text[text.index("## `attnstore sql`") : text.index("## `attnstore check`")]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, "docs/CLI.md's attnstore sql section has no function list"
    assert set(block.group(1).split()) == set(COMMON_FUNCTIONS)
