"""Distributed ingest on Dask (`ingest --scheduler`): the engine-free workers of ingest/workers.py, launched as Dask
tasks.

This process (the coordinator) starts the cluster (or connects to it) first, and each worker loads the run's model
by the name the command gives (`warm_task`) while the coordinator loads it too, holds the run's write lease and plans
the run for K workers, K being the cluster's worker count when the run is first planned, exactly as `ingest
--for-workers K` would (`plan_parts`: the parts' batches of token ids and their cells, in SQL). It then sends K tasks,
one per worker index, and each runs `work()` in a Dask worker: it takes its index's lease, uses the model loaded in
its process (kept there for later tasks; loaded now if the warm-up loaded another) and writes its parts straight
into their cells. Only the run's name and the store's locations travel through the
scheduler; the maps never do. When the tasks are done, the coordinator writes the index arrays from SQL, cuts the
array to the committed end and completes the run (a worker never completes it: the coordinator holds its lease).

Interrupted (a worker dies, the command is killed): committed examples stay, and the plan stays. Dask retries a task
whose worker died; the same command later sends the tasks again. A task whose index is still running elsewhere
waits for it (`wait=True`), and a retried part's examples go to fresh cells (ingest/workers.py). A run planned with
`--for-workers N` may be run on a cluster too: its N indices are sent as tasks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Set
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ..store import parts as planned
from ..store.cluster import client_for
from .align import Encoded
from .model import LoadedModel, load_model
from .progress import progress_bar
from .workers import LOADING, plan_parts, warm_imports, work

if TYPE_CHECKING:
    from ..store.writer import RunWriter

# Models loaded by this process when it is a Dask worker, by (source, compute dtype): loaded once, used by every task.
_WORKER_MODELS: dict[tuple[str, str], LoadedModel] = {}

POLL_SECONDS = 0.5  # how often the coordinator's progress bar reads the committed count


def work_task(locations: dict, run: str, worker: int, workers: int) -> int:
    """On a Dask worker: be worker `worker` of `workers` of the planned `run`; returns examples stored."""
    from ..store import Store
    from ..store.config import Locations

    store = Store(Locations(**locations))
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


def warm_task(model: str, compute_dtype: str) -> None:
    """On a Dask worker, while the coordinator loads the model and plans: load `model` (as the command names it) into
    this process's models, where `work_task` finds it by the source the plan records. A model it cannot load by that
    name (one fine-tuned in the store) is loaded by `work_task` from the plan; the imports are done meanwhile."""
    try:
        with LOADING:
            loaded = load_model(model, compute_dtype=compute_dtype)
            _WORKER_MODELS.setdefault((loaded.source, compute_dtype), loaded)
    except Exception:
        warm_imports()


class Cluster:
    """An ingest's Dask client: started at once with each worker sent a `warm_task` (`warm`), or on first use (a run
    that turns out complete, or fails its checks, starts none)."""

    def __init__(self, spec: str, stack: contextlib.ExitStack, model: str, compute_dtype: str, warm: bool) -> None:
        self.spec = spec
        self._stack = stack
        self._client: Any = None
        self.warming: list = []  # kept until the work tasks are sent: a future let go may be cancelled before it runs
        if warm:
            workers = self.client.scheduler_info().get("workers", {})
            self.warming = [self.client.submit(warm_task, model, compute_dtype, pure=False, workers=[w]) for w in workers]

    @property
    def client(self):
        if self._client is None:
            self._client = self._stack.enter_context(client_for(self.spec))
        return self._client


@contextlib.contextmanager
def started_cluster(spec: str, model: str, compute_dtype: str, warm: bool = True) -> Iterator[Cluster]:
    """The scheduler's client for an ingest. With `warm`, a `local` cluster is started at once and each worker loads
    the model while the coordinator does (3 processes on 2 cores), instead of after its plan: the workers start
    computing about 2 s sooner on MRPC train (benchmarks/workers.py --dask)."""
    with contextlib.ExitStack() as stack:
        yield Cluster(spec, stack, model, compute_dtype, warm)


def ingest_on_cluster(
    cluster: Cluster,
    writer: RunWriter,
    loaded: LoadedModel,
    compute_dtype: str,
    done: Set[int],
    batches: Iterable[list[Encoded]],
    total: int,
    progress: bool,
) -> int:
    """Store the run's missing examples on the scheduler's workers; returns how many were stored. `writer` is the
    coordinator's (it holds the lease and finishes the run); it writes no cells itself."""
    from distributed import wait

    info, store = writer.info, writer.store
    client = cluster.client
    entry = planned.plan_of(store, info.id)
    if entry is None:
        n_workers = max(1, len(client.scheduler_info().get("workers", {})))
        plan_parts(writer, done, batches, total, n_workers, loaded.source, compute_dtype, progress)
        entry = planned.plan_of(store, info.id)
        assert entry is not None
    n_workers = int(entry["workers"])
    locations = asdict(store.locations)
    start = planned.committed(store, info.id)
    # Index i to worker i: left to the scheduler, two indices may queue on one worker while another is still warming
    # (both then run there, one after the other); allowed elsewhere when that worker is gone.
    addresses = sorted(client.scheduler_info().get("workers", {}))
    futures = [
        client.submit(
            work_task,
            locations,
            info.name,
            i,
            n_workers,
            pure=False,
            workers=[addresses[i % len(addresses)]] if addresses else None,
            allow_other_workers=True,
        )
        for i in range(n_workers)
    ]
    cluster.warming.clear()  # done or not, nothing to wait for: each worker runs its tasks in order
    try:
        with progress_bar(total, f"ingesting {info.name} on {n_workers} workers", progress) as bar:
            shown = 0
            while not all(f.done() for f in futures):
                with contextlib.suppress(TimeoutError):  # back as soon as the last task ends, not up to a poll later
                    wait(futures, timeout=POLL_SECONDS)
                writer.lease.check()  # keeps the coordinator's lease fresh while the workers run
                now = planned.committed(store, info.id) - start
                bar.update(now - shown)
                shown = now
            n_new = sum(f.result() for f in futures)  # a task's error is raised here
            bar.update(n_new - shown)
    except BaseException:
        client.cancel(futures)
        raise
    return n_new
