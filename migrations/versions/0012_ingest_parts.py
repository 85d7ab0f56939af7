"""ingest_parts: a run planned for worker processes (`attnstore ingest --for-workers N`, `attnstore work`), part by part

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29 11:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ingest_parts",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("part", sa.Integer(), nullable=False),
        sa.Column("batches", sa.LargeBinary(), nullable=False),
        sa.Column("n_examples", sa.Integer(), nullable=False),
        sa.Column("cell_start", sa.BigInteger(), nullable=False),
        sa.Column("cell_stop", sa.BigInteger(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_ingest_parts_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "part", name=op.f("pk_ingest_parts")),
    )


def downgrade() -> None:
    op.drop_table("ingest_parts")
