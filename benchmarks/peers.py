"""Peer bench (issue 29): the same maps in attnstore and in its peers' formats, measured side by side in one process.

    python benchmarks/peers.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--samples 200] [--pickle-samples 5]

The corpus is ingested with the default model (as benchmarks/ingest_and_query.py does), then the run's maps, read back
from the store, are written as each peer project writes them:

  Clark et al. (attention-analysis)  extract_attention.py: one list of per-example dicts, each with its "tokens" and
                                     "attns", the (layer, head, L, L) maps cut to the example's length and cast to
                                     float16, pickled into one file with the highest protocol (utils.write_pickle)
  exBERT                             one HDF5 file, one group per sentence (a 12-digit zero-padded index), its maps an
                                     uncompressed, contiguous (layer, head, L, L) dataset "attentions", the tokens as
                                     an attribute; exBERT also keeps embeddings and contexts per sentence, left out
                                     here (they are not attention); the values are the stored float16 maps

Printed, each measured in this run on the same maps:
  bytes/cell           bytes on disk / attention cells (attnstore: the run's cells array, lossless)
  one example's maps   p50 / p90 ms over random examples: store.attention(run, e); the HDF5 file open, its group read
                       ([()]); the pickle loaded, then its entry (what the notebook does: the file is one object);
                       and attnstore's third read of the same examples (the second keeps them in its read cache)
  whole-run entropy    first call and again (s): attnstore's run_query("entropy") (the first call builds the run's Clark
                       summary); the peers read every example and compute the same numpy entropy (queries.clark's
                       row_entropy of the maps cast to float32 by numpy, per example means then over examples; their
                       pass with attnstore's float16 tables instead of numpy's cast is printed on the last line)
and attnstore / peer ratios (below 1: attnstore is faster or smaller). Files are read from the page cache (each is
written then read on this machine; nothing drops caches), so reads measure decoding and copying, not a disk.
Beside them: the run ingested again with --small-chunks N cells per chunk (default 131072: one 256 KiB blosc block per
chunk; 0: not), one example read as `store.attention` read it before d9a76dc (2026-11-26: through zarr: the run's info and the
example's row from SQL, the array opened, its chunks checked and read by zarr), and where attnstore's first pass goes
(the maps read and decoded, the Clark kind's reduce of them alone on one thread, compiled since 69fde90, the query
computed for the call alone on a read-only view).
The peers' files are removed at the end; the store is left (its folder is printed).
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import h5py
import numpy as np

from attnstore.queries import clark, run_query
from attnstore.queries.clark import row_entropy
from attnstore.queries.engine import passes
from attnstore.store import arrays, migrate, open_store

DEFAULT_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue" / "MRPC" / "dev.tsv"
EXBERT_KEY = "{:012}"  # exBERT's group names: the sentence's index, zero-padded to 12 digits
SMALL = "attnstore, small chunks"
BEFORE = "attnstore, read as before (zarr)"
AGAIN = "attnstore, read again (read cache)"
PEERS = ("Clark pickle", "exBERT HDF5")


def ingest_runs(args) -> tuple[object, str, str | None, Path]:
    """A store holding the corpus's run (the default settings) and, with --small-chunks N, a second run of it in chunks
    of N cells: ingested here with the default model, or (--store, for development) runs made before."""
    if args.store:
        home = Path(args.store)
        store = open_store(db=f"sqlite:///{home / 'meta.sqlite'}", root=str(home / "attention.zarr"))
        runs = store.runs()
        small = runs[runs["run"].str.endswith("-small-chunks")]["run"]
        return store, str(runs["run"].iloc[0]), (str(small.iloc[0]) if len(small) else None), home
    from attnstore.ingest import ingest
    from attnstore.ingest.model import load_model

    home = Path(tempfile.mkdtemp(prefix="attnstore-peers-"))
    db = f"sqlite:///{home / 'meta.sqlite'}"
    migrate.upgrade(db)
    store = open_store(db=db, root=str(home / "attention.zarr"))
    loaded = load_model()
    t = time.perf_counter()
    result = ingest(store, corpus=args.corpus, fmt=args.format, loaded=loaded, batch_size=args.batch_size, progress=False)
    print(f"ingested {args.corpus} in {time.perf_counter() - t:.1f}s (annotation included)")
    small = None
    if args.small_chunks:
        options = dict(fmt=args.format, loaded=loaded, batch_size=args.batch_size, progress=False, chunk_cells=args.small_chunks)
        small = ingest(store, corpus=args.corpus, name=f"{result.run.name}-small-chunks", **options).run.name
    return store, result.run.name, small, home


def write_clark_pickle(path: Path, store, run: str, tokens: dict[int, list[str]]) -> float:
    start = time.perf_counter()
    feature_dicts = []
    for example, maps in sorted(store.iter_attention(run), key=lambda item: item[0]):
        feature_dicts.append({"tokens": tokens[example], "attns": maps.astype("float16")})
    with open(path, "wb") as f:
        pickle.dump(feature_dicts, f, -1)
    return time.perf_counter() - start


def write_exbert_hdf5(path: Path, store, run: str, tokens: dict[int, list[str]]) -> float:
    start = time.perf_counter()
    with h5py.File(path, "w") as f:
        for example, maps in store.iter_attention(run):
            group = f.create_group(EXBERT_KEY.format(example))
            group.create_dataset("attentions", data=maps)  # no compression, contiguous: h5py's defaults, as exBERT
            group.attrs["token"] = tokens[example]
    return time.perf_counter() - start


def entropies(items, tables: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(entropy, entropy_from_cls) per (layer, head): per-example means over the queries (and of the first token's
    row), then over the examples, as the `entropy` query's default (average="example") computes them. The maps are
    cast to float32 by numpy, as a user of the peer's files would write it; `tables`: as attnstore's reduce computes
    them since 1f0070f, 2026-11-27 (row_entropy of the float16 maps: each summand looked up, store/float16.py)."""
    total = from_cls = None
    n = 0
    for maps in items:
        h = row_entropy(maps if tables else maps.astype(np.float32, copy=False))  # (layer, head, query)
        part = h.sum(-1, dtype=np.float64) / h.shape[-1]
        total = part if total is None else total + part
        from_cls = h[..., 0].astype(np.float64) if from_cls is None else from_cls + h[..., 0]
        n += 1
    assert total is not None and from_cls is not None
    return total / n, from_cls / n


def pickle_entropy(path: Path, tables: bool = False):
    with open(path, "rb") as f:
        data = pickle.load(f)
    return entropies((d["attns"] for d in data), tables)


def hdf5_entropy(path: Path, tables: bool = False):
    with h5py.File(path, "r") as f:
        return entropies((f[key]["attentions"][()] for key in f), tables)


def zarr_read(store, run: str, example: int) -> np.ndarray:
    """One example's maps as `store.attention` read them before d9a76dc (2026-11-26): the run's info and the example's row from
    SQL, the cells array opened (its zarr.json), its chunks checked and read through zarr."""
    info = store.run_info(run)
    _, length, offset = store._sequence(info, example)
    shape = arrays.block_shape(info.n_layers, info.n_heads, length)
    return arrays.read_block(store._array(info), offset, shape, describe=lambda a, b: f"run {run!r}, example {example}")


def first_pass_split(store, run: str) -> dict[str, float]:
    """Where the first pass of the entropy query goes, on a read-only view of the store (nothing kept): the whole run's
    maps read and decoded (iter_attention), the Clark kind's reduce of them alone (queries/_clark.c, one thread), and
    the query computed for the call alone (the reduce on the reduce threads, SQL, combine)."""
    info = store.run_info(run)
    with_zarr = open_store(db=store.locations.db_url, root=store.locations.array_root, read_only=True)
    t = time.perf_counter()
    maps = list(with_zarr.iter_attention(run))
    read = time.perf_counter() - t
    context = clark.CLARK.prepare(with_zarr, info)
    t = time.perf_counter()
    for example, m in maps:
        clark.CLARK.reduce(context, example, m)
    reduce = time.perf_counter() - t
    del maps
    t = time.perf_counter()
    run_query(with_zarr, "entropy", run=run)
    query = time.perf_counter() - t
    # the same on one thread (the reduce on the reading thread, as before 89497f3, 2026-11-26)
    before = os.environ.get(passes.REDUCE_THREADS_ENV)
    os.environ[passes.REDUCE_THREADS_ENV] = "1"
    try:
        t = time.perf_counter()
        run_query(with_zarr, "entropy", run=run)
        one_thread = time.perf_counter() - t
    finally:
        if before is None:
            del os.environ[passes.REDUCE_THREADS_ENV]
        else:
            os.environ[passes.REDUCE_THREADS_ENV] = before
    cells = int((info.n_layers * info.n_heads * with_zarr.examples(run, texts=False)["length"] ** 2).sum())
    with_zarr.close()
    return {"read": read, "entropy": reduce, "query": query, "one_thread": one_thread, "cells": cells}


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    return time.perf_counter() - start, value


def first_reads_in_turns(ours, hdf5_file, picks: list[int], check: int = 0) -> tuple[list[float], list[float]]:
    """Milliseconds of `ours(e)` and of exBERT's HDF5 read of example e, for each e of `picks`, the two in turns, who
    goes first alternating. Two readers only: a third in the same turns slowed HDF5's reads (its allocations and
    decodes push HDF5's out of the caches), 0.30-0.43 -> 0.51-0.70 ms p50, flattering the ratio (docs/PERFORMANCE.md,
    2026-11-28 "fair first reads in the peer bench"). The first
    `check` examples' maps are checked equal."""
    readers = {"ours": ours, "hdf5": lambda e: hdf5_file[EXBERT_KEY.format(e)]["attentions"][()]}
    ms: dict[str, list[float]] = {name: [] for name in readers}
    for k, e in enumerate(picks):
        for name in list(readers)[:: 1 if k % 2 else -1]:
            t = time.perf_counter()
            maps = readers[name](e)
            ms[name].append((time.perf_counter() - t) * 1000)
            if k < check:
                assert np.array_equal(maps, hdf5_file[EXBERT_KEY.format(e)]["attentions"][()]), (name, e)
    return ms["ours"], ms["hdf5"]


def percentiles(ms: list[float]) -> tuple[float, float]:
    return statistics.median(ms), float(np.percentile(ms, 90))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--format", default="pairs-tsv")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=200, help="random examples read from attnstore and the HDF5 file")
    parser.add_argument("--pickle-samples", type=int, default=5, help="... and from the pickle (each read loads the whole file)")
    parser.add_argument(
        "--small-chunks",
        type=int,
        default=1 << 17,
        metavar="N",
        help="also ingest the corpus in chunks of N cells (--chunk-cells N: one 256 KiB blosc block per chunk) and measure it (0: no)",
    )
    parser.add_argument(
        "--store", default=None, help="development: a folder holding runs made before (meta.sqlite, attention.zarr), no ingest"
    )
    args = parser.parse_args()

    store, run, small_run, home = ingest_runs(args)
    info = store.run_info(run)
    frame = store.examples(run, texts=False)
    frame = frame[~frame["skipped"]]
    cells = int((info.n_layers * info.n_heads * frame["length"] ** 2).sum())
    table = store.token_table(run)
    tokens = {int(e): list(group["token"]) for e, group in table.groupby("example", sort=False)}

    folder = Path(tempfile.mkdtemp(prefix="attnstore-peer-files-"))
    pickle_path, hdf5_path = folder / "attn.pkl", folder / "attn.hdf5"
    pickle_write = write_clark_pickle(pickle_path, store, run, tokens)
    hdf5_write = write_exbert_hdf5(hdf5_path, store, run, tokens)

    def stored_bytes(name: str) -> int:
        folder = Path(store.locations.array_root) / store.run_info(name).array_path
        return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())

    ours_runs = {"attnstore": run, **({SMALL: small_run} if small_run else {})}
    sizes = {name: stored_bytes(r) for name, r in ours_runs.items()}
    sizes.update({"Clark pickle": pickle_path.stat().st_size, "exBERT HDF5": hdf5_path.stat().st_size})

    # One example's maps: each attnstore run against HDF5 on the same random examples, the two taken in turns (this
    # machine's speed drifts; `first_reads_in_turns`).
    rng = random.Random(0)
    positions = [int(e) for e in frame["example"]]
    # distinct examples, each read once per reader: every timed read is the first of its example
    picks = rng.sample(positions, min(args.samples + 10, len(positions)))
    warm, picks = picks[:10], picks[10:]
    for r in ours_runs.values():
        for e in warm:  # warm-up: the store's first call reads the run's info and opens its array
            store.attention(r, e)
    latencies: dict[str, list[float]] = {}
    paired_hdf5: dict[str, tuple[float, float]] = {}  # HDF5's p50 / p90 in each attnstore run's turns
    with h5py.File(hdf5_path, "r") as f:
        for ours, r in ours_runs.items():
            latencies[ours], hdf5_ms = first_reads_in_turns(lambda e, r=r: store.attention(r, e), f, picks, check=5)
            paired_hdf5[ours] = percentiles(hdf5_ms)
            if ours == "attnstore":
                latencies["exBERT HDF5"] = hdf5_ms
    # The read as before d9a76dc (through zarr) timed apart, after the others: in the same turns its allocations
    # (~9 ms a read) slowed the next reader, HDF5 1.6-2.2x (0.30-0.43 -> 0.66-0.70 ms p50), flattering attnstore's ratio
    # (docs/PERFORMANCE.md, 2026-11-28 "fair first reads in the peer bench").
    latencies[BEFORE] = []
    for e in picks:
        t = time.perf_counter()
        zarr_read(store, run, e)
        latencies[BEFORE].append((time.perf_counter() - t) * 1000)
    pickled: list[float] = []
    for e in picks[: args.pickle_samples]:
        t = time.perf_counter()
        with open(pickle_path, "rb") as fh:
            pickle.load(fh)[e]["attns"]  # the read a user of the pickle makes
        pickled.append((time.perf_counter() - t) * 1000)
    # The same examples read twice more from the default run: a second read keeps their blocks in the read cache
    # (store/direct.py), the third is timed, as the viewer reads an example again head by head.
    for e in picks:
        store.attention(run, e)
    again_ms = []
    for e in picks:
        t = time.perf_counter()
        store.attention(run, e)
        again_ms.append((time.perf_counter() - t) * 1000)
    reads = {name: percentiles(ms) for name, ms in latencies.items()}
    reads["Clark pickle"] = percentiles(pickled)
    reads[AGAIN] = percentiles(again_ms)

    # A whole-run entropy pass, first call and again.
    split = first_pass_split(store, run)
    passes = {}
    for name, r in ours_runs.items():
        first, frame_of_run = timed(run_query, store, "entropy", run=r)
        again, _ = timed(run_query, store, "entropy", run=r)
        passes[name] = (first, again)
        if name == "attnstore":
            ours_frame = frame_of_run
    agree = {}
    for name, fn, path in (("Clark pickle", pickle_entropy, pickle_path), ("exBERT HDF5", hdf5_entropy, hdf5_path)):
        first, (h, h_cls) = timed(fn, path)
        again, _ = timed(fn, path)
        passes[name] = (first, again)
        agree[name] = max(
            np.abs(h.ravel() - ours_frame["entropy"].to_numpy()).max(),
            np.abs(h_cls.ravel() - ours_frame["entropy_from_cls"].to_numpy()).max(),
        )
        tabled, _ = timed(fn, path, tables=True)  # the same pass with attnstore's float16 tables, for honesty's sake
        passes[f"{name} + tables"] = (tabled, tabled)

    print(f"corpus: {args.corpus}; run {run!r}: {len(frame)} examples, {cells:,} cells ({info.n_layers} x {info.n_heads} heads)")
    print(f"peer files written from the run's maps in {pickle_write:.1f}s (pickle), {hdf5_write:.1f}s (HDF5); removed at the end")
    print(f"entropy from the peers' files vs attnstore's query: max |diff| {max(agree.values()):.1e} (same maps)")
    print()
    header = f"{'':38s} {'bytes/cell':>10s} {'read p50 ms':>12s} {'read p90 ms':>12s} {'entropy 1st s':>14s} {'again s':>9s}"
    print(header)
    for name in (*ours_runs, AGAIN, BEFORE, "Clark pickle", "exBERT HDF5"):
        p50, p90 = reads[name]
        if name in (BEFORE, AGAIN):
            print(f"{name:38s} {'':10s} {p50:12.3f} {p90:12.3f}")
            continue
        first, again = passes[name]
        print(f"{name:38s} {sizes[name] / cells:10.3f} {p50:12.3f} {p90:12.3f} {first:14.3f} {again:9.3f}")
    print()
    print("attnstore / peer (below 1: attnstore smaller or faster):")
    for ours in ours_runs:
        for name in ("Clark pickle", "exBERT HDF5"):
            peer_reads = paired_hdf5[ours] if name == "exBERT HDF5" else reads[name]  # HDF5's reads in the same turns
            ratios = (
                sizes[ours] / sizes[name],
                reads[ours][0] / peer_reads[0],
                reads[ours][1] / peer_reads[1],
                passes[ours][0] / passes[name][0],
                passes[ours][1] / passes[name][1],
            )
            label = f"{ours} / {name}"
            print(f"{label:38s} " + " ".join(f"{r:{w}.3f}" for r, w in zip(ratios, (10, 12, 12, 14, 9))))
    label = f"{AGAIN} / exBERT HDF5"
    print(f"{label:38s} {'':10s} {reads[AGAIN][0] / reads['exBERT HDF5'][0]:12.3f} {reads[AGAIN][1] / reads['exBERT HDF5'][1]:12.3f}")
    print(
        f"(reads: {len(picks)} distinct random examples, each a first read, each attnstore run and HDF5 in turns, two "
        f"readers at a time; then through zarr apart; {args.pickle_samples} for the pickle)"
    )
    if small_run:
        print(f"{SMALL}: run {small_run!r}, ingested with --chunk-cells {store.run_info(small_run).chunk_cells}")
    print(
        f"attnstore's first pass, where it goes (read-only, nothing kept): maps read and decoded {split['read']:.3f}s "
        f"({split['cells'] / split['read'] / 1e6:.0f} M cells/s), the Clark reduce of them {split['entropy']:.3f}s, "
        f"the entropy query computed for the call alone {split['query']:.3f}s on {passes.reduce_threads()} reduce "
        f"thread(s) (the Clark kind's whole reduce: {split['cells'] / split['query'] / 1e6:.0f} M cells/s), "
        f"{split['one_thread']:.3f}s on one ({split['cells'] / split['one_thread'] / 1e6:.0f} M cells/s); the peers' first passes: "
        + ", ".join(f"{name} {split['cells'] / passes[name][0] / 1e6:.0f} M cells/s" for name in ("Clark pickle", "exBERT HDF5"))
        + "; with attnstore's float16 tables in their loop: "
        + ", ".join(f"{name} {split['cells'] / passes[f'{name} + tables'][0] / 1e6:.0f} M cells/s" for name in PEERS)
    )
    shutil.rmtree(folder)  # the peers' files: twice the maps' raw size, made again by the next run
    print(f"store left at {home}", file=sys.stderr)


if __name__ == "__main__":
    main()
