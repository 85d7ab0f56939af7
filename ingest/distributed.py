"""Distributed ingest on Dask (`ingest --scheduler`): the engine-free workers of ingest/workers.py, launched as Dask
tasks, with the planning ingest itself one of them.

This process (the coordinator) neither imports torch nor loads the model: on a LocalCluster it would share the
workers' cores (a coordinator that loaded the model and planned started the workers' forward passes about 3 s later on
MRPC train, benchmarks/workers.py --dask). It starts the cluster (or connects to it), and each worker loads the run's
model by the name the command gives (`warm_task`). Worker 0 then runs the planning ingest (`plan_task`: exactly
`ingest --for-workers K`, K being the cluster's worker count, with the model it warmed: the corpus is read and the
dataset registered there, so a tcp:// cluster's workers must see the corpus file as they see the store). The
coordinator then sends one task per worker index of the plan (`work_task`): each runs `work()` in a Dask worker
with the model loaded in its process, taking its index's lease, and writes its parts straight into their cells; the
last to finish completes the run. Only the settings, the run's name and the store's locations travel through the
scheduler; the maps never do.

A run that is complete under its `--name` starts no cluster: this process checks the settings against it as a
one-process ingest does (the model loaded here). Interrupted (a worker dies, the command is killed): committed
examples stay, and the plan stays. Dask retries a task whose worker died; the same command later sends the tasks
again. A task whose index is still running elsewhere waits for it (`wait=True`), and a retried part's examples go to
fresh cells (ingest/workers.py). A run planned with `--for-workers N` may be run on a cluster too: its N indices are
sent as tasks.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from ..store import parts as planned
from ..store.cluster import client_for
from .errors import InvalidArgumentError
from .model import LoadedModel, load_model
from .progress import progress_bar
from .run_state import is_complete, refuse_if_busy
from .workers import LOADING, complete_run, warm_imports, work

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..store import Store
    from .runner import IngestResult
    from .settings import RunSettings

    # runner.plan_for_cluster, given by the runner (which this module does not import): (store, settings, workers,
    # scheduler, loaded=, notes=) -> (IngestResult, LoadedModel)
    Planner = Callable[..., tuple[IngestResult, LoadedModel]]

# Models loaded by this process when it is a Dask worker, by (source, compute dtype): loaded once, used by every task.
_WORKER_MODELS: dict[tuple[str, str], LoadedModel] = {}
# The source each model name a command gave was loaded from here (`warm_task`), by (name, compute dtype).
_WARMED_SOURCES: dict[tuple[str, str], str] = {}

POLL_SECONDS = 0.5  # how often the coordinator's progress bar reads the committed count


def _store(locations: dict) -> Store:
    from ..store import Store
    from ..store.config import Locations

    return Store(Locations(**locations))


def _kept(loaded: LoadedModel, compute_dtype: str) -> LoadedModel:
    """This worker's model for `loaded`'s source: the one loaded first, kept for the later tasks."""
    return _WORKER_MODELS.setdefault((loaded.source, compute_dtype), loaded)


def warm_task(model: str, compute_dtype: str) -> None:
    """On a Dask worker, first: load `model` (as the command names it) into this process's models, where `plan_task`
    and `work_task` find it. A model it cannot load by that name (one fine-tuned in the store) is loaded by the task
    that needs it; the imports are done meanwhile."""
    try:
        with LOADING:
            loaded = _kept(load_model(model, compute_dtype=compute_dtype), compute_dtype)
            _WARMED_SOURCES[(model, compute_dtype)] = loaded.source
    except Exception:
        warm_imports()


def plan_task(plan: Planner, locations: dict, settings: RunSettings, workers: int, scheduler: str) -> tuple[IngestResult, list[str]]:
    """On a Dask worker: `plan` (runner.plan_for_cluster), the planning ingest of a run for `workers` (or the run's
    plan as it stands, whatever its worker count), with the model this worker warmed; returns its result and the notes
    it would have printed."""
    store = _store(locations)
    notes: list[str] = []
    try:
        source = _WARMED_SOURCES.get((settings.model, settings.compute_dtype))
        loaded = _WORKER_MODELS.get((source, settings.compute_dtype)) if source else None
        result, loaded = plan(store, settings, workers, scheduler, loaded=loaded, notes=notes.append)
        if loaded is not None:
            _kept(loaded, settings.compute_dtype)
        return result, notes
    finally:
        store.engine.dispose()


def work_task(locations: dict, run: str, worker: int, workers: int) -> int:
    """On a Dask worker: be worker `worker` of `workers` of the planned `run`; returns examples stored."""
    store = _store(locations)
    try:
        entry = planned.plan_of(store, store.run_info(run).id) or {}
        key = (entry.get("model", ""), entry.get("compute_dtype", "float32"))
        with LOADING:  # a worker's tasks may be threads of one process
            loaded = _WORKER_MODELS.get(key)
            if loaded is None and key[0]:
                loaded = _WORKER_MODELS[key] = load_model(key[0], compute_dtype=key[1])
        return work(store, run, worker, workers, loaded=loaded, wait=True, progress=False).n_new
    finally:
        store.engine.dispose()


def ingest_on_cluster(
    store: Store, settings: RunSettings, scheduler: str, progress: bool, loaded: LoadedModel | None, plan: Planner
) -> IngestResult:
    """Ingest as `settings` say on the scheduler's workers, `plan` (runner.plan_for_cluster) planning it on one of
    them; `loaded`: a model loaded already (its source is what the workers load)."""
    started = time.perf_counter()
    if settings.name is not None:
        refuse_if_busy(store, settings.name)  # before a cluster is started
        if is_complete(store, settings.name):  # checked against the settings here, as in one process; no cluster
            result, _ = plan(store, settings, 1, scheduler, loaded=loaded)
            if result.already_complete:
                return result
    if loaded is not None:  # the workers load it from where it was loaded
        settings = replace(settings, model=loaded.source)
    model = settings.model
    with client_for(scheduler) as client:
        addresses = sorted(client.scheduler_info().get("workers", {}))
        if not addresses:  # its tasks would wait for a worker, with nothing said
            raise InvalidArgumentError(
                f"the Dask scheduler at {scheduler} has no workers: start them with `dask worker {scheduler}`, then run this again"
            )
        # Each worker loads the model while the cluster is otherwise idle; then worker 0 plans with it.
        warming = [client.submit(warm_task, model, settings.compute_dtype, pure=False, workers=[a]) for a in addresses]
        pinned: dict[str, Any] = dict(workers=addresses[:1], allow_other_workers=True)
        locations = asdict(store.locations)
        n_workers = len(addresses)
        result, notes = client.submit(plan_task, plan, locations, settings, n_workers, scheduler, pure=False, **pinned).result()
        for note in notes:
            print(note, file=sys.stderr)
        info = result.run
        if result.already_complete:
            return result
        n_new = _run_workers(client, store, info, addresses, locations, progress)
        del warming  # kept until the work tasks are sent: a future let go may be cancelled before it runs
        info = store.run_info(info.id)
        if info.status != "complete":  # the last worker completes it; one that lost the race to do so leaves it
            complete_run(store, info)
            info = store.run_info(info.id)
    return replace(result, run=info, n_new=n_new, seconds=time.perf_counter() - started, planned_parts=0, already_planned=False)


def _run_workers(client, store: Store, info, addresses: list[str], locations: dict, progress: bool) -> int:
    """Send one `work_task` per worker index of the run's plan and wait for them; returns the examples stored."""
    from distributed import wait

    entry = planned.plan_of(store, info.id)
    assert entry is not None  # planned by plan_task
    n_workers = int(entry["workers"])
    states = planned.part_states(store, info.id)
    start = planned.committed(store, info.id)
    total = sum(p.n_examples for p in states if not p.finished)
    # Index i to worker i: left to the scheduler, two indices may queue on one worker while another is still warming
    # (both then run there, one after the other); allowed elsewhere when that worker is gone.
    futures = [
        client.submit(
            work_task,
            locations,
            info.name,
            i,
            n_workers,
            pure=False,
            workers=[addresses[i % len(addresses)]],
            allow_other_workers=True,
        )
        for i in range(n_workers)
    ]
    try:
        with progress_bar(total, f"ingesting {info.name} on {n_workers} workers", progress) as bar:
            shown = 0
            while not all(f.done() for f in futures):
                with contextlib.suppress(TimeoutError):  # back as soon as the last task ends, not up to a poll later
                    wait(futures, timeout=POLL_SECONDS)
                now = planned.committed(store, info.id) - start
                bar.update(now - shown)
                shown = now
            n_new = sum(f.result() for f in futures)  # a task's error is raised here
            bar.update(n_new - shown)
    except BaseException:
        client.cancel(futures)
        raise
    return n_new
