"""Benchmark: the same planned parts computed by a plain process and inside a Dask worker, one torch thread each.

    python benchmarks/dask_worker.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--limit N] [--rounds 2]

Two runs of the corpus are planned for one worker (`ingest --for-workers 1`). One is computed by `attnstore work
--threads 1` in a plain process. The other is computed by the same `work()` call sent to a LocalCluster of one
single-threaded worker process, the way `ingest --scheduler` runs its parts. Each row gives the parts' seconds (the
run's `ingest_seconds`: forward passes and writes, model loading excluded), the worker's wall time from model loading
on, and its CPU time, system CPU time and minor page faults (from /proc). Rounds alternate the two, so a change in
load hits both.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEFAULT_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue" / "MRPC" / "dev.tsv"


def work_and_measure(db: str, root: str, run: str) -> dict:
    """In the worker (a plain process or a Dask worker): `work()` on one thread, with this process's costs."""
    import resource

    import torch

    from attnstore.ingest.workers import work
    from attnstore.store import open_store

    torch.set_num_threads(1)
    before, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    store = open_store(db=db, root=root)
    result = work(store, run, 0, 1, progress=False)
    after = resource.getrusage(resource.RUSAGE_SELF)
    parts = float(store.sql("SELECT ingest_seconds AS s FROM runs WHERE name = :n", {"n": run})["s"][0] or 0.0)
    store.close()
    return dict(
        wall=time.perf_counter() - t,
        parts=parts,
        cpu=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        system=after.ru_stime - before.ru_stime,
        faults=after.ru_minflt - before.ru_minflt,
        n=result.n_new,
        trim=os.environ.get("MALLOC_TRIM_THRESHOLD_", "-"),
        omp=os.environ.get("OMP_NUM_THREADS", "-"),
    )


def main() -> None:
    from distributed import Client, LocalCluster

    from attnstore.ingest import file_source, register_dataset
    from attnstore.store import migrate, open_store

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--format", default="pairs-tsv")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--measure", nargs=3, metavar=("DB", "ROOT", "RUN"), help=argparse.SUPPRESS)  # the plain process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(work_and_measure(*args.measure)))
        return

    work = Path(tempfile.mkdtemp(prefix="attnstore-dask-worker-"))
    url, root = f"sqlite:///{work / 'meta.sqlite'}", str(work / "attention.zarr")
    migrate.upgrade(url)
    store = open_store(db=url, root=root)
    register_dataset(store, file_source(args.corpus, args.format), limit=args.limit, progress=False)
    limit = ["--limit", str(args.limit)] if args.limit else []
    cli = [sys.executable, "-m", "attnstore.api.cli"]
    common = ["ingest", "--corpus", args.corpus, "--format", args.format, *limit, "--no-norms", "--no-progress"]
    print(f"{'where':14s} {'parts s':>8s} {'wall s':>7s} {'CPU s':>6s} {'system s':>8s} {'faults':>9s}  MALLOC_TRIM / OMP")
    try:
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, Client(cluster) as client:
            client.run(lambda: __import__("attnstore.ingest.workers"))  # imports paid before the clock, as in a plain process below
            for r in range(args.rounds):
                for where in ("plain", "dask") if r % 2 == 0 else ("dask", "plain"):
                    run = f"{where}-{r}"
                    subprocess.run([*cli, *common, "--name", run, "--for-workers", "1", "--db", url, "--root", root], check=True)
                    if where == "plain":
                        measure = [sys.executable, __file__, "--measure", url, root, run]
                        done = subprocess.run(measure, capture_output=True, text=True)
                        if done.returncode:
                            raise SystemExit(done.stderr[-3000:])
                        m = json.loads(done.stdout.splitlines()[-1])
                    else:
                        m = client.submit(work_and_measure, url, root, run, pure=False).result()
                    costs = f"{m['parts']:8.2f} {m['wall']:7.2f} {m['cpu']:6.2f} {m['system']:8.2f} {m['faults']:9,d}"
                    print(f"{where:14s} {costs}  {m['trim']} / {m['omp']}")
    finally:
        store.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
