"""Engine-free workers (`ingest --for-workers N`, `attnstore work`): a planned run's parts computed by independent
processes that share only the store equal a one-process run bit for bit, in any order, for any N, after a worker is
killed with SIGKILL and restarted with its index; bad input (an index running twice, a wrong worker count, a plan
changed underneath, a plain ingest of a planned run) is refused in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from attnstore.store import migrate, open_store, parts
from attnstore.store.check import check_store
from attnstore.store.errors import BusyError, ConflictError, InvalidArgumentError

pytest.importorskip("torch")

MRPC = Path(__file__).parents[1] / "fixtures" / "mrpc_dev_head.tsv"
N_EXAMPLES = 12
OPTIONS = dict(fmt="pairs-tsv", annotator="whitespace", batch_size=2, chunk_cells=4096, progress=False)
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def plan(store, tiny_bert, workers: int, name: str = "k"):
    from attnstore.ingest import ingest

    return ingest(store, corpus=str(MRPC), model=tiny_bert, name=name, workers=workers, **OPTIONS)


def assert_same_run(store, reference, name: str = "k", same_order: bool = True) -> None:
    info = store.run_info(name)
    assert info.status == "complete" and info.n_stored == N_EXAMPLES
    got = dict(store.iter_attention(name))
    want = dict(reference.iter_attention("k"))
    assert got.keys() == want.keys() == set(range(N_EXAMPLES))
    for example in want:
        np.testing.assert_array_equal(got[example], want[example], err_msg=f"example {example}")
    columns = ["example", "position", "token", "token_id", "word_position", "segment", "is_special"]  # aligned by the workers
    assert store.token_table(name)[columns].equals(reference.token_table("k")[columns])
    if same_order:  # no part was retried: stored in plan order, as one process stores them
        order = list(reference.examples("k").sort_values("offset")["example"])
        assert list(store.examples(name).sort_values("offset")["example"]) == order
    _, problems = check_store(store, [name])
    assert problems.empty, problems.to_string()
    assert store.sql("SELECT count(*) AS n FROM leases")["n"][0] == 0


# 2 workers out of order in the fast lane; 1 and 3 in the whole suite
@pytest.mark.parametrize(
    "workers, order", [pytest.param(1, [0], marks=pytest.mark.slow), (2, [1, 0]), pytest.param(3, [2, 0, 1], marks=pytest.mark.slow)]
)
def test_workers_in_any_order_write_the_one_process_run(store, tiny_bert, one_process, workers, order):
    """The workers run at once (threads, each with its own store), started in `order`."""
    import threading
    from dataclasses import asdict

    from attnstore.ingest.workers import work
    from attnstore.store import Store
    from attnstore.store.config import Locations

    planned = plan(store, tiny_bert, workers)
    # 6 batches of 2 examples: parts of 2 batches for one worker (at least 4 parts each), else of one batch
    assert planned.planned_parts == (3 if workers == 1 else 6) and planned.run.status == "running"
    assert store.sql("SELECT count(*) AS n FROM sequences")["n"][0] == 0  # planned, nothing computed
    results, errors = [], []

    def worker(i: int) -> None:
        own = Store(Locations(**asdict(store.locations)))
        try:
            results.append(work(own, "k", i, workers, progress=False))
        except BaseException as exc:  # raised again below, in the test's thread
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in order]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert sum(r.completed for r in results) == 1 and sum(r.n_new for r in results) == N_EXAMPLES
    assert_same_run(store, one_process)  # every part's first attempt: in plan order, as one process stores them
    # each part starts on a chunk of its own
    offsets = list(store.examples("k").sort_values("offset")["offset"])
    per_part = 4 if workers == 1 else 2
    assert all(o % OPTIONS["chunk_cells"] == 0 for o in offsets[::per_part]), offsets
    assert store.sql("SELECT max(attempts) AS a FROM ingest_parts")["a"][0] == 1  # no part computed twice
    again = work(store, "k", 0, workers, progress=False)
    assert again.already_complete and again.n_new == 0


def test_a_worker_takes_its_own_parts_then_the_others_not_taken(store, tiny_bert, one_process):
    from attnstore.ingest.workers import work
    from attnstore.store.parts import part_lease_name

    plan(store, tiny_bert, 2)
    order = []
    real = parts.part_batches

    def seen(store_, run_id, part):
        order.append(part)
        return real(store_, run_id, part)

    parts.part_batches = seen
    try:
        with store.writer.lease(part_lease_name("k", 4), "part 4 of run 'k'"):  # worker 0 computes part 4 meanwhile
            result = work(store, "k", 1, 2, progress=False)
    finally:
        parts.part_batches = real
    assert order == [1, 3, 5, 2, 0]  # its own in order, then the others' from the last, part 4 left to its holder
    assert (result.n_new, result.parts, result.parts_left, result.completed) == (10, 5, 1, False)
    last = work(store, "k", 0, 2, progress=False)
    assert (last.n_new, last.parts, last.completed) == (2, 1, True)
    assert_same_run(store, one_process)


@pytest.mark.one_backend("sqlite")
def test_the_cli_plans_and_its_workers_say_what_they_did(store, tiny_bert, one_process, db_url, tmp_path):
    from attnstore.api.cli import main

    where = ["--db", db_url, "--root", str(tmp_path / "attention.zarr")]
    common = ["--corpus", str(MRPC), "--format", "pairs-tsv", "--annotate", "whitespace", "--batch-size", "2"]
    common += ["--chunk-cells", "4096", "--model", tiny_bert, "--name", "k", "--no-progress", *where]
    runner = CliRunner()
    out = runner.invoke(main, ["ingest", *common, "--for-workers", "2"])
    assert out.exit_code == 0, out.output
    assert "run 'k' is planned: 6 parts for 2 workers" in out.output and "attnstore work --run k --worker I --of 2" in out.output
    again = runner.invoke(main, ["ingest", *common, "--for-workers", "2"])
    assert again.exit_code == 0 and "is planned already: 6 parts" in again.output
    other = runner.invoke(main, ["ingest", *common, "--for-workers", "3"])
    assert other.exit_code == 1 and "planned for 2 workers already" in other.output
    plain = runner.invoke(main, ["ingest", *common])
    assert plain.exit_code == 1 and "is planned for 2 worker processes, which write it" in plain.output
    wrong = runner.invoke(main, ["work", "--run", "k", "--worker", "0", "--of", "3", "--no-progress", *where])
    assert wrong.exit_code == 1 and "planned for 2 workers, and this one was started as one of 3" in wrong.output
    past = runner.invoke(main, ["work", "--run", "k", "--worker", "2", "--no-progress", *where])
    assert past.exit_code == 1 and "worker 2 does not exist" in past.output
    # the index from a job array's environment (Slurm); part 0 is being computed by worker 0 meanwhile
    with store.writer.lease("run:k:part:0", "part 0 of run 'k'"):
        first = runner.invoke(main, ["work", "--run", "k", "--no-progress", *where], env={"SLURM_ARRAY_TASK_ID": "1"})
    assert first.exit_code == 0 and "worker 1 of 2, run 'k': 10 new examples from 5 parts" in first.output, first.output
    assert "1 parts of the run are left to other workers" in first.output
    last = runner.invoke(main, ["work", "--run", "k", "--worker", "0", "--of", "2", "--no-progress", *where])
    assert last.exit_code == 0 and "2 new examples from 1 parts" in last.output and "this worker completed the run" in last.output
    done = runner.invoke(main, ["work", "--run", "k", "--worker", "1", "--of", "2", "--no-progress", *where])
    assert done.exit_code == 0 and "run 'k' is complete; nothing to do" in done.output
    assert_same_run(store, one_process)


@pytest.mark.one_backend("sqlite")
def test_two_workers_with_one_index_at_once_one_is_refused(store, tiny_bert):
    from attnstore.ingest.workers import work

    plan(store, tiny_bert, 2)
    with store.writer.lease("run:k:worker:1/2", "worker 1 of 2 of run 'k'"):  # worker 1 is running
        with pytest.raises(BusyError, match=r"worker 1 of 2 of run 'k' is running already \(.*pid .*\): one process per index"):
            work(store, "k", 1, 2, progress=False)
        # --wait: waits for the running one (here it ends after 0.5 s), then works
        import threading

        lease = store.writer.lease("run:k:worker:0/2", "worker 0 of 2 of run 'k'")
        threading.Timer(0.5, lease.release).start()
        assert work(store, "k", 0, 2, wait=True, progress=False).n_new == 12  # every part: worker 1 is stopped
    assert store.sql("SELECT count(*) AS n FROM sequences")["n"][0] == 12


@pytest.mark.one_backend("sqlite")
def test_a_worker_started_before_its_plan_waits_for_it(store, tiny_bert, one_process):
    import threading
    from dataclasses import asdict

    from attnstore.ingest.workers import work
    from attnstore.store import Store
    from attnstore.store.config import Locations

    results = []
    own = Store(Locations(**asdict(store.locations)))
    waiting = threading.Thread(target=lambda: results.append(work(own, "k", 1, 2, wait=True, progress=False)))
    waiting.start()  # the run does not exist yet
    plan(store, tiny_bert, 2)
    waiting.join(timeout=120)
    own.close()
    assert results and (results[0].n_new, results[0].completed) == (N_EXAMPLES, True)
    assert_same_run(store, one_process)
    # a run that exists unplanned, with nobody planning it, is refused at once even with --wait
    from attnstore.ingest import ingest

    ingest(store, corpus=str(MRPC), model=tiny_bert, name="plain", limit=2, **OPTIONS)
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE runs SET status = 'interrupted' WHERE name = 'plain'"))
    with pytest.raises(InvalidArgumentError, match="run 'plain' was not planned for worker processes"):
        work(store, "plain", 0, 1, wait=True, progress=False)


@pytest.mark.one_backend("sqlite")
def test_each_worker_names_its_own_device(store, tiny_bert):
    """`cuda:{worker}`: worker 1 asks for cuda:1 (which this machine lacks: refused in one line before any write)."""
    import torch

    from attnstore.ingest.workers import work

    if torch.cuda.device_count() > 1:
        pytest.skip("this machine has a cuda:1")
    plan(store, tiny_bert, 2)
    with pytest.raises(InvalidArgumentError, match=r"--device 'cuda:1' is not available on this machine"):
        work(store, "k", 1, 2, device="cuda:{worker}", progress=False)
    assert work(store, "k", 0, 2, device="cpu", progress=False).n_new == N_EXAMPLES


@pytest.mark.one_backend("sqlite")
def test_a_plan_changed_under_a_worker_stops_it(store, tiny_bert, monkeypatch):
    from attnstore.ingest import workers
    from attnstore.store import parts

    plan(store, tiny_bert, 1)
    real = parts.part_batches
    calls = []

    def replanned(store_, run_id, part):  # between the worker's parts, the run's plan is replaced
        calls.append(part)
        if len(calls) == 1:  # while the first part is computed
            with store.engine.begin() as conn:
                manifest = conn.scalar(sa.text("SELECT manifest FROM runs WHERE id = :i"), {"i": run_id})
                manifest = json.loads(manifest) if isinstance(manifest, str) else manifest
                manifest["plan"]["digest"] = "0" * 64
                conn.execute(sa.text("UPDATE runs SET manifest = :m WHERE id = :i"), {"m": json.dumps(manifest), "i": run_id})
        return real(store_, run_id, part)

    monkeypatch.setattr(parts, "part_batches", replanned)
    with pytest.raises(ConflictError, match=r"the plan of run 'k' changed while this worker ran \(digest \w{12} -> 000000000000\)"):
        workers.work(store, "k", 0, 1, progress=False)
    assert store.sql("SELECT count(*) AS n FROM sequences")["n"][0] == 4  # the part begun before the change is kept


def test_the_plan_keeps_ids_and_a_worker_whose_tokenizer_differs_is_refused(store, tiny_bert):
    """The plan keeps each example's ids, not its tokens: a worker aligns its part's tokens, and stops in one line
    (nothing of the part written) when its tokenizer gives other ids than the planner's did."""
    from attnstore.ingest import workers

    plan(store, tiny_bert, 1)
    run_id = store.run_info("k").id
    first = parts.part_batches(store, run_id, 0)
    assert all("tokens" not in e and e["input_ids"] for batch in first for e in batch)
    first[0][0]["input_ids"][1] += 1  # as another tokenizer would have encoded it
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE ingest_parts SET batches = :b WHERE run_id = :r AND part = 0"), {"b": parts.pack(first), "r": run_id})
    position = first[0][0]["position"]
    with pytest.raises(
        ConflictError, match=rf"^example {position} of run 'k': this worker's tokenizer encodes it otherwise than the planner's"
    ):
        workers.work(store, "k", 0, 1, progress=False)
    assert store.sql("SELECT count(*) AS n FROM sequences")["n"][0] == 0


@pytest.mark.one_backend("sqlite")
def test_a_worker_waiting_for_its_plan_loads_the_model_while_the_run_is_planned(store, tiny_bert, one_process, monkeypatch):
    """Worker 1, started before its planner, loads the model the run's manifest names once the planner has made the
    run, while the plan is made (the plan here waits for that), and computes its parts with it: one load."""
    import threading
    from dataclasses import asdict

    from attnstore.ingest import workers as workers_module
    from attnstore.ingest.workers import work
    from attnstore.store import Store
    from attnstore.store.config import Locations

    preloaded = threading.Event()
    real_preload, real_plan, real_load = workers_module._preload, workers_module.plan_parts, workers_module.load_model

    def preload(manifest, device, into):
        real_preload(manifest, device, into)
        preloaded.set()

    def plan_parts(*args, **kwargs):
        assert preloaded.wait(60), "the waiting worker did not load the model while the run was planned"
        return real_plan(*args, **kwargs)

    loads = []
    monkeypatch.setattr(workers_module, "_preload", preload)
    monkeypatch.setattr(workers_module, "plan_parts", plan_parts)
    monkeypatch.setattr(workers_module, "load_model", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    results = []
    own = Store(Locations(**asdict(store.locations)))
    waiting = threading.Thread(target=lambda: results.append(work(own, "k", 1, 2, wait=True, progress=False)))
    waiting.start()
    plan(store, tiny_bert, 2)
    waiting.join(timeout=120)
    own.close()
    assert [a[0] for a in loads] == [store.run_info("k").manifest["plan"]["model"]]
    assert results and (results[0].n_new, results[0].completed) == (N_EXAMPLES, True)  # worker 0 never started
    assert_same_run(store, one_process)


def test_the_planner_goes_on_as_a_worker_with_its_model(store, tiny_bert, one_process, db_url, monkeypatch):
    """`ingest --for-workers 2 --as-worker 0` plans, then is worker 0 with the model it loaded; worker 1, started before
    the plan with --wait, shares the parts. Run again (a restarted planner), it finds the run complete."""
    import threading
    from dataclasses import asdict

    from attnstore.api.cli import main
    from attnstore.ingest import ingest
    from attnstore.ingest import workers as workers_module
    from attnstore.ingest.workers import work
    from attnstore.store import Store
    from attnstore.store.config import Locations

    results = []
    own = Store(Locations(**asdict(store.locations)))
    waiting = threading.Thread(target=lambda: results.append(work(own, "k", 1, 2, wait=True, progress=False)))
    waiting.start()
    loads = []  # the workers' model loads: worker 1's alone (the planner's is the plan's)
    real = workers_module.load_model
    monkeypatch.setattr(workers_module, "load_model", lambda *a, **k: loads.append(a) or real(*a, **k))
    result = ingest(store, corpus=str(MRPC), model=tiny_bert, name="k", workers=2, as_worker=0, worker_threads=1, **OPTIONS)
    waiting.join(timeout=120)
    own.close()
    assert len(loads) == 1 if results[0].parts else len(loads) <= 1  # loaded while the plan was made, or for its parts
    assert result.planned_parts == 6 and result.worked.worker == 0 and result.run.status in ("running", "complete")
    assert result.worked.n_new + results[0].n_new == N_EXAMPLES and result.worked.completed + results[0].completed == 1
    assert store.run_info("k").status == "complete"
    assert_same_run(store, one_process)
    where = ["--db", db_url, "--root", store.locations.array_root]
    common = ["ingest", "--corpus", str(MRPC), "--format", "pairs-tsv", "--annotate", "whitespace", "--batch-size", "2"]
    common += ["--chunk-cells", "4096", "--model", tiny_bert, "--name", "k", "--no-progress", "--for-workers", "2", *where]
    again = CliRunner().invoke(main, [*common, "--as-worker", "0"])
    assert again.exit_code == 0 and "run 'k' is already complete" in again.output, again.output
    for extra, says in (
        (["--as-worker", "2"], "--as-worker 2: give it with --for-workers N, as an index 0..N-1"),
        (["--worker-threads", "1"], "--worker-threads sets the threads of --as-worker's work; give it with --as-worker I"),
    ):
        out = CliRunner().invoke(main, [*common, *extra])
        assert out.exit_code == 1 and says in out.output, out.output
    with pytest.raises(InvalidArgumentError, match="--as-worker I goes with --for-workers N"):
        ingest(store, corpus=str(MRPC), model=tiny_bert, name="k2", as_worker=0, **OPTIONS)
    with pytest.raises(InvalidArgumentError, match="--worker-threads must be a positive number of threads, not 0"):
        ingest(store, corpus=str(MRPC), model=tiny_bert, name="k2", workers=2, as_worker=0, worker_threads=0, **OPTIONS)


@pytest.mark.one_backend("sqlite")
def test_a_run_not_planned_is_refused_and_bad_indexes_too(store, tiny_bert, monkeypatch):
    from attnstore.ingest import ingest
    from attnstore.ingest.workers import check_worker, work

    ingest(store, corpus=str(MRPC), model=tiny_bert, name="plain", limit=2, **OPTIONS)
    assert work(store, "plain", 0, 1, progress=False).already_complete
    with store.engine.begin() as conn:  # as a plain ingest cut off leaves it
        conn.execute(sa.text("UPDATE runs SET status = 'interrupted'"))
    with pytest.raises(InvalidArgumentError, match="run 'plain' was not planned for worker processes"):
        work(store, "plain", 0, 1, progress=False)
    for name in ("ATTNSTORE_WORKER", "SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX", "ATTNSTORE_WORKERS", "SLURM_ARRAY_TASK_COUNT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InvalidArgumentError, match="give --worker I"):
        check_worker(None, None)
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "x")
    with pytest.raises(InvalidArgumentError, match=r"JOB_COMPLETION_INDEX='x' is not a worker index"):
        check_worker(None, None)
    with pytest.raises(InvalidArgumentError, match="worker index -1 is negative"):
        check_worker(-1, 2)
    with pytest.raises(InvalidArgumentError, match="--for-workers plans the run for worker processes; leave out --scheduler"):
        ingest(store, corpus=str(MRPC), model=tiny_bert, name="x", workers=2, scheduler="local", **OPTIONS)


# A worker killed with SIGKILL at its n-th commit of rows (after its cells are on disk), in a process of its own.
KILLED_WORKER = textwrap.dedent(
    """
    import os, signal, sys
    from attnstore.store import open_store
    from attnstore.store.writer import RunWriter
    from attnstore.ingest.workers import work

    db, root, worker, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    commit = RunWriter._commit_ready
    calls = []

    def dying(self, *args):
        calls.append(1)
        if len(calls) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return commit(self, *args)

    RunWriter._commit_ready = dying
    work(open_store(db=db, root=root), "k", worker, 2, progress=False)
    """
)


@pytest.mark.slow
@pytest.mark.one_backend("sqlite")
def test_a_worker_killed_mid_part_restarts_with_its_index_and_the_run_is_the_same(store, tiny_bert, one_process, db_url, tmp_path):
    from attnstore.ingest.workers import work

    root = str(tmp_path / "attention.zarr")
    plan(store, tiny_bert, 2)
    for worker, kill_at in ((0, 2), (0, 3)):  # killed in its second part, then in the fourth part after restarting
        proc = subprocess.run([sys.executable, "-c", KILLED_WORKER, db_url, root, str(worker), str(kill_at)], env=ENV, timeout=120)
        assert proc.returncode == -signal.SIGKILL
    # Rows commit example by example here (each block spans chunks): the first process stored one example of part 0;
    # the second finished part 0 (its second attempt), stored one example of part 2 and was killed in its second.
    assert store.sql("SELECT count(*) AS n FROM sequences")["n"][0] == 3
    state = store.sql("SELECT part, attempts, finished_at IS NOT NULL AS finished, cell_stop FROM ingest_parts ORDER BY part")
    assert state["attempts"].tolist() == [2, 0, 1, 0, 0, 0] and state["finished"].astype(bool).tolist() == [True] + [False] * 5
    planned_end = int(state["cell_stop"].max())
    # restarted: the killed process's leases are taken over at once; it finishes part 2, then does every part left
    first = work(store, "k", 0, 2, progress=False)
    assert (first.n_new, first.parts, first.completed) == (9, 5, True)
    assert work(store, "k", 1, 2, progress=False).already_complete
    assert_same_run(store, one_process, same_order=False)
    # the retried parts' examples went past the planned cells: the cells of a cut-off attempt are never reused
    state = store.sql("SELECT part, attempts FROM ingest_parts ORDER BY part")
    assert state["attempts"].tolist() == [2, 1, 2, 1, 1, 1]
    past = store.sql('SELECT example_id FROM sequences WHERE "offset" >= :end', {"end": planned_end})
    assert len(past) == 2  # the second attempts' examples: one of part 0, one of part 2


def test_workers_sharing_an_s3_root_write_the_one_process_run(db_url, s3_root, tiny_bert, one_process):
    """The cluster setting: a database (PostgreSQL, or SQLite on a shared disk) and object storage shared by the
    workers, a retried part among them."""
    from attnstore.ingest import ingest
    from attnstore.ingest.workers import work

    migrate.upgrade(db_url)
    store = open_store(db=db_url, root=s3_root)
    try:
        # chunks of 256 Ki cells: fewer objects to write to the test server (the maps do not depend on the chunking)
        ingest(store, corpus=str(MRPC), model=tiny_bert, name="k", workers=2, **{**OPTIONS, "chunk_cells": 262144})
        with store.engine.begin() as conn:  # part 1 as a cut-off first attempt leaves it: counted, nothing committed
            conn.execute(sa.text("UPDATE ingest_parts SET attempts = 1 WHERE part = 1"))
        first = work(store, "k", 1, 2, progress=False)  # every part (it takes worker 0's too)
        assert (first.n_new, first.completed) == (N_EXAMPLES, True)
        assert work(store, "k", 0, 2, progress=False).already_complete
        assert_same_run(store, one_process, same_order=False)
    finally:
        store.close()
