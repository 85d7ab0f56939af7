"""The Dask distributed scheduler that ingest and queries may run on: `--scheduler local[:N] | tcp://HOST:PORT`.

- `local` starts a LocalCluster with one single-threaded worker process per core, `local:N`
  with N; it is closed when the command ends.
- `tcp://HOST:PORT` connects to a running scheduler (`dask scheduler`, `dask worker`); its
  workers need attnstore installed and must reach the store's database and array root
  (PostgreSQL and object storage for a real cluster; SQLite and a local folder work for `local`).
  Start them with `DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False`, as `local` does: Dask's
  profiler slows the Python-bound parts of an ingest (imports, planning, writing) by up to 1.5x.
- ATTNSTORE_SCHEDULER sets the same for every command; `--scheduler` overrides it.

What runs there: ingest's plan, forward passes and writes (ingest/distributed.py) and queries' per-example passes
(queries/engine/passes.py). Needs the `dask` extra (`pip install 'attnstore[dask]'`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import re
from collections.abc import Iterator, Sequence

import numpy as np

from .errors import InvalidArgumentError

ENV_SCHEDULER = "ATTNSTORE_SCHEDULER"
PARTS_PER_WORKER = 2
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


CONNECT_TIMEOUT_S = 10  # how long to try a tcp:// scheduler before the one-line error


@contextlib.contextmanager
def client_for(spec: str) -> Iterator:
    """A dask.distributed Client for the spec; a `local` cluster lives as long as the block."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise InvalidArgumentError(f"scheduler {spec!r} needs Dask distributed: pip install 'attnstore[dask]'") from None
    if spec.startswith("tcp://"):
        try:
            client = Client(spec, timeout=f"{CONNECT_TIMEOUT_S}s")
        except OSError as exc:
            raise InvalidArgumentError(f"cannot reach the Dask scheduler at {spec} ({exc}); start one with `dask scheduler`") from None
        with client:
            yield client
        return
    n = int(spec.split(":", 1)[1]) if ":" in spec else os.cpu_count() or 1
    import dask

    # Its workers' own logs are not shown (e.g. "ended with CancelledError" for a task still running when the command
    # stops early, or a failed task's arguments and traceback): a task's error is raised in the command, in one line.
    # Nor do they run Dask's statistical profiler, which samples every thread's stack with the GIL 100 times a second:
    # a worker then imported torch and loaded a model in 7.1-8.3 s instead of 4.7-5.4 s, and an ingest of MRPC train
    # took 47 s instead of 41 s (docs/PERFORMANCE.md, 2026-11-30 (morning)).
    with dask.config.set({"distributed.worker.profile.enabled": False}):
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.CRITICAL)
    with cluster, Client(cluster) as client:
        yield client


def split(examples: Sequence[int] | np.ndarray, parts: int) -> list[list[int]]:
    """Contiguous, non-empty, near-equal ranges of `examples` (kept in order)."""
    parts = max(1, min(parts, len(examples)))
    return [list(chunk) for chunk in np.array_split(np.asarray(examples, dtype=np.int64), parts) if len(chunk)]
