"""ablation_results: how a pruning step's head importance was estimated (importance_split, importance_examples,
importance_schedule); the pruning steps stored before keep their procedure, now named in their config

Before this revision `attnstore prune` estimated importance on the dev set and re-estimated it at every step; the
default is now the authors' procedure (the training data, estimated once), stored under `prune:N`. The older steps are
renamed so they stay a sweep of their own: `prune:N` -> `prune[importance=dev,reestimate]:N`,
`prune[P]:N` -> `prune[importance=dev,reestimate,P]:N`, and their new columns say dev / the examples used / iterative.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29 01:50:00
"""

import re

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

OLD = "importance=dev,reestimate"


def upgrade() -> None:
    with op.batch_alter_table("ablation_results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("importance_split", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("importance_examples", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("importance_schedule", sa.String(length=16), nullable=True))
    conn = op.get_bind()
    table = sa.table(
        "ablation_results",
        sa.column("id", sa.Integer),
        sa.column("config", sa.String),
        sa.column("n_examples", sa.Integer),
        sa.column("importance_split", sa.String),
        sa.column("importance_examples", sa.Integer),
        sa.column("importance_schedule", sa.String),
    )
    rows = conn.execute(sa.select(table.c.id, table.c.config, table.c.n_examples).where(table.c.config.like("prune%"))).all()
    for row_id, config, n_examples in rows:
        match = re.fullmatch(r"prune(?:\[(.*)\])?:(\d+)", config)
        if match is None:
            continue
        params = match.group(1)
        sample = re.search(r"max_examples=(\d+)", params or "")
        conn.execute(
            table.update()
            .where(table.c.id == row_id)
            .values(
                config=f"prune[{OLD}{',' + params if params else ''}]:{match.group(2)}",
                importance_split="dev",
                importance_examples=int(sample.group(1)) if sample else n_examples,  # no sample: every dev example
                importance_schedule="iterative",
            )
        )


def downgrade() -> None:
    # steps of the other procedures have no name before this revision: they go; the older ones get theirs back
    conn = op.get_bind()
    table = sa.table("ablation_results", sa.column("id", sa.Integer), sa.column("config", sa.String))
    renamed = table.c.config.like(f"prune[{OLD}%")
    conn.execute(table.delete().where(table.c.config.like("prune:%") | (table.c.config.like("prune[%") & ~renamed)))
    for row_id, config in conn.execute(sa.select(table.c.id, table.c.config).where(renamed)).all():
        rest = config[len(f"prune[{OLD}") :]  # "]:N", or ",P]:N" with other parameters
        conn.execute(
            table.update().where(table.c.id == row_id).values(config="prune" + (rest[1:] if rest.startswith("]") else "[" + rest[1:]))
        )
    with op.batch_alter_table("ablation_results", schema=None) as batch_op:
        batch_op.drop_column("importance_schedule")
        batch_op.drop_column("importance_examples")
        batch_op.drop_column("importance_split")
