"""A run planned for worker processes: its parts (`ingest_parts`), the cells each attempt writes, and the plan's digest.

`attnstore ingest --for-workers N` plans a run once (ingest/workers.py): the batches of tokenized examples, grouped
into parts, each part allotted a disjoint, chunk-aligned range of the run's cells; the array is grown to cover them
all before any worker starts. The plan is one transaction: the part rows and the run manifest's `plan` entry (worker
count, part count, digest) appear together or not at all, and are never changed afterwards.

A part's first attempt writes into its planned range. A later attempt (its worker was killed, or stalled past the
lease's stale period and was taken over) is allotted fresh cells past the array's end (`allot_past_end`): cells a
cut-off attempt may still be writing are never reused, as in a resumed one-process ingest.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass

import sqlalchemy as sa

from . import block_writer
from .arrays import block_cells
from .errors import ConflictError
from .records import RunInfo
from .schema import IngestPart, Run, utcnow

PLAN = "plan"  # the run manifest's entry: {"workers", "parts", "digest", "model", "compute_dtype"}


def pack(batches: list[list[dict]]) -> bytes:
    """A part's batches (each example's fields as a dict) as stored: zlib-compressed JSON."""
    return zlib.compress(json.dumps(batches, separators=(",", ":")).encode(), 6)


def unpack(blob: bytes) -> list[list[dict]]:
    return json.loads(zlib.decompress(blob))


@dataclass(frozen=True)
class PlannedPart:
    part: int
    blob: bytes
    n_examples: int
    cell_start: int
    cell_stop: int


def digest(workers: int, parts: list[PlannedPart]) -> str:
    """What a plan is: its worker count and every part's cells and batches."""
    h = hashlib.sha256(f"workers={workers}".encode())
    for p in parts:
        h.update(f"|{p.part}:{p.cell_start}:{p.cell_stop}:".encode())
        h.update(p.blob)
    return h.hexdigest()


def save_plan(store, info: RunInfo, parts: list[PlannedPart], entry: dict) -> None:
    """Store the parts and the manifest's plan entry in one transaction; the caller holds the run's lease."""
    with store.session() as s:
        run = s.get(Run, info.id)
        if (run.manifest or {}).get(PLAN) is not None:
            raise ConflictError(f"run {info.name!r} is planned already")
        s.execute(
            sa.insert(IngestPart),
            [
                dict(
                    run_id=info.id,
                    part=p.part,
                    batches=p.blob,
                    n_examples=p.n_examples,
                    cell_start=p.cell_start,
                    cell_stop=p.cell_stop,
                    attempts=0,
                )
                for p in parts
            ],
        )
        run.manifest = {**(run.manifest or {}), PLAN: entry}


def plan_of(store, run_id: int) -> dict | None:
    """The run's plan entry as stored now (not a cached RunInfo's), or None."""
    with store.engine.connect() as conn:
        manifest = conn.scalar(sa.select(Run.manifest).where(Run.id == run_id))
    return None if manifest is None else manifest.get(PLAN)


@dataclass(frozen=True)
class PartState:
    part: int
    n_examples: int
    cell_start: int
    cell_stop: int
    attempts: int
    finished: bool


def part_states(store, run_id: int, part: int | None = None) -> list[PartState]:
    """The run's parts (or the one `part`), in order."""
    where = [IngestPart.run_id == run_id] if part is None else [IngestPart.run_id == run_id, IngestPart.part == part]
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                IngestPart.part,
                IngestPart.n_examples,
                IngestPart.cell_start,
                IngestPart.cell_stop,
                IngestPart.attempts,
                IngestPart.finished_at.is_not(None),
            )
            .where(*where)
            .order_by(IngestPart.part)
        ).all()
    return [PartState(*row) for row in rows]


def part_state(store, run_id: int, part: int) -> PartState | None:
    return next((p for p in part_states(store, run_id, part) if p.part == part), None)


def part_lease_name(run_name: str, part: int) -> str:
    return f"run:{run_name}:part:{part}"


def part_batches(store, run_id: int, part: int) -> list[list[dict]]:
    with store.engine.connect() as conn:
        return unpack(conn.scalar(sa.select(IngestPart.batches).where(IngestPart.run_id == run_id, IngestPart.part == part)))


def begin_attempt(store, run_id: int, part: int, lease) -> int:
    """Count one more attempt at `part` (under the worker's lease); returns which attempt this is (1: the first)."""
    with store.session() as s:
        lease.check(s.connection())
        s.execute(
            sa.update(IngestPart).where(IngestPart.run_id == run_id, IngestPart.part == part).values(attempts=IngestPart.attempts + 1)
        )
        return int(s.scalar(sa.select(IngestPart.attempts).where(IngestPart.run_id == run_id, IngestPart.part == part)))


def finish_part(store, run_id: int, part: int, lease, seconds: float) -> None:
    """Mark `part` done and add its seconds to the run's (the sum of the workers' seconds)."""
    with store.session() as s:
        lease.check(s.connection())
        s.execute(sa.update(IngestPart).where(IngestPart.run_id == run_id, IngestPart.part == part).values(finished_at=utcnow()))
        s.execute(sa.update(Run).where(Run.id == run_id).values(ingest_seconds=sa.func.coalesce(Run.ingest_seconds, 0.0) + seconds))


def committed(store, run_id: int) -> int:
    """Examples of the run whose rows are committed (stored or skipped)."""
    from .schema import Sequence

    with store.engine.connect() as conn:
        return int(conn.scalar(sa.select(sa.func.count()).select_from(Sequence).where(Sequence.run_id == run_id)) or 0)


def cells_lease_name(run_name: str) -> str:
    return f"run:{run_name}:cells"


def allot_past_end(store, info: RunInfo, sizes: list[int]) -> tuple[int, int]:
    """Cells for blocks of `sizes`, placed as a writer places them from the first chunk boundary past the array's end;
    the array is grown to cover them. One allotter at a time (a lease): two workers never get overlapping cells, and
    the array's length only ever grows."""
    with store.writer.lease(cells_lease_name(info.name), f"the cells of run {info.name!r}", wait=True):
        array = store._array(info, read_only=False)  # opened now: its length as the last allotter left it
        start = block_writer.resume_offset(array.shape[0], info.chunk_cells)
        stop = block_writer.placed_end(start, sizes, block_cells(array))
        if array.shape[0] < stop:
            array.resize((stop,))
    return start, stop
