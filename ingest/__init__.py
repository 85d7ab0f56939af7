"""Ingestion: read corpora, annotate, run models once, write maps and metadata to the store.

The only part of attnstore that imports torch, transformers and spaCy (lazily).
"""

import os

# Idle OpenMP threads of torch sleep instead of spinning, so the writer thread
# (compression, Zarr and SQL writes) gets the CPU time torch leaves unused.
# Must be set before torch is imported; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .runner import CorpusSource, IngestResult, builtin_source, file_source, ingest, register_dataset

__all__ = ["CorpusSource", "IngestResult", "builtin_source", "file_source", "ingest", "register_dataset"]
