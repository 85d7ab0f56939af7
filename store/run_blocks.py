"""A run's committed blocks as SQL holds them, and what its Zarr group says of them: the end of its last block, its
blocks in offset order, its index arrays rebuilt from SQL, and the group's attributes. What the run writer
(store/writer.py), `check`, bundles and layout upgrades read of a run's blocks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import sqlalchemy as sa

from .lazy import LazyModule
from .schema import Dataset, Model, Run, Sequence

if TYPE_CHECKING:
    from . import arrays
    from .reader import StoreReader
    from .records import RunInfo
    from .writer import StoreWriter
else:  # imports zarr: at its first use (store/lazy.py)
    arrays = LazyModule(f"{__package__}.arrays")


def run_attributes(session, run: Run) -> dict:
    """What a run's Zarr group says about itself, so the arrays can be read without SQL."""
    model, dataset = session.get(Model, run.model_id), session.get(Dataset, run.dataset_id)
    return {
        "run": run.name,
        "run_uid": (run.manifest or {}).get("uid"),
        "model": model.name,
        "model_weights_sha256": model.weights_sha256,
        "tokenizer": model.tokenizer,
        "n_layers": model.n_layers,
        "n_heads": model.n_heads,
        "causal": model.causal,
        "dataset": {"name": dataset.name, "split": dataset.split, "checksum": dataset.checksum},
        "dtype": run.dtype,
        "codec": run.codec,
        "chunk_cells": run.chunk_cells,
        "max_length": run.max_length,
        "axes": list(arrays.AXES),
        "block": "cells[offset[i] : offset[i] + n_layers * n_heads * length[i]**2] reshaped to (layer, head, query, key)",
        "tokens": "token_id[token_start[i] : token_start[i] + length[i]]",
        "status": "running",
    }


def committed_end(store: StoreReader, info: RunInfo) -> int:
    """The end of the run's last committed block (0 for a run without one)."""
    with store.engine.connect() as conn:
        end = conn.execute(
            sa.select(sa.func.max(Sequence.offset + info.n_layers * info.n_heads * Sequence.length * Sequence.length)).where(
                Sequence.run_id == info.id
            )
        ).scalar()
    return int(end or 0)


def committed_blocks(store: StoreReader, info: RunInfo) -> pd.DataFrame:
    """The run's committed blocks from SQL: example_id, offset, length, in offset order."""
    with store.engine.connect() as conn:
        return pd.DataFrame(
            conn.execute(
                sa.select(Sequence.example_id, Sequence.offset, Sequence.length)
                .where(Sequence.run_id == info.id, Sequence.offset.is_not(None))
                .order_by(Sequence.offset)
            ).all(),
            columns=["example_id", "offset", "length"],
        )


# Blocks per step when the index arrays are rebuilt from SQL: memory is one step's rows (~50 token rows per
# example), not the run's (100 M token rows at 1000x today's largest corpus, docs/ARCHITECTURE.md).
INDEX_REBUILD_BLOCKS = 4096


def write_index_from_sql(writer: StoreWriter, info: RunInfo, step: int = INDEX_REBUILD_BLOCKS) -> arrays.RunIndex:
    """Rewrite a run's index arrays from SQL (its committed blocks, in offset order), `step` blocks at a time."""
    index = arrays.RunIndex(writer.store.locations.array_root, info.array_path, 0, 0)
    for blocks, token_ids in writer.block_steps(info.id, step):
        index.write(blocks["example"].tolist(), blocks["offset"].tolist(), blocks["length"].tolist(), token_ids)
    index.truncate()
    return index
