"""Sampled queries on kept summaries: a sample's rows read from a large run (issue 29; docs/PERFORMANCE.md, 2026-11-27).

    python benchmarks/sampled_summaries.py --home H --run RUN [--samples 100 1000] [--cold] [--repeats 2]

Times `pattern_proportions`, `pattern_heads` and `pattern_classes` on a default_rng(0) sample of each --samples size
(their `max_examples`), and `pattern_proportions` over the whole run (`max_examples=none`, from the kept range counts),
each as the only call of a fresh read-only process (import and store opening not counted); the best of --repeats
processes. Ratios: each sampled call against the whole-run call timed in the same run. --cold drops the page cache
(`sync; echo 3 > /proc/sys/vm/drop_caches`, root only) before each process, so every chunk a call touches is read from
disk. The run's `pattern_scores` summary must be kept already (run `pattern_proportions` on a writable store once, or
make the store with benchmarks/range_summaries.py --kinds pattern_scores --keep).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHILD = """
import json, sys, time
from attnstore.queries import run_query
from attnstore.store import open_store
from attnstore.store.errors import AttnStoreError
home, run, query, size = sys.argv[1:5]
try:
    store = open_store(home=home, read_only=True)
    started = time.perf_counter()
    frame = run_query(store, query, run=run, max_examples=None if size == "none" else int(size))
except AttnStoreError as exc:
    sys.exit(str(exc))
print(json.dumps({"seconds": time.perf_counter() - started, "rows": len(frame)}))
"""
QUERIES = ("pattern_proportions", "pattern_heads", "pattern_classes")


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=True)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as exc:
        sys.exit(f"--cold: cannot drop the page cache ({exc}); run as root, or leave out --cold")


def timed(home: str, run: str, query: str, size: str, repeats: int, cold: bool) -> float:
    best = float("inf")
    for _ in range(repeats):
        if cold:
            drop_page_cache()
        done = subprocess.run([sys.executable, "-c", CHILD, home, run, query, size], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{query} max_examples={size} failed: {done.stderr.strip()[-2000:]}")
        best = min(best, json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", required=True, help="the store's folder (ATTNSTORE_HOME)")
    parser.add_argument("--run", required=True)
    parser.add_argument("--samples", nargs="+", type=int, default=[100, 1000], help="sample sizes (max_examples)")
    parser.add_argument("--repeats", type=int, default=2, help="processes per call; the best is printed")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each process (root only)")
    args = parser.parse_args()
    if args.repeats < 1 or min(args.samples) < 1:
        parser.error("--repeats and --samples: give 1 or more")
    whole = timed(args.home, args.run, "pattern_proportions", "none", args.repeats, args.cold)
    cache = "cold page cache" if args.cold else "warm page cache"
    print(f"run {args.run!r}, {cache}; best of {args.repeats} fresh processes each")
    print(f"{'query':22s} {'max_examples':>12s} {'seconds':>9s} {'x whole run':>12s}")
    print(f"{'pattern_proportions':22s} {'none':>12s} {whole:9.3f} {1.0:12.1f}")
    for size in args.samples:
        for query in QUERIES:
            seconds = timed(args.home, args.run, query, str(size), args.repeats, args.cold)
            print(f"{query:22s} {size:12d} {seconds:9.3f} {seconds / whole:12.1f}")


if __name__ == "__main__":
    main()
