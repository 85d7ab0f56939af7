"""Benchmark: the per-example pass of the queries on Dask distributed vs one process.

    python benchmarks/scheduler.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--workers 1,2] [--repeats 3] [--ingest]
    python benchmarks/scheduler.py --db URL --root PATH --run NAME      # a run of an existing store

Without --db the corpus is ingested first with the default model (all-MiniLM-L6-v2) into a
temporary SQLite store. For every registered summary kind (queries/engine/), it times the
pass that builds it: in this process (`summarise_examples`), and on a LocalCluster of N single-
threaded worker processes (`summarise_on`), the cluster started once per N beforehand
(start-up printed apart) -- so the figure is the scale-out of the pass itself; a `--scheduler
local` command pays the start-up too. The best of --repeats. Every distributed result is checked
equal to the one-process result, array by array (exactly).

With --ingest (and no --db), the corpus is then ingested again under new run names (its dataset
already annotated): in one process, and with the forward passes on each cluster (this process
tokenizes and writes); each distributed run's maps are checked equal to the one-process run's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEFAULT_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue" / "MRPC" / "dev.tsv"


def best(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    import numpy as np
    from distributed import Client, LocalCluster

    from attnstore.queries import load_all
    from attnstore.queries.engine import concatenate, run_kinds, summarise_examples, summarise_on
    from attnstore.queries.engine import passes as sched
    from attnstore.store import migrate, open_store

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--format", default="pairs-tsv")
    parser.add_argument("--db", default=None)
    parser.add_argument("--root", default=None)
    parser.add_argument("--run", default=None)
    parser.add_argument("--workers", default="1,2", help="Worker counts to try (comma-separated).")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", default=None, help="Summary kinds to time (default: all).")
    parser.add_argument(
        "--ingest", action="store_true", help="Also time a second ingest of the corpus (dataset annotated) in one process and on N workers."
    )
    args = parser.parse_args()

    load_all()
    work = Path(tempfile.mkdtemp(prefix="attnstore-scheduler-"))
    try:
        if args.db:
            store = open_store(db=args.db, root=args.root)
            runs = store.runs()
            run = args.run or runs[runs["status"] == "complete"]["run"].iloc[0]
        else:
            from attnstore.ingest import ingest

            url = f"sqlite:///{work / 'meta.sqlite'}"
            migrate.upgrade(url)
            store = open_store(db=url, root=str(work / "attention.zarr"))
            run = ingest(store, corpus=args.corpus, fmt=args.format, progress=False).run.name
        info = store.run_info(run)
        examples = store.examples(run)
        examples = [int(e) for e in examples[~examples["skipped"]].sort_values("offset")["example"]]
        print(f"run {run!r}: {len(examples)} examples, {info.n_layers}x{info.n_heads} heads; {os.cpu_count()} CPUs here")
        available = run_kinds()
        kinds = [available[k] for k in (args.kinds.split(",") if args.kinds else sorted(available))]
        alone = {kind.name: best(lambda kind=kind: summarise_examples(store, info, kind), args.repeats) for kind in kinds}

        @contextmanager
        def cluster(n: int):
            t = time.perf_counter()
            with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0") as c, Client(c) as client:
                client.run(load_all)  # import the query modules once per worker, as a warm cluster has
                yield client, time.perf_counter() - t

        @contextmanager
        def reuse(client):
            yield client

        header = f"{'kind':12s} {'workers':>7s} {'seconds':>8s} {'vs 1 process':>12s}  equal"
        print(header)
        print("-" * len(header))
        for kind in kinds:
            print(f"{kind.name:12s} {'(none)':>7s} {alone[kind.name][0]:8.2f} {1.0:11.2f}x")
        if args.ingest and not args.db:
            from attnstore.ingest import ingest

            t = time.perf_counter()
            ingest(store, corpus=args.corpus, fmt=args.format, progress=False, name="one-process")
            alone["(ingest)"] = (time.perf_counter() - t, None)
            print(f"{'ingest':12s} {'(none)':>7s} {alone['(ingest)'][0]:8.2f} {1.0:11.2f}x")
        for n in (int(w) for w in args.workers.split(",")):
            with cluster(n) as (client, startup):
                print(f"{'(start-up)':12s} {n:7d} {startup:8.2f}")
                if "(ingest)" in alone:
                    t = time.perf_counter()
                    ingest(store, corpus=args.corpus, fmt=args.format, progress=False, name=f"dask-{n}", scheduler=client.scheduler.address)
                    seconds = time.perf_counter() - t
                    pairs = zip(store.iter_attention("one-process"), store.iter_attention(f"dask-{n}"))
                    equal = all(a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in pairs)
                    print(f"{'ingest':12s} {n:7d} {seconds:8.2f} {alone['(ingest)'][0] / seconds:11.2f}x  {'yes' if equal else 'NO'}")
                original = sched.client_for
                sched.client_for = lambda spec, client=client: reuse(client)  # the cluster started above, not a new one
                try:
                    for kind in kinds:
                        seconds, spread = best(
                            lambda kind=kind: concatenate(kind, summarise_on("local", store, info, kind, examples)), args.repeats
                        )
                        ref = alone[kind.name][1]
                        equal = spread.keys() == ref.keys() and all(np.array_equal(spread[f], ref[f]) for f in ref)
                        print(f"{kind.name:12s} {n:7d} {seconds:8.2f} {alone[kind.name][0] / seconds:11.2f}x  {'yes' if equal else 'NO'}")
                finally:
                    sched.client_for = original
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
