"""corpora: mentions, frames, frame elements, views

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 06:47:16.277561
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


# Documented in docs/SQL.md; plain SQL that SQLite and PostgreSQL both run.
NEGATION_WORDS = (
    "neither",
    "nor",
    "not",
    "never",
    "none",
    "nothing",
    "nowhere",
    "n't",
    "n’t",
    "don't",
    "won't",
    "didn't",
    "hadn't",
    "haven't",
    "can't",
    "isn't",
    "wasn't",
    "shouldn't",
    "couldn't",
)
VIEWS = {
    "word_annotations": """
        SELECT d.name AS dataset, d.split, e.id AS example_id, e.position AS example, w.position, w.segment,
               w.sentence, w.form, w.lemma, w.upos, w.xpos, w.feats, w.deprel, w.head, h.form AS head_form,
               h.upos AS head_upos, w.annotator
        FROM words w
        JOIN examples e ON e.id = w.example_id
        JOIN datasets d ON d.id = e.dataset_id
        LEFT JOIN words h ON h.example_id = w.example_id AND h.position = w.head""",
    "negated_examples": """
        SELECT e.id AS example_id, d.name AS dataset, d.split, e.position AS example, count(*) AS n_negations
        FROM words w
        JOIN examples e ON e.id = w.example_id
        JOIN datasets d ON d.id = e.dataset_id
        WHERE lower(w.form) IN (%s)
        GROUP BY e.id, d.name, d.split, e.position"""
    % ", ".join("'" + w.replace("'", "''") + "'" for w in NEGATION_WORDS),
    "mention_antecedents": """
        SELECT m.id AS mention_id, m.example_id, m.entity, m.kind, m.word_start, m.word_end, m.head,
               mh.form AS head_form, a.id AS antecedent_id, a.word_start AS antecedent_start,
               a.word_end AS antecedent_end, a.head AS antecedent_head, ah.form AS antecedent_head_form,
               m.doc_order - a.doc_order AS mention_distance
        FROM mentions m
        JOIN mentions a ON a.example_id = m.example_id AND a.entity = m.entity AND a.doc_order < m.doc_order
        JOIN words mh ON mh.example_id = m.example_id AND mh.position = m.head
        JOIN words ah ON ah.example_id = a.example_id AND ah.position = a.head
        WHERE NOT EXISTS (
            SELECT 1 FROM mentions b
            WHERE b.example_id = m.example_id AND b.entity = m.entity
              AND b.doc_order < m.doc_order AND b.doc_order > a.doc_order)""",
    "frame_element_spans": """
        SELECT f.example_id, f.id AS frame_row_id, f.frame, f.lu, f.target_start, f.target_end,
               fe.name AS element, fe.core_type, fe.in_core_set, fe.word_start, fe.word_end
        FROM frames f
        JOIN frame_elements fe ON fe.frame_row_id = f.id""",
    "token_annotations": """
        SELECT t.run_id, r.name AS run, t.example_id, e.position AS example, t.position, t.token, t.is_special,
               t.segment, t.word_position, w.form, w.upos, w.deprel, w.head
        FROM tokens t
        JOIN runs r ON r.id = t.run_id
        JOIN examples e ON e.id = t.example_id
        LEFT JOIN words w ON w.example_id = t.example_id AND w.position = t.word_position""",
}


def upgrade() -> None:
    op.create_table(
        "frames",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("example_id", sa.Integer(), nullable=False),
        sa.Column("annoset_id", sa.Integer(), nullable=True),
        sa.Column("frame_id", sa.Integer(), nullable=False),
        sa.Column("frame", sa.String(length=128), nullable=False),
        sa.Column("lu_id", sa.Integer(), nullable=True),
        sa.Column("lu", sa.String(length=128), nullable=False),
        sa.Column("target_start", sa.Integer(), nullable=True),
        sa.Column("target_end", sa.Integer(), nullable=True),
        sa.Column("char_start", sa.Integer(), nullable=False),
        sa.Column("char_end", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["example_id"], ["examples.id"], name=op.f("fk_frames_example_id_examples"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_frames")),
    )
    with op.batch_alter_table("frames", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_frames_example_id"), ["example_id"], unique=False)

    op.create_table(
        "mentions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("example_id", sa.Integer(), nullable=False),
        sa.Column("word_start", sa.Integer(), nullable=False),
        sa.Column("word_end", sa.Integer(), nullable=False),
        sa.Column("head", sa.Integer(), nullable=False),
        sa.Column("entity", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("doc_order", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["example_id"], ["examples.id"], name=op.f("fk_mentions_example_id_examples"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mentions")),
    )
    with op.batch_alter_table("mentions", schema=None) as batch_op:
        batch_op.create_index("ix_mentions_example_id_entity", ["example_id", "entity"], unique=False)

    op.create_table(
        "frame_elements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("frame_row_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("core_type", sa.String(length=32), nullable=False),
        sa.Column("in_core_set", sa.Boolean(), nullable=False),
        sa.Column("word_start", sa.Integer(), nullable=True),
        sa.Column("word_end", sa.Integer(), nullable=True),
        sa.Column("char_start", sa.Integer(), nullable=False),
        sa.Column("char_end", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["frame_row_id"], ["frames.id"], name=op.f("fk_frame_elements_frame_row_id_frames"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_frame_elements")),
    )
    with op.batch_alter_table("frame_elements", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_frame_elements_frame_row_id"), ["frame_row_id"], unique=False)

    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("options", sa.JSON(), nullable=True))

    with op.batch_alter_table("examples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("source_index", sa.Integer(), nullable=True))

    with op.batch_alter_table("words", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sentence", sa.SmallInteger(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("feats", sa.Text(), nullable=True))

    for name, body in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {body}")


def downgrade() -> None:
    for name in VIEWS:
        op.execute(f"DROP VIEW {name}")
    with op.batch_alter_table("words", schema=None) as batch_op:
        batch_op.drop_column("feats")
        batch_op.drop_column("sentence")

    with op.batch_alter_table("examples", schema=None) as batch_op:
        batch_op.drop_column("source_index")

    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_column("options")

    with op.batch_alter_table("frame_elements", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_frame_elements_frame_row_id"))

    op.drop_table("frame_elements")
    with op.batch_alter_table("mentions", schema=None) as batch_op:
        batch_op.drop_index("ix_mentions_example_id_entity")

    op.drop_table("mentions")
    with op.batch_alter_table("frames", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_frames_example_id"))

    op.drop_table("frames")
