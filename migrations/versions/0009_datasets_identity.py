"""datasets.identity: datasets are found by content (checksum, format, reading options, selection, annotator), not by name

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-10 10:00:00
"""

import hashlib
import json
from contextlib import contextmanager

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# A frozen copy of store/identity.py as of this revision (a migration must not change when that module
# does), and of what ingest stored as reading options: each reader's defaults are filled in, options a
# reader does not take are dropped, and RTE's label map (built-in datasets did not store it) is added.
# tests/ingest/test_dataset_identity.py checks that backfilled rows are found by a new ingest.
SELECTION = ("limit", "sample", "seed")
FORMAT_ALIASES = {"read_text": "text", "read_tsv": "tsv", "read_pairs_tsv": "pairs-tsv", "read_conllu": "conllu"}
TSV = {"text_a": None, "text_b": None, "label": None, "quoting": "none", "index": None, "label_map": None}
READER_PARAMETERS = {  # canonical format -> the reader's parameters and their defaults
    "text": {},
    "conllu": {},
    "tsv": {**TSV, "pairs": False},
    "pairs-tsv": TSV,
    "read_gum_documents": {"window_words": 128},
    "read_exemplars_jsonl": {"frames_path": None},
}
RTE_LABELS = {"0": "entailment", "1": "not_entailment"}

# Views that read `datasets` (migration 0003, frozen here): on SQLite the table copy below would break them.
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
}


def canonical_options(name: str, fmt: str, options: dict | None) -> dict:
    """The options ingest stores now for a row stored before: reader defaults filled in, unknown options dropped."""
    options = dict(options or {})
    selection = {k: options[k] for k in SELECTION if k in options}
    reading = {k: v for k, v in options.items() if k not in SELECTION}
    params = READER_PARAMETERS.get(FORMAT_ALIASES.get(fmt, fmt))
    if params is not None:
        reading = {k: v for k, v in reading.items() if k in params}
        reading = {**{k: v for k, v in params.items() if v is not None}, **{k: v for k, v in reading.items() if v is not None}}
    if name == "glue/RTE" and fmt == "read_pairs_tsv" and "label_map" not in reading:
        reading["label_map"] = RTE_LABELS
    return {**reading, **selection}


def identity(checksum: str, fmt: str, options: dict, annotator: str) -> str:
    given = {k: v for k, v in options.items() if v is not None}
    document = {
        "v": 1,
        "checksum": checksum,
        "format": FORMAT_ALIASES.get(fmt, fmt),
        "options": {k: v for k, v in given.items() if k not in SELECTION},
        "selection": {k: given[k] for k in SELECTION if k in given},
        "annotator": annotator.split(":", 1)[0],
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@contextmanager
def _sqlite_foreign_keys_off():
    """On SQLite, a batch operation copies the table and drops the old one, which with foreign keys on
    deletes every example (ON DELETE CASCADE). PRAGMA foreign_keys is a no-op inside a transaction, so it
    is switched in autocommit blocks (committing the revisions before this one, never part of this one)."""
    if op.get_bind().dialect.name != "sqlite":
        yield
        return
    context = op.get_context()
    with context.autocommit_block():
        op.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
        broken = op.get_bind().execute(sa.text("PRAGMA foreign_key_check")).fetchall()
        if broken:
            raise RuntimeError(f"revision 0009 broke foreign keys: {broken[:5]}")
    finally:
        with context.autocommit_block():
            op.execute("PRAGMA foreign_keys=ON")


def _alter_datasets(change) -> None:
    """Run `change(batch_op)` on `datasets`; on SQLite (a table copy) the views that read it are made again."""
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        for name in VIEWS:
            op.execute(f"DROP VIEW IF EXISTS {name}")
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        change(batch_op)
    if sqlite:
        for name, body in VIEWS.items():
            op.execute(f"CREATE VIEW {name} AS {body}")


def upgrade() -> None:
    with _sqlite_foreign_keys_off():
        op.add_column("datasets", sa.Column("identity", sa.String(length=64), nullable=True))
        datasets = sa.table(
            "datasets",
            sa.column("id", sa.Integer()),
            sa.column("name", sa.String()),
            sa.column("format", sa.String()),
            sa.column("checksum", sa.String()),
            sa.column("annotator", sa.String()),
            sa.column("options", sa.JSON()),
            sa.column("identity", sa.String()),
        )
        bind = op.get_bind()
        c = datasets.c
        for row in bind.execute(sa.select(c.id, c.name, c.format, c.checksum, c.annotator, c.options)).all():
            options = canonical_options(row.name, row.format, row.options)
            values = dict(options=options, identity=identity(row.checksum, row.format, options, row.annotator))
            bind.execute(sa.update(datasets).where(c.id == row.id).values(**values))

        def change(batch_op) -> None:
            # Two datasets may share name, split and checksum now (other window words, another annotator).
            batch_op.drop_constraint("uq_datasets_name_split_checksum", type_="unique")
            batch_op.alter_column("identity", existing_type=sa.String(length=64), nullable=False)
            batch_op.create_index(batch_op.f("ix_datasets_identity"), ["identity"], unique=False)

        _alter_datasets(change)


def downgrade() -> None:
    # Fails where two datasets share name, split and checksum (possible since this revision): rename one first.
    def change(batch_op) -> None:
        batch_op.drop_index(batch_op.f("ix_datasets_identity"))
        batch_op.drop_column("identity")
        batch_op.create_unique_constraint(batch_op.f("uq_datasets_name_split_checksum"), ["name", "split", "checksum"])

    with _sqlite_foreign_keys_off():
        _alter_datasets(change)
