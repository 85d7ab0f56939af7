"""Distributed ingest on Dask (`--scheduler`): a LocalCluster of 2 worker processes plans the run, computes the maps
and writes them, each part of the run into its own chunk-aligned cells, while this process loads no model; the run
equals a one-process ingest exactly, on SQLite and PostgreSQL, and a distributed ingest killed with SIGKILL
resumes to the same run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from attnstore.store import migrate, open_store
from attnstore.store.check import check_store

distributed = pytest.importorskip("distributed")
pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # a Dask cluster of real processes, and ingests killed with -9

MRPC = Path(__file__).parents[1] / "fixtures" / "mrpc_dev_head.tsv"
N_EXAMPLES = 12
OPTIONS = dict(fmt="pairs-tsv", annotator="whitespace", batch_size=2, chunk_cells=4096, progress=False)
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as local:
        yield local.scheduler_address


def assert_same_run(store, reference) -> None:
    info = store.run_info("k")
    assert info.status == "complete" and info.n_stored == N_EXAMPLES
    got = dict(store.iter_attention("k"))
    want = dict(reference.iter_attention("k"))
    assert got.keys() == want.keys() == set(range(N_EXAMPLES))
    for example in want:
        np.testing.assert_array_equal(got[example], want[example], err_msg=f"example {example}")
    columns = ["example", "position", "token", "token_id", "word_position", "segment", "is_special"]  # aligned by the workers
    assert store.token_table("k")[columns].equals(reference.token_table("k")[columns])
    # stored in the same order as one process stores them
    assert list(store.examples("k").sort_values("offset")["example"]) == list(reference.examples("k").sort_values("offset")["example"])
    _, problems = check_store(store, ["k"])
    assert problems.empty, problems.to_string()
    assert store.sql("SELECT count(*) AS n FROM leases")["n"][0] == 0


def test_two_workers_write_disjoint_parts_of_the_one_process_run(store, tiny_bert, cluster, one_process, monkeypatch, capsys):
    """The coordinator loads no model (a worker plans the run with the one it warmed) and prints the plan's notes."""
    from attnstore.ingest import distributed as dist
    from attnstore.ingest import ingest, runner

    def not_here(*args, **kwargs):
        raise AssertionError("the coordinator loaded a model")

    monkeypatch.setattr(runner, "load_model", not_here)
    monkeypatch.setattr(dist, "load_model", not_here)
    result = ingest(store, corpus=str(MRPC), model=tiny_bert, name="k", scheduler=cluster, **OPTIONS)
    assert result.n_new == N_EXAMPLES and not result.already_complete
    assert "note: value norms are not kept by an ingest on a Dask scheduler" in capsys.readouterr().err
    assert_same_run(store, one_process)
    # planned for the cluster's 2 workers: 6 parts of one batch (2 examples), at least 4 parts a worker where it can
    plan = store.run_info("k").manifest["plan"]
    assert (plan["workers"], plan["parts"]) == (2, 6)
    # each part starts on a chunk of its own: the first block of every pair of examples
    offsets = list(store.examples("k").sort_values("offset")["offset"])
    assert all(o % OPTIONS["chunk_cells"] == 0 for o in offsets[::2]), offsets
    assert len({o // OPTIONS["chunk_cells"] for o in offsets[::2]}) == N_EXAMPLES // 2


def test_a_complete_run_starts_no_cluster_and_a_worker_warms_with_the_model(store, tiny_bert, cluster, one_process, monkeypatch):
    """The same command again says the run is complete without reaching the scheduler; a worker's warm-up task loads the
    model under the source a plan records (where `work_task` looks), and one it cannot load stops nothing."""
    from attnstore.ingest import distributed as dist
    from attnstore.ingest import ingest

    ingest(store, corpus=str(MRPC), model=tiny_bert, name="k", scheduler=cluster, **OPTIONS)

    def unreachable(spec):
        raise AssertionError(f"a cluster was started for a complete run ({spec})")

    monkeypatch.setattr(dist, "client_for", unreachable)
    assert ingest(store, corpus=str(MRPC), model=tiny_bert, name="k", scheduler=cluster, **OPTIONS).already_complete
    monkeypatch.setattr(dist, "_WORKER_MODELS", {})
    monkeypatch.setattr(dist, "_WARMED_SOURCES", {})
    dist.warm_task(tiny_bert, "float32")
    (key,) = dist._WORKER_MODELS
    assert key == (store.run_info("k").manifest["plan"]["model"], "float32")
    assert dist._WARMED_SOURCES == {(tiny_bert, "float32"): key[0]}  # where plan_task finds it by the command's name
    dist.warm_task(str(Path(tiny_bert) / "no-such-model"), "float32")
    assert list(dist._WORKER_MODELS) == [key]


def test_a_killed_distributed_ingest_resumes_to_the_same_run(tmp_path, tiny_bert, cluster, one_process):
    url = f"sqlite:///{tmp_path / 'meta.sqlite'}"
    root = tmp_path / "attention.zarr"
    migrate.upgrade(url)
    cmd = [
        sys.executable,
        "-m",
        "attnstore.api.cli",
        "ingest",
        "--corpus",
        str(MRPC),
        "--format",
        "pairs-tsv",
        "--annotate",
        "whitespace",
        "--batch-size",
        "2",
        "--chunk-cells",
        "4096",
        "--model",
        tiny_bert,
        "--name",
        "k",
        "--no-progress",
        "--scheduler",
        cluster,
        "--db",
        url,
        "--root",
        str(root),
    ]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    store = open_store(db=url, root=str(root))
    while time.time() < deadline and proc.poll() is None:
        try:
            if store.sql("SELECT count(*) AS n FROM sequences")["n"][0] > 0:
                break
        except Exception:
            pass
        time.sleep(0.02)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    before = store.sql("SELECT count(*) AS n FROM sequences")["n"][0]
    assert proc.returncode == -signal.SIGKILL and 0 < before < N_EXAMPLES, (proc.returncode, before)
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same_run(store, one_process)


def test_a_run_planned_for_workers_runs_on_a_cluster(store, tiny_bert, cluster, one_process):
    """`ingest --for-workers 3` then the same ingest with --scheduler: the cluster runs the plan's 3 worker indices."""
    from attnstore.ingest import ingest

    planned = ingest(store, corpus=str(MRPC), model=tiny_bert, name="k", workers=3, **OPTIONS)
    assert planned.planned_parts == 6
    result = ingest(store, corpus=str(MRPC), model=tiny_bert, name="k", scheduler=cluster, **OPTIONS)
    assert result.n_new == N_EXAMPLES
    assert_same_run(store, one_process)


def test_a_bad_corpus_is_refused_before_a_cluster_starts(store, tiny_bert, tmp_path, monkeypatch):
    from attnstore.ingest import distributed as dist
    from attnstore.ingest import ingest
    from attnstore.ingest.errors import CorpusError

    bad = tmp_path / "bad.tsv"
    bad.write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA sentence.\n")

    def unreachable(spec):
        raise AssertionError(f"a cluster was started for a bad corpus ({spec})")

    monkeypatch.setattr(dist, "client_for", unreachable)
    with pytest.raises(CorpusError, match=r"bad.tsv:2: expected 5 tab-separated fields, found 4"):
        ingest(store, corpus=str(bad), model=tiny_bert, name="k", scheduler="local:2", **OPTIONS)
    assert store.runs().empty and store.sql("SELECT count(*) AS n FROM datasets")["n"][0] == 0


def test_a_scheduler_without_workers_is_refused_in_one_line(store, tiny_bert):
    from attnstore.ingest import ingest
    from attnstore.store.errors import InvalidArgumentError

    with distributed.LocalCluster(n_workers=0, processes=True, dashboard_address=":0") as empty:
        with pytest.raises(InvalidArgumentError, match=f"the Dask scheduler at {empty.scheduler_address} has no workers: start them"):
            ingest(store, corpus=str(MRPC), model=tiny_bert, name="k", scheduler=empty.scheduler_address, **OPTIONS)
    assert store.runs().empty and store.sql("SELECT count(*) AS n FROM datasets")["n"][0] == 0


def test_an_unknown_scheduler_is_refused_before_anything_is_stored(store, tiny_bert):
    from attnstore.ingest import ingest
    from attnstore.store.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="scheduler 'lokal' is not understood"):
        ingest(store, corpus=str(MRPC), model=tiny_bert, name="k", scheduler="lokal", **OPTIONS)
    assert store.runs().empty and store.sql("SELECT count(*) AS n FROM datasets")["n"][0] == 0
