"""`Store.sql` / `attnstore sql` is read-only: every write attempt fails and leaves the store as it was.

Runs on SQLite and PostgreSQL (the `store` fixture). Each refused statement is checked twice: an
InvalidArgumentError("SQL error: ...") is raised, and tables, row counts, PRAGMA user_version and
the file system (no file at a target path) are unchanged.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from attnstore.store import readonly
from attnstore.store.errors import InvalidArgumentError
from attnstore.tests.snapshots import store_with

VIEWS = {"word_annotations", "negated_examples", "mention_antecedents", "frame_element_spans", "token_annotations"}


def backend(store) -> str:
    return store.engine.dialect.name


def sqlite_file(store) -> str:
    return sa.engine.make_url(store.locations.db_url).database


@pytest.fixture
def filled(store):
    return store


def build_filled(store, make_run):
    """The store with one hand-built run (rows in models, datasets, examples, words, runs, tokens)."""
    maps = np.full((1, 2, 4, 4), 0.25, dtype=np.float32)
    make_run(store, [maps, maps], [["[CLS]", "a", "b", "[SEP]"], ["[CLS]", "c", "d", "[SEP]"]], name="ro")


# For a test of `filled`: the store build_filled fills, built once per session on SQLite and copied (tests/snapshots.py).
store = store_with("filled", build_filled)


@pytest.fixture
def target_dir():
    """A folder the PostgreSQL server process (another OS user) could write to, were it allowed."""
    path = Path(tempfile.mkdtemp(prefix="attnstore-ro-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def snapshot(store) -> dict:
    """Tables, views, row counts (and on SQLite user_version), read through the store's own engine."""
    with store.engine.connect() as conn:
        inspector = sa.inspect(conn)
        tables = sorted(inspector.get_table_names())
        state = {
            "tables": tables,
            "views": sorted(inspector.get_view_names()),
            "counts": {t: conn.execute(sa.text(f'SELECT count(*) FROM "{t}"')).scalar() for t in tables},
        }
        if backend(store) == "sqlite":
            state["user_version"] = conn.exec_driver_sql("PRAGMA user_version").scalar()
            state["databases"] = [r[1] for r in conn.exec_driver_sql("PRAGMA database_list")]
        else:
            state["large_objects"] = conn.execute(sa.text("SELECT count(*) FROM pg_largeobject_metadata")).scalar()
    return state


COMMON_WRITES = [
    "DROP TABLE tokens",
    "DELETE FROM tokens",
    "UPDATE tokens SET position = position + 100",
    "INSERT INTO tokens SELECT * FROM tokens",
    "CREATE TABLE evil (x INTEGER)",
    "CREATE VIEW evil AS SELECT 1 AS x",
    "CREATE INDEX evil ON tokens (token)",
    "ALTER TABLE tokens ADD COLUMN evil INTEGER",
    "BEGIN; DROP TABLE tokens",
    "DELETE FROM tokens; COMMIT",
    "COMMIT; DROP TABLE tokens",
    "SELECT 1; DROP TABLE tokens",
    "WITH gone AS (DELETE FROM tokens RETURNING *) SELECT count(*) FROM gone",
]
SQLITE_WRITES = [
    "PRAGMA user_version=42",
    "PRAGMA user_version = 42",
    "PRAGMA main.user_version=42",
    "PRAGMA journal_mode=DELETE",
    "PRAGMA writable_schema=ON",
    "PRAGMA query_only=OFF",
    "ATTACH DATABASE '{dir}/attached.db' AS x",
    "VACUUM INTO '{dir}/copy.db'",
    "VACUUM",
    "REINDEX",
    "ANALYZE",
    "DETACH DATABASE main",
    "SELECT load_extension('{dir}/evil')",
    "SAVEPOINT s",
    "CREATE TEMP TABLE evil AS SELECT * FROM tokens",
]
PG_WRITES = [
    "COMMIT; DROP TABLE tokens CASCADE",
    "COPY tokens TO '{dir}/copy.csv'",
    "COPY tokens TO PROGRAM 'touch {dir}/program'",
    "COPY (SELECT 1) TO '{dir}/copy.csv'",
    "SELECT pg_read_file('/etc/hostname')",
    "SELECT lo_export(lo_from_bytea(0, 'x'), '{dir}/lo_export')",
    "SELECT * FROM tokens FOR UPDATE",
    "SELECT * INTO evil FROM tokens",
    "EXPLAIN ANALYZE DELETE FROM tokens",
    "TRUNCATE tokens",
    "SET ROLE postgres",
    "SELECT set_config('role', current_setting('is_superuser'), true)",
    "SELECT set_config('default_transaction_read_only', 'off', false)",
    "SELECT query_to_xml('SELECT pg_catalog.set_config(''role'', session_user, true)', true, false, '')",
    "DO $$BEGIN EXECUTE 'SET LOCAL ROLE ' || session_user; EXECUTE 'COPY tokens TO ''{dir}/do.csv'''; END$$",
    "DO $$BEGIN DELETE FROM tokens; END$$",
    "CALL nothing()",
    "PREPARE p AS DELETE FROM tokens",
    "LOCK TABLE tokens",
    "SELECT U&\"set\\005fconfig\"('role', session_user, true)",
    "SELECT 1 /* unterminated",
]


def writes_for(store) -> list[str]:
    return COMMON_WRITES + (SQLITE_WRITES if backend(store) == "sqlite" else PG_WRITES)


def test_every_write_attempt_is_refused_and_changes_nothing(filled, target_dir):
    store = filled
    before = snapshot(store)
    assert before["counts"]["tokens"] == 8
    for template in writes_for(store):
        query = template.format(dir=target_dir)
        with pytest.raises(InvalidArgumentError) as info:
            store.sql(query)
        message = str(info.value)
        assert message.startswith("SQL error: ") and "\n" not in message, (query, message)
        assert snapshot(store) == before, query
        assert list(target_dir.iterdir()) == [], (query, list(target_dir.iterdir()))
    if backend(store) == "sqlite":
        folder = Path(sqlite_file(store)).parent
        assert sorted(p.name for p in folder.iterdir() if p.name.endswith(".db")) == []


def test_messages_say_what_is_refused(filled, target_dir):
    store = filled
    expected = (
        r"^SQL error: not allowed in attnstore sql \(read-only\): DROP TABLE tokens; "
        r"use a SQLite/PostgreSQL client with write access"
    )
    with pytest.raises(InvalidArgumentError, match=expected):
        store.sql("DROP TABLE tokens")
    if backend(store) == "sqlite":
        with pytest.raises(InvalidArgumentError, match="not allowed.*VACUUM INTO"):
            store.sql(f"VACUUM INTO '{target_dir}/copy.db'")
        with pytest.raises(InvalidArgumentError, match="one statement at a time"):
            store.sql("SELECT 1; SELECT 2")
    else:
        with pytest.raises(InvalidArgumentError, match="one statement at a time"):
            store.sql("SELECT 1; SELECT 2")
        with pytest.raises(InvalidArgumentError, match="set_config"):
            store.sql("SELECT set_config('role', 'postgres', true)")


def test_postgresql_server_side_guards_hold_without_the_statement_check(filled, target_dir):
    """The server refuses these on its own (read-only transaction, pg_read_all_data, prepared statement)."""
    store = filled
    if backend(store) != "postgresql":
        pytest.skip("PostgreSQL only")
    with store.engine.connect() as conn:
        superuser = conn.execute(sa.text("SELECT current_setting('is_superuser')")).scalar() == "on"
        has_role = conn.execute(sa.text("SELECT count(*) FROM pg_roles WHERE rolname = 'pg_read_all_data'")).scalar()
        as_role = conn.execute(sa.text("SELECT current_user")).scalar()
    before = snapshot(store)
    cases = {
        "DELETE FROM tokens; COMMIT": "cannot insert multiple commands into a prepared statement",
        "COMMIT; DROP TABLE tokens CASCADE": "cannot insert multiple commands into a prepared statement",
        "SELECT 1; DROP TABLE tokens": "cannot insert multiple commands into a prepared statement",
        "DROP TABLE tokens": "not allowed in attnstore sql",
        "DELETE FROM tokens": "not allowed in attnstore sql",
        f"COPY tokens TO '{target_dir}/copy.csv'": "pg_write_server_files|not allowed",
        f"COPY tokens TO PROGRAM 'touch {target_dir}/program'": "pg_execute_server_program|not allowed",
        "SELECT pg_read_file('/etc/hostname')": "permission denied",
        "SELECT pg_sleep(10)": "time limit",
    }
    for query, expected in cases.items():
        with pytest.raises(InvalidArgumentError, match=expected):
            readonly.run_postgresql(store.engine, query, None, None, 1.0, check=False)
        assert snapshot(store) == before, query
        assert list(target_dir.iterdir()) == [], query
    columns, rows = readonly.run_postgresql(store.engine, "SELECT current_user AS u", None, None, 5.0, check=False)
    assert rows == [("pg_read_all_data" if superuser and has_role else as_role,)]
    # and the store's own connections are not left in that role
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT current_user")).scalar() == as_role


def test_postgresql_what_a_statement_leaves_in_its_session_is_gone(filled):
    """Refused by the allow-list; and were they run (check=False), they are rolled back / released:
    the connection is closed after."""
    store = filled
    if backend(store) != "postgresql":
        pytest.skip("PostgreSQL only")
    before = snapshot(store)
    for query in ("SELECT lo_from_bytea(0, 'x') AS oid", "SELECT pg_advisory_lock(4242) AS locked"):
        with pytest.raises(InvalidArgumentError, match=r"does not call (lo_from_bytea|pg_advisory_lock)\(\)"):
            store.sql(query)
        assert readonly.run_postgresql(store.engine, query, None, None, 5.0, check=False)[1] != []
    assert snapshot(store) == before  # no large object kept
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT pg_try_advisory_lock(4242)")).scalar() is True
        conn.execute(sa.text("SELECT pg_advisory_unlock(4242)"))


def test_time_limit(filled, monkeypatch):
    store = filled
    monkeypatch.setenv(readonly.ENV_TIMEOUT, "0.5")
    before = snapshot(store)
    queries = ["WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) SELECT count(*) FROM c"]
    if backend(store) == "postgresql":
        queries.append("SELECT count(*) FROM generate_series(1, 1000000000) AS g")
    for query in queries:
        start = time.monotonic()
        with pytest.raises(InvalidArgumentError, match=r"stopped after 0.5 s \(attnstore sql time limit"):
            store.sql(query)
        assert time.monotonic() - start < 5, query
        assert snapshot(store) == before
    assert store.sql("SELECT count(*) AS n FROM tokens").n[0] == 8  # a fast statement still runs
    monkeypatch.setenv(readonly.ENV_TIMEOUT, "soon")
    with pytest.raises(InvalidArgumentError, match="ATTNSTORE_SQL_TIMEOUT"):
        store.sql("SELECT 1 AS x")


def test_reads_still_work(filled):
    store = filled
    assert store.sql("SELECT count(*) AS n FROM tokens").n[0] == 8
    assert store.sql("SELECT count(*) AS n FROM tokens;").n[0] == 8
    run_id = store.sql("SELECT id FROM runs WHERE name = :n", {"n": "ro"}).id[0]
    tokens = store.sql(
        "SELECT position, token FROM tokens WHERE run_id = :r AND example_id = (SELECT min(example_id) FROM tokens) ORDER BY position",
        {"r": int(run_id)},
    )
    assert tokens.token.tolist() == ["[CLS]", "a", "b", "[SEP]"]
    with_query = store.sql("WITH t AS (SELECT token FROM tokens WHERE is_special = :s) SELECT count(*) AS n FROM t", {"s": False})
    assert with_query.n[0] == 4
    assert store.sql("WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 5) SELECT sum(n) AS s FROM c").s[0] == 15
    assert store.sql("VALUES (1, 'a')").shape == (1, 2)
    assert len(store.sql("EXPLAIN SELECT * FROM tokens")) > 0
    assert store.sql("SELECT 'a:b' AS colon, 'ab' LIKE 'a%' AS percent").values.tolist() == [["a:b", True]]
    # colons inside literals, quoted names and comments are text, not bind parameters
    literals = store.sql("""SELECT ':x' AS "a:b", 'dev[:20]' AS s -- :c\n FROM tokens /* :d */ WHERE token = :t""", {"t": "a"})
    assert literals.values.tolist() == [[":x", "dev[:20]"]] and list(literals.columns) == ["a:b", "s"]
    # views (migration 0003), listed from the catalogue through `sql` itself
    if backend(store) == "sqlite":
        views = set(store.sql("SELECT name FROM sqlite_master WHERE type = 'view'").name)
    else:
        views = set(store.sql("SELECT table_name AS name FROM information_schema.views WHERE table_schema = 'public'").name)
    assert VIEWS <= views
    for view in sorted(VIEWS):
        store.sql(f"SELECT * FROM {view}")
    words = store.sql("SELECT form FROM token_annotations WHERE run = :r AND form IS NOT NULL ORDER BY example, position", {"r": "ro"})
    assert words.form.tolist() == ["a", "b", "c", "d"]
    # empty results keep their columns; max_rows
    empty = store.sql("SELECT token, position FROM tokens WHERE position < 0")
    assert list(empty.columns) == ["token", "position"] and empty.empty
    assert len(store.sql("SELECT * FROM tokens", max_rows=3)) == 3
    # errors are one line
    with pytest.raises(InvalidArgumentError, match=r"^SQL error: .*no_such_table"):
        store.sql("SELECT * FROM no_such_table")


def test_sqlite_introspection_pragmas(filled):
    store = filled
    if backend(store) != "sqlite":
        pytest.skip("SQLite only")
    info = store.sql("PRAGMA table_info(tokens)")
    assert {"run_id", "example_id", "position", "token"} <= set(info.name)
    assert set(store.sql("SELECT name FROM pragma_table_info('tokens')").name) == set(info.name)
    assert len(store.sql("PRAGMA index_list(tokens)")) >= 1
    assert len(store.sql("PRAGMA foreign_key_list(tokens)")) >= 1
    assert store.sql("PRAGMA user_version").iloc[0, 0] == snapshot(store)["user_version"]
    assert store.sql("PRAGMA journal_mode").iloc[0, 0] == "wal"


def test_internal_reads_of_the_store_use_sql(filled):
    """ingest/runner.py and conftest read through `sql` with named parameters."""
    store = filled
    datasets = store.sql("SELECT id FROM datasets")
    row = store.sql("SELECT name, split, n_examples FROM datasets WHERE id = :i", {"i": int(datasets.id[0])}).iloc[0]
    assert (row["name"], row["split"], row["n_examples"]) == ("hand-ro", "test", 2)


def test_other_backends_are_refused():
    with pytest.raises(InvalidArgumentError, match="SQLite and PostgreSQL"):
        readonly.run_readonly_sql("mysql://u@h/db", "SELECT 1")


# ---------------------------------------------------------------- SQLite file handling


def test_sqlite_readonly_uri():
    assert readonly.sqlite_readonly_uri("/data/store/meta.sqlite") == "file:/data/store/meta.sqlite?mode=ro"
    assert readonly.sqlite_readonly_uri("/data/a b/m#1?.sqlite", immutable=True) == "file:/data/a%20b/m%231%3F.sqlite?mode=ro&immutable=1"


def _wal_database(folder: Path) -> Path:
    folder.mkdir()
    path = folder / "meta.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x INTEGER)")
    conn.execute("INSERT INTO t VALUES (1), (2)")
    conn.commit()
    conn.close()  # the last connection removes -wal and -shm
    assert sorted(p.name for p in folder.iterdir()) == ["meta.sqlite"]
    return path


def test_sqlite_file_with_odd_characters_in_its_path(tmp_path):
    path = _wal_database(tmp_path / "a b#c&mode=rw")
    assert readonly.run_readonly_sql(f"sqlite:///{path}", "SELECT sum(x) AS s FROM t") == (["s"], [(3,)])


READ_IN_READONLY_FOLDER = """
import json, os, sys
from attnstore.store import readonly
path = sys.argv[1]
try:
    open(os.path.join(os.path.dirname(path), "probe"), "w").close()
    print(json.dumps({"writable": True}))
    sys.exit(0)
except OSError:
    pass
try:
    readonly._sqlite_connect(readonly.sqlite_readonly_uri(path), 5).close()
    mode_ro = "ok"
except Exception as exc:
    mode_ro = str(exc)
result = readonly.run_readonly_sql("sqlite:///" + path, "SELECT sum(x) AS s FROM t")
try:
    readonly.run_readonly_sql("sqlite:///" + path, "DROP TABLE t")
    refused = False
except readonly.InvalidArgumentError:
    refused = True
print(json.dumps({"writable": False, "mode_ro": mode_ro, "result": result, "refused": refused,
                  "files": sorted(os.listdir(os.path.dirname(path)))}))
"""


def test_sqlite_store_in_a_folder_nobody_can_write(tmp_path):
    """mode=ro cannot open a WAL file without -shm in a read-only folder; immutable=1 reads it."""
    import json

    path = _wal_database(tmp_path / "ro")
    path.chmod(0o444)
    path.parent.chmod(0o555)
    command = [sys.executable, "-c", READ_IN_READONLY_FOLDER, str(path)]
    if os.geteuid() == 0:  # root ignores file modes unless it drops CAP_DAC_OVERRIDE
        setpriv = shutil.which("setpriv")
        if not setpriv:
            pytest.skip("running as root without setpriv: cannot make a folder unwritable")
        command = [setpriv, "--bounding-set=-dac_override,-dac_read_search", *command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    finally:
        path.parent.chmod(0o755)
        path.chmod(0o644)
    if done.returncode != 0 and "setpriv" in done.stderr:
        pytest.skip(f"cannot drop privileges here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if out["writable"]:
        pytest.skip("this environment can write a 0555 folder")
    assert out["mode_ro"] != "ok"  # so the immutable=1 fallback is what read it
    assert out["result"] == [["s"], [[3]]]
    assert out["refused"] is True
    assert out["files"] == ["meta.sqlite"]


# ---------------------------------------------------------------- the PostgreSQL statement check


@pytest.mark.parametrize(
    "text",
    [
        "SELECT 1",
        "  -- a comment\n(SELECT 1) UNION (SELECT 2);",
        "WITH x AS (SELECT 1) SELECT * FROM x",
        "VALUES (1)",
        "TABLE tokens",
        "EXPLAIN SELECT 1",
        "SELECT 1 /* nested /* comment */ ; DROP TABLE t */",
        "SELECT E'a\\'; DROP TABLE t; --'",
        "SELECT $$; set_config('role', 'x', true)$$, $q$ $$ ; $q$",
        "SELECT 'set_config' AS name, x$y FROM t WHERE a = $1",
        "SELECT 1 -- ; DROP TABLE t",
    ],
)
def test_pg_statement_check_allows(text):
    readonly.check_pg_statement(text, {"tokens", "t"})


@pytest.mark.parametrize(
    "text, reason",
    [
        ("SELECT 'a\\'; DROP TABLE t; --'", "one statement"),  # standard_conforming_strings: the string ends at \'
        ("SELECT 1; SELECT 2", "one statement"),
        ("COPY t TO '/tmp/x'", "not allowed"),
        ("/* SELECT */ DO $$BEGIN END$$", "not allowed"),
        ("SELECT pg_catalog.SET_CONFIG('role', 'postgres', true)", "set_config"),
        ("SELECT \"set_config\"('role', 'postgres', true)", "set_config"),
        ("SELECT set_config /* */ ('role', 'postgres', true)", "set_config"),
        ("SELECT query_to_xml('SELECT 1', true, false, '')", "query_to_xml"),
        ("SELECT * FROM dblink('dbname=x', 'SELECT 1') AS t(x int)", "dblink"),
        ('SELECT U&"\\0073et_config"(1)', "set_config"),  # PostgreSQL's parser decodes the escape
        ("SHOW search_path", "not allowed"),
        ("SELECT 'unterminated", "unterminated"),
        ("SELECT $a$ unterminated", "unterminated"),
        ("SELECT 1 /* /* */", "unterminated"),
        ("", "empty"),
        (" ; ", "empty"),
    ],
)
def test_pg_statement_check_refuses(text, reason):
    with pytest.raises(InvalidArgumentError, match=re.escape(reason)):
        readonly.check_pg_statement(text, {"tokens", "t"})


def test_check_sees_the_text_psycopg_sends():
    assert readonly._as_sent("SELECT %(a)s, 'x%%' FROM t WHERE b = %(b)s") == "SELECT $1, 'x%' FROM t WHERE b = $2"
