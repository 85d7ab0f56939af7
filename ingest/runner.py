"""Ingestion: register a corpus as a dataset (annotated once), run a model over it once, store every map.

Resumable and idempotent: examples are keyed by (dataset, position) and
(run, example); a re-run skips what is committed and continues. A run's SQL rows
are committed only after its maps are on disk (see store.block_writer.BlockWriter).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from itertools import islice
from typing import TYPE_CHECKING, Any

from ..store import row_stats
from ..store.identity import annotator_kind, dataset_identity, dataset_lease_name
from ..store.leases import clear_stale
from ..store.qk import qk_entry
from ..store.records import HIDDEN_PEAKS_FLAG, QK_FLAG, ROW_STATS_FLAG, TOKEN_LOSS_FLAG, VALUE_NORMS_FLAG, ExampleInput, RunInfo
from ..store.writer import run_lease_name, validate_run_name
from .activations import decoder_layers, peaks_manifest
from .annotate import annotate, make_annotator
from .batches import MAX_BATCH_TOKENS, planned_batches
from .corpus import FORMAT_READERS, file_checksum, read_corpus, read_pairs_tsv  # noqa: F401 (read_pairs_tsv: tests take it from here)
from .errors import EmptyCorpusError, IngestError, InvalidArgumentError
from .feed import Feed
from .generated import is_generated
from .generation import check_generation, generation_manifest
from .manifest import build_manifest
from .model import LoadedModel, load_model, models_folder
from .passes import run_batches, token_loss_manifest
from .progress import progress_bar
from .run_state import mark_interrupted, plan_entry, refuse_if_busy, where
from .settings import RunSettings
from .sources import CorpusSource, builtin_source, file_source, generated_source
from .tiers import capture_manifest, choose_tier

if TYPE_CHECKING:
    from ..store import Store

INSERT_BATCH = 256


@dataclass(frozen=True)
class IngestResult:
    run: RunInfo
    n_new: int
    seconds: float
    already_complete: bool
    planned_parts: int = 0  # planned for worker processes (`workers`), not run: its parts
    already_planned: bool = False
    worked: Any = None  # with `as_worker`: the planning process's own WorkResult as that worker (ingest/workers.py)


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
    if len(chosen) == n:  # a --limit or --sample that takes every example is the whole corpus: the same dataset
        limit = sample = None
        suffix = ""
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
        with progress_bar(len(self.plan.chosen) - len(self.stored), f"annotating ({self.annotator_name})", progress) as bar:
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


def ingest(
    store: Store,
    settings: RunSettings | None = None,
    *,
    progress: bool = True,
    loaded: LoadedModel | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
    as_worker: int | None = None,
    worker_threads: int | None = None,
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
    plans the run on one of the cluster's workers for all of them and runs each worker index as a Dask task, this
    process loading no model (ingest/distributed.py): the maps, and their order in storage, are those a single
    process would write, and it resumes the same way. `workers`: plan the run for that many worker
    processes (ingest/workers.py, `attnstore work`) instead of running it here; with `as_worker` I, this process
    then goes on as worker I of them (`worker_threads`: its torch threads), with the model it loaded to plan: one
    interpreter's imports and model load fewer than a separate `attnstore work`.
    """
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise InvalidArgumentError(f"--for-workers must be a positive number of worker processes, not {workers!r}")
    if worker_threads is not None and as_worker is None:
        raise InvalidArgumentError("--worker-threads sets the threads of --as-worker's work; give it with --as-worker I")
    if worker_threads is not None and (isinstance(worker_threads, bool) or not isinstance(worker_threads, int) or worker_threads < 1):
        raise InvalidArgumentError(f"--worker-threads must be a positive number of threads, not {worker_threads!r}")
    if as_worker is not None and (
        workers is None or isinstance(as_worker, bool) or not isinstance(as_worker, int) or not 0 <= as_worker < workers
    ):
        raise InvalidArgumentError(
            f"--as-worker {as_worker!r}: give it with --for-workers N, as an index 0..N-1"
            if workers is not None
            else "--as-worker I goes with --for-workers N: the planning process is then worker I of the N"
        )
    result, loaded = _ingest(store, settings, progress, loaded, scheduler, workers, options)
    if as_worker is None or result.already_complete:
        return result
    from .workers import work

    worked = work(store, result.run.name, as_worker, workers, threads=worker_threads, loaded=loaded, progress=progress)
    return replace(result, run=store.run_info(result.run.id), worked=worked)


def _ingest(store, settings, progress, loaded, scheduler, workers, options) -> tuple[IngestResult, LoadedModel]:
    if settings is None:
        settings = RunSettings.of(**options)
    elif options:
        raise TypeError(f"ingest() takes either a RunSettings or keyword settings, not both (got {sorted(options)})")
    from ..store.cluster import check_scheduler, current_scheduler

    scheduler = check_scheduler(scheduler) if scheduler is not None else current_scheduler()
    if workers is not None and scheduler is not None:
        raise InvalidArgumentError("--for-workers plans the run for worker processes; leave out --scheduler (or ATTNSTORE_SCHEDULER)")
    store.writer.require_writable()
    if scheduler is None:
        return _ingest_with(store, settings, progress, loaded, workers)
    source = corpus_source(settings)
    if source is not None:  # a bad corpus fails here, in one line, before a cluster is started
        plan_dataset(source, limit=settings.limit, sample=settings.sample, seed=settings.seed)
    from .distributed import ingest_on_cluster

    return ingest_on_cluster(store, settings, scheduler, progress, loaded, plan_for_cluster), loaded


def corpus_source(settings: RunSettings) -> CorpusSource | None:
    """The run's corpus, or None for a generated dataset (made from the model's tokenizer, once it is loaded)."""
    if settings.corpus is not None:
        assert settings.fmt is not None  # refused by RunSettings
        return file_source(settings.corpus, settings.fmt, settings.dataset_name, settings.split, **settings.read_options)
    if is_generated(settings.dataset):
        return None
    assert settings.dataset is not None  # refused by RunSettings: one of corpus and dataset
    return builtin_source(settings.dataset, settings.data_dir, window_words=settings.window_words)


def plan_for_cluster(
    store: Store,
    settings: RunSettings,
    workers: int,
    scheduler: str,
    loaded: LoadedModel | None = None,
    notes: Callable[[str], None] | None = None,
) -> tuple[IngestResult, LoadedModel]:
    """The planning ingest of a run on a Dask scheduler (ingest/distributed.py): as `ingest --for-workers workers`,
    except that a run planned already is taken whatever its worker count, and its notes go to `notes`."""
    return _ingest_with(store, settings, False, loaded, workers, scheduler, notes)


def _ingest_with(store, settings, progress, loaded, workers, scheduler=None, notes=None) -> tuple[IngestResult, LoadedModel]:
    """`_ingest` in this process, or planned for `workers` processes (with `scheduler`, a Dask cluster's: then a run
    planned already is taken as it is); `notes`: where the one-line notes go (default: printed to stderr)."""
    parallel = workers is not None  # parts written by other processes: no per-token extras
    note = notes or (lambda msg: print(msg, file=sys.stderr))
    how = where(scheduler, workers)
    started = time.perf_counter()
    source = corpus_source(settings)
    if settings.name is not None:
        refuse_if_busy(store, settings.name)  # fail at once, before reading the corpus or loading the model
    # The model and corpus are checked before anything is written: a bad --model or a bad
    # record leaves the store as it was.
    registered = store.model_row(settings.model) if loaded is None else None
    finetuned = registered if registered is not None and (registered.get("training") or {}).get("checkpoint") else None
    if finetuned is not None:  # a model fine-tuned in this store: its encoder, from the store's models folder
        loaded = load_model(str(models_folder(store) / finetuned["training"]["checkpoint"]))
    if source is None:
        assert settings.dataset is not None
        loaded = loaded or load_model(settings.model, device=settings.device, compute_dtype=settings.compute_dtype)
        limit = settings.max_length or loaded.max_length
        source = generated_source(settings.dataset, loaded, seed=settings.seed, max_length=limit, data_dir=settings.data_dir)
    plan = plan_dataset(source, limit=settings.limit, sample=settings.sample, seed=settings.seed)
    asked = ("--sample", settings.sample) if settings.sample is not None else ("--limit", settings.limit)
    if asked[1] is not None and plan.split == source.split:
        note(f"note: {asked[0]} {asked[1]} takes all {len(plan.chosen)} examples of the corpus: the run is over the whole corpus")
    loaded = loaded or load_model(settings.model, device=settings.device, compute_dtype=settings.compute_dtype)
    check_generation(loaded, settings.generate)
    settings = settings.resolved(model_max_length=loaded.max_length, gold=source.gold)
    assert settings.max_length is not None and settings.tokenization is not None  # resolved
    tier = choose_tier(settings, loaded, source, plan, scheduler or ("workers" if workers else None))
    run_name = settings.name or f"{source.name}-{plan.split}-{loaded.name}"
    validate_run_name(run_name)
    with (
        store.writer.lease(run_lease_name(run_name), f"run {run_name!r}") as lease,
        opened_dataset(store, plan, annotator=settings.annotator, progress=progress, notify=note) as load,
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
        if settings.value_norms and loaded.value_projections is not None:
            if not parallel:
                manifest[VALUE_NORMS_FLAG] = True
            else:
                note(f"note: value norms are not kept by an ingest {how} (weights=norm needs them)")
        elif settings.value_norms:
            note(f"note: model {loaded.name!r}: no value norms (its value and output projections were not found)")
        if settings.token_loss and loaded.causal:
            if loaded.lm is None:
                note(f"note: model {loaded.name!r}: no per-token loss (its checkpoint has no causal-LM head)")
            elif parallel:
                note(f"note: per-token loss is not kept by an ingest {how}")
            else:
                manifest[TOKEN_LOSS_FLAG] = token_loss_manifest()
                if decoder_layers(loaded.model, loaded.n_layers) is not None:  # massive activations, from the same pass
                    manifest[HIDDEN_PEAKS_FLAG] = peaks_manifest()
        if (settings.row_stats if settings.row_stats is not None else tier == "qk") and loaded.causal and loaded.capture == "streaming":
            if parallel:
                note(f"note: row statistics are not kept by an ingest {how}")
            else:
                manifest[ROW_STATS_FLAG] = row_stats.manifest()
        manifest["capture"] = capture_manifest(loaded)
        manifest["tier"] = tier
        if settings.generate:
            manifest["generation"] = generation_manifest(settings.generate)
        if tier == "qk":
            assert loaded.qk is not None  # choose_tier refuses otherwise
            manifest[QK_FLAG] = qk_entry(
                dtype=settings.qk_dtype,
                n_kv_heads=loaded.qk["n_kv_heads"],
                head_dim=loaded.qk["head_dim"],
                scales=loaded.qk["scales"],
                windows=loaded.qk["windows"],
            )
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
            return IngestResult(info, 0, 0.0, True), loaded
        entry = plan_entry(info, workers, any_count=scheduler is not None)  # a cluster runs a planned run's workers
        if entry is not None:
            return IngestResult(info, 0, 0.0, False, entry["parts"], already_planned=True), loaded
        kept = {"value norms": info.has_value_norms, "per-token loss": info.has_token_loss, "row statistics": info.has_row_stats}
        for what in (w for w, has in kept.items() if has and parallel):
            raise InvalidArgumentError(
                f"run {run_name!r} keeps {what}, which an ingest {how} does not compute: "
                f"resume it without {'--scheduler' if scheduler else '--for-workers'}"
            )
        done = store.writer.done_example_ids(info.id)
        total = len(plan.chosen) - len(done)
        run_started = time.perf_counter()
        writer = store.writer.run_writer(info.id, lease)
        try:
            with feed or nullcontext():
                examples = feed.examples() if feed is not None else store.writer.dataset_examples(dataset_id)
                batches = planned_batches(
                    examples,
                    loaded,
                    settings.tokenization,
                    settings.max_length,
                    settings.truncation,
                    settings.batch_size,
                    max_tokens=MAX_BATCH_TOKENS if info.qk else None,
                    generate=settings.generate,
                    done=done,
                    # planned for other processes: the ids alone, each worker aligning its part's tokens (ingest/workers.py)
                    aligned=not parallel or bool(settings.generate),
                )
                if workers is not None:
                    from .workers import plan_parts

                    parts = plan_parts(writer, done, batches, total, workers, loaded.source, settings.compute_dtype, progress)
                    writer.close()
                    return IngestResult(store.run_info(info.id), 0, time.perf_counter() - run_started, False, parts), loaded
                n_new = run_batches(writer, loaded, settings.dtype, info, done, batches, total, progress)
            seconds = time.perf_counter() - run_started
            timings = {"timings": {"total_seconds": time.perf_counter() - started}}
            info = writer.finish(seconds, timings)
        except BaseException:
            writer.close()  # its background chunk write ends before the run is marked interrupted
            mark_interrupted(store, info.id)
            raise
    return IngestResult(info, n_new, seconds, False), loaded
