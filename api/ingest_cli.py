"""`attnstore ingest`: run a model once over a corpus and store every attention map.

A module of its own so that other commands (and `attnstore --help`) do not import the ingest
machinery's option values (formats, codecs, the default model), which load numpy and zarr.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from ..ingest.align import TOKENIZATIONS, TRUNCATION_POLICIES
from ..ingest.annotate import ANNOTATORS
from ..ingest.corpus import FORMATS as CORPUS_FORMATS
from ..ingest.model import DEFAULT_MODEL
from ..ingest.settings import RunSettings
from ..store.arrays import CODECS, DEFAULT_CHUNK_CELLS, DTYPES
from .common import friendly_errors, open_store, require_extra, scheduler_option, store_options


@click.command(short_help="Run a model over a corpus and store every attention map.")
@click.option("--corpus", default=None, type=click.Path(dir_okay=False), help="Corpus file to ingest (or use --dataset).")
@click.option(
    "--format",
    "fmt",
    default=None,
    type=click.Choice(CORPUS_FORMATS),
    help="text: one example per line; tsv / pairs-tsv: TSV with a header and one / two text columns; conllu: CoNLL-U "
    'with gold annotation; jsonl: one JSON object per line whose "text" is a whole document (or --text-a-column).',
)
@click.option(
    "--dataset",
    default=None,
    metavar="NAME:SPLIT",
    help="A built-in dataset, e.g. glue/MRPC:dev, or a generated one: generated/repeated_tokens:T20,50,200 (`attnstore datasets`).",
)
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Folder holding the built-in datasets' files (env ATTNSTORE_DATA; default ../shared/data).",
)
@click.option(
    "--model",
    default=DEFAULT_MODEL,
    show_default=True,
    help="A packaged model (all-MiniLM-L6-v2; SmolLM2-135M-Instruct, a decoder), a Hugging Face model name or a local directory.",
)
@click.option("--name", default=None, help="Run name (default DATASET-SPLIT-MODEL). Re-running a name resumes it.")
@click.option(
    "--dataset-name",
    default=None,
    help="Dataset name (default: the file's folder name, e.g. MRPC for .../glue/MRPC/dev.tsv, where the built-in "
    "--dataset glue/MRPC:dev is named glue/MRPC; give --dataset-name glue/MRPC for one name: docs/SQL.md).",
)
@click.option("--split", default=None, help="Split name (default: the file's stem).")
@click.option(
    "--annotate",
    "annotator",
    default="spacy",
    show_default=True,
    type=click.Choice(ANNOTATORS),
    help="Word annotation for corpora without gold annotation.",
)
@click.option("--batch-size", default=32, show_default=True, type=int)
@click.option("--max-length", default=None, type=int, help="Token limit (default: the model's).")
@click.option(
    "--truncation",
    default="truncate",
    show_default=True,
    type=click.Choice(TRUNCATION_POLICIES),
    help="What to do with inputs over the limit: truncate them (longest segment first) or skip them. Counted per run.",
)
@click.option("--dtype", default="float16", show_default=True, type=click.Choice(DTYPES))
@click.option(
    "--codec",
    "codec_name",
    default="lossless",
    show_default=True,
    type=click.Choice(sorted(CODECS)),
    help="lossless: blosc zstd (~1.66 bytes/cell); u8: each value stored as one byte round(255 v) "
    "(~0.40 bytes/cell, at most 0.0025 off per value; its effect on every query is in docs/PERFORMANCE.md).",
)
@click.option("--limit", default=None, type=int, help="Only the first N examples.")
@click.option("--sample", default=None, type=int, help="A random sample of N examples (reproducible with --seed).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed for --sample, and of a generated dataset's tokens.")
@click.option(
    "--window-words",
    default=None,
    type=int,
    help="gum/ontogum: words per document window (default 128; 0: whole documents, for long-context decoders).",
)
@click.option("--text-a-column", default=None, help="pairs-tsv: first text column (default: found from the header).")
@click.option("--text-b-column", default=None, help="pairs-tsv: second text column.")
@click.option("--label-column", default=None, help="pairs-tsv: label column.")
@click.option(
    "--quoting",
    default="none",
    show_default=True,
    type=click.Choice(["none", "csv"]),
    help="pairs-tsv: 'none' treats quotes as text (GLUE); 'csv' reads quoted fields (HF exports).",
)
@click.option(
    "--tokenize",
    "tokenization",
    default=None,
    type=click.Choice(TOKENIZATIONS),
    help="Feed the model the raw text (default for GLUE and plain text) or the corpus's words (default for CoNLL-U).",
)
@click.option(
    "--chunk-cells",
    default=DEFAULT_CHUNK_CELLS,
    show_default=True,
    type=int,
    help=(
        "Zarr chunk length in cells (advanced; the default was chosen by benchmarks/choose_codec.py). Where a chunk holds "
        "several 256 KiB blosc blocks, each example is placed in the fewest of them (docs/ARCHITECTURE.md)."
    ),
)
@click.option(
    "--norms/--no-norms",
    "value_norms",
    default=True,
    show_default=True,
    help="Keep each token's value norm per (layer, head) beside the maps, for queries' weights=norm (Kobayashi et al. "
    "2020; ~1/L of the maps' size; its cost is in docs/PERFORMANCE.md).",
)
@click.option(
    "--token-loss/--no-token-loss",
    "token_loss",
    default=True,
    show_default=True,
    help="For a causal LM with its LM head: keep each token's next-token loss (nats, NaN at the last token) and its "
    "hidden-state peak per layer (massive activations) from the same forward pass, run to the logits instead of stopping "
    "at the last map (store.token_loss; docs/ARCHITECTURE.md).",
)
@click.option(
    "--row-stats/--no-row-stats",
    "row_stats",
    default=None,
    help="For a causal LM captured block by block: keep per-row statistics of every head's attention (the first "
    "positions, entropy, mass by distance, top keys, each key's column; 96 bytes per row and head), from which "
    "attention_sink, previous_token_heads, streaming_heads, entropy_by_position, heavy_hitters and retrieval_heads answer "
    "without reading the maps (docs/DECODERS.md, with their cost). Default: with --tier qk, whose maps a query would "
    "rebuild; a dense run of short examples reads its maps about as fast.",
)
@click.option(
    "--tier",
    default=None,
    type=click.Choice(["dense", "qk"]),
    help="dense: store the maps; qk: store each layer's post-RoPE queries and keys and each row's log-sum-exp, and rebuild "
    "the maps on read (decoders; ~1 %% of the maps' bytes at 8,192 tokens: docs/DECODERS.md). Default: qk for a decoder "
    "whose examples are longer than where it is smaller, else dense.",
)
@click.option(
    "--qk-dtype",
    default="float16",
    show_default=True,
    type=click.Choice(["float16", "float32"]),
    help="--tier qk: the stored queries and keys (float32: rebuilt maps within 1e-5 of the model's; float16: half the "
    "bytes, within the bound in docs/DECODERS.md).",
)
@click.option(
    "--device",
    default="auto",
    show_default=True,
    help="Where the forward passes run: auto (CUDA, else MPS, else the CPU), cpu, cuda, cuda:N or mps. Maps leave it block by block.",
)
@click.option(
    "--compute-dtype",
    default="float32",
    show_default=True,
    type=click.Choice(["float32", "bfloat16", "float16"]),
    help="The weights' dtype in the forward passes (recorded in the run's manifest).",
)
@click.option(
    "--generate",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="A causal LM continues each example's text greedily by up to N tokens (stopping after a newline), and the text "
    "and the generation are stored as one sequence, the generated tokens as segment 1 (retrieval_heads; docs/DECODERS.md).",
)
@click.option(
    "--for-workers",
    "workers",
    default=None,
    type=click.IntRange(min=1),
    metavar="N",
    help="Plan the run for N worker processes instead of running it here: tokenize and split it into parts, then exit "
    "(or, with --as-worker I, go on as worker I). Each worker is `attnstore work --run NAME --worker I --of N` (a Slurm "
    "array, a Kubernetes Indexed Job: docs/SCALING.md).",
)
@click.option(
    "--as-worker",
    "as_worker",
    default=None,
    type=click.IntRange(min=0),
    metavar="I",
    help="With --for-workers N: once the run is planned, go on as worker I of the N with the model loaded to plan (start "
    "the others with `attnstore work --wait`); again after a crash, it resumes that worker.",
)
@click.option(
    "--worker-threads",
    default=None,
    type=click.IntRange(min=1),
    help="With --as-worker: torch's CPU threads for its work (default: every core; N workers on one host: cores/N each).",
)
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show progress bars.")
@scheduler_option("the plan, the forward passes and the writes of their maps (this process loads no model)")
@store_options
@friendly_errors
def ingest(
    locations,
    codec_name,
    text_a_column,
    text_b_column,
    label_column,
    quoting,
    progress,
    scheduler,
    workers,
    as_worker,
    worker_threads,
    **options,
):
    """Run a model once over a corpus and store every attention map.

    Interrupted runs resume when the same command is run again: no example is
    stored twice or lost.
    """
    # Every option not named above is named after the RunSettings field it sets (ingest/settings.py).
    from ..ingest import ingest as run_ingest

    read_options = {}
    if options["fmt"] == "pairs-tsv":
        read_options = dict(text_a=text_a_column, text_b=text_b_column, label=label_column, quoting=quoting)
    elif options["fmt"] == "tsv":
        read_options = dict(text_a=text_a_column, label=label_column, quoting=quoting)
    elif options["fmt"] == "jsonl":
        read_options = dict(text_a=text_a_column, label=label_column)
    require_extra("ingest")
    created = new_store(locations)  # what this command creates, when its store does not exist yet
    store = None
    try:
        store = open_store(locations, create=True)
        settings = RunSettings(**options, codec=dict(CODECS[codec_name]), read_options=read_options)
        result = run_ingest(
            store, settings, progress=progress, scheduler=scheduler, workers=workers, as_worker=as_worker, worker_threads=worker_threads
        )
    except BaseException as exc:
        removed = remove_if_unused(store, created)
        if isinstance(exc, KeyboardInterrupt):
            click.echo(
                "interrupted before anything was stored"
                if removed
                else "interrupted: stored examples are kept; run the same command again to resume",
                err=True,
            )
            sys.exit(130)
        raise
    run = result.run
    if result.worked is not None:
        _say_worked(result.worked)
        return
    if result.planned_parts or result.already_planned:
        n = workers
        click.echo(
            f"run {run.name!r} is planned{' already' if result.already_planned else ''}: {result.planned_parts} parts for {n} "
            f"workers; start each one, in any order, on any host that reaches the store: "
            f"attnstore work --run {run.name} --worker I --of {n}   (I = 0..{n - 1})"
        )
        return
    if result.already_complete:
        click.echo(f"run {run.name!r} is already complete ({run.n_stored} examples); nothing to do")
        return
    click.echo(
        # n_new: the examples this command took (stored or skipped); the counts in brackets are the whole run's
        f"run {run.name!r}: {result.n_new} new examples in {result.seconds:.1f}s "
        f"(the run: {run.n_stored} stored, {run.n_truncated} truncated, {run.n_skipped} skipped; max length {run.max_length}, "
        f"truncation={run.truncation})"
    )
    if run.has_row_stats and run.status == "complete" and run.n_stored:
        _keep_row_summaries(store, run)


def _keep_row_summaries(store, run) -> None:
    """Keep the summaries of the queries that answer from a run's row statistics (docs/DECODERS.md), read from them
    now: each such query then answers the whole run from its kept totals, whatever its size."""
    import time

    from ..queries.engine import keep, row_kinds

    started = time.perf_counter()
    kinds = row_kinds(run)
    for kind in kinds:
        keep(store, run, kind)
    names = ", ".join(kind.name for kind in kinds)
    click.echo(f"kept {len(kinds)} summaries from the run's row statistics ({names}) in {time.perf_counter() - started:.1f}s", err=True)


def _local(url_or_path: str) -> Path | None:
    """The local file or folder a --db (SQLite) or --root names; None for a server or object storage."""
    if url_or_path.startswith("sqlite:///"):
        path = url_or_path[len("sqlite:///") :]
        return None if path in ("", ":memory:") else Path(path).absolute()
    if url_or_path.startswith("file://"):
        return Path(url_or_path[len("file://") :]).absolute()
    return None if "://" in url_or_path else Path(url_or_path).absolute()


@dataclass(frozen=True)
class NewStore:
    """What a first ingest into a SQLite store that does not exist yet creates: the database file, the array root
    (when it is local and missing too) and the folders above them that are missing (ATTNSTORE_HOME), deepest first."""

    db: Path
    root: Path | None
    folders: tuple[Path, ...]


def new_store(locations) -> NewStore | None:
    """NewStore for a store that does not exist yet; None for one that exists, or a server database (which
    `db upgrade` creates, never ingest): then nothing is ever removed."""
    db = _local(locations.db_url) if locations.db_url.startswith("sqlite:///") else None
    if db is None or db.exists():
        return None
    root = _local(locations.array_root)
    root = root if root is not None and not root.exists() else None
    folders: set[Path] = set()
    for path in (db, root):
        parent = path.parent if path is not None else None
        while parent is not None and not parent.exists() and parent != parent.parent:
            folders.add(parent)
            parent = parent.parent
    return NewStore(db, root, tuple(sorted(folders, key=lambda p: len(p.parts), reverse=True)))


def remove_if_unused(store, created: NewStore | None) -> bool:
    """After a failed ingest that created its store: remove what it created when no example was stored, so a failed
    first ingest leaves no empty store behind. A store holding examples is kept (an interrupted ingest resumes
    from it), and a store that existed before the command is never touched. Says what it removed, on stderr."""
    if created is None:
        return False
    if store is not None:  # else opening (creating) it is what failed
        try:
            stored = int(store.sql("SELECT count(*) AS n FROM examples")["n"].iloc[0])
        except Exception:
            stored = -1  # not known: keep it
        finally:
            store.close()
        if stored:
            return False
    for suffix in ("", "-journal", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{created.db}{suffix}")
    if created.root is not None:
        shutil.rmtree(created.root, ignore_errors=True)
    for folder in created.folders:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty: nothing but what this command made
    click.echo(f"nothing was stored: removed the new store this command created ({created.db})", err=True)
    return True


@click.command(short_help="Be one worker of a run planned with `ingest --for-workers N`.")
@click.option("--run", "run_name", required=True, help="The planned run.")
@click.option(
    "--worker",
    default=None,
    type=int,
    metavar="I",
    help="This worker's index, 0..N-1 (default: ATTNSTORE_WORKER, SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX).",
)
@click.option(
    "--of",
    "of",
    default=None,
    type=click.IntRange(min=1),
    metavar="N",
    help="The number of workers, checked against the plan (default: ATTNSTORE_WORKERS or SLURM_ARRAY_TASK_COUNT).",
)
@click.option(
    "--device",
    default="auto",
    show_default=True,
    help="Where this worker's forward passes run: auto, cpu, cuda, cuda:N, mps; {worker} is replaced by the index "
    "(cuda:{worker}: one GPU per worker on one host). Under Slurm or Kubernetes, CUDA_VISIBLE_DEVICES with auto.",
)
@click.option(
    "--threads",
    default=None,
    type=click.IntRange(min=1),
    help="torch's CPU threads for this worker (default: every core; give N workers on one host cores/N each).",
)
@click.option(
    "--wait",
    is_flag=True,
    default=False,
    help="If a process with this index is running, wait until it ends or goes silent for the lease's stale period "
    "(ATTNSTORE_LEASE_STALE_SECONDS, 60 s) instead of stopping: for an index restarted on another host. If the run is "
    "not planned yet, wait for its plan (workers started with their planner).",
)
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@store_options
@friendly_errors
def work(locations, run_name, worker, of, device, threads, wait, progress):
    """Compute and store this worker's parts of a planned run (parts I, I+N, I+2N, ...), then complete the run when
    every part is in. Restarted with the same index after a crash or kill, it goes on where it stopped: nothing is
    lost or stored twice. A second process with an index that is running is refused.
    """
    from ..ingest.workers import work as run_work

    require_extra("ingest")
    store = open_store(locations)
    _say_worked(run_work(store, run_name, worker, of, device=device, threads=threads, wait=wait, progress=progress))


def _say_worked(result) -> None:
    if result.already_complete:
        click.echo(f"run {result.run!r} is complete; nothing to do")
        return
    state = (
        "this worker completed the run"
        if result.completed
        else "the run is complete"
        if not result.parts_left
        else f"{result.parts_left} parts of the run are left to other workers"
    )
    click.echo(
        f"worker {result.worker} of {result.workers}, run {result.run!r}: {result.n_new} new examples from {result.parts} "
        f"parts in {result.seconds:.1f}s; {state}"
    )
