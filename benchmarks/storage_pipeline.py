"""Benchmark: the storage pipeline alone (forward pass taken away), with 1 and 2 compressing workers.

    python benchmarks/storage_pipeline.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--workers 1 2]
                                          [--commit overlap wait] [--flush-batches 1] [--repeats 3]

Does the storage path keep up with the model when the host has cores to spare (a GPU host)?
The maps of the corpus are made once with the real model (`load_model()`, the batches that `ingest`
forms, `to_blocks`: float16, one (layer, head, L, L) block per example) and kept in memory. Then the
storage path is timed as `ingest`'s writer thread runs it: `RunWriter.add` for every example of a
batch, `RunWriter.commit(wait=False)` after the batch (`--flush-batches K`: after every K batches, so one
flush writes K times as many chunks), `RunWriter.finish`, into a fresh run of a temporary SQLite store, with
Zarr's thread pool bounded to each worker count of `--workers`. `--commit wait` times the commit that
waits for its chunks before it commits their rows (what `ingest` did before 6ac3be1, 2026-11-24, and what a
commit with `wait=True` does): `overlap` lets the chunk writes of one batch run while the writer commits
the rows of the one before and takes the next batch's blocks.

How the worker count is applied: zarr-python 3 encodes each chunk in `asyncio.to_thread`, i.e. the
default executor of its event loop, which is `ThreadPoolExecutor(threading.max_workers)` once
`zarr.config` sets that key (zarr/core/sync.py), asyncio's default (min(32, cores + 4) threads)
otherwise. The executor is created once per process, so the script tears zarr's loop and pool down
(`zarr.core.sync.cleanup_resources()`) before setting the count for each measurement, and checks the
size of the pool that did the work. Blosc itself compresses each chunk single-threaded: importing
zarr.codecs.blosc sets `numcodecs.blosc.use_threads = False` (blosc's internal threads, and so
`numcodecs.blosc.set_nthreads`, are never used), so chunks are compressed in parallel only across
zarr's pool, one chunk per thread. The CRC32C of each chunk runs on zarr's event-loop thread.

Also measured, as references: a bare eager forward pass (`output_attentions`) over the same batches
(cells per second the model produces, so the reader sees whether storage keeps up), `to_blocks`
(float16 conversion + row-sum check, which `ingest` runs on the forward thread), and the codec alone
(blosc zstd-1 + CRC32C of the same 2**20-cell chunks in a plain thread pool of N threads: the most
that N workers could give on this machine at this moment).

`--write-empty-chunks` sets zarr's default `array.write_empty_chunks` to True. `arrays.ARRAY_CONFIG` asks
for that, but `zarr.open_array` keeps the config only when it creates an array. An existing array, such as
the one `RunWriter` opens, gets zarr's default (False), so each chunk is compared with the fill value on
zarr's event-loop thread before it is written. The script prints what the array it writes to ended up with.
The flag measures what passing the config on would save.

Every measurement is repeated (`--repeats`, worker counts interleaved) and reported as best and median;
the load average is printed at the start and the end (other tenants share the machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from attnstore import __version__
from attnstore.ingest import file_source, register_dataset
from attnstore.ingest.align import encode_batch
from attnstore.ingest.batches import plan_batches
from attnstore.ingest.model import load_model
from attnstore.ingest.passes import forward_attention, to_blocks
from attnstore.store import arrays, migrate, open_store

DEFAULT_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue" / "MRPC" / "dev.tsv"


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def set_zarr_workers(n: int) -> None:
    """Bound zarr's pool (chunk encoding and file writes) to n threads, for this process from now on."""
    import zarr
    import zarr.core.sync as zsync

    zsync.cleanup_resources()  # the pool and its loop are made once; drop them so the new bound applies
    zarr.config.set({"threading.max_workers": n})


def zarr_pool() -> tuple[int | None, int]:
    """(max_workers, threads started) of the pool zarr used."""
    import zarr.core.sync as zsync

    ex = zsync._executor
    return (ex._max_workers, len(ex._threads)) if ex is not None else (None, 0)


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of each live thread, by native id, with its role: "writer" (the calling
    thread), "loop" (zarr's event-loop thread), "pool" (the executor zarr's chunk work runs in), "other".
    Read from /proc/self/task/<tid>/stat (Linux; empty elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    me = threading.get_native_id()
    out = {}
    for th in threading.enumerate():
        name, tid = th.name, th.native_id
        if tid is None:  # not started
            continue
        role = "writer" if tid == me else "loop" if name == "zarr_io" else "pool" if name.startswith(("zarr_pool", "asyncio_")) else "other"
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (role, (int(fields[11]) + int(fields[12])) / tick)  # utime, stime (fields 14, 15 of stat)
    return out


def summary(values: list[float]) -> tuple[float, float]:
    return min(values), statistics.median(values)


def time_forward(loaded, batches) -> float:
    t = time.perf_counter()
    for batch in batches:
        forward_attention(loaded, batch)
    return time.perf_counter() - t


def make_maps(loaded, batches, dtype: str):
    """The maps ingest would hand to its writer thread: per batch, (encodings, blocks). Also times to_blocks."""
    kept, convert = [], 0.0
    for batch in batches:
        attentions, lengths = forward_attention(loaded, batch)
        t = time.perf_counter()
        blocks = to_blocks(attentions, lengths, dtype, batch)
        convert += time.perf_counter() - t
        kept.append((batch, blocks))
    return kept, convert


def store_run(store, info, kept, flush_every: int, wait: bool) -> dict:
    """Write every kept batch into run `info` the way ingest's writer thread does; returns timings."""
    writer = store.writer.run_writer(info.id)
    timings: dict = {"append": 0.0, "flush": 0.0, "index": 0.0}
    blocks = writer.blocks
    append, flush = blocks.append, blocks.flush
    index_write = writer.index.write if writer.index is not None else None

    def timed_append(block):  # wraps this writer instance's methods only (no library change)
        t = time.perf_counter()
        try:
            return append(block)
        finally:
            timings["append"] += time.perf_counter() - t

    def timed_flush(final=False, wait=True):
        t = time.perf_counter()
        try:
            return flush(final=final, wait=wait)
        finally:
            timings["flush"] += time.perf_counter() - t

    def timed_index(*a):
        t = time.perf_counter()
        try:
            return index_write(*a)
        finally:
            timings["index"] += time.perf_counter() - t

    blocks.append, blocks.flush = timed_append, timed_flush
    if writer.index is not None:
        writer.index.write = timed_index

    def work():
        before = thread_cpu()
        t = time.perf_counter()
        for i, (batch, maps) in enumerate(kept, 1):
            for enc, block in zip(batch, maps):
                writer.add(enc.example_id, block, enc.tokens, truncated=enc.truncated)
            if i % flush_every == 0:
                writer.commit(wait=wait)
        writer.finish(time.perf_counter() - t)
        after = thread_cpu()  # while the writer thread and zarr's threads are alive
        for role in ("writer", "loop", "pool"):
            timings[f"cpu_{role}"] = sum(c - before.get(tid, (role, 0.0))[1] for tid, (r, c) in after.items() if r == role)

    cpu, wall = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=1) as thread:  # ingest's writer thread
        thread.submit(work).result()
    timings["wall"] = time.perf_counter() - wall
    timings["cpu"] = time.process_time() - cpu
    timings["pool"] = zarr_pool()
    return timings


def codec_only(chunks: list[np.ndarray], workers: int, codec) -> float:
    """Seconds to blosc-encode and CRC32C every chunk in a pool of `workers` threads (no zarr, no files)."""
    import google_crc32c

    def encode(chunk):
        return google_crc32c.value(codec.encode(chunk))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(encode, chunks[: workers * 2]))  # start the threads
        t = time.perf_counter()
        list(pool.map(encode, chunks))
        return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--format", default="pairs-tsv")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="zarr thread-pool sizes to compare")
    parser.add_argument("--flush-batches", type=int, nargs="+", default=[1], help="commit after every K batches (ingest: 1)")
    parser.add_argument(
        "--commit",
        nargs="+",
        choices=["overlap", "wait"],
        default=["overlap", "wait"],
        help="overlap: chunks written in the background while the rows before them commit (ingest); wait: each commit waits",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the temporary store (one run per measurement: ~1.7 GB)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for the forward pass (default: torch's choice)")
    parser.add_argument(
        "--write-empty-chunks",
        action="store_true",
        help="set zarr's default array.write_empty_chunks=True: what arrays.ARRAY_CONFIG asks for, but zarr.open_array "
        "drops the config of an existing array, so RunWriter's array compares every chunk with the fill value",
    )
    args = parser.parse_args()
    import numcodecs.blosc
    import torch
    import zarr

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.write_empty_chunks:
        zarr.config.set({"array.write_empty_chunks": True})
    load_start = loadavg()
    started = time.perf_counter()
    home = Path(tempfile.mkdtemp(prefix="attnstore-storage-"))
    db = f"sqlite:///{home / 'meta.sqlite'}"
    migrate.upgrade(db)
    store = open_store(db=db, root=str(home / "attention.zarr"))

    loaded = load_model()
    # Whitespace words: annotation is not what is measured, and the maps and tokens are the same.
    source = file_source(args.corpus, args.format)
    dataset_id, _ = register_dataset(store, source, annotator="whitespace", progress=False)
    examples = list(store.writer.dataset_examples(dataset_id))
    encoded = encode_batch(loaded.tokenizer, examples, loaded.max_length, "truncate", tokenization="text")
    batches = list(plan_batches(encoded, args.batch_size))
    dtype = "float16"
    cells = sum(loaded.n_layers * loaded.n_heads * e.length**2 for e in encoded)
    mb = cells * np.dtype(dtype).itemsize / 1e6

    forward_attention(loaded, batches[0])  # warm-up
    kept, convert_s = make_maps(loaded, batches, dtype)
    forward_s = [time_forward(loaded, batches) for _ in range(args.repeats)]

    model_id = store.writer.find_or_create_model(**loaded.record())
    codec = dict(arrays.DEFAULT_CODEC)
    results: dict[tuple[int, str, int], list[dict]] = {}
    settings = [(f, c, w) for f in args.flush_batches for c in args.commit for w in args.workers]
    n_run = 0
    for _ in range(args.repeats):
        for flush_every, commit, workers in settings:  # interleaved, so a change in load hits every setting alike
            set_zarr_workers(workers)
            n_run += 1
            info = store.writer.start_run(
                name=f"storage-{n_run}-w{workers}-f{flush_every}-{commit}",
                model_id=model_id,
                dataset_id=dataset_id,
                dtype=dtype,
                codec=codec,
                chunk_cells=arrays.DEFAULT_CHUNK_CELLS,
                max_length=loaded.max_length,
                truncation="truncate",
                attn_implementation=loaded.attn_implementation,
                batch_size=args.batch_size,
                tokenization="text",
                code_version=__version__,
                corpus_checksum=source.checksum,
            )
            t = store_run(store, info, kept, flush_every, wait=commit == "wait")
            t["bytes"] = sum(f.stat().st_size for f in (home / "attention.zarr" / info.array_path).rglob("*") if f.is_file())
            results.setdefault((flush_every, commit, workers), []).append(t)

    # The codec alone, on the same chunks.
    flat = np.concatenate([b.ravel() for _, blocks in kept for b in blocks])
    chunk = arrays.DEFAULT_CHUNK_CELLS
    chunks = [flat[i : i + chunk] for i in range(0, len(flat) - chunk + 1, chunk)]
    blosc = arrays.make_codec(codec, dtype)[0]._blosc_codec  # the numcodecs Blosc that zarr's codec wraps
    codec_s: dict[int, list[float]] = {w: [] for w in args.workers}
    for _ in range(args.repeats):
        for workers in args.workers:
            codec_s[workers].append(codec_only(chunks, workers, blosc))
    codec_cells = len(chunks) * chunk
    elapsed = time.perf_counter() - started

    print(
        f"corpus: {args.corpus} ({len(encoded)} examples, {len(batches)} batches of <= {args.batch_size}, "
        f"{cells:,} cells = {mb:,.0f} MB of {dtype})"
    )
    print(
        f"machine: {os.cpu_count()} CPUs; torch threads {torch.get_num_threads()}; zarr {zarr.__version__}, "
        f"numcodecs {numcodecs.__version__} (blosc use_threads={numcodecs.blosc.use_threads}, nthreads={numcodecs.blosc.get_nthreads()})"
    )
    array = arrays.open_run_array(store.locations.array_root, info.array_path, read_only=False)  # as RunWriter opens it
    print(
        f"RunWriter's cells array: write_empty_chunks={array.config.write_empty_chunks} "
        f"(arrays.ARRAY_CONFIG asks for {arrays.ARRAY_CONFIG['write_empty_chunks']}; --write-empty-chunks={args.write_empty_chunks})"
    )
    print(f"load average (1/5/15 min): start {load_start}, end {loadavg()}; {elapsed:.0f}s in all")
    print()
    fb, fm = summary(forward_s)
    print(
        f"bare forward (output_attentions), {args.repeats} runs: best {fb:.2f}s = {cells / fb / 1e6:.1f} M cells/s, "
        f"median {fm:.2f}s = {cells / fm / 1e6:.1f} M cells/s"
    )
    print(f"to_blocks (float16 copy + row-sum check, on the forward thread): {convert_s:.2f}s = {cells / convert_s / 1e6:.0f} M cells/s")
    print()
    print(f"storage path (RunWriter.add + commit + finish, fresh run each time), {args.repeats} runs per setting")
    print(
        f"{'flush':>5s} {'commit':>7s} {'workers':>7s} {'pool':>5s} {'best s':>7s} {'median s':>8s} {'Mcells/s':>8s} {'MB/s':>5s} "
        f"{'speed-up':>8s} {'median':>6s} {'vs forward':>10s} {'bytes/cell':>10s}"
    )
    best_runs = {}
    first = settings[0]
    for key in settings:
        runs = results[key]
        best, median = summary([r["wall"] for r in runs])
        best_runs[key] = b = min(runs, key=lambda r: r["wall"])
        base = summary([r["wall"] for r in results[first]])
        flush_every, commit, workers = key
        print(
            f"{flush_every:5d} {commit:>7s} {workers:7d} {b['pool'][0]}/{b['pool'][1]:<3d} {best:7.2f} {median:8.2f} "
            f"{cells / best / 1e6:8.1f} {mb / best:5.0f} {base[0] / best:7.2f}x {base[1] / median:5.2f}x {fb / best:9.2f}x "
            f"{b['bytes'] / cells:10.3f}"
        )
    print(
        f"  flush: commit after every K batches (ingest: 1); commit: overlap (ingest: chunks written while the rows before\n"
        f"  them commit) or wait; pool: zarr pool max_workers/threads it started; MB/s: float16 in; speed-up: best (median)\n"
        f"  time of the first setting ({' '.join(map(str, first))}) over this one; vs forward: best bare forward / best storage time"
    )
    print()
    print("where the time goes, best run of each setting (seconds)")
    print(
        f"{'flush':>5s} {'commit':>7s} {'workers':>7s} {'add':>5s} {'flush':>5s} {'index':>5s} {'SQL+rest':>8s} "
        f"{'CPU writer':>10s} {'CPU loop':>8s} {'CPU pool':>8s} {'cpu/wall':>8s}"
    )
    for (flush_every, commit, workers), b in best_runs.items():
        print(
            f"{flush_every:5d} {commit:>7s} {workers:7d} {b['append']:5.2f} {b['flush']:5.2f} {b['index']:5.2f} "
            f"{b['wall'] - b['append'] - b['flush'] - b['index']:8.2f} {b['cpu_writer']:10.2f} {b['cpu_loop']:8.2f} "
            f"{b['cpu_pool']:8.2f} {b['cpu'] / b['wall']:8.2f}"
        )
    print(
        "  add, flush: in BlockWriter.append / .flush (flush = blosc + CRC32C + chunk files + resize, waited for by the writer:\n"
        "  with overlap, only the wait for the write before); index: RunIndex.write (5 index arrays, written every 2**16\n"
        "  tokens); SQL+rest: the remainder (sequence and token rows, lease checks, commits, RunWriter.add's own work);\n"
        "  CPU writer / loop / pool: CPU time of ingest's writer thread, zarr's event-loop thread (CRC32C, copies,\n"
        "  bookkeeping) and zarr's pool (blosc, chunk file writes), from /proc (10 ms ticks); cpu/wall: the whole process"
    )
    print()
    print(f"codec alone (blosc zstd-1 + CRC32C, {len(chunks)} chunks of {chunk:,} cells, plain thread pool)")
    base_c = None
    for workers in args.workers:
        best, median = summary(codec_s[workers])
        base_c = base_c or best
        print(
            f"{workers:3d} threads: best {best:.2f}s = {codec_cells / best / 1e6:.0f} M cells/s, median {median:.2f}s; "
            f"speed-up {base_c / best:.2f}x"
        )
    if args.keep:
        print(f"store left at {home}", file=sys.stderr)
    else:
        store.engine.dispose()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
