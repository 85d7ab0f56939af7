"""Distributed ingest on Dask (`ingest --scheduler`): the workers run the forward passes and write the maps.

This process (the coordinator) holds the run's write lease, reads and tokenizes the dataset and
plans the batches exactly as a one-process ingest does. It groups consecutive batches into parts
of `PART_BATCHES` and allots each part a disjoint range of the run's cells: the part's exact size
(every block's layers x heads x L x L is known once it is tokenized), starting at a chunk
boundary past everything allotted before. It grows the cells array to cover the range before it
sends the part, so the workers never resize it.

A worker (`write_part`) loads the model once, runs the part's forward passes and writes its
blocks into its range with the same `RunWriter` a single process uses: whole chunks, then the
part's last partial chunk, each batch's SQL rows (sequences, tokens) committed once its cells are
on disk, in a transaction that checks the coordinator's lease (its token travels with the
part). Ranges are disjoint and chunk-aligned, so no two writers ever touch one chunk;
`sequences`' primary key (run, example) keeps an example from being registered twice.

When every part is in, the coordinator writes the index arrays from SQL, cuts the array to
the committed end and marks the run complete. Storage order is plan order, as in one process,
and the maps are bit-identical (same batches, same padding).

Interrupted (a worker fails, the command is killed): committed parts and batches stay. The next
ingest plans only the examples not committed and allots their ranges past the array's length:
cells a cut-off writer may still be writing are never reused, so a late write cannot damage new
data, and a late commit fails its lease check. Cells written but never committed are left as
unused chunks between parts (at most a part's worth per interruption).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Set
from dataclasses import asdict
from typing import TYPE_CHECKING

from ..store import arrays, block_writer
from ..store.cluster import PARTS_PER_WORKER, client_for
from .align import Encoded
from .model import LoadedModel, load_model
from .passes import run_batches
from .progress import progress_bar

if TYPE_CHECKING:
    from ..store.writer import RunWriter

# Batches per part: a part is a worker's unit of work and ends in one partial chunk (its only waste).
PART_BATCHES = 4

# Models loaded by this process when it is a Dask worker, by source: loaded once, used for every part.
_WORKER_MODELS: dict[str, LoadedModel] = {}


def write_part(
    locations: dict,
    run_id: int,
    lease: tuple[str, str, str],
    source: str,
    dtype: str,
    cells: tuple[int, int],
    batches: list[list[Encoded]],
    done: Set[int],
) -> int:
    """On a worker: compute and store one part's batches in the allotted `cells` (start, stop), leaving out the
    examples in `done` (stored before); returns examples stored."""
    from ..store import Store
    from ..store.config import Locations
    from ..store.leases import LeaseCheck

    loaded = _WORKER_MODELS.get(source)
    if loaded is None:
        loaded = _WORKER_MODELS[source] = load_model(source)
    store = Store(Locations(**locations))
    try:
        resource, what, token = lease
        writer = store.writer.run_writer(run_id, LeaseCheck(store.engine, resource, what, token), part=cells)
        try:
            # As in one process: the next batch's forward pass overlaps this one's compression, writes and commit.
            # The worker's own chunk writes wait for their commit: the other workers' passes use the other cores.
            n = run_batches(writer, loaded, dtype, writer.info, done, batches, total=0, progress=False, overlap=False)
            writer.commit(final=True)  # the part's last, partial chunk
            return n
        finally:
            writer.close()  # ends its background chunk write
    finally:
        store.engine.dispose()


def ingest_on_cluster(
    scheduler: str, writer: RunWriter, source: str, dtype: str, done: Set[int], batches: Iterable[list[Encoded]], total: int, progress: bool
) -> int:
    """Store the run's missing examples on the scheduler's workers; returns how many were stored. `writer` is the
    coordinator's (it holds the lease and finishes the run); it writes no cells itself."""
    info, store = writer.info, writer.store
    per_pair = info.n_layers * info.n_heads
    lease = (writer.lease.resource, writer.lease.what, writer.lease.token)
    locations = asdict(store.locations)
    array = writer.blocks.array
    next_free = writer.blocks.next_offset  # a chunk boundary past every cell allotted before
    block = writer.blocks.block_cells
    running: deque = deque()
    n_new = 0
    if writer.index is not None:  # SQL runs ahead of the index arrays until the run completes: `check` knows
        writer.index.group.attrs.update({arrays.INDEX_PENDING: True})

    with client_for(scheduler) as client, progress_bar(total, f"ingesting {info.name}", progress) as bar:
        ahead = PARTS_PER_WORKER * max(1, len(client.scheduler_info().get("workers", {})))

        def send(part: list[list[Encoded]]) -> None:
            nonlocal next_free
            examples = [e for batch in part for e in batch]
            part_done = frozenset(e.example_id for e in examples if e.example_id in done)
            start = next_free
            new_blocks = (per_pair * e.length**2 for e in examples if e.input_ids and e.example_id not in done)
            stop = block_writer.placed_end(start, new_blocks, block)  # placed as the worker's writer places them
            writer.lease.check()
            if array.shape[0] < stop:
                array.resize((stop,))  # before the part leaves: workers only write inside the array
            next_free = block_writer.resume_offset(stop, info.chunk_cells)
            future = client.submit(write_part, locations, info.id, lease, source, dtype, (start, stop), part, part_done, pure=False)
            running.append(future)

        def collect() -> int:
            n = running.popleft().result()
            bar.update(n)
            return n

        part: list[list[Encoded]] = []
        try:
            for batch in batches:
                if all(e.example_id in done for e in batch):
                    continue
                part.append(batch)
                if len(part) == PART_BATCHES:
                    send(part)
                    part = []
                    while len(running) > ahead:
                        n_new += collect()
            if part:
                send(part)
            while running:
                n_new += collect()
        except BaseException:
            client.cancel(list(running))
            raise
    return n_new
