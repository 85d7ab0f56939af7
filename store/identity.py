"""A dataset's identity: what decides its examples and words, never what it is called.

Two datasets with the same identity hold the same examples with the same words, so a store
keeps one and reuses it whatever name, split or file path a later ingest gives
(`datasets.identity`, indexed; docs/SHARING.md). The identity is the sha256 of the canonical
JSON of:

- the corpus file's sha256 (a folder's: names and contents),
- the format, with the built-in readers' names mapped to the formats they read
  (`read_pairs_tsv` is `pairs-tsv`),
- the reading options that change examples (columns, quoting, label map, GUM's window
  words, ...; options left unset, None, are not part of it),
- the selection (`limit`, or `sample` and `seed`),
- the kind of annotator: `gold`, `spacy` or `whitespace` (not the spaCy pipeline's version:
  a store annotates a dataset once).

It is computed from the columns a `datasets` row stores (`checksum`, `format`, `options`,
`annotator`), so any row's identity can be recomputed from the row itself; ingest stores its
reading options with the reader's defaults filled in (ingest/runner.py). Migration 0009
backfilled rows made before it with a frozen copy of this function.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

IDENTITY_VERSION = 1
SELECTION = ("limit", "sample", "seed")
FORMAT_ALIASES = {"read_text": "text", "read_tsv": "tsv", "read_pairs_tsv": "pairs-tsv", "read_conllu": "conllu"}


def canonical_format(fmt: str) -> str:
    return FORMAT_ALIASES.get(fmt, fmt)


def annotator_kind(annotator: str) -> str:
    """`spacy:en_core_web_sm@3.8.0` -> `spacy`; `gold`, `whitespace` as they are."""
    return annotator.split(":", 1)[0]


def identity_document(*, checksum: str, format: str, options: Mapping[str, Any] | None, annotator: str) -> dict:
    given = {k: v for k, v in (options or {}).items() if v is not None}
    return {
        "v": IDENTITY_VERSION,
        "checksum": checksum,
        "format": canonical_format(format),
        "options": {k: v for k, v in given.items() if k not in SELECTION},
        "selection": {k: given[k] for k in SELECTION if k in given},
        "annotator": annotator_kind(annotator),
    }


def canonical_json(document: Any) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def dataset_identity(*, checksum: str, format: str, options: Mapping[str, Any] | None, annotator: str) -> str:
    """sha256 hex of the canonical JSON of what decides a dataset's examples (see the module's doc)."""
    document = identity_document(checksum=checksum, format=format, options=options, annotator=annotator)
    return hashlib.sha256(canonical_json(document).encode("utf-8")).hexdigest()


def dataset_lease_name(identity: str) -> str:
    """The write lease under which one process loads the dataset of this identity."""
    return f"dataset:{identity}"
