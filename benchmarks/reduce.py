"""A summary kind's reduce alone, over maps already read and decoded: where a first whole-run pass spends its compute.

    python benchmarks/reduce.py --home H --run RUN [--kinds clark head_roles ...] [--repeats 3] [--heap reading]

The run's maps are read once into memory (`store.iter_attention`, nothing kept; mind the memory: MRPC dev is 176 MB of
float16), each kind's `prepare` runs once (its SQL), then its `reduce` is timed over every example on this thread,
`--repeats` times (the best is printed, with ns per cell). Only kinds that read one run's attention maps (no `read`
of their own, e.g. not the weighted or per-pair kinds) are timed; a store opened read-only, so nothing is written.
`--heap reading` first sets the heap as the CLI's commands do (`attnstore query`, `attnstore serve` with one worker;
store/heap.py `for_reading`: a 1 MiB mmap threshold, so any larger temporary a reduce makes is a fresh mmap); the
default leaves glibc's own.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from attnstore.queries import engine as summary
from attnstore.store import heap, open_store
from attnstore.store.errors import AttnStoreError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", required=True, help="the store's folder (ATTNSTORE_HOME)")
    parser.add_argument("--run", required=True)
    parser.add_argument("--kinds", nargs="+", default=["clark"], help="summary kinds (queries/engine/'s KINDS)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--heap", choices=("default", "reading"), default="default", help="reading: the heap of the CLI's commands")
    args = parser.parse_args()
    if args.heap == "reading":
        heap.for_reading()
    known = summary.run_kinds()
    unknown = [name for name in args.kinds if name not in known]
    if unknown or args.repeats < 1:
        parser.error(f"unknown kind(s) {', '.join(unknown)}: give some of {', '.join(known)}" if unknown else "--repeats: give 1 or more")
    store = open_store(home=args.home, read_only=True)
    try:
        info = store.run_info(args.run)
    except AttnStoreError as exc:
        parser.error(str(exc))
    maps = list(store.iter_attention(args.run))
    cells = sum(m.size for _, m in maps)
    examples = [e for e, _ in maps]
    print(f"run {args.run!r}: {len(maps)} examples, {cells:,} cells read into memory")
    for name in args.kinds:
        kind = known[name]
        if kind.read is not None:
            print(f"{name:22s} skipped: it reads its own inputs (a `read` of its own), not the maps alone")
            continue
        params = kind.bind({})
        params.pop("weights", None)
        context = kind.prepare(store, info, examples, **params)
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            for example, m in maps:
                kind.reduce(context, example, m)
            best = min(best, time.perf_counter() - start)
        print(f"{name:22s} {best:8.3f} s  {best / cells * 1e9:6.2f} ns/cell  (best of {args.repeats}, one thread, {args.heap} heap)")
    store.close()


if __name__ == "__main__":
    main()
