"""Upgrade runs from Zarr layout 1 (one bare array at runs/<uuid>, before 2026-11-23) to layout 2 (a self-describing
group): the way out for a store this version refuses to read (`RunInfo.array_path`, store/records.py), and the one
module that still opens a layout-1 array.

`upgrade_arrays(store)` converts every layout-1 run: it creates the run's group with its real
length, copies the compressed chunks byte for byte (same codecs, no decode), writes the index
arrays from SQL, then points `runs.array_path` at the new cells and deletes the old array. The
SQL update is the switch: a crash before it leaves the old array as it was (and an orphan group the
next attempt replaces); a crash after it leaves only old chunks to delete, which the next call
does. `rebuild_index=True` rewrites the index arrays of layout-2 runs from SQL. Each run is
converted under its write lease, so no ingest writes it meanwhile.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import sqlalchemy as sa
import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from . import arrays
from .errors import DamagedDataError
from .records import RunInfo, in_layout_1
from .run_blocks import committed_blocks, run_attributes, write_index_from_sql
from .schema import Run
from .writer import run_lease_name

if TYPE_CHECKING:
    from .store import Store


def upgrade_arrays(store: Store, runs: list[str] | None = None, rebuild_index: bool = False) -> pd.DataFrame:
    """One row per run: run, layout before, action, chunks copied, seconds."""
    store.writer.require_writable()
    names = list(runs) if runs else list(store.runs()["run"])
    rows = []
    for name in names:
        started = time.perf_counter()
        info = store.run_info(name)
        before = 1 if in_layout_1(info.stored_array_path) else 2
        with store.writer.lease(run_lease_name(info.name), f"upgrading the arrays of run {info.name!r}"):
            if before == 1:
                copied = _convert(store, info)
                action = "converted to layout 2"
            elif rebuild_index:
                _write_index(store, info)
                copied, action = 0, "index rebuilt from SQL"
            else:
                copied, action = 0, "already layout 2"
        rows.append(dict(run=info.name, layout=before, action=action, chunks=copied, seconds=round(time.perf_counter() - started, 3)))
    return pd.DataFrame(rows, columns=["run", "layout", "action", "chunks", "seconds"])


def _write_index(store: Store, info: RunInfo) -> None:
    """Rewrite a layout-2 run's index arrays from SQL (entries in offset order); an index ahead of SQL is cut back."""
    index = write_index_from_sql(store.writer, info)
    index.group.attrs.update({"status": info.status, "n_examples": index.n})


def _convert(store: Store, info: RunInfo) -> int:
    root, old_path = store.locations.array_root, info.stored_array_path
    old = arrays.open_run_array(root, old_path, read_only=True)
    seqs = committed_blocks(store, info)
    size = info.n_layers * info.n_heads * seqs["length"].to_numpy(np.int64) ** 2
    end = int((seqs["offset"].to_numpy(np.int64) + size).max()) if len(seqs) else 0
    with store.session() as s:
        attributes = run_attributes(s, s.get(Run, info.id))
    cells_path = arrays.create_run_group(
        root, info.name, dtype=str(old.dtype), chunk_cells=old.chunks[0], codec=info.codec, attributes=attributes
    )
    kv = arrays.open_root(root, read_only=False)
    # The old array's exact codecs (a run ingested before checksums has none): chunks are copied, not re-encoded.
    cells = zarr.create_array(
        store=kv,
        name=cells_path,
        shape=(end,),
        chunks=old.chunks,
        dtype=old.dtype,
        serializer=old.serializer,
        filters=old.filters,
        compressors=old.compressors,
        fill_value=old.fill_value,
        config=arrays.ARRAY_CONFIG,
        dimension_names=("cell",),
        attributes={"block_axes": list(arrays.AXES)},
        overwrite=True,
    )
    prototype = default_buffer_prototype()
    n_chunks = -(-end // old.chunks[0])
    for i in range(n_chunks):
        data = sync(kv.get(arrays.chunk_key(old, i), prototype=prototype))
        if data is None:
            raise DamagedDataError(
                f"run {info.name!r}: chunk {arrays.chunk_key(old, i)} is missing, so the run cannot be converted; "
                "run `attnstore check` to list the damage"
            )
        sync(kv.set(arrays.chunk_key(cells, i), data))
    new_info = dataclasses.replace(info, stored_array_path=cells_path)
    _write_index(store, new_info)
    with store.session() as s:
        s.execute(sa.update(Run).where(Run.id == info.id, Run.array_path == old_path).values(array_path=cells_path))
    sync(kv.delete_dir(old_path))
    return n_chunks
