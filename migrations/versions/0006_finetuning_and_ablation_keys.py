"""fine-tuned models (models.training) and one ablation result per configuration

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 11:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.add_column(sa.Column("training", sa.JSON(), nullable=True))
    # ablation_results was never written before this revision: its rows (none) need no config.
    with op.batch_alter_table("ablation_results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("config", sa.String(length=255), nullable=False, server_default="none"))
        batch_op.create_unique_constraint(
            batch_op.f("uq_ablation_results_model_id_task_split_mode_config_metric"),
            ["model_id", "task", "split", "mode", "config", "metric"],
        )
    with op.batch_alter_table("ablation_results", schema=None) as batch_op:
        batch_op.alter_column("config", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("ablation_results", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_ablation_results_model_id_task_split_mode_config_metric"), type_="unique")
        batch_op.drop_column("config")
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.drop_column("training")
