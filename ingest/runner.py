"""Ingestion: register a corpus as a dataset (annotated once), run a model over it once, store every map.

Resumable and idempotent: examples are keyed by (dataset, position) and
(run, example); a re-run skips what is committed and continues. A run's SQL rows
are committed only after its maps are on disk (see store.arrays.BlockWriter).
"""

from __future__ import annotations

import inspect
import os
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Set
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..store.errors import BusyError
from ..store.identity import annotator_kind, dataset_identity, dataset_lease_name
from ..store.leases import clear_stale, live_holder
from ..store.records import ExampleInput, RunInfo, StoredExample
from ..store.writer import run_lease_name, validate_run_name
from . import capture
from .align import Encoded, can_use_text, encode_batch, pad_inputs
from .annotate import annotate, make_annotator
from .corpus import FORMAT_READERS, file_checksum, read_corpus, read_pairs_tsv  # noqa: F401 (read_pairs_tsv: tests take it from here)
from .datasets import dataset_path, find_dataset, path_checksum, resolve_data_dir
from .errors import CorpusError, EmptyCorpusError, IngestError, InvalidArgumentError
from .feed import Feed
from .manifest import build_manifest
from .model import LoadedModel, load_model
from .settings import RunSettings

if TYPE_CHECKING:
    from ..store import Store

ROW_SUM_TOLERANCE = 1e-3
INSERT_BATCH = 256


@dataclass(frozen=True)
class IngestResult:
    run: RunInfo
    n_new: int
    seconds: float
    already_complete: bool


def _progress(total: int, desc: str, enabled: bool, unit: str = "ex"):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True, leave=False)


@dataclass(frozen=True)
class CorpusSource:
    """Where a dataset's examples come from: a user's file or a built-in dataset."""

    name: str
    split: str
    fmt: str
    source: str
    checksum: str
    gold: bool
    read: Callable[[], Iterator]
    license: str | None = None
    options: dict = field(default_factory=dict)


def reading_options(reader: Callable[..., Iterator] | None, options: dict) -> dict:
    """The reading options that decide a reader's examples, canonical: those given (None = not given), with
    the reader's other defaults filled in, and without options the reader does not take (read_corpus
    ignores them). Stored as the dataset's options and part of its identity (store/identity.py)."""
    given = {k: v for k, v in options.items() if v is not None}
    if reader is None:
        return given
    params = list(inspect.signature(reader).parameters.values())[1:]  # after the path
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        names = {p.name for p in params}
        given = {k: v for k, v in given.items() if k in names}
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty and p.default is not None}
    return {**defaults, **given}


def file_source(corpus: str, fmt: str, name: str | None = None, split: str | None = None, **read_options) -> CorpusSource:
    path = Path(corpus)
    if not path.is_file():
        raise CorpusError(path, None, "no such file", "check the --corpus path")
    return CorpusSource(
        name=name or path.parent.name or "corpus",
        split=split or path.stem,
        fmt=fmt,
        source=str(path.resolve()),
        checksum=file_checksum(path),
        gold=fmt == "conllu",
        read=lambda: read_corpus(path, fmt, **read_options),
        options=reading_options(FORMAT_READERS.get(fmt), read_options),
    )


def builtin_source(key: str, data_dir: str | None = None, **overrides) -> CorpusSource:
    spec = find_dataset(key)
    root = resolve_data_dir(data_dir)
    path = dataset_path(spec, root)
    options = {**spec.options, **{k: v for k, v in overrides.items() if v is not None}}
    return CorpusSource(
        name=spec.name,
        split=spec.split,
        fmt=spec.reader.__name__,
        source=str(path.resolve()),
        checksum=path_checksum(path),
        gold=spec.annotation == "gold",
        read=lambda: spec.reader(path, **options),
        license=spec.license,
        options=reading_options(spec.reader, options),  # the label map too: it changes the labels
    )


def select_positions(n: int, limit: int | None, sample: int | None, seed: int) -> tuple[list[int], str]:
    """Which of n examples to keep (sorted), and the suffix that names the subset in the split."""
    if sample is not None:
        chosen = sorted(random.Random(seed).sample(range(n), min(sample, n)))
        return chosen, f"[sample={sample},seed={seed}]"
    if limit is not None:
        return list(range(min(limit, n))), f"[:{limit}]"
    return list(range(n)), ""


@dataclass(frozen=True)
class DatasetPlan:
    """Which examples of a source a dataset holds, and the split name that says so."""

    source: CorpusSource
    chosen: list[int]
    split: str
    options: dict

    def annotator_kind(self, annotator: str) -> str:
        """`gold` for gold-annotated corpora (whatever --annotate says), else the annotator asked for."""
        return "gold" if self.source.gold else annotator

    def identity(self, annotator: str) -> str:
        """The dataset's identity (store/identity.py): file checksum, format, reading options, selection, annotator kind."""
        return dataset_identity(
            checksum=self.source.checksum, format=self.source.fmt, options=self.options, annotator=self.annotator_kind(annotator)
        )

    def lease_name(self, annotator: str) -> str:
        return dataset_lease_name(self.identity(annotator))


def plan_dataset(source: CorpusSource, *, limit: int | None = None, sample: int | None = None, seed: int = 0) -> DatasetPlan:
    """Read (and so validate) the whole corpus once and choose its examples; writes nothing."""
    n = sum(1 for _ in source.read())
    if n == 0:
        raise EmptyCorpusError(source.source)
    chosen, suffix = select_positions(n, limit, sample, seed)
    options = {**source.options, "limit": limit, "sample": sample, "seed": seed if sample is not None else None}
    return DatasetPlan(source, chosen, source.split + suffix, options)


def register_dataset(
    store: Store,
    source: CorpusSource | DatasetPlan,
    *,
    annotator: str = "spacy",
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
    progress: bool = True,
    notify: Callable[[str], None] | None = None,
) -> tuple[int, str]:
    """Validate the whole corpus, then store the selected examples with words (resuming a partial load).

    Returns (dataset id, annotator name). Nothing is written if any record is bad. A dataset is
    found by its identity (store/identity.py), not its name: a file already registered with the
    same reading options and annotator is reused (and not annotated again) whatever the name,
    split or path given now; `notify` is told in one line when it is stored under another name.
    One process loads a dataset at a time (a lease on the identity); another one asking for it,
    under any name, waits, then uses what the first stored.
    """
    plan = source if isinstance(source, DatasetPlan) else plan_dataset(source, limit=limit, sample=sample, seed=seed)
    with opened_dataset(store, plan, annotator=annotator, progress=progress, notify=notify) as load:
        if not load.complete:
            load.load_all(progress)
    return load.dataset_id, load.annotator_name


@dataclass
class DatasetLoad:
    """A dataset found or created in the store, and what of it is still to annotate and store.

    `complete`: nothing to do. Otherwise this process holds the dataset's lease (`lease`) and
    stores the rest, all at once (`load_all`) or on a thread during the first run (ingest/feed.py).
    """

    store: Store
    plan: DatasetPlan
    dataset_id: int
    annotator_name: str
    complete: bool = True
    tool: Any = None  # the annotator; None for gold words
    stored: frozenset[int] = frozenset()  # positions stored by an earlier, cut-off load
    lease: Any = None

    def chunks(self) -> Iterator[list[ExampleInput]]:
        """The examples still to store, annotated, INSERT_BATCH at a time in corpus order."""
        rank = {original: new for new, original in enumerate(self.plan.chosen)}
        todo = (
            replace(e, position=rank[e.position])
            for e in self.plan.source.read()
            if e.position in rank and rank[e.position] not in self.stored
        )
        while batch := list(islice(todo, INSERT_BATCH)):
            yield list(annotate(batch, self.tool)) if self.tool else batch

    def add(self, chunk: list[ExampleInput]) -> None:
        self.store.writer.add_examples(self.dataset_id, chunk, self.annotator_name)

    def finish(self) -> None:
        """Mark the dataset complete and let other processes use it."""
        self.store.writer.complete_dataset(self.dataset_id)
        if self.lease is not None:
            self.lease.release()

    def load_all(self, progress: bool) -> None:
        with _progress(len(self.plan.chosen) - len(self.stored), f"annotating ({self.annotator_name})", progress) as bar:
            for chunk in self.chunks():
                self.add(chunk)
                bar.update(len(chunk))
        self.finish()

    def stored_a_prefix(self) -> bool:
        """Whether the examples stored before are the first ones (a cut-off load stores them in order)."""
        return self.stored == frozenset(range(len(self.stored)))


@contextmanager
def opened_dataset(
    store: Store,
    plan: DatasetPlan,
    *,
    annotator: str,
    progress: bool,
    notify: Callable[[str], None] | None,
) -> Iterator[DatasetLoad]:
    """The plan's dataset: found complete, or created/resumed with this process holding its lease until the block ends."""
    source = plan.source
    identity = plan.identity(annotator)
    existing = store.writer.find_dataset(identity)
    if existing is not None and existing["status"] == "complete":
        _tell_reused(notify, plan, existing)
        if not store.read_only:
            clear_stale(store.engine, dataset_lease_name(identity))  # left by a loader killed before releasing
        yield DatasetLoad(store, plan, existing["id"], existing["annotator"])  # annotated once: no spaCy needed
        return
    on_wait = (lambda msg: print(msg, file=sys.stderr)) if progress else None
    with store.writer.lease(dataset_lease_name(identity), f"dataset {source.name}:{plan.split}", wait=True, on_wait=on_wait) as lease:
        existing = store.writer.find_dataset(identity)
        if existing is not None:
            _tell_reused(notify, plan, existing)
            if existing["status"] == "complete":  # loaded by the process we waited for
                yield DatasetLoad(store, plan, existing["id"], existing["annotator"])
                return
        annotator_tool = None if source.gold else make_annotator(annotator)
        annotator_name = "gold" if annotator_tool is None else annotator_tool.name
        if annotator_kind(annotator_name) != plan.annotator_kind(annotator):  # the identity looked up is the one stored
            raise IngestError(f"annotator {annotator!r} names itself {annotator_name!r}: its name must start with {annotator!r}")
        dataset_id, _ = store.writer.find_or_create_dataset(
            name=source.name,
            split=plan.split,
            checksum=source.checksum,
            format=source.fmt,
            source=source.source,
            annotator=annotator_name,
            license=source.license,
            options=plan.options,
        )
        stored = frozenset(store.writer.stored_positions(dataset_id))
        yield DatasetLoad(store, plan, dataset_id, annotator_name, False, annotator_tool, stored, lease)


def _tell_reused(notify: Callable[[str], None] | None, plan: DatasetPlan, existing: dict) -> None:
    if notify is not None and (existing["name"], existing["split"]) != (plan.source.name, plan.split):
        notify(
            f"dataset {plan.source.name}:{plan.split} has the content of stored dataset {existing['name']}:{existing['split']} "
            f"(id {existing['id']}: same file, reading options and annotator); reusing it and its annotation"
        )


# A batch's attention is batch x layers x heads x T x T floats: cap batch x T^2 so long
# inputs get smaller batches and peak memory does not depend on the corpus's lengths.
MAX_BATCH_PAIRS = 32 * 128 * 128


def plan_batches(
    encoded: Iterable[Encoded], batch_size: int, window_batches: int = 8, max_pairs: int = MAX_BATCH_PAIRS
) -> Iterator[list[Encoded]]:
    """Batches of similar length (sorted within windows of a few batches), at most `batch_size`
    examples and `max_pairs` (batch x longest length squared) token pairs each."""
    it = iter(encoded)
    while window := list(islice(it, batch_size * window_batches)):
        window.sort(key=lambda e: e.length)
        batch: list[Encoded] = []
        for e in window:
            if batch and (len(batch) == batch_size or (len(batch) + 1) * e.length**2 > max_pairs):
                yield batch
                batch = []
            batch.append(e)
        if batch:
            yield batch


def forward_attention(loaded: LoadedModel, batch: list[Encoded], whole: bool = False):
    """One eager forward pass; returns the per-layer attentions (batch, head, query, key) and the lengths.

    The pass stops at the last map where the model allows it (ingest/capture.py): the maps are
    the same. `whole`: run the whole model (what a user recomputing maps runs; benchmarks).
    """
    import torch

    lengths = [e.length for e in batch]
    inputs = loaded.model_inputs(pad_inputs(batch, loaded.pad_id))  # only what the model's forward takes
    with torch.inference_mode():
        if loaded.attention_sources is not None and not whole:
            attentions = capture.attention_maps(loaded.model, inputs, loaded.attention_sources)
        else:
            attentions = loaded.model(**inputs, output_attentions=True).attentions
    if not attentions or attentions[0] is None:
        raise IngestError(f"model {loaded.name!r} returned no attention maps with attn_implementation={loaded.attn_implementation!r}")
    return attentions, lengths


def to_blocks(attentions, lengths: list[int], dtype: str, batch: list[Encoded]) -> list:
    """Per example, its unpadded (layer, head, L, L) maps in `dtype`, checked: real rows sum to 1 over real keys.

    One conversion pass into a preallocated (batch, layer, head, T, T) array; the
    blocks are views of it. The check runs on the stored values (float16 rounding
    moves a row sum by at most 2**-11).
    """
    import torch

    first = attentions[0]
    out = torch.empty((first.shape[0], len(attentions), *first.shape[1:]), dtype=getattr(torch, dtype))
    for layer, attn in enumerate(attentions):
        out[:, layer].copy_(attn)
    blocks = []
    for k, n in enumerate(lengths):
        block = out[k, :, :, :n, :n]
        err = (block.sum(-1, dtype=torch.float32) - 1).abs().max().item()
        if err > ROW_SUM_TOLERANCE:
            raise IngestError(
                f"attention rows of example {batch[k].position} do not sum to 1 over its real tokens "
                f"(max error {err:.2e}); the model must use eager softmax attention"
            )
        blocks.append(block.numpy())
    return blocks


def ingest(
    store: Store,
    settings: RunSettings | None = None,
    *,
    progress: bool = True,
    loaded: LoadedModel | None = None,
    scheduler: str | None = None,
    **options,
) -> IngestResult:
    """Ingest a corpus file or a built-in dataset with a model into a run, as `settings` say (created, or
    resumed if it exists).

    `settings`: a RunSettings (ingest/settings.py), checked when made; or, without it, the same as keywords
    (`ingest(store, corpus=..., fmt="pairs-tsv", limit=8)`, reader options such as `quoting="csv"` too:
    `RunSettings.of`). The run's `tokenization`: "text" feeds the model the raw text (the default for corpora
    without gold tokenization), "words" the corpus's words (the default for gold-tokenized corpora such as
    CoNLL-U); see ingest/align.py. Recorded in `runs.tokenization`.

    How it runs, not what it stores: `progress` bars; `loaded`, a model already loaded (settings.model is
    then not loaded); `scheduler` (local, local:N, tcp://HOST:PORT; default ATTNSTORE_SCHEDULER, else none)
    runs the forward passes and the writes on Dask workers, each into its own range of the run's cells, while
    this process plans and tokenizes the batches and holds the run's lease (ingest/distributed.py): the maps,
    and their order in storage, are those a single process would write, and it resumes the same way.
    """
    if settings is None:
        settings = RunSettings.of(**options)
    elif options:
        raise TypeError(f"ingest() takes either a RunSettings or keyword settings, not both (got {sorted(options)})")
    from ..store.cluster import check_scheduler, current_scheduler

    scheduler = check_scheduler(scheduler) if scheduler is not None else current_scheduler()
    store.writer.require_writable()
    started = time.perf_counter()
    if settings.corpus is not None:
        assert settings.fmt is not None  # refused by RunSettings
        source = file_source(settings.corpus, settings.fmt, settings.dataset_name, settings.split, **settings.read_options)
    else:
        assert settings.dataset is not None  # refused by RunSettings: one of corpus and dataset
        source = builtin_source(settings.dataset, settings.data_dir, window_words=settings.window_words)
    if settings.name is not None:
        _refuse_if_busy(store, settings.name)  # fail at once, before reading the corpus or loading the model
    # The model and corpus are checked before anything is written: a bad --model or a bad
    # record leaves the store as it was.
    registered = store.model_row(settings.model) if loaded is None else None
    finetuned = registered if registered is not None and (registered.get("training") or {}).get("checkpoint") else None
    if finetuned is not None:  # a model fine-tuned in this store: its encoder, from the store's models folder
        from .finetune import models_folder

        loaded = load_model(str(models_folder(store) / finetuned["training"]["checkpoint"]))
    plan = plan_dataset(source, limit=settings.limit, sample=settings.sample, seed=settings.seed)
    loaded = loaded or load_model(settings.model)
    settings = settings.resolved(model_max_length=loaded.max_length, gold=source.gold)
    assert settings.max_length is not None and settings.tokenization is not None  # resolved
    run_name = settings.name or f"{source.name}-{plan.split}-{loaded.name}"
    validate_run_name(run_name)
    with (
        store.writer.lease(run_lease_name(run_name), f"run {run_name!r}") as lease,
        opened_dataset(
            store, plan, annotator=settings.annotator, progress=progress, notify=lambda msg: print(msg, file=sys.stderr)
        ) as load,
    ):
        dataset_id, annotator_name = load.dataset_id, load.annotator_name
        # A dataset's first load runs on a thread during this run's forward passes (ingest/feed.py),
        # unless an earlier cut-off load left gaps that corpus order would skip.
        feed = Feed(load) if not load.complete and load.stored_a_prefix() else None
        if not load.complete and feed is None:
            load.load_all(progress)
        model_id = finetuned["id"] if finetuned is not None else store.writer.find_or_create_model(**loaded.record())
        dataset_row = store.sql("SELECT name, split, identity FROM datasets WHERE id = :i", {"i": dataset_id}).iloc[0]
        manifest = build_manifest(
            loaded=loaded,
            settings=settings,
            corpus=source.source,
            fmt=source.fmt,
            corpus_checksum=source.checksum,
            annotator=annotator_name,
        )
        manifest["model"].update(causal=loaded.causal, inputs=list(loaded.inputs))
        # The dataset the run used (runs.dataset_id), which may be stored under another name than asked for.
        manifest["corpus"]["dataset"] = {k: str(dataset_row[k]) for k in ("name", "split", "identity")}
        if settings.tokenization == "words":
            manifest["tokenizer"].update(loaded.word_tokenizer_options)  # e.g. add_prefix_space for byte-level BPE
        from ..version import __version__

        info = store.writer.start_run(
            name=run_name,
            model_id=model_id,
            dataset_id=dataset_id,
            **settings.run_fields(),
            attn_implementation=loaded.attn_implementation,
            code_version=__version__,
            corpus_checksum=source.checksum,
            manifest=manifest,
        )
        if info.status == "complete":
            return IngestResult(info, 0, 0.0, True)
        done = store.writer.done_example_ids(info.id)
        total = len(plan.chosen) - len(done)
        run_started = time.perf_counter()
        writer = store.writer.run_writer(info.id, lease)
        try:
            with feed or nullcontext():
                examples = feed.examples() if feed is not None else store.writer.dataset_examples(dataset_id)
                batches = planned_batches(
                    examples, loaded, settings.tokenization, settings.max_length, settings.truncation, settings.batch_size
                )
                if scheduler is None:
                    n_new = run_batches(writer, loaded, settings.dtype, info, done, batches, total, progress)
                else:
                    from .distributed import ingest_on_cluster

                    n_new = ingest_on_cluster(scheduler, writer, loaded.source, settings.dtype, done, batches, total, progress)
            seconds = time.perf_counter() - run_started
            timings = {"timings": {"total_seconds": time.perf_counter() - started}}
            info = writer.finish(seconds, timings, rebuild_index=scheduler is not None)
        except BaseException:
            writer.close()  # its background chunk write ends before the run is marked interrupted
            _mark_interrupted(store, info.id)
            raise
    return IngestResult(info, n_new, seconds, False)


def _checked(group, tokenization: str):
    if tokenization == "text" and not can_use_text(group):
        raise InvalidArgumentError(
            "--tokenize text needs each word's character offsets, which this dataset's words lack "
            "(gold-tokenized corpora): use --tokenize words"
        )
    return group


def _refuse_if_busy(store: Store, run_name: str) -> None:
    holder = live_holder(store.engine, run_lease_name(run_name))
    if holder is not None:
        raise BusyError(
            f"run {run_name!r} is being written by {holder.describe()}; wait for it to finish "
            f"(or stop it: a killed writer's run resumes with the same command)"
        )


def _mark_interrupted(store: Store, run_id: int) -> None:
    try:
        store.writer.fail_run(run_id, status="interrupted")
    except Exception:
        pass  # e.g. the database is on the full disk too: a run whose writer is gone reads as interrupted anyway


def planned_batches(
    examples: Iterator[StoredExample], loaded: LoadedModel, tokenization, max_length, truncation, batch_size
) -> Iterator[list[Encoded]]:
    """The batches of a dataset's `examples` (all of them, in corpus order), tokenized as they are
    planned (already-stored examples included, see `run_batches`)."""
    pending = examples
    encoded = (
        enc
        for group in iter(lambda: list(islice(pending, 256)), [])
        for enc in encode_batch(loaded.tokenizer_for(tokenization), _checked(group, tokenization), max_length, truncation, tokenization)
    )
    return plan_batches(encoded, batch_size)


def batch_items(loaded: LoadedModel, dtype: str, batch: list[Encoded], done: Set[int]) -> list[tuple[Encoded, np.ndarray | None]]:
    """One planned batch's examples to store, in storage order, with their maps (None: skipped, no tokens)."""
    runnable = [e for e in batch if e.input_ids]
    items: list[tuple[Encoded, np.ndarray | None]] = [(e, None) for e in batch if not e.input_ids and e.example_id not in done]
    if any(e.example_id not in done for e in runnable):
        attentions, lengths = forward_attention(loaded, runnable)
        items += [(e, maps) for e, maps in zip(runnable, to_blocks(attentions, lengths, dtype, runnable)) if e.example_id not in done]
    return items


def store_items(writer, items: list[tuple[Encoded, np.ndarray | None]], overlap: bool = False) -> None:
    """Hand a batch's examples to a run writer and commit what is on disk. `overlap`: the batch's chunks are
    written in the background while the writer goes on (`storage_overlaps`)."""
    for enc, maps in items:
        if maps is None:
            writer.add_skipped(enc.example_id, enc.full_length)
        else:
            writer.add(enc.example_id, maps, enc.tokens, truncated=enc.truncated)
    writer.commit(wait=not overlap)


def storage_overlaps() -> bool:
    """Whether a batch's chunks are written in the background while the writer commits the rows of the batch
    before (`RunWriter.commit(wait=False)`): only where cores are left beside the forward passes' torch threads.
    Where the passes use every core, the overlapped storage work takes CPU from them: on MRPC dev (2 cores)
    ingest / bare was 0.80-0.81 overlapped against 0.85-0.86 waiting with 2 torch threads, and 0.91 against
    0.87 with 1 (docs/PERFORMANCE.md, session 23)."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores > torch.get_num_threads()


def forward_passes() -> tuple[int, int]:
    """How many forward passes run at once on the CPU, and torch's threads for each.

    Two passes of half the threads each, rather than one pass on all of them: the writer thread's
    work then delays one pass, where it stalled all of a pass's OpenMP threads at their next
    barrier (docs/PERFORMANCE.md, session 21). An odd number of threads cannot be halved without
    leaving a core idle or oversubscribed, so it keeps one pass."""
    import torch

    threads = torch.get_num_threads()
    passes = 2 if threads % 2 == 0 else 1
    return passes, threads // passes


@contextmanager
def _torch_threads(n: int):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_batches(
    writer,
    loaded: LoadedModel,
    dtype: str,
    info,
    done: Set[int],
    batches: Iterable[list[Encoded]],
    total,
    progress,
    overlap: bool | None = None,
) -> int:
    """Run and store `batches`; returns examples stored. `overlap`: chunk writes beside the next commit (default:
    `storage_overlaps()`)."""
    # Batches are planned over the whole dataset, already-stored examples included, so a resumed
    # run forms exactly the batches of an uninterrupted one (same padding, same arithmetic):
    # its maps are bit-identical. Batches with nothing new are not run.
    import torch

    passes, threads = forward_passes()
    overlap = storage_overlaps() if overlap is None else overlap
    running: deque = deque()  # forward passes, in batch order
    storing: deque = deque()  # store steps, in batch order
    n_new = 0

    def store_batch(items):
        store_items(writer, items, overlap)
        bar.update(len(items))

    def hand_over() -> int:
        """The oldest forward pass's examples to the writer thread, in batch order (storage order)."""
        items = running.popleft().result()
        while len(storing) > 1:
            storing.popleft().result()
        storing.append(store.submit(store_batch, items))
        return len(items)

    # `passes` forward passes run at once, each on `threads` of torch's threads, while this thread
    # plans the next batch (reads its examples, tokenizes, aligns) and one writer thread compresses,
    # writes chunks and inserts rows.
    with (
        _torch_threads(threads),
        ThreadPoolExecutor(passes, "attnstore-forward", initializer=torch.set_num_threads, initargs=(threads,)) as forward,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnstore-store") as store,
        _progress(total, f"ingesting {info.name}", progress) as bar,
    ):
        try:
            for batch in batches:
                if all(e.example_id in done for e in batch):
                    continue
                running.append(forward.submit(batch_items, loaded, dtype, batch, done))
                while len(running) > passes:
                    n_new += hand_over()
            while running:
                n_new += hand_over()
            while storing:
                storing.popleft().result()
        except BaseException:
            # Keep what is safely on disk (the caller marks the run interrupted, so `ingest` resumes it).
            for f in (*running, *storing):
                f.cancel()
            for f in (*running, *storing):
                if not f.cancelled():
                    try:
                        f.result()
                    except Exception:
                        pass
            try:
                writer.commit()
            except Exception:
                pass
            raise
    return n_new
