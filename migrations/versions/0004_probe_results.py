"""probe results

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 07:07:25.655061
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "probe_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("eval_run_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("uas", sa.Float(), nullable=False),
        sa.Column("train_uas", sa.Float(), nullable=True),
        sa.Column("n_train", sa.Integer(), nullable=False),
        sa.Column("n_eval", sa.Integer(), nullable=False),
        sa.Column("epochs", sa.Integer(), nullable=False),
        sa.Column("final_loss", sa.Float(), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["eval_run_id"], ["runs.id"], name=op.f("fk_probe_results_eval_run_id_runs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_probe_results_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_probe_results")),
    )


def downgrade() -> None:
    op.drop_table("probe_results")
