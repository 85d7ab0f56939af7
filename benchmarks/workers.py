"""Benchmark: engine-free workers (`ingest --for-workers N` + `attnstore work`) against one process, and workers
killed with SIGKILL at random moments.

    python benchmarks/workers.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--limit N] [--kills 10] [--dask]
        [--counts 1,2] [--paths plan,together,as-worker] [--rounds 1]

Every ingest is a whole command in a process of its own (model loading included), into one temporary SQLite store
whose dataset is annotated beforehand. It times:

- one process using every core (`attnstore ingest`, torch's default threads);
- the run planned for 1 and for 2 workers, then the workers at once, each with one torch thread
  (`attnstore work --threads 1`): throughput = examples / (plan + workers' wall time), and the workers alone; and
  2 workers started together with their plan (`work --wait`: they import torch while the plan is made); and the
  planning command going on as worker 0 (`--as-worker 0`) with worker 1 started beside it;
- with --dask, the same ingest on a LocalCluster of 2 single-threaded workers (`--scheduler local:2`), and the bytes
  its coordinator sends through the scheduler (the pickled tasks; the maps never travel: workers write them);
- --rounds R: all of that R times, each round with its own one-process run, so that a change of load between rounds
  hits every path of a round alike (this 2-core machine's 2-process runs vary by 10 % from one minute to the next);
- --kills N: 2 workers, one of them killed with SIGKILL at a random moment once it has stored something since it
  (re)started, and restarted with its index, N times; the run must equal the one-process run bit for bit and
  `attnstore check` must pass.

Each run's maps are compared with the one-process run's, example by example (exactly).
"""

from __future__ import annotations

import argparse
import functools
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


def print_row(n: int, alone: float, label: str, seconds: float, same: str = "") -> None:
    print(f"{label:34s} {seconds:8.2f} {n / seconds:7.1f} {alone / seconds:13.2f}x  {same}")


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
    parser.add_argument(
        "--paths",
        default="plan,together,as-worker",
        help="Engine-free paths to time (comma-separated): plan (the plan, then the workers), together (workers started "
        "with their plan), as-worker (the planner going on as worker 0).",
    )
    parser.add_argument("--rounds", type=int, default=1, help="Rounds, each with its own one-process run (alternated).")
    args = parser.parse_args()
    paths = set(args.paths.split(","))

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
        for r in range(0 if args.kills_only else args.rounds):
            if r:  # each round against its own one-process run: the load may have changed
                alone = run([*common, "--name", f"one-{r}"])
                print(f"round {r + 1}")
            row = functools.partial(print_row, n, alone)
            row("one process, every core", alone)
            for count in [int(c) for c in args.counts.split(",") if c]:
                name = f"workers-{count}-{r}"
                if "plan" in paths:
                    plan = run([*common, "--name", name, "--for-workers", str(count)])
                    computed = workers(name, count)
                    row(f"{count} worker{'s' if count > 1 else ''} x 1 thread (plan {plan:.1f} s)", plan + computed, equal(name))
                    row("  the workers alone", computed)
                if count == 2 and "together" in paths:
                    name = f"with-plan-2-{r}"
                    row("  started with their plan", workers(name, 2, plan=[*common, "--name", name, "--for-workers", "2"]), equal(name))
                if count == 2 and "as-worker" in paths:
                    name = f"as-worker-2-{r}"
                    planner = [*common, "--name", name, "--for-workers", "2", "--as-worker", "0", "--worker-threads", "1"]
                    row("  the planner as worker 0", workers(name, 2, plan=planner, first=1), equal(name))
            if args.dask:
                name = f"dask-2-{r}"
                row("Dask LocalCluster, 2 x 1 thread", run([*common, "--name", name, "--scheduler", "local:2"]), equal(name))
        if args.dask and not args.kills_only:
            import cloudpickle

            from attnstore.ingest.distributed import plan_task, work_task
            from attnstore.ingest.runner import plan_for_cluster
            from attnstore.ingest.settings import RunSettings

            plan_bytes = store.sql(
                "SELECT sum(length(batches)) AS b FROM ingest_parts WHERE run_id = (SELECT id FROM runs WHERE name = 'dask-2-0')"
            )["b"][0]
            locations = asdict(store.locations)
            settings = RunSettings.of(corpus=args.corpus, fmt=args.format, limit=args.limit, value_norms=False, name="dask-2-0")
            planning = len(cloudpickle.dumps((plan_task, plan_for_cluster, locations, settings, 2, "local:2")))
            task = len(cloudpickle.dumps((work_task, locations, "dask-2-0", 0, 2)))
            print(
                f"bytes of the Dask run's plan in SQL (zlib JSON): {int(plan_bytes):,}; through the Dask scheduler: "
                f"{planning:,} the plan's task (its result the run's record and notes), {task:,} a work task (2 tasks; "
                f"the result an int); maps through any engine: 0"
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
