"""A summary kind's reduce alone, over maps already read and decoded: where a first whole-run pass spends its compute.

    python benchmarks/reduce.py --home H --run RUN [--kinds clark head_roles ...] [--repeats 3]

The run's maps are read once into memory (`store.iter_attention`, nothing kept; mind the memory: MRPC dev is 176 MB of
float16), each kind's `prepare` runs once (its SQL), then its `reduce` is timed over every example on this thread,
`--repeats` times (the best is printed, with ns per cell). Only kinds that read one run's attention maps (no `read`
of their own, e.g. not the weighted or per-pair kinds) are timed; a store opened read-only, so nothing is written.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from attnstore.queries import summary
from attnstore.store import open_store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", required=True, help="the store's folder (ATTNSTORE_HOME)")
    parser.add_argument("--run", required=True)
    parser.add_argument("--kinds", nargs="+", default=["clark"], help="summary kinds (queries/summary.py's KINDS)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    store = open_store(home=args.home, read_only=True)
    info = store.run_info(args.run)
    maps = list(store.iter_attention(args.run))
    cells = sum(m.size for _, m in maps)
    examples = [e for e, _ in maps]
    print(f"run {args.run!r}: {len(maps)} examples, {cells:,} cells read into memory")
    for name in args.kinds:
        kind = summary.kind_named(name)
        if kind.read is not None or not kind.one_run:
            print(f"{name:22s} skipped: it reads more than one run's maps")
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
        print(f"{name:22s} {best:8.3f} s  {best / cells * 1e9:6.2f} ns/cell  (best of {args.repeats}, one thread)")
    store.close()


if __name__ == "__main__":
    main()
