import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from attnstore.store import migrate, open_store
from attnstore.store.errors import NotFoundError, SchemaOutOfDateError
from attnstore.store.schema import Base


def test_migrations_build_exactly_the_models(db_url):
    migrate.upgrade(db_url)
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_upgrade_is_idempotent(db_url):
    assert migrate.upgrade(db_url) == (None, migrate.head_revision())
    assert migrate.upgrade(db_url) == (migrate.head_revision(), migrate.head_revision())


def test_out_of_date_database_is_refused_with_the_command(db_url, tmp_path):
    migrate.upgrade(db_url, "0001")
    with pytest.raises(SchemaOutOfDateError, match=r"revision 0001, expected .*run: attnstore db upgrade --db"):
        open_store(db=db_url, root=str(tmp_path / "z"))
    migrate.upgrade(db_url)
    open_store(db=db_url, root=str(tmp_path / "z")).close()


def test_empty_database_is_refused(db_url, tmp_path):
    if db_url.startswith("sqlite"):
        sa.create_engine(db_url).connect().close()  # an empty SQLite file
    with pytest.raises(SchemaOutOfDateError, match="has no attnstore schema; create it with: attnstore db upgrade"):
        open_store(db=db_url, root=str(tmp_path / "z"))


def test_missing_sqlite_file_is_not_created_on_open(tmp_path):
    path = tmp_path / "nothing.sqlite"
    with pytest.raises(NotFoundError, match="no store database"):
        open_store(db=f"sqlite:///{path}")
    assert not path.exists()


def test_newer_database_is_refused(db_url, tmp_path):
    migrate.upgrade(db_url)
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(SchemaOutOfDateError, match="newer than this attnstore"):
        open_store(db=db_url, root=str(tmp_path / "z"))


def test_downgrade_and_upgrade_again(db_url):
    migrate.upgrade(db_url)
    from alembic import command

    command.downgrade(migrate.alembic_config(db_url), "0002")
    engine = sa.create_engine(db_url)
    names = set(sa.inspect(engine).get_table_names()) | set(sa.inspect(engine).get_view_names())
    engine.dispose()
    assert "mentions" not in names and "mention_antecedents" not in names
    assert migrate.upgrade(db_url) == ("0002", migrate.head_revision())
    engine = sa.create_engine(db_url)
    views = set(sa.inspect(engine).get_view_names())
    engine.dispose()
    assert {"word_annotations", "negated_examples", "mention_antecedents", "frame_element_spans", "token_annotations"} <= views


def test_the_head_revision_constant_is_the_scripts_head():
    # Opening a store compares with HEAD_REVISION without importing Alembic: a new migration must change it too.
    assert migrate.head_revision() == migrate.HEAD_REVISION == migrate.script_head()


def test_current_revision_reads_what_alembic_reads(db_url):
    def alembics(engine):
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    engine = sa.create_engine(db_url)
    try:
        assert migrate.current_revision(engine) is None is alembics(engine)  # no version table yet
        for revision in ("0001", "0002", migrate.HEAD_REVISION):
            migrate.upgrade(db_url, revision)
            assert migrate.current_revision(engine) == revision == alembics(engine)
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO alembic_version (version_num) VALUES ('0003')"))
        with pytest.raises(
            SchemaOutOfDateError,
            match=rf"has 2 rows in alembic_version \(0003, {migrate.HEAD_REVISION}\); it must hold one: restore the database from a backup",
        ):
            migrate.current_revision(engine)
    finally:
        engine.dispose()


def test_opening_a_store_does_not_import_alembic(db_url, tmp_path):
    import subprocess
    import sys

    migrate.upgrade(db_url)
    code = (
        "import sys\nfrom attnstore.store import open_store\n"
        f"open_store(db={db_url!r}, root={str(tmp_path / 'z')!r}).close()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_0011_names_the_procedure_of_pruning_steps_stored_before(db_url):
    """Before 0011 `attnstore prune` estimated importance on the dev set, again before each step, under `prune:N`; that
    key is now the authors' procedure (training data, once), so the older steps are renamed and say what they were."""
    from alembic import command

    migrate.upgrade(db_url, "0010")
    engine = sa.create_engine(db_url)
    insert = sa.text(
        "INSERT INTO ablation_results (config, model_id, task, split, mode, disabled_heads, metric, score, baseline_score, "
        "n_examples, created_at) VALUES (:config, :model, 'SST-2', 'dev', 'zero', '[]', 'accuracy', 80.0, 83.0, 872, CURRENT_TIMESTAMP)"
    )
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO models (name, source, weights_sha256, architecture, n_layers, n_heads, max_length, tokenizer, "
                    "special_tokens, init, created_at) VALUES ('m', 'm', 'x', 'Bert', 1, 2, 8, 'T', '{}', 'pretrained', CURRENT_TIMESTAMP)"
                )
            )
            model_id = conn.execute(sa.text("SELECT id FROM models")).scalar_one()
            for config in ("none", "prune:8", "prune[fraction=0.25,max_examples=200]:18", "layer:3"):
                conn.execute(insert, {"config": config, "model": model_id})
        migrate.upgrade(db_url)
        query = "SELECT config, importance_split, importance_examples, importance_schedule FROM ablation_results ORDER BY id"
        with engine.connect() as conn:
            rows = [tuple(r) for r in conn.execute(sa.text(query))]
        assert rows == [
            ("none", None, None, None),
            ("prune[importance=dev,reestimate]:8", "dev", 872, "iterative"),
            ("prune[importance=dev,reestimate,fraction=0.25,max_examples=200]:18", "dev", 200, "iterative"),
            ("layer:3", None, None, None),
        ]
        with engine.begin() as conn:  # a step of the new default has no name before 0011: a downgrade drops it
            conn.execute(insert, {"config": "prune:8", "model": model_id})
        command.downgrade(migrate.alembic_config(db_url), "0010")
        with engine.connect() as conn:
            configs = [r[0] for r in conn.execute(sa.text("SELECT config FROM ablation_results ORDER BY id"))]
        assert configs == ["none", "prune:8", "prune[fraction=0.25,max_examples=200]:18", "layer:3"]
    finally:
        engine.dispose()
