"""Ingestion: read corpora, annotate, run models once, write maps and metadata to the store.

The only part of attnstore that imports torch, transformers and spaCy (lazily).
"""

from .runner import IngestResult, ingest, register_dataset

__all__ = ["IngestResult", "ingest", "register_dataset"]
