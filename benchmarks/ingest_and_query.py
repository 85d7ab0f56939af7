"""Benchmark: ingest and query the MRPC dev set, printing the design targets as ratios measured in one run.

    python benchmarks/ingest_and_query.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--batch-size 32] [--framenet 300]

Figures (DESIGN.md, "Performance targets"):
  ingest / bare forward   throughput of `ingest` (tokenize, forward, check, compress, write Zarr + SQL)
                          over a bare eager forward pass with output_attentions on the same batches  (>= 0.9)
  bytes per cell          bytes on disk of the run's Zarr array / attention cells stored               (<= 1.7)
  query speed-up          time to recompute a per-head aggregate with the model / time to compute it
                          from the stored run                                                          (>= 30)
  read latency p50        store.attention(run, example) for random examples                            (< 20 ms)

The queries that need another run are measured on their own runs, against the forward passes of what they read:
`frame_heads` / `frame_heads_top` on a sample of FrameNet 1.5 exemplars (`--framenet N`, ingested into the same
store; recompute = a bare forward pass over those sentences) and `run_similarity` against a second run of the corpus
stored with the lossy u8 codec (same tokens, other stored values; recompute = two bare forward passes of the
compared examples).
"""

from __future__ import annotations

import argparse
import inspect
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from attnstore.ingest import file_source, ingest, register_dataset
from attnstore.ingest.align import encode_batch
from attnstore.ingest.batches import plan_batches
from attnstore.ingest.model import load_model
from attnstore.ingest.passes import forward_attention
from attnstore.queries import QUERIES, load_all, run_query
from attnstore.queries.clark import CLARK, relative_position
from attnstore.queries.engine import KINDS, keep, run_kinds
from attnstore.store import arrays, migrate, open_store
from attnstore.store.errors import AttnStoreError

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DEFAULT_CORPUS = DEFAULT_DATA / "glue" / "MRPC" / "dev.tsv"
FRAMENET = "framenet/1.5:exemplars"
FRAMENET_QUERIES = ("frame_heads", "frame_heads_top")
# The queries this benchmark measures with a figure of their own (against the forward passes of what each reads):
# relative_position against its recomputation, the others on their own runs. Every other registered query is timed
# by `timed_queries` with no list to extend; a query that cannot run on the corpus's run alone says why in the output.
OWN_FIGURES = ("relative_position", "run_similarity", *FRAMENET_QUERIES)
FRAMENET_KINDS = ("lu_fe_max",)  # summaries of FrameNet runs: built on the FrameNet run, not on the corpus's


def timed_queries(queries) -> tuple[list[str], dict[str, str]]:
    """(the registered queries timed on the corpus's run with their defaults, {query: why it is not}) for every query
    without a figure of its own (OWN_FIGURES): one with a required parameter is listed as skipped, naming it."""
    timed, skipped = [], {}
    for name, spec in sorted(queries.items()):
        if name in OWN_FIGURES:
            continue
        required = [p for p, v in spec.parameters().items() if v.default is inspect.Parameter.empty]
        if required:
            skipped[name] = f"skipped (needs {', '.join(f'--param {p}=...' for p in required)})"
        else:
            timed.append(name)
    return timed, skipped


def bare_forward(loaded, batches, whole: bool = True) -> float:
    """Seconds of eager forward passes over `batches`: the whole model (a user recomputing maps), or
    stopped at the last map as ingest runs it (ingest/capture.py)."""
    start = time.perf_counter()
    for batch in batches:
        forward_attention(loaded, batch, whole=whole)
    return time.perf_counter() - start


def recompute_relative_position(loaded, batches) -> tuple[float, np.ndarray]:
    """What the papers' notebooks do: run the model, then aggregate its attention (here: to the previous token)."""
    start = time.perf_counter()
    total = np.zeros((loaded.n_layers, loaded.n_heads))
    pairs = 0
    for batch in batches:
        attentions, lengths = forward_attention(loaded, batch, whole=True)
        for layer, attn in enumerate(attentions):
            attn = attn.numpy()
            for k, n in enumerate(lengths):
                total[layer] += np.diagonal(attn[k, :, :n, :n], offset=-1, axis1=1, axis2=2).sum(-1)
        pairs += sum(n - 1 for n in lengths)
    return time.perf_counter() - start, total / pairs


def best_of(repeats: int, store, name: str, **params) -> float:
    """Seconds of run_query(store, name, **params), the best of `repeats`."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run_query(store, name, **params)
        times.append(time.perf_counter() - t)
    return min(times)


def framenet_figures(store, loaded, args) -> dict:
    """Ingest a sample of FrameNet exemplars into the store, time a bare forward pass over its batches, the
    `lu_fe_max` summary (once) and frame_heads / frame_heads_top (best of --query-repeats)."""
    t = time.perf_counter()
    result = ingest(
        store,
        dataset=FRAMENET,
        data_dir=args.data_dir,
        sample=args.framenet,
        seed=0,
        loaded=loaded,
        batch_size=args.batch_size,
        progress=False,
    )
    ingest_seconds = time.perf_counter() - t
    info = store.run_info(result.run.name)
    examples = list(store.writer.dataset_examples(info.dataset_id))
    encoded = encode_batch(loaded.tokenizer_for(info.tokenization), examples, loaded.max_length, "truncate", info.tokenization)
    batches = list(plan_batches(encoded, args.batch_size))
    forward_attention(loaded, batches[0])  # warm-up
    forward = bare_forward(loaded, batches)
    built = {}
    for kind_name in FRAMENET_KINDS:
        t = time.perf_counter()
        keep(store, info, KINDS[kind_name])
        built[kind_name] = time.perf_counter() - t
    queries = {name: best_of(args.query_repeats, store, name, run=info.name) for name in FRAMENET_QUERIES}
    sentences = run_query(store, "frame_heads", run=info.name)["n_sentences"].iloc[0]
    return dict(
        run=info.name,
        n=len(examples),
        cells=int((info.n_layers * info.n_heads * store.examples(info.id)["length"] ** 2).sum()),
        ingest=ingest_seconds,
        forward=forward,
        built=built,
        queries=queries,
        kept_sentences=int(sentences),
    )


def timed_ingest(store, loaded, args, **options):
    """`ingest` of the corpus with the benchmark's batch size: (its result, seconds)."""
    t = time.perf_counter()
    result = ingest(store, corpus=args.corpus, fmt=args.format, loaded=loaded, batch_size=args.batch_size, progress=False, **options)
    return result, time.perf_counter() - t


def similarity_figures(store, loaded, args, run, bare_passes: tuple[float, float], batches) -> dict:
    """A second run of the corpus with the lossy u8 codec; run_similarity between the two, against two bare forward
    passes of the compared examples (the two measured around the first ingest when every example is compared)."""
    from attnstore.queries.run_similarity import shared_examples

    done, ingest_seconds = timed_ingest(store, loaded, args, codec=dict(arrays.LOSSY_U8_CODEC), name=f"{run.name}-u8")
    other = done.run
    compared = shared_examples(store, store.run_info(run.name), store.run_info(other.name))  # the query's defaults
    if len(compared) == len(store.examples(run.name)):
        recompute = sum(bare_passes)
    else:  # a sample: the forward passes of those examples only
        chosen = set(compared["example"].tolist())
        subset = [[e for e in batch if e.position in chosen] for batch in batches]
        recompute = sum(bare_forward(loaded, [b for b in subset if b]) for _ in range(2))
    # The first call compares every shared example and keeps the per-example cosines for the pair (timed apart).
    build = best_of(1, store, "run_similarity", run=run.name, other=other.name)
    seconds = best_of(args.query_repeats, store, "run_similarity", run=run.name, other=other.name)
    return dict(other=other.name, n=len(compared), ingest=ingest_seconds, recompute=recompute, seconds=seconds, build=build)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--format", default="pairs-tsv")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--query-repeats", type=int, default=2, help="Runs of each query; the best is reported (the first may build its summary)."
    )
    parser.add_argument(
        "--framenet",
        type=int,
        default=300,
        metavar="N",
        help=f"Ingest a sample of N {FRAMENET} sentences for frame_heads / frame_heads_top (0: skip).",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="Folder holding the built-in datasets, for --framenet (default: the one --corpus is in, else ../shared/data).",
    )
    parser.add_argument(
        "--ingest-rounds", type=int, default=3, help="Rounds of ingest and `attnstore ingest`, each between bare forward passes."
    )
    parser.add_argument(
        "--no-similarity", action="store_true", help="Skip run_similarity (it ingests the corpus a second time, with the u8 codec)."
    )
    args = parser.parse_args()
    if args.ingest_rounds < 1:
        parser.error("--ingest-rounds must be at least 1")
    if args.data_dir is None:  # `make bench DATA=...` passes --corpus DATA/glue/MRPC/dev.tsv
        folders = Path(args.corpus).resolve().parents
        beside = folders[2] if len(folders) > 2 else DEFAULT_DATA
        args.data_dir = str(beside if (beside / "framenet_v15").is_dir() else DEFAULT_DATA)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    home = Path(tempfile.mkdtemp(prefix="attnstore-bench-"))
    db = f"sqlite:///{home / 'meta.sqlite'}"
    migrate.upgrade(db)
    store = open_store(db=db, root=str(home / "attention.zarr"))

    t = time.perf_counter()
    loaded = load_model()
    load_seconds = time.perf_counter() - t
    t = time.perf_counter()
    dataset_id, annotator = register_dataset(store, file_source(args.corpus, args.format), progress=False)
    annotate_seconds = time.perf_counter() - t
    examples = list(store.writer.dataset_examples(dataset_id))
    encoded = encode_batch(loaded.tokenizer, examples, loaded.max_length, "truncate", tokenization="text")  # as ingest feeds it
    batches = list(plan_batches(encoded, args.batch_size))
    forward_attention(loaded, batches[0])  # warm-up

    # Ingest and `attnstore ingest` against bare forward passes, alternated over rounds (timings on this shared
    # machine drift by +-30 % within a minute): each is compared with the mean of the bare passes just before
    # and after it, and the median over rounds is reported. As a user meets it, `attnstore ingest` runs in its
    # own process, a further run of the (annotated) dataset; its run time (tokenize, forward, store) is what
    # the command records, start-up and model load left out.
    bares = [bare_forward(loaded, batches)]
    ingest_times: list[float] = []
    plain_times: list[float] = []  # the same ingest without value norms (--no-norms): what keeping them costs
    cli_runs: list[float] = []
    cli_walls: list[float] = []
    for r in range(args.ingest_rounds):
        done, seconds = timed_ingest(store, loaded, args, name=f"in-process-{r}" if r else None)  # the first: the run queried below
        ingest_times.append(seconds)
        if r == 0:
            result = done
        plain_times.append(timed_ingest(store, loaded, args, name=f"no-norms-{r}", value_norms=False)[1])
        bares.append(bare_forward(loaded, batches))
        t = time.perf_counter()
        cli = subprocess.run(
            [sys.executable, "-m", "attnstore.api.cli", "ingest", "--corpus", args.corpus, "--format", args.format]
            + [
                "--name",
                f"cli-ingest-{r}",
                "--batch-size",
                str(args.batch_size),
                "--no-progress",
                "--db",
                db,
                "--root",
                str(home / "attention.zarr"),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})},  # torch's threads, as here
        )
        cli_walls.append(time.perf_counter() - t)
        if cli.returncode:
            sys.exit(f"attnstore ingest failed: {cli.stderr[-2000:]}")
        cli_runs.append(float(store.sql("SELECT ingest_seconds FROM runs WHERE name = :n", {"n": f"cli-ingest-{r}"})["ingest_seconds"][0]))
        bares.append(bare_forward(loaded, batches))
    ingest_ratios = [(bares[2 * r] + bares[2 * r + 1]) / 2 / ingest_times[r] for r in range(args.ingest_rounds)]
    cli_ratios = [(bares[2 * r + 1] + bares[2 * r + 2]) / 2 / cli_runs[r] for r in range(args.ingest_rounds)]
    bare_1, bare_2, bare_3 = bares[0], bares[1], bares[-1]
    ingest_seconds = ingest_times[0]
    stopped = bare_forward(loaded, batches, whole=False)  # the forward work ingest does: what storing adds to it
    # The first ingest of the corpus, in a fresh store: spaCy's load and annotation included, the annotation
    # on a thread during the forward passes (ingest/feed.py). Before, it was register_dataset then ingest.
    first_db = f"sqlite:///{home / 'first.sqlite'}"
    migrate.upgrade(first_db)
    first_store = open_store(db=first_db, root=str(home / "first.zarr"))
    _, first_seconds = timed_ingest(first_store, loaded, args)
    first_store.close()
    bare_4 = bare_forward(loaded, batches)
    run = result.run

    frame = store.examples(run.name)
    cells = int((run.n_layers * run.n_heads * frame["length"] ** 2).sum())
    stored_bytes = dir_bytes(home / "attention.zarr" / run.array_path)
    norm_bytes = dir_bytes(home / "attention.zarr" / run.array_path.rsplit("/", 1)[0] / "value_norm")

    recompute_seconds, recomputed = recompute_relative_position(loaded, batches)
    # relative_position, special_tokens and entropy read per-example sums kept with the run (queries/engine/),
    # built by one pass the first time one of them runs: timed here on its own, then the queries after it.
    t = time.perf_counter()
    keep(store, store.run_info(run.name), CLARK)
    summary_seconds = time.perf_counter() - t
    query_times = []
    for _ in range(3):
        t = time.perf_counter()
        stored = relative_position(store, run=run.name, average="token")  # pooled, like the recomputation
        query_times.append(time.perf_counter() - t)
    query_seconds = min(query_times)
    agree = np.abs(stored["to_previous"].to_numpy().reshape(recomputed.shape) - recomputed).max()

    other: dict[str, float | str] = {}
    load_all()
    # Every other kind of per-example summary, built once per run as its first query would (timed apart).
    built: dict[str, float] = {}
    info = store.run_info(run.name)
    for kind_name, kind in run_kinds().items():
        if kind_name == "clark" or kind_name in FRAMENET_KINDS:
            continue
        t = time.perf_counter()
        try:
            keep(store, info, kind)
        except AttnStoreError:
            continue  # e.g. a kind needing annotation this corpus lacks: its query says so below
        built[kind_name] = time.perf_counter() - t
    timed, skipped = timed_queries(QUERIES)
    other.update(skipped)
    for name in timed:  # every registered query that needs nothing but the run
        times = []
        try:
            for _ in range(args.query_repeats):
                t = time.perf_counter()
                run_query(store, name, run=run.name)
                times.append(time.perf_counter() - t)
        except AttnStoreError as exc:  # e.g. coreference on a corpus without mentions
            other[name] = f"not applicable to this corpus ({str(exc)[:80]})"
            continue
        other[name] = min(times)

    framenet = framenet_figures(store, loaded, args) if args.framenet > 0 else None
    similarity = None if args.no_similarity else similarity_figures(store, loaded, args, run, (bare_1, bare_2), batches)

    rng = random.Random(0)
    positions = frame["example"].tolist()
    latencies = []
    for example in rng.choices(positions, k=200):
        t = time.perf_counter()
        store.attention(run.name, example)
        latencies.append((time.perf_counter() - t) * 1000)

    n = len(examples)
    print(
        f"corpus: {args.corpus} ({n} examples, {cells:,} attention cells, batch size {args.batch_size}, "
        f"torch threads {torch.get_num_threads()})"
    )
    print(
        f"model: {loaded.name} ({loaded.n_layers} layers x {loaded.n_heads} heads), load {load_seconds:.1f}s; "
        f"annotation once per dataset ({annotator}): {annotate_seconds:.1f}s"
    )
    print(f"codec: {run.codec}, chunk {run.chunk_cells:,} cells, dtype {run.dtype}")
    print()
    print(f"{'figure':42s} {'measured':>12s}  {'target':>8s}")
    rows = [
        (
            "ingest / bare forward throughput",
            statistics.median(ingest_ratios),
            ">= 0.9",
            f"median of {len(ingest_ratios)} rounds: {' '.join(f'{x:.3f}' for x in ingest_ratios)} (ingest "
            f"{' '.join(f'{x:.2f}s' for x in ingest_times)}; bare {' '.join(f'{x:.2f}' for x in bares)}s)",
        ),
        (
            "ingest / its own forward passes (stopped)",
            stopped / statistics.median(ingest_times),
            "",
            f"the passes alone {stopped:.2f}s, {bare_3 / stopped:.2f}x faster than whole ones: storing's cost",
        ),
        (
            "first ingest (annotation included) / bare",
            (bare_3 + bare_4) / 2 / first_seconds,
            "",
            f"bare {(bare_3 + bare_4) / 2:.2f}s, first ingest {first_seconds:.2f}s in a fresh store "
            f"(spaCy loaded, then annotating on a thread); "
            f"one after the other: {annotate_seconds + ingest_seconds:.2f}s "
            f"({(bare_3 + bare_4) / 2 / (annotate_seconds + ingest_seconds):.3f})",
        ),
        (
            "CLI ingest (run time) / bare forward",
            statistics.median(cli_ratios),
            ">= 0.9",
            f"median of {len(cli_ratios)} rounds: {' '.join(f'{x:.3f}' for x in cli_ratios)} (`attnstore ingest` runs "
            f"{' '.join(f'{x:.2f}s' for x in cli_runs)}; the commands took {' '.join(f'{x:.1f}s' for x in cli_walls)} "
            "with start-up and model load)",
        ),
        ("stored bytes per attention cell", stored_bytes / cells, "<= 1.7", f"{stored_bytes:,} bytes; raw float16 = 2.0"),
        (
            "ingest with value norms / without",
            statistics.median(t / p for t, p in zip(ingest_times, plain_times)),
            "<= 1.05",
            f"with {' '.join(f'{x:.2f}s' for x in ingest_times)}, --no-norms {' '.join(f'{x:.2f}s' for x in plain_times)} "
            f"(rounds paired); value_norm array {norm_bytes:,} bytes = {norm_bytes / stored_bytes:.1%} of the maps'",
        ),
        (
            "recompute / stored query (relative_position)",
            recompute_seconds / query_seconds,
            ">= 30",
            f"recompute {recompute_seconds:.2f}s, stored {query_seconds:.3f}s, max |diff| {agree:.1e}",
        ),
        ("read one example's maps, p50 (ms)", statistics.median(latencies), "< 20", f"p90 {np.percentile(latencies, 90):.1f} ms"),
        (
            "recompute / building the per-example sums",
            recompute_seconds / summary_seconds,
            "(once)",
            f"{summary_seconds:.3f}s, once per run, at the first relative_position/special_tokens/entropy query",
        ),
    ]
    for label, value, target, detail in rows:
        print(f"{label:42s} {value:12.3f}  {target:>8s}   {detail}")
    print()
    print(f"every other query through run_query (best of {args.query_repeats}; recompute = {recompute_seconds:.2f}s as above):")
    print(f"{'query':28s} {'seconds':>8s} {'recompute/query':>16s}  {'>= 30':>6s}")
    for name, seconds in sorted(other.items()):
        if isinstance(seconds, str):
            print(f"{name:28s} {seconds}")
            continue
        ratio = recompute_seconds / seconds
        print(f"{name:28s} {seconds:8.3f} {ratio:15.1f}x  {'yes' if ratio >= 30 else 'no':>6s}")
    print()
    print("queries over other runs (recompute = bare forward passes over what each reads, measured here):")
    print(f"{'query':28s} {'seconds':>8s} {'recompute/query':>16s}  {'>= 30':>6s}")
    if framenet is None:
        for name in FRAMENET_QUERIES:
            print(f"{name:28s} skipped (--framenet 0)")
    else:
        for name, seconds in framenet["queries"].items():
            ratio = framenet["forward"] / seconds
            print(
                f"{name:28s} {seconds:8.3f} {ratio:15.1f}x  {'yes' if ratio >= 30 else 'no':>6s}   {framenet['n']} FrameNet "
                f"sentences ({framenet['kept_sentences']} pass the filters): bare forward {framenet['forward']:.2f}s"
            )
    if similarity is None:
        print(f"{'run_similarity':28s} skipped (--no-similarity)")
    else:
        ratio = similarity["recompute"] / similarity["seconds"]
        print(
            f"{'run_similarity':28s} {similarity['seconds']:8.3f} {ratio:15.1f}x  {'yes' if ratio >= 30 else 'no':>6s}   "
            f"{similarity['n']} examples vs {similarity['other']!r}: 2 bare forward passes {similarity['recompute']:.2f}s"
        )
    for kind_name, seconds in built.items():
        print(f"building summary {kind_name!r} (once per run, before its first query): {seconds:.2f}s ({recompute_seconds / seconds:.1f}x)")
    if framenet is not None:
        for kind_name, seconds in framenet["built"].items():
            print(
                f"building summary {kind_name!r} (once per run, before its first query): {seconds:.2f}s "
                f"({framenet['forward'] / seconds:.1f}x the FrameNet forward)"
            )
        print(
            f"FrameNet run {framenet['run']!r}: {framenet['n']} sentences, {framenet['cells']:,} cells, "
            f"ingest {framenet['ingest']:.1f}s (annotation included)"
        )
    if similarity is not None:
        print(f"second run {similarity['other']!r} (u8 codec): ingest {similarity['ingest']:.1f}s")
        print(
            f"building the pair's cosines for run_similarity (once per pair of runs, at its first query): {similarity['build']:.2f}s "
            f"({similarity['recompute'] / similarity['build']:.1f}x)"
        )
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    print(f"store left at {home}", file=sys.stderr)


if __name__ == "__main__":
    main()
