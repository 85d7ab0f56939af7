"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 06:05:03.087924
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("split", sa.String(length=64), nullable=False),
        sa.Column("format", sa.String(length=32), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("license", sa.Text(), nullable=True),
        sa.Column("checksum", sa.String(length=64), nullable=False),
        sa.Column("annotator", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("n_examples", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
        sa.UniqueConstraint("name", "split", "checksum", name=op.f("uq_datasets_name_split_checksum")),
    )
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("weights_sha256", sa.String(length=64), nullable=False),
        sa.Column("architecture", sa.String(length=255), nullable=False),
        sa.Column("n_layers", sa.Integer(), nullable=False),
        sa.Column("n_heads", sa.Integer(), nullable=False),
        sa.Column("max_length", sa.Integer(), nullable=False),
        sa.Column("tokenizer", sa.String(length=255), nullable=False),
        sa.Column("special_tokens", sa.JSON(), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("init", sa.String(length=32), nullable=False),
        sa.Column("task", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["parent_id"], ["models.id"], name=op.f("fk_models_parent_id_models")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("name", "weights_sha256", name=op.f("uq_models_name_weights_sha256")),
    )
    op.create_table(
        "examples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("text_a", sa.Text(), nullable=False),
        sa.Column("text_b", sa.Text(), nullable=True),
        sa.Column("label", sa.String(length=64), nullable=True),
        sa.Column("doc_id", sa.String(length=255), nullable=True),
        sa.Column("sent_id", sa.String(length=255), nullable=True),
        sa.Column("source_line", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"], name=op.f("fk_examples_dataset_id_datasets"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_examples")),
        sa.UniqueConstraint("dataset_id", "position", name=op.f("uq_examples_dataset_id_position")),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("max_length", sa.Integer(), nullable=False),
        sa.Column("truncation", sa.String(length=16), nullable=False),
        sa.Column("attn_implementation", sa.String(length=32), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("codec", sa.JSON(), nullable=False),
        sa.Column("chunk_cells", sa.BigInteger(), nullable=False),
        sa.Column("array_path", sa.Text(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("code_version", sa.String(length=64), nullable=False),
        sa.Column("corpus_checksum", sa.String(length=64), nullable=False),
        sa.Column("manifest", sa.JSON(), nullable=False),
        sa.Column("n_stored", sa.Integer(), nullable=False),
        sa.Column("n_truncated", sa.Integer(), nullable=False),
        sa.Column("n_skipped", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ingest_seconds", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"], name=op.f("fk_runs_dataset_id_datasets")),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], name=op.f("fk_runs_model_id_models")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("name", name=op.f("uq_runs_name")),
    )
    op.create_table(
        "head_metrics",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(length=128), nullable=False),
        sa.Column("params", sa.String(length=512), nullable=False),
        sa.Column("layer", sa.Integer(), nullable=False),
        sa.Column("head", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_head_metrics_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_head_metrics")),
        sa.UniqueConstraint("run_id", "metric", "params", "layer", "head", name=op.f("uq_head_metrics_run_id_metric_params_layer_head")),
    )
    op.create_table(
        "sequences",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("example_id", sa.Integer(), nullable=False),
        sa.Column("length", sa.Integer(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=True),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("skipped", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["example_id"], ["examples.id"], name=op.f("fk_sequences_example_id_examples"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_sequences_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "example_id", name=op.f("pk_sequences")),
    )
    with op.batch_alter_table("sequences", schema=None) as batch_op:
        batch_op.create_index("ix_sequences_run_id_offset", ["run_id", "offset"], unique=False)

    op.create_table(
        "tokens",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("example_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("token", sa.Text(), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("word_position", sa.Integer(), nullable=True),
        sa.Column("segment", sa.SmallInteger(), nullable=False),
        sa.Column("is_special", sa.Boolean(), nullable=False),
        sa.Column("char_start", sa.Integer(), nullable=True),
        sa.Column("char_end", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["example_id"], ["examples.id"], name=op.f("fk_tokens_example_id_examples"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_tokens_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "example_id", "position", name=op.f("pk_tokens")),
    )
    op.create_table(
        "words",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("example_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("segment", sa.SmallInteger(), nullable=False),
        sa.Column("form", sa.Text(), nullable=False),
        sa.Column("lemma", sa.Text(), nullable=True),
        sa.Column("upos", sa.String(length=16), nullable=True),
        sa.Column("xpos", sa.String(length=32), nullable=True),
        sa.Column("head", sa.Integer(), nullable=True),
        sa.Column("deprel", sa.String(length=64), nullable=True),
        sa.Column("char_start", sa.Integer(), nullable=True),
        sa.Column("char_end", sa.Integer(), nullable=True),
        sa.Column("annotator", sa.String(length=255), nullable=False),
        sa.ForeignKeyConstraint(["example_id"], ["examples.id"], name=op.f("fk_words_example_id_examples"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_words")),
        sa.UniqueConstraint("example_id", "position", name=op.f("uq_words_example_id_position")),
    )


def downgrade() -> None:
    op.drop_table("words")
    op.drop_table("tokens")
    with op.batch_alter_table("sequences", schema=None) as batch_op:
        batch_op.drop_index("ix_sequences_run_id_offset")

    op.drop_table("sequences")
    op.drop_table("head_metrics")
    op.drop_table("runs")
    op.drop_table("examples")
    op.drop_table("models")
    op.drop_table("datasets")
