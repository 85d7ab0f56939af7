"""Read-only collaborators (docs/SHARING.md): a PostgreSQL role granted SELECT only, a read-only array
root, or --read-only / ATTNSTORE_READ_ONLY. Everything that reads works; every command that writes
fails before doing anything, in one line saying the store is read-only, and nothing changes.

The store is populated as the owner (postgres) with a hand-made run every registered query can
read (tests/store/conftest.py), then opened as a fresh LOGIN role `attnstore_ro_<random>` granted
SELECT on all tables of its database (dropped at the end).
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import uuid

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.queries import run_query
from attnstore.store import migrate, open_store
from attnstore.store.errors import ReadOnlyStoreError

HAS_INGEST = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None


def row_counts(url: str) -> dict[str, int]:
    """Rows of every table of the store (read as its owner)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            tables = sa.inspect(conn).get_table_names()
            return {t: conn.exec_driver_sql(f'SELECT count(*) FROM "{t}"').scalar_one() for t in tables}
    finally:
        engine.dispose()


def one_read_only_line(result, args) -> None:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1, (args, result.output)
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "read-only" in lines[0], (args, result.output)
    assert "Traceback" not in result.output, (args, result.output)


def writing_commands(run: str, tmp_path) -> list[list[str]]:
    """Every command that writes to the store, with arguments that would otherwise start real work.

    Model names that do not exist and a label file that does not exist: a command that got past
    the read-only check would fail differently (or load a model), so the message proves the order.
    """
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat\n", encoding="utf-8")
    commands = [
        ["db", "upgrade"],
        ["query", "relative_position", "--run", run, "--save"],
        ["probe", "train", "--run", run, "--eval-run", run, "--kind", "attn"],
        ["patterns", "import", str(tmp_path / "labels.jsonl")],
        ["patterns", "classify", "--run", run, "--save"],
    ]
    if HAS_INGEST:  # without the ingest extra these stop earlier, on the missing extra
        commands += [
            ["ingest", "--corpus", str(corpus), "--format", "text", "--annotate", "whitespace", "--model", "no-such/model", "--name", "x"],
            ["finetune", "--task", "MRPC", "--model", "no-such/model", "--epochs", "1"],
            ["evaluate", "--model", "no-such/model", "--task", "MRPC"],
            ["ablate", "--model", "no-such/model", "--task", "MRPC"],
            ["gradients", "--run", run],
        ]
    return commands


@pytest.fixture
def shared(pg_databases, pg_admin_url, tmp_path, annotated_run):
    """(owner URL, read-only role's URL, array root): a populated store and a SELECT-only role on its database."""
    url = pg_databases()
    migrate.upgrade(url)
    root = tmp_path / "attention.zarr"
    with open_store(db=url, root=str(root)) as owner:
        run = annotated_run(owner)
        owner.save_head_metrics(run, run_query(owner, "relative_position", run=run), prefix="relative_position")
        owner.save_pattern_labels(pd.DataFrame(dict(run=[run], example=[0], layer=[0], head=[1], label=["diagonal"])), source="human")
    role = f"attnstore_ro_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")  # as postgres, in the store's database
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        conn.exec_driver_sql(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    ro_url = sa.engine.make_url(url).set(username=role, password=None).render_as_string(hide_password=False)
    yield url, ro_url, root
    with admin.connect() as conn:
        conn.exec_driver_sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
        conn.exec_driver_sql(f"DROP OWNED BY {role}")
        conn.exec_driver_sql(f"DROP ROLE {role}")
    admin.dispose()


def test_a_select_only_role_reads_everything(shared, every_query):
    url, ro_url, root = shared
    with open_store(db=url, root=str(root)) as owner, open_store(db=ro_url, root=str(root)) as reader:
        assert not owner.read_only
        assert reader.read_only and "may not write" in reader.read_only_reason
        pd.testing.assert_frame_equal(reader.runs(), owner.runs())
        assert reader.run_info("shared") == owner.run_info("shared")
        pd.testing.assert_frame_equal(reader.examples("shared"), owner.examples("shared"))
        pd.testing.assert_frame_equal(reader.tokens("shared", 1), owner.tokens("shared", 1))
        pd.testing.assert_frame_equal(reader.word_table("shared"), owner.word_table("shared"))
        pd.testing.assert_frame_equal(reader.mention_table("shared"), owner.mention_table("shared"))
        for example in range(3):
            np.testing.assert_array_equal(reader.attention("shared", example), owner.attention("shared", example))
        assert reader.run("shared").attention(2, layer=1, head=2).shape == (1, 1, 6, 6)
        pd.testing.assert_frame_equal(reader.head_metrics("shared"), owner.head_metrics("shared"))
        pd.testing.assert_frame_equal(reader.pattern_labels("shared"), owner.pattern_labels("shared"))
        pd.testing.assert_frame_equal(reader.models(), owner.models())
        assert reader.run_state("shared") == ("complete", None)
        for name, params in every_query.items():
            got = run_query(reader, name, run="shared", **params)
            assert not got.empty, name
            pd.testing.assert_frame_equal(got, run_query(owner, name, run="shared", **params), obj=name)
        count = "SELECT count(*) AS n FROM word_annotations"
        assert reader.sql(count)["n"][0] == owner.sql(count)["n"][0] > 0


def test_a_select_only_role_uses_every_reading_command(shared, tmp_path):
    url, ro_url, root = shared
    opts = ["--db", ro_url, "--root", str(root)]
    runner = CliRunner()
    for args in (
        ["runs"],
        ["show", "shared"],
        ["examples", "--run", "shared"],
        ["tokens", "--run", "shared", "--example", "0"],
        ["sql", "SELECT runs.name, metric, layer, head, value FROM head_metrics JOIN runs ON runs.id = head_metrics.run_id LIMIT 5"],
        ["query", "dependency", "--run", "shared", "--param", "min_count=1"],
        ["query", "entropy", "--run", "shared", "--output", str(tmp_path / "entropy.csv"), "--format", "csv"],
        ["check"],
        ["models"],
        ["probe", "results"],
        ["patterns", "export", "--source", "human"],
        ["patterns", "classify", "--run", "shared"],
        ["view", "--run", "shared", "--example", "0", "--bertviz", "--out", str(tmp_path / "view.json")],
        ["db", "current"],
        ["export", "--run", "shared", "--to", str(tmp_path / "bundle.zip")],
    ):
        result = runner.invoke(main, [*args, *opts])
        assert result.exit_code == 0, (args, result.output)
    assert json.loads(runner.invoke(main, ["runs", "--format", "json", *opts]).stdout)[0]["run"] == "shared"


def test_every_writing_command_fails_first_in_one_line_and_writes_nothing(shared, tmp_path):
    url, ro_url, root = shared
    bundle = tmp_path / "bundle.zip"  # written by the owner, for `import`
    exported = CliRunner().invoke(main, ["export", "--run", "shared", "--to", str(bundle), "--db", url, "--root", str(root)])
    assert exported.exit_code == 0, exported.output
    before = row_counts(url)
    files_before = sorted(p.relative_to(root) for p in root.rglob("*"))
    runner = CliRunner()
    for args in [*writing_commands("shared", tmp_path), ["import", str(bundle), "--rename", "shared=shared2"]]:
        result = runner.invoke(main, [*args, "--db", ro_url, "--root", str(root)])
        one_read_only_line(result, args)
    assert row_counts(url) == before
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == files_before
    with open_store(db=ro_url, root=str(root)) as reader:
        with pytest.raises(ReadOnlyStoreError, match="read-only"):
            reader.save_head_metrics("shared", run_query(reader, "entropy", run="shared"), prefix="entropy")
        with pytest.raises(ReadOnlyStoreError, match="read-only"):
            reader.writer.lease("run:shared", "run 'shared'")
        with pytest.raises(ReadOnlyStoreError, match="read-only"):
            reader.writer.run_writer("shared")
    assert row_counts(url) == before


def test_the_read_only_flag_and_environment_refuse_writes_for_the_owner_too(shared, tmp_path, monkeypatch):
    url, _, root = shared
    before = row_counts(url)
    runner = CliRunner()
    result = runner.invoke(main, ["query", "entropy", "--run", "shared", "--save", "--read-only", "--db", url, "--root", str(root)])
    one_read_only_line(result, "--read-only")
    assert "--read-only" in result.output
    monkeypatch.setenv("ATTNSTORE_READ_ONLY", "1")
    for args in writing_commands("shared", tmp_path)[:3]:
        one_read_only_line(runner.invoke(main, [*args, "--db", url, "--root", str(root)]), args)
    for args in (["query", "entropy", "--run", "shared"], ["sql", "SELECT count(*) AS n FROM tokens"], ["check"]):
        assert runner.invoke(main, [*args, "--db", url, "--root", str(root)]).exit_code == 0, args
    with open_store(db=url, root=str(root)) as store:
        assert store.read_only
        with pytest.raises(sa.exc.InternalError, match="read-only transaction"):  # the server refuses, too
            with store.engine.begin() as conn:
                conn.exec_driver_sql("DELETE FROM head_metrics")
    monkeypatch.setenv("ATTNSTORE_READ_ONLY", "maybe")
    bad = runner.invoke(main, ["runs", "--db", url, "--root", str(root)])
    assert bad.exit_code == 1 and "ATTNSTORE_READ_ONLY='maybe' is not a boolean" in bad.output
    assert row_counts(url) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions (use --read-only there; tested above)")
def test_a_folder_this_user_cannot_write_opens_read_only(tmp_path, annotated_run):
    url = f"sqlite:///{tmp_path / 'db' / 'meta.sqlite'}"
    (tmp_path / "db").mkdir()
    migrate.upgrade(url)
    root = tmp_path / "attention.zarr"
    with open_store(db=url, root=str(root)) as owner:
        annotated_run(owner)
    modes = [(p, p.stat().st_mode) for p in (tmp_path / "db", root)]
    try:
        for path, mode in modes:
            path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        with open_store(db=url, root=str(root)) as reader:
            assert reader.read_only
            assert run_query(reader, "entropy", run="shared").shape[0] == 6
        result = CliRunner().invoke(main, ["query", "entropy", "--run", "shared", "--save", "--db", url, "--root", str(root)])
        one_read_only_line(result, "query --save")
    finally:
        for path, mode in modes:
            path.chmod(mode)


def test_read_only_s3_credentials_read_everything_and_write_nothing(tmp_path, s3_root, s3_endpoint, s3_auth, annotated_run):
    """Object storage with read-only credentials (s3:GetObject, s3:ListBucket): with --read-only, and without
    it (a writing command tests write access first, by writing a test object, and fails before any work)."""
    url = f"sqlite:///{tmp_path / 'meta.sqlite'}"
    migrate.upgrade(url)
    with open_store(db=url, root=s3_root) as owner:
        annotated_run(owner)
        want = {e: owner.attention("shared", e) for e in range(3)}
        entropy = run_query(owner, "entropy", run="shared")
    key, secret = s3_auth.user(["s3:GetObject", "s3:ListBucket"])
    before = row_counts(url)
    runner = CliRunner()
    with s3_auth.enforced():
        s3_auth.use(key, secret)
        with open_store(db=url, root=s3_root, read_only=True) as reader:
            assert reader.read_only
            for example, maps in want.items():
                np.testing.assert_array_equal(reader.attention("shared", example), maps)
            pd.testing.assert_frame_equal(run_query(reader, "entropy", run="shared"), entropy)
            with pytest.raises(ReadOnlyStoreError, match="read-only"):
                reader.save_head_metrics("shared", entropy, prefix="entropy")
        for flag in (["--read-only"], []):
            opts = ["--db", url, "--root", s3_root, *flag]
            assert runner.invoke(main, ["check", *opts]).exit_code == 0
            assert runner.invoke(main, ["query", "special_tokens", "--run", "shared", *opts]).exit_code == 0
            for args in writing_commands("shared", tmp_path):
                one_read_only_line(runner.invoke(main, [*args, *opts]), [*args, *flag])
    assert row_counts(url) == before
    assert not (tmp_path / "labels.jsonl").exists()
