"""A real `attnstore ingest --root s3://...` with the real model, killed with -9 mid-run, then resumed:
every example's maps equal a one-shot ingest into a local root, bit for bit.

The S3 server is moto's on 127.0.0.1 (the `s3_root` fixture); the ingest runs in a child process,
which reaches it through the AWS_* and FSSPEC_S3_ENDPOINT_URL variables the fixture sets.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.store import migrate, open_store
from attnstore.store.check import check_store
from attnstore.tests.ingest.test_ingest_e2e import MRPC
from attnstore.tests.test_faults import cli, maps_of, wait_for

pytestmark = pytest.mark.model
pytest.importorskip("s3fs", reason="the s3 extra (fsspec, s3fs) is not installed")

N_EXAMPLES = 12  # rows of tests/fixtures/mrpc_dev_head.tsv
# One example per batch and small chunks: each example is committed on its own, after several
# object writes, so the kill lands between commits with examples left to do.
OPTIONS = ["--format", "pairs-tsv", "--annotate", "whitespace", "--batch-size", "1", "--chunk-cells", "16384"]


def stored(db_file) -> int:
    try:
        with sqlite3.connect(f"file:{db_file}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute("SELECT count(*) FROM sequences").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_ingest_to_s3_killed_with_9_then_resumed_equals_a_one_shot_local_ingest(tmp_path, s3_root, loaded_model):
    from attnstore.ingest import ingest

    db_file = tmp_path / "meta.sqlite"
    url = f"sqlite:///{db_file}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}  # with the S3 server's variables
    upgraded = subprocess.run(cli(url, s3_root, "db", "upgrade"), env=env, capture_output=True, text=True, timeout=120)
    assert upgraded.returncode == 0 and f"arrays in {s3_root}" in upgraded.stdout, upgraded.stderr
    cmd = cli(url, s3_root, "ingest", "--corpus", str(MRPC), *OPTIONS, "--name", "k", "--no-progress")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: stored(db_file) > 0, proc, timeout=300)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-2000:] if proc.stderr else proc.returncode
    before = stored(db_file)
    assert 0 < before < N_EXAMPLES

    # the same command resumes it; in this process, which has torch and the model's code imported (a fresh one spends
    # ~6 s on that): what is tested is the resume of a run whose writer was killed, and that writer was a real process
    done = CliRunner().invoke(main, cmd[3:], env={"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    assert done.exit_code == 0, done.output[-2000:]

    local_url = f"sqlite:///{tmp_path / 'local.sqlite'}"
    migrate.upgrade(local_url)
    local = open_store(db=local_url, root=str(tmp_path / "attention.zarr"))
    ingest(
        local,
        corpus=str(MRPC),
        fmt="pairs-tsv",
        annotator="whitespace",
        batch_size=1,
        chunk_cells=16384,
        name="k",
        progress=False,
        loaded=loaded_model,
    )
    with open_store(db=url, root=s3_root) as store:
        info = store.run_info("k")
        assert info.status == "complete" and info.n_stored == N_EXAMPLES
        examples = store.examples("k")
        assert sorted(examples["example"]) == list(range(N_EXAMPLES)) and examples["example_id"].is_unique
        got, want = maps_of(store, "k"), maps_of(local, "k")
        assert got.keys() == want.keys() == set(range(N_EXAMPLES))
        for example in want:
            np.testing.assert_array_equal(got[example], want[example], err_msg=f"example {example}")
        columns = ["example", "position", "token_id"]
        assert store.token_table("k")[columns].equals(local.token_table("k")[columns])
        summary, problems = check_store(store)
        assert problems.empty, problems.to_string()
        assert store.sql("SELECT count(*) AS n FROM leases")["n"][0] == 0
    local.close()
