"""`RunSettings`: the options of one ingest, as one checked value.

The command line (api/ingest_cli.py) builds one from its options, `ingest(store, settings)`
(ingest/runner.py) runs it, `build_manifest` (ingest/manifest.py) records it and
`store.start_run` stores its `run_fields()` as the run's row. A RunSettings is checked when
it is made (`__post_init__`): a bad value or combination fails there, in one line naming the
option, before anything is read or stored. Two settings depend on the model and the corpus
and are filled in by `resolved` once both are known: `max_length` (the model's limit) and
`tokenization` (words for gold-tokenized corpora, else text).

How a run is executed, not what it is, stays a keyword of `ingest`: progress bars, an
already-loaded model, the Dask scheduler (whose maps are those of one process).

A light module (no torch, pandas or SQLAlchemy at import), so the command line can build one
before the ingest machinery loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..store import arrays
from .align import TOKENIZATIONS, TRUNCATION_POLICIES
from .errors import InvalidArgumentError
from .model import DEFAULT_MODEL

# The settings a run records, in this order: each is a column of its row (store.start_run, named as the field)
# and a top-level key of its manifest (ingest/manifest.py).
RUN_FIELDS = ("tokenization", "dtype", "max_length", "truncation", "batch_size")
# Storage settings: columns of the run's row too, and under the manifest's "storage".
STORAGE_FIELDS = ("codec", "chunk_cells")


@dataclass(frozen=True)
class RunSettings:
    """What one ingest reads, which examples, with which model, and how it stores the maps.

    `corpus` + `fmt` (a file) or `dataset` (a built-in NAME:SPLIT, from `data_dir`); `read_options`
    are the file reader's options (pairs-tsv: text_a, text_b, label, quoting; tsv: text_a, label,
    quoting). `name` None: DATASET-SPLIT-MODEL. `tokenization` None: "words" for gold-tokenized
    corpora (CoNLL-U), else "text" (see ingest/align.py). `max_length` None: the model's limit.
    `codec` None: the lossless default (store/arrays.py).
    """

    # what to read
    corpus: str | None = None
    fmt: str | None = None
    dataset: str | None = None
    data_dir: str | None = None
    dataset_name: str | None = None
    split: str | None = None
    read_options: Mapping[str, Any] = field(default_factory=dict)
    window_words: int | None = None
    # which examples, and their words
    limit: int | None = None
    sample: int | None = None
    seed: int = 0
    annotator: str = "spacy"
    # the model and the run
    model: str = DEFAULT_MODEL
    name: str | None = None
    tokenization: str | None = None
    max_length: int | None = None
    truncation: str = "truncate"
    batch_size: int = 32
    # storage
    dtype: str = "float16"
    codec: dict | None = None
    chunk_cells: int = arrays.DEFAULT_CHUNK_CELLS
    # each token's value norm per (layer, head) beside the maps (ingest/norms.py; recorded in the run's manifest)
    value_norms: bool = True
    # a causal LM's next-token loss per token beside the maps, from the same pass run to the logits (ingest/passes.py)
    token_loss: bool = True
    # a causal LM's per-row attention statistics, reduced from each block of rows as the capture passes it
    # (ingest/row_stats.py, store/row_stats.py): what the decoder queries answer from without reading the maps; None: with
    # the Q/K tier, whose maps a query would rebuild (a dense run of short examples reads its maps faster than these)
    row_stats: bool | None = None
    # "dense" (the maps), "qk" (post-RoPE queries and keys and each row's log-sum-exp, maps rebuilt on read: store/qk.py)
    # or None: qk for a decoder whose corpus's examples are longer than where the tier is smaller (ingest/runner.py)
    tier: str | None = None
    qk_dtype: str = "float16"  # the Q/K tier's stored queries and keys
    # where the forward passes run ("auto": CUDA, else MPS, else the CPU) and the weights' dtype there
    device: str = "auto"
    compute_dtype: str = "float32"
    # tokens a causal LM generates greedily after each example's text, stored with it as one sequence (0: none;
    # ingest/generation.py)
    generate: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "read_options", dict(self.read_options))
        object.__setattr__(self, "codec", dict(self.codec or arrays.DEFAULT_CODEC))
        if self.tokenization is not None and self.tokenization not in TOKENIZATIONS:
            raise InvalidArgumentError(f"--tokenize must be one of {TOKENIZATIONS}, not {self.tokenization!r}")
        if self.truncation not in TRUNCATION_POLICIES:
            raise InvalidArgumentError(f"truncation must be one of {TRUNCATION_POLICIES}, not {self.truncation!r}")
        if self.tier not in (None, "dense", "qk"):
            raise InvalidArgumentError(f"--tier must be dense or qk, not {self.tier!r}")
        if self.qk_dtype not in ("float16", "float32"):
            raise InvalidArgumentError(f"--qk-dtype must be float16 or float32, not {self.qk_dtype!r}")
        if self.compute_dtype not in ("float32", "bfloat16", "float16"):
            raise InvalidArgumentError(f"--compute-dtype must be float32, bfloat16 or float16, not {self.compute_dtype!r}")
        if self.dtype not in arrays.DTYPES:
            raise InvalidArgumentError(f"dtype must be one of {arrays.DTYPES}, not {self.dtype!r}")
        if isinstance(self.generate, bool) or not isinstance(self.generate, int) or self.generate < 0:
            raise InvalidArgumentError(f"--generate must be a number of tokens (0: none), not {self.generate!r}")
        if self.batch_size < 1 or any(v is not None and v < 1 for v in (self.limit, self.sample)):
            raise InvalidArgumentError("--batch-size, --limit and --sample must be positive")
        if self.window_words is not None and self.window_words < 0:
            raise InvalidArgumentError("--window-words must be positive, or 0 for whole documents")
        if self.limit is not None and self.sample is not None:
            raise InvalidArgumentError("use either --limit or --sample, not both")
        if (self.corpus is None) == (self.dataset is None):
            raise InvalidArgumentError("give either --corpus FILE (with --format) or --dataset NAME:SPLIT")
        if self.corpus is not None and self.fmt is None:
            raise InvalidArgumentError("--corpus needs --format (text, tsv, pairs-tsv, conllu or jsonl)")
        if self.window_words is not None:
            from .datasets import find_dataset

            if self.dataset is None or "window_words" not in find_dataset(self.dataset).options:
                raise InvalidArgumentError(
                    f"--window-words cuts gum/ontogum documents into windows; {self.dataset or self.corpus} has none: leave it out"
                )
        chunk_cells = self.chunk_cells
        if isinstance(chunk_cells, bool) or not isinstance(chunk_cells, int) or chunk_cells < 1:
            raise InvalidArgumentError(f"--chunk-cells must be a positive number of cells, not {chunk_cells!r}")
        if self.name is not None:
            from ..store.writer import validate_run_name  # SQLAlchemy and pandas: only when a name is given

            validate_run_name(self.name)
        arrays.make_codec(self.codec or {}, self.dtype)  # a bad codec fails here, before anything is stored

    @classmethod
    def of(cls, **options: Any) -> RunSettings:
        """Settings from keyword options, as `ingest(store, corpus=..., fmt=..., ...)` takes them: the names of
        RunSettings' fields, and any other keyword is a reader option (text_a=..., quoting=...)."""
        names = {f.name for f in fields(cls)} - {"read_options"}
        read_options = {**options.pop("read_options", {}), **{k: options.pop(k) for k in list(options) if k not in names}}
        return cls(**options, read_options=read_options)

    def resolved(self, *, model_max_length: int, gold: bool) -> RunSettings:
        """These settings with the defaults that depend on the model and the corpus filled in: `max_length` (checked
        against the model's limit) and `tokenization` (words for a gold-tokenized corpus)."""
        if self.max_length is not None and not 2 < self.max_length <= model_max_length:
            raise InvalidArgumentError(f"--max-length must be between 3 and the model's limit {model_max_length}")
        return replace(
            self,
            max_length=self.max_length or model_max_length,
            tokenization=self.tokenization or ("words" if gold else "text"),
        )

    def run_fields(self) -> dict[str, Any]:
        """The settings stored as columns of the run's row (store.start_run's keywords). Resolved settings only."""
        if self.max_length is None or self.tokenization is None:
            raise ValueError("run_fields() needs resolved settings (RunSettings.resolved)")
        return {k: getattr(self, k) for k in (*RUN_FIELDS, *STORAGE_FIELDS)}
