"""Plain records returned by the store (never ORM objects)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .errors import OldLayoutError

# The manifest flag of a run that keeps its value norms (store/arrays.py VALUE_NORMS): set when the run is started.
VALUE_NORMS_FLAG = "value_norms"
# The manifest entry of a run that keeps each token's next-token loss (store/arrays.py TOKEN_LOSS): what it is, its unit.
TOKEN_LOSS_FLAG = "token_loss"
# The manifest entry of a run that keeps each token's hidden-state peak per layer (store/arrays.py HIDDEN_PEAKS).
HIDDEN_PEAKS_FLAG = "hidden_peaks"
# The manifest entry of a run that keeps per-row statistics of every head's attention (store/row_stats.py).
ROW_STATS_FLAG = "row_stats"
# The manifest entry of a run in the Q/K tier (store/qk.py): its maps are rebuilt from stored queries and keys.
QK_FLAG = "qk"


def in_layout_1(array_path: str) -> bool:
    """Whether a run's stored array path is Zarr layout 1's bare array (runs/<uuid>, written before 2026-11-23) rather
    than layout 2's cells array in the run's group (runs/<slug>/cells, store/arrays.py CELLS)."""
    return not array_path.endswith("/cells")


def layout_1_error(run: str) -> OldLayoutError:
    """The one line a read or write of a layout-1 run's arrays gets, naming the command that converts them."""
    return OldLayoutError(
        f"run {run!r} is stored in Zarr layout 1, which this version no longer reads: "
        "run `attnstore db upgrade-arrays` to convert it (a byte-for-byte chunk copy)"
    )


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
    stored_array_path: str  # runs.array_path as SQL holds it, whatever its layout: arrays are reached through `array_path`
    attn_implementation: str
    special_tokens: dict
    n_stored: int
    n_truncated: int
    n_skipped: int
    manifest: dict = field(default_factory=dict)
    tokenization: str = "words"
    dataset_format: str = ""  # how the dataset's examples were read or made (datasets.format: pairs-tsv, repeated_tokens)
    dataset_options: dict = field(default_factory=dict)  # and with which options (datasets.options)

    @property
    def array_path(self) -> str:
        """The run's cells array under the array root (runs/<slug>/cells), where every read or write of its arrays
        starts. A run still in Zarr layout 1 is refused here, the one place (`layout_1_error`): past it, attnstore
        assumes layout 2. What reads SQL only (run listings, tokens, `attnstore sql`) never asks, and keeps working."""
        if in_layout_1(self.stored_array_path):
            raise layout_1_error(self.name)
        return self.stored_array_path

    def as_dict(self) -> dict:
        """Every field, `array_path` under its column's name as SQL holds it (a layout-1 run's too: shown, never read)."""
        return {("array_path" if key == "stored_array_path" else key): value for key, value in dataclasses.asdict(self).items()}

    @property
    def has_value_norms(self) -> bool:
        """Whether the run keeps each token's value norm per (layer, head) beside its maps (weights="norm" queries)."""
        return bool((self.manifest or {}).get(VALUE_NORMS_FLAG))

    @property
    def has_token_loss(self) -> bool:
        """Whether the run keeps each token's next-token loss beside its maps (a causal LM's run)."""
        return bool((self.manifest or {}).get(TOKEN_LOSS_FLAG))

    @property
    def has_hidden_peaks(self) -> bool:
        """Whether the run keeps each token's hidden-state peak per layer (massive activations: a causal LM's run)."""
        return bool((self.manifest or {}).get(HIDDEN_PEAKS_FLAG))

    @property
    def has_row_stats(self) -> bool:
        """Whether the run keeps per-row statistics of every head's attention (store/row_stats.py: a causal LM's run)."""
        return bool((self.manifest or {}).get(ROW_STATS_FLAG))

    @property
    def row_stats_fields(self) -> tuple[str, ...]:
        """The row-statistics fields the run keeps (store/row_stats.py: all, or the first 32 in a run kept before the
        others existed); () without row statistics."""
        from .row_stats import stored_fields  # numpy: not on the command line's start-up path

        entry = (self.manifest or {}).get(ROW_STATS_FLAG)
        return stored_fields(entry) if entry else ()

    @property
    def sink_logits(self) -> bool:
        """Whether the run's model has learned sink logits (gpt-oss): its rows sum to at most 1, the sink holding the
        rest (ingest records it in the manifest's `capture` entry)."""
        return bool((self.manifest or {}).get("capture", {}).get("sink_logits"))

    @property
    def qk(self) -> dict | None:
        """The run's Q/K tier entry (store/qk.py: dtype, key/value heads, head size, scale and window per layer), or None:
        the run stores its maps (the dense tier)."""
        return (self.manifest or {}).get(QK_FLAG) or None

    @property
    def tier(self) -> str:
        """The run's tier: "qk" (maps rebuilt from stored queries and keys) or "dense" (maps stored)."""
        return "qk" if self.qk else "dense"


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
