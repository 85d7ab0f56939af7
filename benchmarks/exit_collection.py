"""Benchmark: how long a process that loaded a model takes to exit, and a LocalCluster of such workers to close, with
the interpreter's final garbage collection (the default) and without it (`heap.skip_exit_collection`, which
`load_model` calls).

    python benchmarks/exit_collection.py [--rounds 3] [--model all-MiniLM-L6-v2]

A process's exit: from the last line of a script that loaded the model to the process's end, timed by its parent.
A cluster's close: `LocalCluster.close()` after each of its 2 single-threaded workers loaded the model. Rounds
alternate the two settings.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CHILD = """
import sys, time
from attnstore.store import heap
if sys.argv[2] == "collect":
    heap.skip_exit_collection = lambda: None
from attnstore.ingest.model import load_model
load_model(sys.argv[1])
print(time.time(), flush=True)
"""


def process_exit(model: str, how: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, model, how], check=True, capture_output=True, text=True).stdout
    return time.time() - float(out.split()[-1])


def load_in_worker(model: str, how: str) -> None:
    from attnstore.store import heap

    if how == "collect":
        heap.skip_exit_collection = lambda: None  # type: ignore[assignment]
    from attnstore.ingest.model import load_model

    load_model(model)


def cluster_close(model: str, how: str) -> float:
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.ERROR)
    with Client(cluster) as client:
        client.gather([client.submit(load_in_worker, model, how, pure=False, workers=[w]) for w in client.scheduler_info()["workers"]])
    started = time.perf_counter()
    cluster.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    args = parser.parse_args()
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for how in ("collect", "skip"):
            times.setdefault(("a process's exit", how), []).append(process_exit(args.model, how))
            times.setdefault(("a LocalCluster of 2's close", how), []).append(cluster_close(args.model, how))
    print(f"{'what':30s} {'final collection':>24s} {'skipped':>24s}")
    for what in ("a process's exit", "a LocalCluster of 2's close"):
        cells = [" / ".join(f"{t:.2f}" for t in times[(what, how)]) + " s" for how in ("collect", "skip")]
        print(f"{what:30s} {cells[0]:>24s} {cells[1]:>24s}")


if __name__ == "__main__":
    main()
