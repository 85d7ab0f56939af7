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

from attnstore.store import readonly, sql_policy
from attnstore.store.errors import InvalidArgumentError, TooLargeError
from attnstore.tests.snapshots import store_with

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
def filled(store):
    return store


def build_filled(store, make_run):
    maps = np.full((1, 2, 4, 4), 0.25, dtype=np.float32)
    make_run(store, [maps, maps], [["[CLS]", "a", "b", "[SEP]"], ["[CLS]", "c", "d", "[SEP]"]], name="ro")


# For a test of `filled`: the store build_filled fills, built once per session on SQLite and copied (tests/snapshots.py).
store = store_with("filled", build_filled)


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
    query = "SELECT printf('%.*c', 2000000, 'x') AS big" if not is_pg(filled) else "SELECT repeat('x', 2000000) AS big"
    target = filled.locations.db_url if not is_pg(filled) else filled.engine
    start = time.monotonic()
    with pytest.raises(TooLargeError, match=r"^SQL error: .*over 1,000,000 bytes"):
        readonly.run_readonly_sql(target, query, max_value_bytes=1_000_000)
    with pytest.raises(InvalidArgumentError):
        filled.sql("SELECT zeroblob(1000000000)")  # not an allowed function at all
    assert time.monotonic() - start < 10


PEAK_RSS = """
import resource, sys, time
from attnstore.store import readonly, sql_policy
from attnstore.store.errors import TooLargeError
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.monotonic()
try:
    readonly.run_readonly_sql(sys.argv[1], sys.argv[2])
    print("no error")
except TooLargeError as exc:
    print(exc)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, round(time.monotonic() - started, 1))
"""


def test_a_300_mb_value_never_reaches_the_process(filled):
    """Issue 49 item 6: `SELECT repeat('x', 300000000)` took the CLI to 1.0 GB (1.58 GB for 500 MB) before its refusal,
    because PostgreSQL's value was checked after it arrived. Now the server refuses it (SQLite never builds it, and its
    printf says so instead of giving NULL): the reading process's peak grows by ~16 MB, not ~875 MB."""
    import subprocess
    import sys

    if is_pg(filled):
        target, query = filled.engine.url.render_as_string(hide_password=False), "SELECT repeat('x', 300000000) AS big"
    else:
        target, query = filled.locations.db_url, "SELECT printf('%.*c', 300000000, 'x') AS big"
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, target, query], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    message, figures = done.stdout.strip().splitlines()
    grown_mb, seconds = figures.split()
    said = "a value in column 'big' is over 16,777,216 bytes (300,000,000 bytes;" if is_pg(filled) else "printf() is over 16,777,216 bytes"
    assert said in message, message
    assert int(grown_mb) < 100, (grown_mb, seconds)


def test_printf_past_the_value_limit_is_an_error_not_null(filled):
    """Issue 49 item 7: SQLite's printf (and format, its other name) gave a silent NULL past the value limit."""
    target = filled.locations.db_url if not is_pg(filled) else filled.engine
    run = lambda q: readonly.run_readonly_sql(target, q, max_value_bytes=1000)[1]  # noqa: E731
    if not is_pg(filled):
        for query, name in (("SELECT printf('%.*c', 2000, 'x')", "printf"), ("SELECT format('%.*c', 1001, 'x')", "format")):
            with pytest.raises(TooLargeError) as err:
                run(query)
            assert str(err.value).startswith(f"SQL error: the result of {name}() is over 1,000 bytes") and "\n" not in str(err.value)
        assert run("SELECT printf('') AS a, printf(NULL) AS b, printf('%d', 3) AS c") == [(None, None, "3")]  # as SQLite's own
        assert len(run("SELECT printf('%.*c', 1000, 'x')")[0][0]) == 1000  # at the limit: whole
        assert run("SELECT count(*) FROM tokens WHERE printf('%s!', token) LIKE '%!'") == [(8,)]
        with pytest.raises(TooLargeError, match=r"^SQL error: a value is over 1,000 bytes"):  # SQLite's own refusal
            run("SELECT 'x' || format('%.*c', 1000, 'x') AS f")
    else:  # the server measures it, and says where
        with pytest.raises(TooLargeError, match=r"^SQL error: a value in column 'f' is over 1,000 bytes \(2,001 bytes; "):
            run("SELECT format('%s%s', repeat('x', 2000), '!') AS f")


def test_rows_are_bounded_before_they_arrive(filled):
    """Rows of values just under the value limit: the result is cut at --max-bytes with the rows that fit (256 rows
    of 900 kB were fetched at once before), and a row larger than the whole result is refused (PostgreSQL: by the server)."""
    target = filled.locations.db_url if not is_pg(filled) else filled.engine
    rows = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 256) "
    big = "repeat('x', 900000)" if is_pg(filled) else "printf('%.*c', 900000, 'x')"
    with pytest.raises(TooLargeError, match=r"passed 8,000,000 bytes after 8 rows") as err:
        readonly.run_readonly_sql(target, f"{rows} SELECT x, {big} AS v FROM c", max_bytes=8_000_000, max_value_bytes=1_000_000)
    assert [r[0] for r in err.value.partial[1]] == list(range(1, 9))
    with pytest.raises(TooLargeError, match=r"passed 1,000,000 bytes after 0 rows"):
        readonly.run_readonly_sql(target, f"SELECT {big} AS a, {big} AS b", max_bytes=1_000_000, max_value_bytes=1_000_000)
    # the order, the filters and the parameters of the statement are the statement's
    ordered = f"{rows} SELECT x, 'v' || x AS v FROM c WHERE x % :m = 0 ORDER BY x DESC LIMIT 3; -- trailing comment"
    assert readonly.run_readonly_sql(target, ordered, {"m": 7}, max_bytes=1000)[1] == [(252, "v252"), (245, "v245"), (238, "v238")]
    assert readonly.run_readonly_sql(target, "-- a comment first\nSELECT 1 AS one")[1] == [(1,)]


def test_functional_notation_does_not_pass_the_function_list(filled):
    """Issue 49 item 7: PostgreSQL reads `r.pg_typeof` as pg_typeof(r) (and `(x).f` as f(x) for any one-argument f,
    `(0.01).pg_sleep` included): a name after a dot that is a function and no column of the store is refused."""
    if not is_pg(filled):
        pytest.skip("PostgreSQL only (SQLite has no attribute notation for functions)")
    refused = [
        "SELECT r.pg_typeof FROM runs r",
        "SELECT runs.pg_column_size FROM runs",
        "SELECT (r).pg_typeof FROM runs r",
        "SELECT (r.*).record_out FROM runs r",
        "SELECT ('0.01'::float8).pg_sleep",
        "SELECT (0).pg_terminate_backend",
        "SELECT t.pg_typeof FROM (SELECT 1 AS a) t",
        "SELECT (j).key.pg_typeof FROM (SELECT jsonb_each('{}') AS j) s",
    ]
    for query in refused:
        with pytest.raises(InvalidArgumentError) as err:
            filled.sql(query)
        message = str(err.value)
        assert "written as a field" in message and "\n" not in message, (query, message)
    assert filled.sql("SELECT r.name, (r).name AS again, public.runs.name AS third FROM runs r, runs").values.tolist() == [["ro"] * 3]
    assert filled.sql("""SELECT (jsonb_each('{"a": 1}')).key""").key.tolist() == ["a"]
    assert filled.sql("SELECT r.row_to_json IS NOT NULL AS ok FROM runs r").ok.tolist() == [True]  # an allowed function
    # Store columns named after a one-argument function are read as columns (host(inet) and name(text), which are
    # harmless, are the only ones not on the list): a new column named after another function must be looked at.
    with filled.engine.connect() as conn:
        names = {n for (n,) in conn.execute(sa.text(sql_policy.PG_ONE_ARGUMENT_FUNCTIONS_SQL))}
        columns = {n for (n,) in conn.execute(sa.text(sql_policy.PG_STORE_COLUMNS_SQL))}
    assert (names & columns) - sql_policy.COMMON_FUNCTIONS <= {"host", "name"}


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
    block = re.search(r"^  ```\n(.*?)^  ```", section, re.S | re.M)  # the list's block, indented under its bullet
    assert block, "docs/CLI.md's attnstore sql section has no function list"
    assert set(block.group(1).split()) == set(COMMON_FUNCTIONS)
