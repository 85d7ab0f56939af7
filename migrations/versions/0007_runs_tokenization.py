"""runs.tokenization: whether the model was fed the raw text or the corpus's words

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22 11:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Every run before this revision fed the model the corpus's words. A plain ADD COLUMN (no
    # batch copy): on SQLite a table copy would break the views that read `runs`.
    op.add_column("runs", sa.Column("tokenization", sa.String(length=16), nullable=False, server_default="words"))


def downgrade() -> None:
    op.drop_column("runs", "tokenization")  # SQLite >= 3.35
