"""Provenance manifest of a run: what produced the stored maps."""

from __future__ import annotations

import platform
import sys
from datetime import UTC, datetime
from importlib import metadata

PACKAGES = ("attnstore", "torch", "transformers", "tokenizers", "spacy", "zarr", "numcodecs", "numpy", "sqlalchemy", "pandas")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def build_manifest(
    *,
    loaded,
    corpus: str,
    fmt: str,
    corpus_checksum: str,
    annotator: str,
    dtype: str,
    max_length: int,
    truncation: str,
    batch_size: int,
    codec: dict,
    chunk_cells: int,
    tokenization: str = "words",
) -> dict:
    return {
        "model": {
            "name": loaded.name,
            "source": loaded.source,
            "weights_sha256": loaded.weights_sha256,
            "architecture": loaded.architecture,
            "n_layers": loaded.n_layers,
            "n_heads": loaded.n_heads,
        },
        "tokenizer": {
            "class": type(loaded.tokenizer).__name__,
            "name_or_path": getattr(loaded.tokenizer, "name_or_path", None),
            "special_tokens": loaded.special_tokens,
        },
        "attn_implementation": loaded.attn_implementation,
        "tokenization": tokenization,
        "dtype": dtype,
        "max_length": max_length,
        "truncation": truncation,
        "batch_size": batch_size,
        "corpus": {"path": corpus, "format": fmt, "sha256": corpus_checksum, "annotator": annotator},
        "storage": {"codec": codec, "chunk_cells": chunk_cells, "layout": "flat (layer, head, query, key) blocks at offsets"},
        "packages": package_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "created_at": datetime.now(UTC).isoformat(),
    }
