"""Engine-free workers: a run planned once (`attnstore ingest --for-workers N`), its parts computed by N independent
processes that share only the store (`attnstore work --run R --worker I --of N`): a Slurm array, a Kubernetes
Indexed Job, a Ray actor pool, or N shells.

The plan (`plan_parts`, in the planning ingest's process, which holds the run's lease while it plans) tokenizes the
dataset into the batches one process would run, keeping each example's token ids (a worker aligns its part's tokens
to their words: `_encoded`), and groups them into parts (`part_size`): each part gets a disjoint
range of cells starting on a chunk boundary, and the array is grown over all of them. store/parts.py keeps the parts
and their digest. A Dask ingest plans the same way and runs these workers as tasks (ingest/distributed.py).

A worker (`work`) holds a lease on its index (a second process with the same index is refused), loads the model
once and takes parts under a lease each: its own (I, I+N, I+2N, ...) first, then the others' not taken, from the
last (`_claim_next`), so the work balances itself. For each part it counts an attempt, writes the part's examples
not yet committed, each batch's rows committed under its lease once the cells are on disk (the one-process
writer, with the part's cells), and marks the part finished. A retried part's examples go to fresh cells past the
array's end. Whichever worker finds every part finished completes the run (the index arrays from SQL, the array
cut to its committed end), under the run's lease; a worker of a complete run says so and does nothing.

The maps equal a one-process run's bit for bit: the same batches (same padding), from the plan.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

from ..store import arrays, block_writer
from ..store import parts as planned
from ..store.errors import BusyError, ConflictError, NotFoundError
from ..store.leases import live_holder
from ..store.writer import run_lease_name
from .align import Encoded, encode_batch
from .errors import InvalidArgumentError
from .model import LoadedModel, load_model
from .passes import run_batches
from .progress import progress_bar

# Batches per part at most: the unit a worker takes (and retries); each part ends in one partial chunk (its only waste).
PART_BATCHES = 4
# Parts per worker at least, where there are batches enough: the last parts to finish then hold the fewest batches.
PARTS_PER_WORKER = 4


def part_size(n_batches: int, workers: int) -> int:
    """Batches per part: PART_BATCHES, or fewer so that each worker gets PARTS_PER_WORKER parts."""
    return max(1, min(PART_BATCHES, -(-n_batches // (PARTS_PER_WORKER * workers))))


ENCODED_FIELDS = tuple(f.name for f in fields(Encoded))

# One model load at a time in a process: transformers' loading is not thread-safe (two at once in threads fail with
# "Tensor on device cpu is not on the expected device meta"), and workers may be threads (a Dask worker's tasks).
LOADING = threading.Lock()

# The environment variables that give a worker its index and the worker count, in the order they are looked at.
INDEX_VARIABLES = ("ATTNSTORE_WORKER", "SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX")
COUNT_VARIABLES = ("ATTNSTORE_WORKERS", "SLURM_ARRAY_TASK_COUNT")


def plan_parts(writer, done, batches, total: int, workers: int, model: str, compute_dtype: str, progress: bool) -> int:
    """Tokenize and plan the run's missing examples for `workers` processes; returns the number of parts. `writer` is
    the planning ingest's (it holds the run's lease); it writes no cells."""
    info, store = writer.info, writer.store
    per_pair = info.n_layers * info.n_heads
    next_free = writer.blocks.next_offset  # a chunk boundary past every cell written or allotted before
    block = writer.blocks.block_cells
    found: list[planned.PlannedPart] = []

    def add(part: list[list[Encoded]]) -> None:
        nonlocal next_free
        examples = [e for batch in part for e in batch]
        sizes = (per_pair * e.length**2 for e in examples if e.input_ids and e.example_id not in done)
        stop = block_writer.placed_end(next_free, sizes, block)  # placed as the worker's writer places them
        blob = planned.pack([[_fields(e) for e in batch] for batch in part])
        found.append(planned.PlannedPart(len(found), blob, len(examples), next_free, stop))
        next_free = block_writer.resume_offset(stop, info.chunk_cells)

    todo: list[list[Encoded]] = []
    with progress_bar(total, f"planning {info.name}", progress) as bar:
        for batch in batches:
            if not all(e.example_id in done for e in batch):
                todo.append(batch)
                bar.update(sum(1 for e in batch if e.example_id not in done))
    size = part_size(len(todo), workers)
    for first in range(0, len(todo), size):
        add(todo[first : first + size])
    writer.lease.check()
    array = writer.blocks.array
    if found and array.shape[0] < found[-1].cell_stop:
        array.resize((found[-1].cell_stop,))  # before any worker starts: workers never grow the array over a plan
    if writer.index is not None:  # SQL runs ahead of the index arrays until the run completes: `check` knows
        writer.index.group.attrs.update({arrays.INDEX_PENDING: True})
    entry = dict(
        workers=workers,
        parts=len(found),
        digest=planned.digest(workers, found),
        model=model,
        compute_dtype=compute_dtype,
    )
    planned.save_plan(store, info, found, entry)
    return len(found)


def _fields(e: Encoded) -> dict:
    """An example's fields for JSON, as `Encoded(**fields)` reads them back (dataclasses.asdict deep-copies every
    token's dict: 15 % of planning 1,600 MRPC pairs, by py-spy). Planned without its tokens (`encode_batch(...,
    aligned=False)`), it has no "tokens": the worker aligns them (`_encoded`)."""
    return {f: getattr(e, f) for f in ENCODED_FIELDS if f != "tokens" or e.tokens}


def check_worker(worker: int | None, of: int | None) -> tuple[int, int | None]:
    """The worker's index and count: as given, else from the scheduler's environment (`INDEX_VARIABLES`)."""
    if worker is None:
        named = next((v for v in INDEX_VARIABLES if os.environ.get(v, "").strip()), None)
        if named is None:
            raise InvalidArgumentError(f"give --worker I (or set one of {', '.join(INDEX_VARIABLES)})")
        try:
            worker = int(os.environ[named])
        except ValueError:
            raise InvalidArgumentError(f"{named}={os.environ[named]!r} is not a worker index (0, 1, ...)") from None
    if of is None:
        named = next((v for v in COUNT_VARIABLES if os.environ.get(v, "").strip()), None)
        if named is not None:
            try:
                of = int(os.environ[named])
            except ValueError:
                raise InvalidArgumentError(f"{named}={os.environ[named]!r} is not a worker count") from None
    if worker < 0:
        raise InvalidArgumentError(f"worker index {worker} is negative: workers are numbered 0..N-1")
    return worker, of


@dataclass(frozen=True)
class WorkResult:
    run: str
    worker: int
    workers: int
    parts: int  # parts this worker wrote examples of
    n_new: int
    seconds: float
    parts_left: int  # parts of the run not finished when this worker stopped
    completed: bool  # this worker completed the run
    already_complete: bool


def work(
    store,
    run: str,
    worker: int | None = None,
    of: int | None = None,
    *,
    device: str = "auto",
    threads: int | None = None,
    wait: bool = False,
    loaded: LoadedModel | None = None,
    progress: bool = True,
) -> WorkResult:
    """Be worker `worker` of the `of` the run was planned for: compute and store its parts, then complete the run if
    every part is in. `device` may name the worker's index: `cuda:{worker}`. `threads`: torch's threads (default:
    torch's own choice, every core; give N workers on one host cores/N each). `wait`: if a process with this index is
    running, wait until it ends or goes silent past the lease's stale period (a restarted index on another host),
    rather than stop; and if the run is not planned yet (its planning ingest is running, or has not created it yet),
    wait for the plan, with torch and transformers imported meanwhile. `loaded`: the model, loaded already (a Dask
    worker keeps it for its later tasks)."""
    store.writer.require_writable()
    worker, of = check_worker(worker, of)
    on = device.replace("{worker}", str(worker))
    preloaded: dict[tuple[str, str], LoadedModel] = {}
    info = _wait_for_plan(store, run, progress, None if loaded else lambda m: _preload(m, on, preloaded)) if wait else store.run_info(run)
    if info.status == "complete":
        return WorkResult(info.name, worker, of or 0, 0, 0, 0.0, 0, False, True)
    entry = planned.plan_of(store, info.id)
    if entry is None:
        raise InvalidArgumentError(
            f"run {info.name!r} was not planned for worker processes; plan it with the ingest command that made it plus --for-workers N"
        )
    workers = int(entry["workers"])
    loaded = loaded or preloaded.get((entry["model"], entry["compute_dtype"]))
    if of is not None and of != workers:
        raise ConflictError(
            f"run {info.name!r} was planned for {workers} workers, and this one was started as one of {of}: start "
            f"workers 0..{workers - 1} with --of {workers} (a plan's worker count is fixed when it is made)"
        )
    if worker >= workers:
        raise InvalidArgumentError(f"worker {worker} does not exist: run {info.name!r} was planned for workers 0..{workers - 1}")
    what = f"worker {worker} of {workers} of run {info.name!r}"
    try:
        on_wait = (lambda msg: print(msg, file=sys.stderr)) if progress else None
        lease = store.writer.lease(f"run:{info.name}:worker:{worker}/{workers}", what, wait=wait, on_wait=on_wait)
    except BusyError:
        holder = live_holder(store.engine, f"run:{info.name}:worker:{worker}/{workers}")
        by = holder.describe() if holder is not None else "another process"
        raise BusyError(
            f"{what} is running already ({by}): one process per index; this one stops (--wait: wait for it to end or go "
            f"silent past the lease's stale period, as a restarted index on another host must)"
        ) from None
    started = time.perf_counter()
    n_new = n_parts = 0
    try:
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        todo = sum(p.n_examples for p in planned.part_states(store, info.id) if not p.finished)
        with progress_bar(todo, f"worker {worker}/{workers} {info.name}", progress) as bar:
            while (claimed := _claim_next(store, info, worker, workers)) is not None:
                state, part_lease = claimed
                try:
                    _check_plan(store, info, entry)
                    if loaded is None:  # loaded once, and only when there is something to compute
                        with LOADING:
                            loaded = load_model(entry["model"], device=on, compute_dtype=entry["compute_dtype"])
                    written = _work_part(store, info, loaded, state, part_lease)
                finally:
                    part_lease.release()
                n_new += written
                n_parts += 1 if written else 0
                bar.update(state.n_examples)
        left = sum(1 for p in planned.part_states(store, info.id) if not p.finished)
    finally:
        lease.release()
    completed = not left and complete_run(store, info)
    return WorkResult(info.name, worker, workers, n_parts, n_new, time.perf_counter() - started, left, completed, False)


PLAN_POLL_SECONDS = 0.2  # a worker started with its planner notices the plan this late at most


def warm_imports() -> None:
    """Import what a model load needs (torch, transformers' auto classes): most of a worker's start-up."""
    import torch  # noqa: F401
    import transformers

    transformers.AutoConfig, transformers.AutoModel, transformers.AutoTokenizer  # noqa: B018 (their lazy imports)


def _preload(manifest: dict, device: str, into: dict) -> None:
    """Load the model a run being planned names in its manifest (its source and compute dtype), into `into`; one this
    host cannot load is left to the worker's load after the plan, which says why."""
    source = (manifest.get("model") or {}).get("source")
    dtype = (manifest.get("capture") or {}).get("compute_dtype", "float32")
    if not source:
        return
    try:
        with LOADING:
            into[(source, dtype)] = load_model(source, device=device, compute_dtype=dtype)
    except Exception:
        pass


def _wait_for_plan(store, run: str, progress: bool, preload: Callable[[dict], None] | None = None):
    """The run once it is planned or complete. Meanwhile the imports a model load needs are done (most of a worker's
    start-up: 6.7 of the 12.4 s of planning MRPC train, by py-spy), so a worker started with its planner is ready when
    the plan is; and once the planner has made the run, `preload` is given its manifest to load the model it names
    while the plan is made, not after it (a large corpus's plan, or a large model's load, takes long). A run that
    exists unplanned with no process writing it is returned as it is (refused by the caller)."""
    told = False
    warmed = False
    while True:
        try:
            info = store.run_info(run)
        except NotFoundError:
            info = None
        if info is not None and (info.status == "complete" or planned.plan_of(store, info.id) is not None):
            return info
        if info is not None and live_holder(store.engine, run_lease_name(info.name)) is None:
            return info  # not planned, and nobody is planning it
        if progress and not told:
            print(f"waiting for run {run!r} to be planned (attnstore ingest ... --for-workers N)", file=sys.stderr)
            told = True
        if not warmed:
            warm_imports()
            warmed = True
            continue
        if info is not None and preload is not None:
            preload(info.manifest)
            preload = None
            continue
        time.sleep(PLAN_POLL_SECONDS)


def _claim_next(store, info, worker: int, workers: int):
    """The next part to compute and its lease, or None: this worker's own parts (I, I+N, ...) first, then the other
    workers' from the last one back. A worker that starts late or runs slow leaves its parts to the others, and a
    part held by a live process is never computed twice at once. A part whose process died is taken over (at once on
    the same host, after the lease's stale period elsewhere) and retried."""
    unfinished = [p for p in planned.part_states(store, info.id) if not p.finished]
    own = [p for p in unfinished if p.part % workers == worker]
    others = [p for p in reversed(unfinished) if p.part % workers != worker]
    for state in own + others:
        try:
            lease = store.writer.lease(planned.part_lease_name(info.name, state.part), f"part {state.part} of run {info.name!r}")
        except BusyError:
            continue  # another worker computes it
        now = planned.part_state(store, info.id, state.part)
        if now is not None and not now.finished:
            return now, lease
        lease.release()  # finished meanwhile by the worker that held it
    return None


def _check_plan(store, info, entry: dict) -> None:
    """The plan this worker read is still the run's (the run was not deleted and planned again meanwhile)."""
    now = planned.plan_of(store, info.id)
    if now is None or now.get("digest") != entry["digest"]:
        raise ConflictError(
            f"the plan of run {info.name!r} changed while this worker ran (digest {entry['digest'][:12]} -> "
            f"{(now or {}).get('digest', 'none')[:12]}): stopped; start the workers of the new plan"
        )


def _work_part(store, info, loaded, state: planned.PartState, lease) -> int:
    """Store the part's examples not committed yet; returns how many were stored."""
    started = time.perf_counter()
    part = planned.part_batches(store, info.id, state.part)
    ids = {e["example_id"] for batch in part for e in batch}
    done = store.writer.done_example_ids(info.id) & ids
    n = 0
    if len(done) < len(ids):
        batches = _encoded(store, info, loaded, part)
        attempt = planned.begin_attempt(store, info.id, state.part, lease)
        cells = (state.cell_start, state.cell_stop)
        if attempt > 1:  # an earlier attempt was cut off: its cells may still be written by it
            per_pair = info.n_layers * info.n_heads
            sizes = [per_pair * e.length**2 for batch in batches for e in batch if e.input_ids and e.example_id not in done]
            cells = planned.allot_past_end(store, info, sizes)
        writer = store.writer.run_writer(info.id, lease, part=cells)
        try:
            n = run_batches(writer, loaded, info.dtype, writer.info, done, batches, total=0, progress=False, overlap=False)
            writer.commit(final=True)  # the part's last, partial chunk
        finally:
            writer.close()
    planned.finish_part(store, info.id, state.part, lease, time.perf_counter() - started)
    return n


def _encoded(store, info, loaded, part: list[list[dict]]) -> list[list[Encoded]]:
    """A part's planned batches as the forward passes take them. Where the plan kept an example's ids alone, its tokens
    are aligned here from its stored words, as the planner would have (ingest/align.py): 0.6 of the 1.0 s that
    encoding MRPC train takes, off the plan that every worker waits for and spread over the workers (no gain with 2
    workers on 2 cores, where the work only moves: docs/PERFORMANCE.md, 2026-11-30 (night)). The ids must come out as
    planned, else this host's tokenizer is not the planner's and the worker stops."""
    todo = [e for batch in part for e in batch if "tokens" not in e and e["input_ids"]]
    aligned: dict[int, Encoded] = {}
    if todo:
        examples = store.writer.examples_by_id([e["example_id"] for e in todo])
        tokenizer = loaded.tokenizer_for(info.tokenization)
        for plan, enc in zip(todo, encode_batch(tokenizer, examples, info.max_length, info.truncation, info.tokenization)):
            if [enc.input_ids, enc.token_type_ids, enc.truncated, enc.full_length] != [
                plan["input_ids"],
                plan["token_type_ids"],
                plan["truncated"],
                plan["full_length"],
            ]:
                raise ConflictError(
                    f"example {enc.position} of run {info.name!r}: this worker's tokenizer encodes it otherwise than the "
                    f"planner's did (ids {enc.input_ids[:8]}... against {plan['input_ids'][:8]}...): give every worker the "
                    f"planner's model files and the same transformers and tokenizers versions"
                )
            aligned[enc.example_id] = enc
    return [[aligned[e["example_id"]] if e["example_id"] in aligned else Encoded(**{"tokens": [], **e}) for e in batch] for batch in part]


def complete_run(store, info) -> bool:
    """Complete a run whose parts are all finished: the index arrays from SQL, the array cut to its committed end.
    False when another process is completing it (it holds the run's lease)."""
    try:
        lease = store.writer.lease(run_lease_name(info.name), f"run {info.name!r}")
    except BusyError:
        return False
    with lease:
        if store.run_info(info.id).status == "complete":
            return False
        writer = store.writer.run_writer(info.id, lease)
        writer.finish(0.0, rebuild_index=True)  # the seconds are the parts' (store/parts.finish_part)
    return True
