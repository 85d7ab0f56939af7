"""Benchmark: row statistics on a corpus of many examples, against the maps, with SmolLM2-135M-Instruct.

    python benchmarks/row_stats.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--tier dense|qk] [--rounds 2]
    python benchmarks/row_stats.py --dataset generated/repeated_tokens:T20,50,200 --tier qk --rounds 1

Ingests the corpus (pairs-tsv) or the built-in dataset `--rounds` times with row statistics and without, in one
process (the model loaded once), then asks each query that reads them for the whole run: its first call from them,
again once kept, and its first call from the maps of the run without them, and the largest difference between the two
answers. Prints CPU and wall seconds, and the bytes of both on disk. docs/DECODERS.md ("Row statistics") quotes it.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

QUERIES = ("attention_sink", "previous_token_heads", "streaming_heads", "entropy_by_position", "heavy_hitters")
REPEATED_QUERIES = ("induction_heads", "duplicate_token_heads", "previous_token_heads")  # on generated/repeated_tokens


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def du(path: Path) -> int:
    return int(subprocess.check_output(["du", "-sb", str(path)]).split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    parser.add_argument("--corpus", default=str(data / "glue" / "MRPC" / "dev.tsv"))
    parser.add_argument("--dataset", help="a built-in dataset instead of --corpus, e.g. generated/repeated_tokens:T20,50,200")
    parser.add_argument("--tier", default="dense", choices=["dense", "qk"])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from attnstore.ingest import ingest
    from attnstore.ingest.model import load_model
    from attnstore.queries import run_query
    from attnstore.store import open_store, qk, row_stats
    from attnstore.store.migrate import upgrade

    loaded = load_model("SmolLM2-135M-Instruct")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "arrays"
        db = f"sqlite:///{Path(tmp) / 'meta.sqlite'}"
        upgrade(db)
        store = open_store(db=db, root=str(root))
        source = dict(dataset=args.dataset) if args.dataset else dict(corpus=args.corpus, fmt="pairs-tsv")
        options = dict(source, annotator="whitespace", loaded=loaded, progress=False, tier=args.tier)
        for round_ in range(args.rounds):
            for kept in (True, False):
                name = f"{'rows' if kept else 'maps'}-{round_}"
                t, w = cpu(), time.perf_counter()
                result = ingest(store, name=name, row_stats=kept, **options)
                print(f"ingest --tier {args.tier} {'--row-stats' if kept else '--no-row-stats'}: {cpu() - t:.1f} CPU s, "
                      f"{time.perf_counter() - w:.1f} s wall, {result.run.n_stored} examples", flush=True)  # fmt: skip
        info = store.run_info("rows-0")
        tokens = int(store.sql("SELECT count(*) FROM tokens WHERE run_id = :r", {"r": info.id}).iloc[0, 0])
        group = root / "runs"
        rows_bytes = du(group / "rows-0" / row_stats.STATS) + du(group / "rows-0" / row_stats.TOP)
        what = ("cells",) if args.tier == "dense" else (qk.QUERY, qk.KEY, qk.LSE)
        maps_bytes = sum(du(group / "maps-0" / name) for name in what)
        per = rows_bytes / (tokens * info.n_layers * info.n_heads)
        print(f"{tokens} tokens: row statistics {rows_bytes / 2**20:.0f} MiB ({per:.0f} bytes per row and head), "
              f"the {'maps' if args.tier == 'dense' else 'Q/K arrays'} {maps_bytes / 2**20:.0f} MiB")  # fmt: skip
        for query in REPEATED_QUERIES if args.dataset else QUERIES:
            timings, frames = [], []
            for run in ("rows-0", "rows-0", "maps-0"):  # the first call, the kept one, the maps' first call
                t, w = cpu(), time.perf_counter()
                frames.append(run_query(store, query, run=run))
                timings.append((cpu() - t, time.perf_counter() - w))
            (rc, rw), (_, kw), (mc, mw) = timings
            numeric = frames[0].select_dtypes("number").columns
            diff = float(abs(frames[0][numeric].to_numpy(float) - frames[2][numeric].to_numpy(float)).max())
            print(f"{query}: first call from row statistics {rw:.2f} s wall ({rc:.2f} CPU s), kept {kw:.3f} s; "
                  f"first call from the maps {mw:.2f} s wall ({mc:.2f} CPU s); largest difference {diff:.1e}", flush=True)  # fmt: skip
        store.close()


if __name__ == "__main__":
    main()
