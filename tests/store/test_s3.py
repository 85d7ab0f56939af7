"""Array roots on object storage (`--root s3://bucket/prefix`), against a real S3-compatible server.

The server is moto's, started on 127.0.0.1 by the `s3_endpoint` fixture; each test gets a fresh
bucket (`s3_root`). Runs are hand-made (`make_run`) through the same write API ingestion uses;
tests/ingest/test_s3_ingest.py ingests with the real model and kills the ingest with -9.
"""

from __future__ import annotations

import io
import os
import socket
import sys
import time

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.queries import run_query
from attnstore.store import arrays, migrate, open_store
from attnstore.store.check import check_store
from attnstore.store.errors import DamagedDataError, StorageIOError

pytest.importorskip("s3fs", reason="the s3 extra (fsspec, s3fs) is not installed")


def s3_client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def bucket_keys(endpoint: str, root: str) -> list[str]:
    bucket, prefix = root[len("s3://") :].split("/", 1)
    pages = s3_client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def one_line_error(result, *fragments: str) -> str:
    """The CLI failed with exit status 1 and one `Error:` line holding every fragment, no traceback."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture
def pair(db_url, s3_root, tmp_path, annotated_run):
    """The same hand-made run in a store whose arrays are on S3 (SQLite or PostgreSQL) and in one on a local folder."""
    migrate.upgrade(db_url)
    on_s3 = open_store(db=db_url, root=s3_root)
    local_url = f"sqlite:///{tmp_path / 'local.sqlite'}"
    migrate.upgrade(local_url)
    local = open_store(db=local_url, root=str(tmp_path / "attention.zarr"))
    annotated_run(on_s3)
    annotated_run(local)
    yield on_s3, local
    on_s3.close()
    local.close()


def test_a_run_on_s3_reads_back_exactly_and_lives_in_the_bucket(pair, s3_endpoint, s3_root):
    on_s3, local = pair
    assert not on_s3.read_only
    for example in range(3):
        np.testing.assert_array_equal(on_s3.attention("shared", example), local.attention("shared", example))
    assert on_s3.attention("shared", 1).dtype == np.float32
    streamed = dict(on_s3.iter_attention("shared"))
    assert sorted(streamed) == [0, 1, 2]
    for example, maps in local.iter_attention("shared"):
        np.testing.assert_array_equal(streamed[example], maps)
    pd.testing.assert_frame_equal(on_s3.token_table("shared"), local.token_table("shared"))
    info = on_s3.run_info("shared")
    keys = bucket_keys(s3_endpoint, s3_root)
    chunks = [k for k in keys if k.startswith(f"attention.zarr/{info.array_path}/c/")]
    assert len(chunks) >= 3, keys  # several 64-cell chunks
    assert not [k for k in keys if ".attnstore-write-test-" in k]  # the write test object is deleted again


def test_a_read_on_s3_is_one_get_per_object_without_a_head_first(pair):
    """s3fs sends a HEAD before each whole-object GET unless max_concurrency is 1 (store/remote.py): every chunk,
    index and zarr.json read cost two or three requests. Reading a run's maps and a query now GET each object alone;
    the only HEADs left are read_cells' existence check of each maps chunk it reads (zarr would fill a missing one)."""
    import logging
    import re

    on_s3, local = pair
    calls: list[tuple[str, str]] = []

    class Calls(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if message.startswith("CALL: "):
                key = re.search(r"'Key': '([^']+)'", message)
                calls.append((message.split()[1], key.group(1) if key else ""))

    logger, handler = logging.getLogger("s3fs"), Calls()
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        reopened = open_store(db=on_s3.locations.db_url, root=on_s3.locations.array_root, read_only=True)
        np.testing.assert_array_equal(reopened.attention("shared", 2), local.attention("shared", 2))
        pd.testing.assert_frame_equal(
            run_query(reopened, "relative_position", run="shared"), run_query(local, "relative_position", run="shared")
        )
        reopened.close()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    got = [key for call, key in calls if call == "get_object"]
    heads = [key for call, key in calls if call == "head_object"]
    assert any(key.endswith("zarr.json") for key in got) and not [key for key in heads if "/cells/c/" not in key], calls


# Where the package's read paths live: a query reaches the array root only through these (its own module computes on
# what they return). The modules that read a local root's files directly (direct.py, sharded.py) and the store's
# choice of that reader are never taken on S3, whose reads go through zarr (arrays.read_cells and friends) instead.
READ_PATH_DIRS = ("store", os.path.join("queries", "engine"))
LOCAL_ONLY_FILES = ("direct.py", "sharded.py")


def read_path_functions(store, name: str, params: dict):
    """(run_query's frame of query `name` on the run "shared", the functions of attnstore/store/ and
    attnstore/queries/engine/ it ran in this thread, as "file:qualname", less those only a local root takes)."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    folders = tuple(os.path.join(package, d) + os.sep for d in READ_PATH_DIRS)
    seen: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename
            if path.startswith(folders) and os.path.basename(path) not in LOCAL_ONLY_FILES:
                seen.add(f"{os.path.relpath(path, package)}:{frame.f_code.co_qualname}")

    sys.setprofile(profile)
    try:
        value = run_query(store, name, run="shared", **params)
    finally:
        sys.setprofile(None)
    return value, {f for f in seen if not f.endswith("StoreReader._direct_reader")}


@pytest.mark.one_backend
def test_every_query_on_s3_equals_the_same_run_on_a_local_root(pair, every_query):
    """Every registered query runs on the local root (and answers); every read path they take there is then taken on
    S3 by at least one query whose frame equals the local one.

    A query reads the array root only through the store's and the query engine's functions (attnstore/store/,
    attnstore/queries/engine/: maps one example or a whole run at a time, value norms, saliency, token arrays, kept
    summaries and their ranges, written and read back); what its own module does with the numbers does not depend on
    where they came from. So the queries are run on S3 one at a time, each next one the query whose local run
    called the most of those functions not yet called on S3, until every function any query called on the local root
    (less the local root's direct readers, store/direct.py and store/sharded.py, which S3 replaces by zarr's reads)
    has been called on S3 too; the test fails if some never is. This covers every distinct read path with ~10 of
    the ~35 queries (each costs 1.5-2.5 s on the moto server, ~40 requests), and a new query with a read path of its
    own is added to the S3 runs by itself."""
    on_s3, local = pair
    wants, local_paths = {}, {}
    for name, params in every_query.items():
        wants[name], local_paths[name] = read_path_functions(local, name, params)
        assert not wants[name].empty, name
    uncovered, on_s3_runs = set().union(*local_paths.values()), []
    while uncovered:
        name = max((n for n in every_query if n not in on_s3_runs), key=lambda n: len(local_paths[n] & uncovered), default=None)
        assert name is not None and local_paths[name] & uncovered, f"never called on S3: {sorted(uncovered)} ({on_s3_runs})"
        got, s3_paths = read_path_functions(on_s3, name, every_query[name])
        pd.testing.assert_frame_equal(got, wants[name], obj=name)
        on_s3_runs.append(name)
        uncovered -= s3_paths


def test_check_passes_and_a_deleted_chunk_object_is_reported_as_damage(pair, s3_endpoint, s3_root):
    on_s3, _ = pair
    summary, problems = check_store(on_s3)
    assert problems.empty and summary["problems"].tolist() == [0], problems.to_string()
    info = on_s3.run_info("shared")
    array = on_s3._array(info)
    examples = on_s3.examples("shared")
    second = examples[examples["example"] == 1].iloc[0]
    index = int(second["offset"]) // info.chunk_cells  # a chunk holding example 1's block
    key = arrays.chunk_key(array, index)
    bucket = s3_root[len("s3://") :].split("/", 1)[0]
    s3_client(s3_endpoint).delete_object(Bucket=bucket, Key=f"attention.zarr/{key}")

    summary, problems = check_store(on_s3)
    assert summary["problems"].tolist() == [len(problems)] and len(problems) >= 1
    hit = problems[problems["chunk"] == key]
    assert not hit.empty and "is missing" in hit["problem"].iloc[0] and 1 in set(hit["example"]), problems.to_string()
    with pytest.raises(DamagedDataError, match=rf"run 'shared', example 1: chunk {key} is missing"):
        on_s3.attention("shared", 1)
    result = CliRunner().invoke(main, ["check", "--db", on_s3.locations.db_url, "--root", s3_root])
    assert result.exit_code == 1 and key in result.output and "is missing" in result.output


def test_check_on_s3_reports_a_missing_chunk_beside_a_damaged_one(pair, s3_endpoint, s3_root):
    """Issue 24 item 8 on object storage: one chunk object deleted, another's bytes flipped (same slab of chunks):
    `check` lists both, never raising (it crashed with an 89-line traceback)."""
    on_s3, _ = pair
    info = on_s3.run_info("shared")
    array = on_s3._array(info)
    examples = on_s3.examples("shared").set_index("example")
    first = int(examples.loc[0, "offset"]) // info.chunk_cells
    last = (int(examples.loc[2, "offset"]) + 2 * 3 * 6 * 6 - 1) // info.chunk_cells  # example 2's last chunk
    assert last > first + 1
    bucket, client = s3_root[len("s3://") :].split("/", 1)[0], s3_client(s3_endpoint)
    missing, flipped = arrays.chunk_key(array, first), arrays.chunk_key(array, last)
    client.delete_object(Bucket=bucket, Key=f"attention.zarr/{missing}")
    data = bytearray(client.get_object(Bucket=bucket, Key=f"attention.zarr/{flipped}")["Body"].read())
    data[len(data) // 2] ^= 0x40
    client.put_object(Bucket=bucket, Key=f"attention.zarr/{flipped}", Body=bytes(data))

    summary, problems = check_store(on_s3)
    assert summary["problems"].tolist() == [len(problems)], problems.to_string()
    hit = problems.set_index("chunk")
    assert "is missing" in hit.loc[[missing], "problem"].iloc[0] and 0 in set(hit.loc[[missing], "example"])
    assert "is damaged" in hit.loc[[flipped], "problem"].iloc[0] and 2 in set(hit.loc[[flipped], "example"])
    result = CliRunner().invoke(main, ["check", "--format", "csv", "--db", on_s3.locations.db_url, "--root", s3_root])
    assert result.exit_code == 1 and "Traceback" not in result.output and missing in result.output and flipped in result.output


def test_a_reader_lists_chunks_written_after_its_first_listing(pair, s3_endpoint, s3_root):
    """No listing cache: a reader in a long-lived process sees chunks another process wrote since."""
    on_s3, _ = pair
    array = on_s3._array(on_s3.run_info("shared"))
    before = arrays.present_chunks(array)
    bucket = s3_root[len("s3://") :].split("/", 1)[0]
    new = max(before) + 5
    s3_client(s3_endpoint).put_object(Bucket=bucket, Key=f"attention.zarr/{arrays.chunk_key(array, new)}", Body=b"x")
    assert arrays.present_chunks(array) == before | {new}


@pytest.mark.one_backend
def test_the_command_line_works_on_s3(db_url, s3_root, tmp_path, annotated_run):
    runner = CliRunner()
    upgraded = runner.invoke(main, ["db", "upgrade", "--db", db_url, "--root", s3_root])
    assert upgraded.exit_code == 0 and f"arrays in {s3_root}" in upgraded.output, upgraded.output
    with open_store(db=db_url, root=s3_root) as store:
        annotated_run(store)
        want = run_query(store, "relative_position", run="shared")
    opts = ["--db", db_url, "--root", s3_root]
    runs = runner.invoke(main, ["runs", "--format", "csv", *opts])
    assert runs.exit_code == 0 and "shared" in runs.output
    query = runner.invoke(main, ["query", "relative_position", "--run", "shared", "--format", "json", "--save", *opts])
    assert query.exit_code == 0, query.output
    got = pd.read_json(io.StringIO(query.stdout))
    np.testing.assert_allclose(got["to_next"], want["to_next"])
    check = runner.invoke(main, ["check", *opts])
    assert check.exit_code == 0 and "store OK" in check.output
    sql = runner.invoke(main, ["sql", "SELECT count(*) AS n FROM head_metrics", "--format", "csv", *opts])
    assert sql.exit_code == 0 and sql.stdout.split() == ["n", str(3 * 6)]


def test_a_missing_bucket_is_one_line_naming_the_bucket_and_the_fix(tmp_path, s3_endpoint):
    url = f"sqlite:///{tmp_path / 'meta.sqlite'}"
    result = CliRunner().invoke(main, ["db", "upgrade", "--db", url, "--root", "s3://no-such-bucket-attnstore/attention.zarr"])
    one_line_error(result, "bucket 'no-such-bucket-attnstore'", "does not exist", s3_endpoint, "aws s3 mb s3://no-such-bucket-attnstore")
    assert not (tmp_path / "meta.sqlite").exists()  # refused before anything was created


def test_an_unreachable_endpoint_is_one_line_and_gives_up_quickly(tmp_path, s3_root, make_run, monkeypatch):
    url = f"sqlite:///{tmp_path / 'meta.sqlite'}"
    migrate.upgrade(url)
    with open_store(db=url, root=s3_root) as store:
        make_run(store, [np.full((1, 1, 2, 2), 0.5, np.float32)], [["[CLS]", "[SEP]"]], name="r")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    reader = open_store(db=url, root=s3_root)
    assert reader.attention("r", 0).shape == (1, 1, 2, 2)  # the root is checked once, here
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", dead)
    with monkeypatch.context() as retries:
        # What these reads raise is the subject, not how long they retry (timed below, with the defaults): one
        # attempt each (botocore's, set as a user would in fsspec's configuration, and s3fs's own loop), instead of
        # ~2.5 s of backoff per read.
        retries.setitem(__import__("fsspec.config").config.conf, "s3", {"config_kwargs": {"retries": {"max_attempts": 1}}})
        retries.setattr(__import__("s3fs").S3FileSystem, "retries", 1)
        for read in (lambda: reader.attention("r", 0), lambda: dict(reader.iter_attention("r"))):
            with pytest.raises(StorageIOError, match=f"cannot reach the object store at {dead}"):  # not "damaged"
                read()
    reader.close()
    runner = CliRunner()
    started = time.monotonic()
    for args in (["query", "entropy", "--run", "r"], ["check"], ["db", "upgrade"]):
        result = runner.invoke(main, [*args, "--db", url, "--root", s3_root])
        one_line_error(result, f"cannot reach the object store at {dead}", s3_root, "FSSPEC_S3_ENDPOINT_URL")
    assert time.monotonic() - started < 60  # bounded retries, not botocore's minutes


def test_an_unreachable_endpoint_prints_the_error_line_only(tmp_path, s3_root, make_run):
    """Issue 24 item 10: `attnstore query` and `check` as real processes against a closed port print the one error
    line and nothing after it (no "Task was destroyed but it is pending!", no "Exception ignored in" tracebacks from
    zarr's requests still in flight at exit)."""
    import os
    import subprocess

    url = f"sqlite:///{tmp_path / 'meta.sqlite'}"
    migrate.upgrade(url)
    with open_store(db=url, root=s3_root) as store:
        make_run(store, [np.full((1, 1, 2, 2), 0.5, np.float32)], [["[CLS]", "[SEP]"]], name="r")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    env = {**os.environ, "FSSPEC_S3_ENDPOINT_URL": dead, "FSSPEC_S3": '{"config_kwargs": {"connect_timeout": 1}}'}
    started = [  # both at once: each spends its ~5 s starting up and waiting out its retries, not on the CPU
        subprocess.Popen(
            [sys.executable, "-m", "attnstore.api.cli", *args, "--db", url, "--root", s3_root],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in (["query", "entropy", "--run", "r"], ["check"])
    ]
    for process in started:
        try:
            _, stderr = process.communicate(timeout=120)
        finally:
            process.kill()
        lines = stderr.strip().splitlines()
        assert process.returncode == 1 and len(lines) == 1, stderr[-3000:]
        assert lines[0].startswith("Error: cannot reach the object store at") and dead in lines[0]


def test_refused_or_missing_credentials_are_one_line_naming_the_fix(tmp_path, s3_root, make_run, s3_auth, monkeypatch):
    url = f"sqlite:///{tmp_path / 'meta.sqlite'}"
    migrate.upgrade(url)
    with open_store(db=url, root=s3_root) as store:
        make_run(store, [np.full((1, 1, 2, 2), 0.5, np.float32)], [["[CLS]", "[SEP]"]], name="r")
    runner = CliRunner()
    with s3_auth.enforced():
        s3_auth.use("AKIAUNKNOWNKEY000000", "not-a-secret")
        result = runner.invoke(main, ["query", "entropy", "--run", "r", "--db", url, "--root", s3_root])
        line = one_line_error(result, s3_root, "AWS_ACCESS_KEY_ID")
        # A GET answers InvalidAccessKeyId; a HEAD (which request comes first varies) answers a bare 403 without a
        # code, which cannot be told apart from a key lacking permission: either line names the fix.
        assert ("credentials were refused" in line and "InvalidAccessKeyId" in line) or "access denied (Forbidden)" in line, line
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    __import__("s3fs").S3FileSystem.clear_instance_cache()
    result = runner.invoke(main, ["check", "--db", url, "--root", s3_root])
    one_line_error(result, "no usable S3 credentials", s3_root, "AWS_ACCESS_KEY_ID")


def test_a_missing_s3_extra_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    """s3fs not installed (simulated: its import fails): one line saying how to install it, nothing created."""
    monkeypatch.setitem(sys.modules, "s3fs", None)  # `import s3fs` raises ModuleNotFoundError(name="s3fs")
    url = f"sqlite:///{tmp_path / 'meta.sqlite'}"
    runner = CliRunner()
    result = runner.invoke(main, ["db", "upgrade", "--db", url, "--root", "s3://bucket/attention.zarr"])
    one_line_error(result, "needs the 's3' extra", "s3fs is not installed", "pip install")
    assert not (tmp_path / "meta.sqlite").exists()
    migrate.upgrade(url)
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b\n", encoding="utf-8")
    result = runner.invoke(main, ["ingest", "--corpus", str(corpus), "--format", "text", "--db", url, "--root", "s3://bucket/x"])
    if "'ingest' extra" not in result.output:  # without the ingest extra that line comes first; with it, ours
        one_line_error(result, "needs the 's3' extra")
