"""Errors raised while reading corpora, loading models and ingesting runs."""

from __future__ import annotations

from ..store.errors import AttnStoreError, CorruptInputError, InvalidArgumentError, NotFoundError

__all__ = [
    "AttnStoreError",
    "CorpusError",
    "EmptyCorpusError",
    "IngestError",
    "InvalidArgumentError",
    "ModelError",
    "ModelNotFoundError",
    "UnsupportedModelError",
]


class CorpusError(CorruptInputError):
    """A corpus file that cannot be read; the message names file, line and fix."""

    def __init__(self, path, line: int | None, problem: str, fix: str):
        self.path, self.line, self.problem, self.fix = str(path), line, problem, fix
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {problem}; {fix}")


class EmptyCorpusError(CorpusError):
    def __init__(self, path, what: str = "examples"):
        super().__init__(path, None, f"the corpus has no {what}", "check the file and the --format option")


class ModelNotFoundError(NotFoundError):
    """A model name or path that cannot be loaded offline."""


class IngestError(AttnStoreError):
    """Ingestion cannot go on (e.g. the model's attention is not a valid distribution)."""


class ModelError(IngestError):
    """A model directory that exists but cannot be loaded: no weights, no tokenizer, a corrupt or truncated file."""


class UnsupportedModelError(ModelError):
    """A model that loads but whose attention attnstore cannot store as (layer, head, query, key) maps over its input
    (an encoder-decoder, pooled or partly convolutional attention); the message names what the probe at load found."""
