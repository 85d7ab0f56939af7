"""Running the per-example pass of a query on Dask distributed: `--scheduler local[:N] | tcp://HOST:PORT`.

A query's costly part is one pass that decodes every map of a run and keeps a few numbers per
example (queries/summary.py). With a scheduler, the run's committed examples are cut into
contiguous ranges in storage order (a few per worker, so a slow worker does not hold the rest
back), each worker opens the same store (its database URL and array root: PostgreSQL and
object storage for a real cluster; SQLite and a local folder work for `local`), summarises its
range, and the parts are concatenated in order: the result equals the one-process pass exactly.

- `local` starts a LocalCluster with one single-threaded worker process per core, `local:N`
  with N; it is closed when the query ends.
- `tcp://HOST:PORT` connects to a running scheduler (`dask scheduler`, `dask worker`); its
  workers need attnstore installed and must reach the store's database and array root.
- ATTNSTORE_SCHEDULER sets the same for every command; `--scheduler` overrides it.

Needs the `dask` extra (`pip install 'attnstore[dask]'`).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
from collections.abc import Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING

import numpy as np

from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo
    from .summary import SummaryKind

ENV_SCHEDULER = "ATTNSTORE_SCHEDULER"
PARTS_PER_WORKER = 4
_SCHEDULER: contextvars.ContextVar[str | None] = contextvars.ContextVar("attnstore_scheduler", default=None)
_FORMS = "local, local:N (N worker processes) or tcp://HOST:PORT (a running Dask scheduler)"


def check_scheduler(spec: str | None) -> str | None:
    """The spec as given, or InvalidArgumentError naming the accepted forms; None and '' mean no scheduler."""
    if spec is None or not spec.strip():
        return None
    spec = spec.strip()
    if spec == "local" or re.fullmatch(r"local:[1-9]\d*", spec) or re.fullmatch(r"tcp://[^\s/:]+:\d+", spec):
        return spec
    raise InvalidArgumentError(f"scheduler {spec!r} is not understood; use {_FORMS}")


def current_scheduler() -> str | None:
    """The scheduler in effect: the innermost `use_scheduler`, else ATTNSTORE_SCHEDULER, else None (one process)."""
    given = _SCHEDULER.get()
    return given if given is not None else check_scheduler(os.environ.get(ENV_SCHEDULER))


@contextlib.contextmanager
def use_scheduler(spec: str | None) -> Iterator[None]:
    """Run the queries inside on this scheduler ('' or None: the environment's, or one process)."""
    token = _SCHEDULER.set(check_scheduler(spec))
    try:
        yield
    finally:
        _SCHEDULER.reset(token)


@contextlib.contextmanager
def client_for(spec: str) -> Iterator:
    """A dask.distributed Client for the spec; a `local` cluster lives as long as the block."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise InvalidArgumentError(f"scheduler {spec!r} needs Dask distributed: pip install 'attnstore[dask]'") from None
    if spec.startswith("tcp://"):
        try:
            client = Client(spec, timeout="10s")
        except OSError as exc:
            raise InvalidArgumentError(f"cannot reach the Dask scheduler at {spec} ({exc}); start one with `dask scheduler`") from None
        with client:
            yield client
        return
    n = int(spec.split(":", 1)[1]) if ":" in spec else os.cpu_count() or 1
    with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, Client(cluster) as client:
        yield client


def split(examples: list[int], parts: int) -> list[list[int]]:
    """Contiguous, non-empty, near-equal ranges of `examples` (kept in order)."""
    parts = max(1, min(parts, len(examples)))
    return [list(chunk) for chunk in np.array_split(np.asarray(examples, dtype=np.int64), parts) if len(chunk)]


def _summarise_part(locations: dict, run_id: int, kind_name: str, examples: list[int]) -> dict[str, np.ndarray]:
    """On a worker: open the store read-only and summarise one range of the run's examples."""
    from ..store import Store
    from ..store.config import Locations
    from .summary import kind_named, summarise_examples

    store = Store(Locations(**{**locations, "read_only": True}))
    try:
        return summarise_examples(store, store.run_info(run_id), kind_named(kind_name), examples)
    finally:
        store.engine.dispose()


def summarise_on(spec: str, store: Store, info: RunInfo, kind: SummaryKind, examples: list[int]) -> dict[str, np.ndarray]:
    """The kind's summary of `examples` (storage order), computed on the scheduler's workers."""
    from .summary import concatenate

    locations = asdict(store.locations)
    with client_for(spec) as client:
        workers = max(1, len(client.scheduler_info().get("workers", {})))
        ranges = split(examples, workers * PARTS_PER_WORKER)
        n = len(ranges)
        futures = client.map(_summarise_part, [locations] * n, [info.id] * n, [kind.name] * n, ranges, pure=False)
        parts = client.gather(futures)
    return concatenate(kind, parts)
