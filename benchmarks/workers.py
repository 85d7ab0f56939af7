"""Benchmark: engine-free workers (`ingest --for-workers N` + `attnstore work`) against one process, and workers
killed with SIGKILL at random moments.

    python benchmarks/workers.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--limit N] [--kills 10] [--dask]

Every ingest is a whole command in a process of its own (model loading included), into one temporary SQLite store
whose dataset is annotated beforehand. It times:

- one process using every core (`attnstore ingest`, torch's default threads);
- the run planned for 1 and for 2 workers, then the workers at once, each with one torch thread
  (`attnstore work --threads 1`): throughput = examples / (plan + workers' wall time), and the workers alone; and
  2 workers started together with their plan (`work --wait`: they import torch while the plan is made); and the
  planning command going on as worker 0 (`--as-worker 0`) with worker 1 started beside it;
- with --dask, the same ingest on a LocalCluster of 2 single-threaded workers (`--scheduler local:2`), and the bytes
  its coordinator sent through the scheduler (the pickled parts; the maps never travel: workers write them);
- --kills N: 2 workers, one of them killed with SIGKILL at a random moment once it has stored something since it
  (re)started, and restarted with its index, N times; the run must equal the one-process run bit for bit and
  `attnstore check` must pass.

Each run's maps are compared with the one-process run's, example by example (exactly).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEFAULT_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue" / "MRPC" / "dev.tsv"
CLI = [sys.executable, "-m", "attnstore.api.cli"]


def main() -> None:
    import numpy as np

    from attnstore.ingest import file_source, register_dataset
    from attnstore.store import migrate, open_store
    from attnstore.store.check import check_store

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--format", default="pairs-tsv")
    parser.add_argument("--limit", type=int, default=None, help="Only the corpus's first N examples.")
    parser.add_argument("--kills", type=int, default=10, help="Workers killed and restarted (0: none).")
    parser.add_argument("--dask", action="store_true", help="Also time the ingest on a LocalCluster of 2 workers.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the kill moments.")
    parser.add_argument("--kills-only", action="store_true", help="Only the one-process run and the kills.")
    parser.add_argument("--counts", default="1,2", help="Worker counts to time (comma-separated).")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="attnstore-workers-"))
    url = f"sqlite:///{work / 'meta.sqlite'}"
    root = str(work / "attention.zarr")
    where = ["--db", url, "--root", root]
    migrate.upgrade(url)
    store = open_store(db=url, root=root)
    register_dataset(store, file_source(args.corpus, args.format), limit=args.limit, progress=False)
    limit = ["--limit", str(args.limit)] if args.limit else []
    common = ["ingest", "--corpus", args.corpus, "--format", args.format, *limit, "--no-norms", "--no-progress", *where]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}

    def run(cmd: list[str]) -> float:
        t = time.perf_counter()
        subprocess.run([*CLI, *cmd], check=True, env=env, stdout=subprocess.DEVNULL)
        return time.perf_counter() - t

    def workers(name: str, n: int, plan: list[str] | None = None, first: int = 0) -> float:
        """The wall time of workers first..n-1; with `plan`, that planning command started with them (`work --wait`)."""
        t = time.perf_counter()
        procs = [
            subprocess.Popen(
                [*CLI, "work", "--run", name, "--worker", str(i), "--of", str(n), "--threads", "1", "--wait", "--no-progress", *where],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i in range(first, n)
        ]
        if plan is not None:
            run(plan)
        for p in procs:
            if p.wait() != 0:
                raise SystemExit(f"a worker of {name} failed ({p.returncode})")
        return time.perf_counter() - t

    def committed(name: str) -> int:
        return int(store.sql(f"SELECT count(*) AS n FROM sequences s JOIN runs r ON r.id = s.run_id WHERE r.name = '{name}'")["n"][0])

    def equal(name: str) -> str:
        """'yes' when every map equals the one-process run's (looked up by example: a retried part is stored later),
        the counts match and `check` is clean; else what differs."""
        differs = [e for e, maps in store.iter_attention(name) if not np.array_equal(maps, store.attention("one", e))]
        _, problems = check_store(store, [name])
        counts = store.run_info(name).n_stored == store.run_info("one").n_stored
        if not differs and problems.empty and counts:
            return "yes"
        return f"NO (maps of {len(differs)} examples differ, {len(problems)} problems, counts equal: {counts})"

    try:
        alone = run([*common, "--name", "one"])
        n = store.run_info("one").n_stored
        print(f"{args.corpus}: {n} examples; {os.cpu_count()} CPUs here; whole commands, model loading included")
        header = f"{'how':34s} {'seconds':>8s} {'ex/s':>7s} {'vs one process':>14s}  equal"
        print(header)
        print("-" * len(header))
        print(f"{'one process, every core':34s} {alone:8.2f} {n / alone:7.1f} {1.0:13.2f}x")
        for count in () if args.kills_only else [int(c) for c in args.counts.split(",")]:
            name = f"workers-{count}"
            plan = run([*common, "--name", name, "--for-workers", str(count)])
            computed = workers(name, count)
            total = plan + computed
            label = f"{count} worker{'s' if count > 1 else ''} x 1 thread (plan {plan:.1f} s)"
            print(f"{label:34s} {total:8.2f} {n / total:7.1f} {alone / total:13.2f}x  {equal(name)}")
            print(f"{'  the workers alone':34s} {computed:8.2f} {n / computed:7.1f} {alone / computed:13.2f}x")
            if count == 2:
                name = "with-plan-2"
                together = workers(name, 2, plan=[*common, "--name", name, "--for-workers", "2"])
                print(f"{'  started with their plan':34s} {together:8.2f} {n / together:7.1f} {alone / together:13.2f}x  {equal(name)}")
                name = "as-worker-2"
                planner = [*common, "--name", name, "--for-workers", "2", "--as-worker", "0", "--worker-threads", "1"]
                joined = workers(name, 2, plan=planner, first=1)
                print(f"{'  the planner as worker 0':34s} {joined:8.2f} {n / joined:7.1f} {alone / joined:13.2f}x  {equal(name)}")
        if args.dask and not args.kills_only:
            seconds = run([*common, "--name", "dask-2", "--scheduler", "local:2"])
            print(f"{'Dask LocalCluster, 2 x 1 thread':34s} {seconds:8.2f} {n / seconds:7.1f} {alone / seconds:13.2f}x  {equal('dask-2')}")
            import cloudpickle

            from attnstore.ingest.distributed import work_task

            plan_bytes = store.sql(
                "SELECT sum(length(batches)) AS b FROM ingest_parts WHERE run_id = (SELECT id FROM runs WHERE name = 'dask-2')"
            )["b"][0]
            task = len(cloudpickle.dumps((work_task, asdict(store.locations), "dask-2", 0, 2)))
            print(
                f"bytes of the Dask run's plan in SQL (zlib JSON): {int(plan_bytes):,}; through the Dask scheduler: "
                f"{task:,} a task (2 tasks; the result an int); maps through any engine: 0"
            )
        if args.kills:
            rng = random.Random(args.seed)
            name = "killed"
            run([*common, "--name", name, "--for-workers", "2"])
            procs: dict[int, subprocess.Popen] = {}

            def start(i: int) -> None:
                procs[i] = subprocess.Popen(
                    [*CLI, "work", "--run", name, "--worker", str(i), "--of", "2", "--threads", "1", "--no-progress", *where],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )

            t = time.perf_counter()
            start(0)
            start(1)
            kills = 0
            while kills < args.kills:
                running = [i for i, p in procs.items() if p.poll() is None]
                if not running:
                    break
                victim = rng.choice(running)
                rows = committed(name)
                while procs[victim].poll() is None and committed(name) == rows:  # past model loading, into its parts
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.0, 1.5))  # then anywhere: inside a batch, between commits, between parts
                if procs[victim].poll() is not None:
                    continue
                procs[victim].send_signal(signal.SIGKILL)
                procs[victim].wait()
                kills += 1
                start(victim)  # restarted with its index: takes over its lease at once (same host, process gone)
            for p in procs.values():
                p.wait()
            seconds = time.perf_counter() - t
            retried = store.sql(f"SELECT sum(attempts) - count(*) AS r FROM ingest_parts WHERE run_id = {store.run_info(name).id}")["r"][0]
            if store.run_info(name).status != "complete":
                run(["work", "--run", name, "--worker", "0", "--of", "2", "--no-progress", *where])  # the run completes
            print(
                f"{kills} workers killed with SIGKILL and restarted ({int(retried)} parts retried) in {seconds:.1f} s: "
                f"run equal to one process and `check` clean: {equal(name)}"
            )
    finally:
        store.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
