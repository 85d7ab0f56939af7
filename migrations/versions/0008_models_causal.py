"""models.causal: whether the model's attention is causal (decoder-only), as probed at load

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Models registered before this revision were never probed: NULL (queries treat them as bidirectional, as
    # before). A plain ADD COLUMN (no batch copy): on SQLite a table copy would break the views that read `models`.
    op.add_column("models", sa.Column("causal", sa.Boolean(), nullable=True))


def downgrade() -> None:
    op.drop_column("models", "causal")  # SQLite >= 3.35
