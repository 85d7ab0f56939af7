"""Plain records returned by the store (never ORM objects)."""

from __future__ import annotations

from dataclasses import dataclass, field

# The manifest flag of a run that keeps its value norms (store/arrays.py VALUE_NORMS): set when the run is started.
VALUE_NORMS_FLAG = "value_norms"


@dataclass(frozen=True)
class RunInfo:
    id: int
    name: str
    status: str
    model: str
    model_id: int
    dataset: str
    split: str
    dataset_id: int
    n_layers: int
    n_heads: int
    max_length: int
    truncation: str
    dtype: str
    codec: dict
    chunk_cells: int
    array_path: str
    attn_implementation: str
    special_tokens: dict
    n_stored: int
    n_truncated: int
    n_skipped: int
    manifest: dict = field(default_factory=dict)
    tokenization: str = "words"

    @property
    def has_value_norms(self) -> bool:
        """Whether the run keeps each token's value norm per (layer, head) beside its maps (weights="norm" queries)."""
        return bool((self.manifest or {}).get(VALUE_NORMS_FLAG)) and self.array_path.endswith("/cells")


@dataclass(frozen=True)
class ExampleInput:
    """An example to store in a dataset: its text(s), label and annotated words."""

    position: int
    text_a: str
    text_b: str | None = None
    label: str | None = None
    doc_id: str | None = None
    sent_id: str | None = None
    source_line: int | None = None
    source_index: int | None = None
    words: tuple[dict, ...] = ()
    # Coreference mentions: dicts with word_start, word_end, head, entity, kind, doc_order.
    mentions: tuple[dict, ...] = ()
    # FrameNet annotation sets: dicts with frame fields and "elements" (list of dicts).
    frames: tuple[dict, ...] = ()
    # Words given (e.g. FrameNet's tokenization) but to be annotated by the tagger.
    pretokenized: bool = False


@dataclass(frozen=True)
class StoredExample:
    """An example of a dataset as the ingester needs it (id, texts, words)."""

    id: int
    position: int
    text_a: str
    text_b: str | None
    words: tuple[dict, ...]
