"""Store calls and parameter binds of one query call, its first and a kept one: python benchmarks/query_calls.py --home H --run RUN
[--query entropy] (2026-11-29, the engine package, a kept entropy over 200 MRPC pairs: 8 store calls and 1 bind, a first
call 11 and 2; on 2026-11-28 before the query request and the bound kind, 10 and 6, a first call 14 and 7)."""

import argparse
import collections
import functools
import inspect

from attnstore.queries import run_query
from attnstore.queries.engine import SummaryKind
from attnstore.store import open_store
from attnstore.store.store import Store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--home", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--query", default="entropy")
    args = parser.parse_args()
    store = open_store(home=args.home)
    calls: collections.Counter = collections.Counter()
    depth = [0]

    def counted(name, method):
        @functools.wraps(method)
        def wrapper(*a, **k):
            if depth[0] == 0:
                calls[name] += 1
            depth[0] += 1
            try:
                return method(*a, **k)
            finally:
                depth[0] -= 1

        return wrapper

    for name, method in inspect.getmembers(Store, inspect.isfunction):
        if not name.startswith("__"):
            setattr(Store, name, counted(name, method))
    binds = [0]
    bind = SummaryKind.bind

    def counted_bind(self, params=None):
        binds[0] += 1
        return bind(self, params)

    SummaryKind.bind = counted_bind
    for label in ("first", "kept"):
        calls.clear()
        binds[0] = 0
        run_query(store, args.query, run=args.run)
        print(f"{label} call: {sum(calls.values())} store calls (outermost), {binds[0]} binds; {dict(calls)}")


if __name__ == "__main__":
    main()
