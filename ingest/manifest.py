"""Provenance manifest of a run: what produced the stored maps."""

from __future__ import annotations

import platform
import sys
from datetime import UTC, datetime
from importlib import metadata

from .settings import RUN_FIELDS, STORAGE_FIELDS, RunSettings

PACKAGES = ("attnstore", "torch", "transformers", "tokenizers", "spacy", "zarr", "numcodecs", "numpy", "sqlalchemy", "pandas")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def build_manifest(*, loaded, settings: RunSettings, corpus: str, fmt: str, corpus_checksum: str, annotator: str) -> dict:
    """The manifest of a run of `loaded` with resolved `settings` (RunSettings.resolved) over the corpus file `corpus`
    (its format, or the built-in dataset's reader, and sha256), annotated by `annotator`. The run settings
    (RUN_FIELDS) are top-level keys, the storage settings (STORAGE_FIELDS) are under "storage"."""
    stored = settings.run_fields()
    return {
        "model": {
            "name": loaded.name,
            "source": loaded.source,
            "weights_sha256": loaded.weights_sha256,
            "architecture": loaded.architecture,
            "n_layers": loaded.n_layers,
            "n_heads": loaded.n_heads,
            # a GGUF dequantized to float32 (ingest/gguf.py): the file, its sha256, quantization, the converted weights
            **({"weights": loaded.provenance} if getattr(loaded, "provenance", None) else {}),
        },
        "tokenizer": {
            "class": type(loaded.tokenizer).__name__,
            "name_or_path": getattr(loaded.tokenizer, "name_or_path", None),
            "special_tokens": loaded.special_tokens,
        },
        "attn_implementation": loaded.attn_implementation,
        **{k: stored[k] for k in RUN_FIELDS},
        "corpus": {"path": corpus, "format": fmt, "sha256": corpus_checksum, "annotator": annotator},
        "storage": {
            **{k: stored[k] for k in STORAGE_FIELDS},
            "layout": "flat (layer, head, query, key) blocks at offsets",
        },
        "packages": package_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "created_at": datetime.now(UTC).isoformat(),
    }
