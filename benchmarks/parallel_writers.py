"""Benchmark: the storage path with 1, 2, ... writer processes on disjoint parts of one run (forward pass taken away).

    python benchmarks/parallel_writers.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--writers 1 2] [--repeats 3]
                                          [--db postgresql://...]

Does storing maps scale with cores? A distributed ingest (`ingest --scheduler`, ingest/distributed.py) has
every worker write its own parts of the run: the coordinator allots each part disjoint, chunk-aligned cells,
and each worker compresses, writes and commits its part with a `RunWriter` under the coordinator's lease.
This script times exactly that storage path without the model:

1. The corpus's maps are made once with the real model (the batches `ingest` forms, `to_blocks`: float16
   (layer, head, L, L) blocks) and saved to a temporary file.
2. For each writer count N (interleaved over `--repeats`), a fresh run is started; the coordinator (this
   process) splits the batches into N contiguous parts, allots their cells and grows the array, as
   `ingest_on_cluster` does. N spawned processes each load their part's maps, wait at a barrier, then
   run `RunWriter.add` per example and `commit()` per batch into their cells (`commit(final=True)` at
   the end). The time is from the barrier to the last process done; the coordinator's finish (index
   arrays from SQL, array cut to its end) is timed apart.
3. The run is checked (`check_store`) and its maps compared with the kept ones.

Processes, not threads: each writer has its own Python interpreter, event loop and zarr pool, as a Dask
worker does. Cells per second are the corpus's cells over the wall time. The default database is a
temporary SQLite file (writers wait on its one write lock); `--db` takes a PostgreSQL URL to measure that.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pickle
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

DEFAULT_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue" / "MRPC" / "dev.tsv"


def write_part(locations: dict, run_id: int, lease: tuple[str, str, str], cells: tuple[int, int], maps_file: str, barrier, times) -> None:
    """A writer process: load its part's maps, wait for the others, store them into `cells`; put (start, end) wall times."""
    from attnstore.ingest.passes import store_items
    from attnstore.store import Store
    from attnstore.store.config import Locations
    from attnstore.store.leases import LeaseCheck

    with open(maps_file, "rb") as f:
        part = pickle.load(f)
    store = Store(Locations(**locations))
    writer = store.writer.run_writer(run_id, LeaseCheck(store.engine, *lease), part=cells)
    barrier.wait()
    start = time.time()
    for batch, blocks in part:
        store_items(writer, list(zip(batch, blocks)))
    writer.commit(final=True)
    times.put((start, time.time()))
    store.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--format", default="pairs-tsv")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--db", default=None, help="database URL (default: a temporary SQLite file)")
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from storage_pipeline import loadavg, make_maps

    from attnstore import __version__
    from attnstore.ingest import file_source, register_dataset
    from attnstore.ingest.align import encode_batch
    from attnstore.ingest.batches import plan_batches
    from attnstore.ingest.model import load_model
    from attnstore.store import arrays, block_writer, migrate, open_store
    from attnstore.store.check import check_store
    from attnstore.store.cluster import split

    load_start = loadavg()
    home = Path(tempfile.mkdtemp(prefix="attnstore-writers-"))
    db = args.db or f"sqlite:///{home / 'meta.sqlite'}"
    migrate.upgrade(db)
    store = open_store(db=db, root=str(home / "attention.zarr"))
    loaded = load_model()
    source = file_source(args.corpus, args.format)
    dataset_id, _ = register_dataset(store, source, annotator="whitespace", progress=False)
    examples = list(store.writer.dataset_examples(dataset_id))
    encoded = encode_batch(loaded.tokenizer, examples, loaded.max_length, "truncate", tokenization="text")
    batches = list(plan_batches(encoded, args.batch_size))
    kept, _ = make_maps(loaded, batches, "float16")
    per_pair = loaded.n_layers * loaded.n_heads
    cells = sum(per_pair * e.length**2 for e in encoded)
    model_id = store.writer.find_or_create_model(**loaded.record())

    spawn = mp.get_context("spawn")
    results: dict[int, list[tuple[float, float]]] = {n: [] for n in args.writers}
    n_run = 0
    for _ in range(args.repeats):
        for n in args.writers:
            n_run += 1
            info = store.writer.start_run(
                name=f"writers-{n_run}-{n}",
                model_id=model_id,
                dataset_id=dataset_id,
                dtype="float16",
                codec=dict(arrays.DEFAULT_CODEC),
                chunk_cells=arrays.DEFAULT_CHUNK_CELLS,
                max_length=loaded.max_length,
                truncation="truncate",
                attn_implementation=loaded.attn_implementation,
                batch_size=args.batch_size,
                tokenization="text",
                code_version=__version__,
                corpus_checksum=source.checksum,
            )
            coordinator = store.writer.run_writer(info.id)
            parts = [[kept[i] for i in ids] for ids in split(list(range(len(kept))), n)]
            ranges, start = [], coordinator.blocks.next_offset
            for part in parts:
                ranges.append((start, start + sum(b.size for _, blocks in part for b in blocks)))
                start = block_writer.resume_offset(ranges[-1][1], info.chunk_cells)
            coordinator.blocks.array.resize((ranges[-1][1],))
            coordinator.index.group.attrs.update({arrays.INDEX_PENDING: True})
            files = []
            for k, part in enumerate(parts):
                files.append(str(home / f"part-{k}.pickle"))
                with open(files[-1], "wb") as f:
                    pickle.dump(part, f, protocol=pickle.HIGHEST_PROTOCOL)
            barrier, times = spawn.Barrier(n), spawn.Queue()
            lease = (coordinator.lease.resource, coordinator.lease.what, coordinator.lease.token)
            procs = [
                spawn.Process(target=write_part, args=(asdict(store.locations), info.id, lease, r, f, barrier, times))
                for r, f in zip(ranges, files)
            ]
            for p in procs:
                p.start()
            spans = [times.get(timeout=600) for _ in procs]
            for p in procs:
                p.join()
                assert p.exitcode == 0, f"a writer failed (exit {p.exitcode})"
            t = time.perf_counter()
            coordinator.finish(0.0, rebuild_index=True)
            finish = time.perf_counter() - t
            results[n].append((max(e for _, e in spans) - min(s for s, _ in spans), finish))
            _, problems = check_store(store, [info.name])
            assert problems.empty, problems.to_string()
            got = dict(store.iter_attention(info.name))
            for batch, blocks in kept:
                for e, block in zip(batch, blocks):
                    np.testing.assert_array_equal(got[e.position], block)

    print(f"corpus: {args.corpus} ({len(encoded)} examples, {len(batches)} batches of <= {args.batch_size}, {cells:,} cells)")
    print(f"database: {'SQLite (temporary)' if args.db is None else store.engine.dialect.name}; {os.cpu_count()} CPUs")
    print(f"load average (1/5/15 min): start {load_start}, end {loadavg()}")
    print("every run checked (check_store) and its maps equal to the kept ones\n")
    print(f"{'writers':>7} {'best s':>7} {'median s':>8} {'M cells/s':>9} {'speed-up best':>13} {'median':>7} {'finish s':>8}")
    base_best = min(w for w, _ in results[args.writers[0]])
    base_median = statistics.median(w for w, _ in results[args.writers[0]])
    for n, rows in results.items():
        best, median = min(w for w, _ in rows), statistics.median(w for w, _ in rows)
        print(
            f"{n:>7} {best:7.2f} {median:8.2f} {cells / best / 1e6:9.1f} {base_best / best:12.2f}x {base_median / median:6.2f}x "
            f"{statistics.median(f for _, f in rows):8.2f}"
        )
    print(f"(finish: the coordinator writes the index arrays from SQL and cuts the array; store left at {home})")


if __name__ == "__main__":
    main()
