"""Ingestion: read corpora, annotate, run models once, write maps and metadata to the store.

The only part of attnstore that imports torch, transformers and spaCy (lazily). The runner's
names below are imported when first used (PEP 562): `attnstore.ingest.datasets` and the other
light modules load without numpy, zarr or SQLAlchemy.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# Idle OpenMP threads of torch sleep instead of spinning, so the writer thread
# (compression, Zarr and SQL writes) gets the CPU time torch leaves unused.
# Must be set before torch is imported; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if TYPE_CHECKING:
    from .runner import IngestResult, ingest, register_dataset
    from .sources import CorpusSource, builtin_source, file_source

__all__ = ["CorpusSource", "IngestResult", "builtin_source", "file_source", "ingest", "register_dataset"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(".runner", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
