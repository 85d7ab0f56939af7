"""SQL tables of the store (SQLAlchemy 2 declarative models).

These models are used to *read and write* rows and to check that the Alembic
migrations agree with them; the schema itself is only ever built by running the
migrations (`attnstore db upgrade`). ORM objects never leave `attnstore.store`.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)


class Model(Base):
    """A model whose attention was captured: name, weights hash, shape, special tokens."""

    __tablename__ = "models"
    __table_args__ = (sa.UniqueConstraint("name", "weights_sha256"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(255))
    source: Mapped[str] = mapped_column(sa.Text)
    weights_sha256: Mapped[str] = mapped_column(sa.String(64))
    architecture: Mapped[str] = mapped_column(sa.String(255))
    n_layers: Mapped[int]
    n_heads: Mapped[int]
    max_length: Mapped[int]
    tokenizer: Mapped[str] = mapped_column(sa.String(255))
    special_tokens: Mapped[dict] = mapped_column(sa.JSON)
    parent_id: Mapped[int | None] = mapped_column(sa.ForeignKey("models.id"))
    init: Mapped[str] = mapped_column(sa.String(32), default="pretrained")
    task: Mapped[str | None] = mapped_column(sa.String(64))
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)
    # Fine-tuned models: hyper-parameters, seed, data used, epochs done, training time, checkpoint
    # folder relative to the store's models root (so a copied store finds its models).
    training: Mapped[dict | None] = mapped_column(sa.JSON)
    # Whether each token attends only to itself and earlier tokens (decoder-only models: GPT-2, Llama), as the
    # forward pass at load showed; NULL for models registered before revision 0008 (treated as bidirectional).
    causal: Mapped[bool | None] = mapped_column(sa.Boolean, default=False)


class Dataset(Base):
    """A corpus file (or a split of a built-in corpus) registered once, shared by runs.

    Found by `identity` (store/identity.py: file checksum, format, reading options, selection,
    annotator kind), not by name: the same content ingested under another name reuses the row.
    """

    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(255))
    split: Mapped[str] = mapped_column(sa.String(64))
    format: Mapped[str] = mapped_column(sa.String(32))
    source: Mapped[str] = mapped_column(sa.Text)
    license: Mapped[str | None] = mapped_column(sa.Text)
    checksum: Mapped[str] = mapped_column(sa.String(64))
    annotator: Mapped[str] = mapped_column(sa.String(255))
    status: Mapped[str] = mapped_column(sa.String(16), default="loading")
    n_examples: Mapped[int | None]
    options: Mapped[dict | None] = mapped_column(sa.JSON)  # how the examples were made (reading options, limit, sample, seed)
    identity: Mapped[str] = mapped_column(sa.String(64), index=True)  # sha256 of what decides the examples (revision 0009)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)


class Example(Base):
    """One input of a dataset: a sentence or a pair of segments, with its label."""

    __tablename__ = "examples"
    __table_args__ = (sa.UniqueConstraint("dataset_id", "position"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    dataset_id: Mapped[int] = mapped_column(sa.ForeignKey("datasets.id", ondelete="CASCADE"))
    position: Mapped[int]
    text_a: Mapped[str] = mapped_column(sa.Text)
    text_b: Mapped[str | None] = mapped_column(sa.Text)
    label: Mapped[str | None] = mapped_column(sa.String(64))
    doc_id: Mapped[str | None] = mapped_column(sa.String(255))
    sent_id: Mapped[str | None] = mapped_column(sa.String(255))
    source_line: Mapped[int | None]
    source_index: Mapped[int | None]  # the row's own index in the original corpus (GLUE idx, MNLI row)


class Word(Base):
    """A word of an example with its (gold or predicted) annotation.

    `position` counts words across both segments; `head` is the position of the
    head word in the same example (NULL for the root or when unannotated).
    """

    __tablename__ = "words"
    __table_args__ = (sa.UniqueConstraint("example_id", "position"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    example_id: Mapped[int] = mapped_column(sa.ForeignKey("examples.id", ondelete="CASCADE"))
    position: Mapped[int]
    segment: Mapped[int] = mapped_column(sa.SmallInteger)
    form: Mapped[str] = mapped_column(sa.Text)
    lemma: Mapped[str | None] = mapped_column(sa.Text)
    upos: Mapped[str | None] = mapped_column(sa.String(16))
    xpos: Mapped[str | None] = mapped_column(sa.String(32))
    head: Mapped[int | None]
    deprel: Mapped[str | None] = mapped_column(sa.String(64))
    char_start: Mapped[int | None]
    char_end: Mapped[int | None]
    annotator: Mapped[str] = mapped_column(sa.String(255))
    sentence: Mapped[int] = mapped_column(sa.SmallInteger, default=0, server_default="0")
    feats: Mapped[str | None] = mapped_column(sa.Text)


class Mention(Base):
    """A coreference mention: words [word_start, word_end) of an example, its entity and head word (gold tree)."""

    __tablename__ = "mentions"
    __table_args__ = (sa.Index("ix_mentions_example_id_entity", "example_id", "entity"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    example_id: Mapped[int] = mapped_column(sa.ForeignKey("examples.id", ondelete="CASCADE"))
    word_start: Mapped[int]
    word_end: Mapped[int]
    head: Mapped[int]
    entity: Mapped[str] = mapped_column(sa.String(64))
    kind: Mapped[str] = mapped_column(sa.String(16))  # pronoun | proper | nominal (from the head's UPOS)
    doc_order: Mapped[int]  # position of the mention in its document, counting all windows


class Frame(Base):
    """A FrameNet annotation set: the frame evoked by a lexical unit (target) in an example."""

    __tablename__ = "frames"

    id: Mapped[int] = mapped_column(primary_key=True)
    example_id: Mapped[int] = mapped_column(sa.ForeignKey("examples.id", ondelete="CASCADE"), index=True)
    annoset_id: Mapped[int | None]
    frame_id: Mapped[int]
    frame: Mapped[str] = mapped_column(sa.String(128))
    lu_id: Mapped[int | None]
    lu: Mapped[str] = mapped_column(sa.String(128))
    target_start: Mapped[int | None]  # word positions [start, end)
    target_end: Mapped[int | None]
    char_start: Mapped[int]
    char_end: Mapped[int]


class FrameElement(Base):
    """A frame element span of an annotation set, with its core type."""

    __tablename__ = "frame_elements"

    id: Mapped[int] = mapped_column(primary_key=True)
    frame_row_id: Mapped[int] = mapped_column(sa.ForeignKey("frames.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(sa.String(128))
    core_type: Mapped[str] = mapped_column(sa.String(32))
    in_core_set: Mapped[bool]
    word_start: Mapped[int | None]
    word_end: Mapped[int | None]
    char_start: Mapped[int]
    char_end: Mapped[int]


class Run(Base):
    """One pass of one model over one dataset; its maps live at `array_path` under the array root."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(255), unique=True)
    model_id: Mapped[int] = mapped_column(sa.ForeignKey("models.id"))
    dataset_id: Mapped[int] = mapped_column(sa.ForeignKey("datasets.id"))
    status: Mapped[str] = mapped_column(sa.String(16), default="running")
    max_length: Mapped[int]
    truncation: Mapped[str] = mapped_column(sa.String(16))
    attn_implementation: Mapped[str] = mapped_column(sa.String(32))
    dtype: Mapped[str] = mapped_column(sa.String(16))
    codec: Mapped[dict] = mapped_column(sa.JSON)
    chunk_cells: Mapped[int] = mapped_column(sa.BigInteger)
    array_path: Mapped[str] = mapped_column(sa.Text)
    batch_size: Mapped[int]
    # text | words: what the model was fed (raw text, or the corpus's words; see ingest/align.py)
    tokenization: Mapped[str] = mapped_column(sa.String(16), default="words", server_default="words")
    code_version: Mapped[str] = mapped_column(sa.String(64))
    corpus_checksum: Mapped[str] = mapped_column(sa.String(64))
    manifest: Mapped[dict] = mapped_column(sa.JSON)
    n_stored: Mapped[int] = mapped_column(default=0)
    n_truncated: Mapped[int] = mapped_column(default=0)
    n_skipped: Mapped[int] = mapped_column(default=0)
    started_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    ingest_seconds: Mapped[float | None]


class Sequence(Base):
    """Where one example's (layer, head, L, L) block sits in the run's flat array."""

    __tablename__ = "sequences"
    __table_args__ = (sa.Index("ix_sequences_run_id_offset", "run_id", "offset"),)

    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    example_id: Mapped[int] = mapped_column(sa.ForeignKey("examples.id", ondelete="CASCADE"), primary_key=True)
    length: Mapped[int]
    offset: Mapped[int | None] = mapped_column(sa.BigInteger)
    truncated: Mapped[bool] = mapped_column(default=False)
    skipped: Mapped[bool] = mapped_column(default=False)


class Token(Base):
    """A wordpiece of a stored sequence, aligned to its word (NULL for special tokens)."""

    __tablename__ = "tokens"

    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    example_id: Mapped[int] = mapped_column(sa.ForeignKey("examples.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(primary_key=True)
    token: Mapped[str] = mapped_column(sa.Text)
    token_id: Mapped[int]
    word_position: Mapped[int | None]
    segment: Mapped[int] = mapped_column(sa.SmallInteger)
    is_special: Mapped[bool]
    char_start: Mapped[int | None]
    char_end: Mapped[int | None]


class HeadMetric(Base):
    """A saved per-head query result, so heads can be selected with SQL."""

    __tablename__ = "head_metrics"
    __table_args__ = (sa.UniqueConstraint("run_id", "metric", "params", "layer", "head"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    metric: Mapped[str] = mapped_column(sa.String(128))
    params: Mapped[str] = mapped_column(sa.String(512), default="{}")
    layer: Mapped[int]
    head: Mapped[int]
    value: Mapped[float | None] = mapped_column(sa.Float)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)


class PatternLabel(Base):
    """Attention-pattern class of one (example, layer, head) map (Kovaleva et al. K1), by a person or a classifier."""

    __tablename__ = "pattern_labels"
    __table_args__ = (sa.UniqueConstraint("run_id", "example_id", "layer", "head", "source"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    example_id: Mapped[int] = mapped_column(sa.ForeignKey("examples.id", ondelete="CASCADE"))
    layer: Mapped[int]
    head: Mapped[int]
    label: Mapped[str] = mapped_column(sa.String(32))
    source: Mapped[str] = mapped_column(sa.String(64))
    confidence: Mapped[float | None] = mapped_column(sa.Float)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)


class AblationResult(Base):
    """Task score of a model with some heads disabled (Kovaleva et al. K7), next to its baseline.

    `config` names the disabled set canonically ("none", "layer:3", "heads:0:1,2:5"); a
    configuration is stored once per (model, task, split, mode, metric): the unique key makes
    two processes sweeping one model unable to write duplicates. config "none" (no head
    disabled) is the plain evaluation of the model. A pruning step (config `prune:N`,
    `prune[...]:N`) records how the importance that chose its heads was estimated:
    importance_split ("train" or "dev"), importance_examples (how many), importance_schedule
    ("once": one estimate orders every step, as the authors' script does by default; "iterative":
    re-estimated with the pruned heads disabled before each step); NULL for the other rows.
    """

    __tablename__ = "ablation_results"
    __table_args__ = (sa.UniqueConstraint("model_id", "task", "split", "mode", "config", "metric"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(sa.ForeignKey("models.id", ondelete="CASCADE"))
    task: Mapped[str] = mapped_column(sa.String(64))
    split: Mapped[str] = mapped_column(sa.String(64))
    mode: Mapped[str] = mapped_column(sa.String(16))
    config: Mapped[str] = mapped_column(sa.String(255))
    disabled_heads: Mapped[list] = mapped_column(sa.JSON)
    metric: Mapped[str] = mapped_column(sa.String(64))
    score: Mapped[float] = mapped_column(sa.Float)
    baseline_score: Mapped[float | None] = mapped_column(sa.Float)
    n_examples: Mapped[int]
    importance_split: Mapped[str | None] = mapped_column(sa.String(16))
    importance_examples: Mapped[int | None]
    importance_schedule: Mapped[str | None] = mapped_column(sa.String(16))
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)


class ProbeResult(Base):
    """UAS of an attention probe (Clark et al. C8) trained on one run and evaluated on another."""

    __tablename__ = "probe_results"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    eval_run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(sa.String(32))
    uas: Mapped[float] = mapped_column(sa.Float)
    train_uas: Mapped[float | None] = mapped_column(sa.Float)
    n_train: Mapped[int]
    n_eval: Mapped[int]
    epochs: Mapped[int]
    final_loss: Mapped[float | None] = mapped_column(sa.Float)
    params: Mapped[dict] = mapped_column(sa.JSON)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)


class HeadMatch(Base):
    """A saved cross-model head match (queries/head_match.py): head (layer, head) of run A and its match in run B."""

    __tablename__ = "head_matches"
    __table_args__ = (sa.UniqueConstraint("run_id", "other_run_id", "params", "layer", "head"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    other_run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    params: Mapped[str] = mapped_column(sa.String(512), default="{}")
    layer: Mapped[int]
    head: Mapped[int]
    match_layer: Mapped[int | None]
    match_head: Mapped[int | None]
    distance: Mapped[float | None] = mapped_column(sa.Float)
    best_layer: Mapped[int | None]
    best_head: Mapped[int | None]
    best_distance: Mapped[float | None] = mapped_column(sa.Float)
    margin: Mapped[float | None] = mapped_column(sa.Float)
    rank: Mapped[int | None]
    row_z: Mapped[float | None] = mapped_column(sa.Float)
    null_mean: Mapped[float | None] = mapped_column(sa.Float)
    null_sd: Mapped[float | None] = mapped_column(sa.Float)
    z: Mapped[float | None] = mapped_column(sa.Float)
    p_value: Mapped[float | None] = mapped_column(sa.Float)
    n_examples: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), default=utcnow)


class IngestPart(Base):
    """One part of a run planned for worker processes (`attnstore ingest --for-workers N`, `attnstore work`): its
    batches of tokenized examples (zlib-compressed JSON) and the cells allotted to its first attempt; a retry is
    allotted cells past the array's end (store/parts.py)."""

    __tablename__ = "ingest_parts"

    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    part: Mapped[int] = mapped_column(primary_key=True)
    batches: Mapped[bytes] = mapped_column(sa.LargeBinary)
    n_examples: Mapped[int]
    cell_start: Mapped[int] = mapped_column(sa.BigInteger)
    cell_stop: Mapped[int] = mapped_column(sa.BigInteger)
    attempts: Mapped[int] = mapped_column(default=0)
    finished_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))


class Lease(Base):
    """Who may write a resource ("run:NAME", "dataset:KEY") now: one row while a writer holds it.

    The holder refreshes `heartbeat_at`; a row whose holder died (same host, process gone)
    or whose heartbeat is older than the stale period may be taken over, so a crashed
    ingest resumes. See store/leases.py and docs/RELIABILITY.md.
    """

    __tablename__ = "leases"

    resource: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    token: Mapped[str] = mapped_column(sa.String(32))
    host: Mapped[str] = mapped_column(sa.String(255))
    pid: Mapped[int]
    acquired_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    heartbeat_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
