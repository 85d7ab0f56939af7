"""What a run's state in the store allows an ingest: busy (another process writes it), complete, planned for worker
processes (then written by them alone), and marking it interrupted when an ingest stops."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..store.errors import BusyError, ConflictError, NotFoundError
from ..store.leases import live_holder
from ..store.parts import PLAN
from ..store.writer import run_lease_name

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo


def where(scheduler: str | None, workers: int | None) -> str:
    """How an ingest runs, for its notes."""
    return "on a Dask scheduler" if scheduler else "planned for worker processes" if workers else "in one process"


def plan_entry(info: RunInfo, workers: int | None, any_count: bool = False) -> dict | None:
    """A run planned for workers is written by them alone: refused unless this is the same plan asked again, or
    `any_count` (a Dask cluster runs a plan's N indices whatever its size); then its plan entry."""
    entry = info.manifest.get(PLAN)
    if entry is None or any_count:
        return entry
    n = entry["workers"]
    start = f"start `attnstore work --run {info.name} --worker I --of {n}` for I = 0..{n - 1}"
    if workers is None:
        raise ConflictError(f"run {info.name!r} is planned for {n} worker processes, which write it: {start} (or --scheduler)")
    if workers != n:
        raise ConflictError(f"run {info.name!r} is planned for {n} workers already (a plan is fixed once made): {start}")
    return entry


def is_complete(store: Store, run_name: str | None) -> bool:
    """The run of that name exists and is complete (None: no name given, so not known to be)."""
    if run_name is None:
        return False
    try:
        return store.run_info(run_name).status == "complete"
    except NotFoundError:
        return False


def refuse_if_busy(store: Store, run_name: str) -> None:
    holder = live_holder(store.engine, run_lease_name(run_name))
    if holder is not None:
        raise BusyError(
            f"run {run_name!r} is being written by {holder.describe()}; wait for it to finish "
            f"(or stop it: a killed writer's run resumes with the same command)"
        )


def mark_interrupted(store: Store, run_id: int) -> None:
    try:
        store.writer.fail_run(run_id, status="interrupted")
    except Exception:
        pass  # e.g. the database is on the full disk too: a run whose writer is gone reads as interrupted anyway
