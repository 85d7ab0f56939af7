"""Datasets are identified by content: the same file with the same reading options and annotator is one
dataset, annotated once, whatever its name, split or path; options that change the examples make another.

On SQLite and PostgreSQL (the `store` fixture). See store/identity.py and docs/SHARING.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from attnstore.ingest import builtin_source, file_source, register_dataset
from attnstore.ingest import runner as runner_module
from attnstore.ingest.annotate import WhitespaceAnnotator
from attnstore.ingest.datasets import BUILTIN
from attnstore.ingest.runner import plan_dataset
from attnstore.ingest.sources import reading_options
from attnstore.store import migrate, open_store
from attnstore.store.identity import dataset_identity

DATA = Path(__file__).parents[1] / "fixtures" / "data"
MIGRATION = Path(__file__).parents[2] / "migrations" / "versions" / "0009_datasets_identity.py"
LINES = [f"the cat number {i} sat on the mat" for i in range(12)]
N_WORDS = sum(len(line.split()) for line in LINES)


def counts(store) -> tuple[int, int, int]:
    n = store.sql("SELECT (SELECT count(*) FROM datasets) AS d, (SELECT count(*) FROM examples) AS e, (SELECT count(*) FROM words) AS w")
    return int(n["d"][0]), int(n["e"][0]), int(n["w"][0])


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "first" / "sentences.txt"
    path.parent.mkdir()
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def annotations(monkeypatch) -> list[str]:
    """Every annotator made and every text annotated, as "make:<kind>" and the texts themselves.
    `spacy` is a whitespace annotator named like a spaCy pipeline (no spaCy needed)."""
    calls: list[str] = []

    class Counting(WhitespaceAnnotator):
        def __init__(self, kind: str):
            self.name = "whitespace" if kind == "whitespace" else "spacy:en_fake@0.0"

        def words(self, texts):
            calls.extend(texts)
            return super().words(texts)

    def make(kind: str):
        calls.append(f"make:{kind}")
        return Counting(kind)

    monkeypatch.setattr(runner_module, "make_annotator", make)
    return calls


def register(store, source, annotator="whitespace", **kw):
    told: list[str] = []
    dataset_id, name = register_dataset(store, source, annotator=annotator, progress=False, notify=told.append, **kw)
    return dataset_id, name, told


# ---------------------------------------------------------------- one content, one dataset


def test_same_file_under_two_names_is_one_dataset_annotated_once(store, corpus, annotations):
    first, annotator, told = register(store, file_source(str(corpus), "text", name="mine"))
    assert annotator == "whitespace" and told == []
    assert counts(store) == (1, len(LINES), N_WORDS)
    assert annotations == ["make:whitespace", *LINES]
    annotations.clear()
    again, annotator, told = register(store, file_source(str(corpus), "text", name="yours", split="other"))
    assert again == first and annotator == "whitespace"
    assert annotations == []  # no annotator made, nothing annotated
    assert counts(store) == (1, len(LINES), N_WORDS)
    (line,) = told
    assert "yours:other" in line and "mine:sentences" in line and "reusing it" in line
    row = store.sql("SELECT name, split, identity FROM datasets").iloc[0]
    assert (row["name"], row["split"]) == ("mine", "sentences")  # stored under the first name
    # the same name again says nothing
    assert register(store, file_source(str(corpus), "text", name="mine"))[2] == []


def test_copied_file_at_another_path_is_reused(store, corpus, tmp_path, annotations):
    first, _, _ = register(store, file_source(str(corpus), "text"))
    copy = tmp_path / "elsewhere" / "copy.txt"
    copy.parent.mkdir()
    shutil.copy(corpus, copy)
    annotations.clear()
    again, _, told = register(store, file_source(str(copy), "text"))
    assert again == first and annotations == [] and len(told) == 1
    assert counts(store) == (1, len(LINES), N_WORDS)


def test_builtin_key_and_its_file_with_the_same_options_are_one_dataset(store, annotations):
    path = DATA / "glue" / "MRPC" / "dev.tsv"
    first, _, _ = register(store, builtin_source("glue/MRPC:dev", str(DATA)))
    n = counts(store)
    annotations.clear()
    same = file_source(str(path), "pairs-tsv", name="my-mrpc", text_a="#1 String", text_b="#2 String", label="Quality", quoting="none")
    again, _, told = register(store, same)
    assert again == first and annotations == [] and counts(store) == n and len(told) == 1


def test_options_that_do_not_change_examples_are_not_identity(corpus, tmp_path):
    def identity(source, **selection):
        return plan_dataset(source, **selection).identity("whitespace")

    base = identity(file_source(str(corpus), "text"))
    assert identity(file_source(str(corpus), "text", name="x", split="y")) == base  # name, split
    assert identity(file_source(str(corpus), "text", quoting="csv")) == base  # read_text takes no options
    assert identity(file_source(str(corpus), "text"), seed=5) == base  # a seed without --sample selects nothing
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\tlabel\na b\tc d\t1\n", encoding="utf-8")
    cli_default = file_source(str(pairs), "pairs-tsv", text_a=None, text_b=None, label=None, quoting="none")  # what the CLI passes
    assert identity(cli_default) == identity(file_source(str(pairs), "pairs-tsv"))  # the reader's default, given or not
    assert reading_options(runner_module.read_pairs_tsv, {"text_a": None, "quoting": "none"}) == {"quoting": "none"}


def test_options_that_change_examples_are_identity(corpus):
    def identity(source, annotator="whitespace", **selection):
        return plan_dataset(source, **selection).identity(annotator)

    text = file_source(str(corpus), "text")
    seen = {
        identity(text),
        identity(text, limit=3),
        identity(text, limit=4),
        identity(text, sample=3, seed=0),
        identity(text, sample=3, seed=1),
        identity(text, annotator="spacy"),
        identity(file_source(str(corpus), "tsv", text_a="the cat number 0 sat on the mat")),
        identity(builtin_source("gum/ontogum:dev", str(DATA), window_words=30)),
        identity(builtin_source("gum/ontogum:dev", str(DATA), window_words=40)),
        identity(builtin_source("gum/ontogum:dev", str(DATA))),
    }
    assert len(seen) == 10
    # a --limit or --sample that takes every example is the whole corpus: the same dataset, split and identity
    for whole in (dict(limit=len(LINES)), dict(limit=100), dict(sample=len(LINES), seed=3), dict(sample=100)):
        plan = plan_dataset(text, **whole)
        assert (plan.identity("whitespace"), plan.split, plan.chosen) == (identity(text), "sentences", list(range(len(LINES))))
    # the default window is its value: the same dataset asked for with or without it
    assert identity(builtin_source("gum/ontogum:dev", str(DATA))) == identity(
        builtin_source("gum/ontogum:dev", str(DATA), window_words=128)
    )
    # gold annotation ignores --annotate
    gum = builtin_source("gum/ontogum:dev", str(DATA), window_words=30)
    assert identity(gum, annotator="spacy") == identity(gum, annotator="whitespace")
    # RTE's label map is part of its options: its file read without it is another dataset
    rte = builtin_source("glue/RTE:dev", str(DATA))
    assert rte.options["label_map"] == {"0": "entailment", "1": "not_entailment"}
    plain = file_source(
        str(DATA / "glue" / "RTE" / "dev.tsv"),
        "pairs-tsv",
        text_a="sentence1",
        text_b="sentence2",
        label="label",
        quoting="csv",
        index="idx",
    )
    assert identity(rte) != identity(plain)


def test_window_words_limit_and_annotator_make_other_datasets(store, corpus, annotations):
    a, _, _ = register(store, builtin_source("gum/ontogum:dev", str(DATA), window_words=30))
    b, _, _ = register(store, builtin_source("gum/ontogum:dev", str(DATA), window_words=40))
    assert a != b  # same name, split and checksum: two datasets
    rows = store.sql("SELECT name, split, checksum, options, n_examples FROM datasets ORDER BY id")
    assert rows["name"].nunique() == 1 and rows["split"].nunique() == 1 and rows["checksum"].nunique() == 1
    assert rows["n_examples"][0] > rows["n_examples"][1]
    assert register(store, builtin_source("gum/ontogum:dev", str(DATA), window_words=30))[0] == a
    annotations.clear()
    c, _, _ = register(store, file_source(str(corpus), "text"), limit=5)
    d, _, _ = register(store, file_source(str(corpus), "text"), limit=6)
    e, annotator, _ = register(store, file_source(str(corpus), "text"), annotator="spacy", limit=5)
    assert len({a, b, c, d, e}) == 5 and annotator == "spacy:en_fake@0.0"
    assert annotations.count("make:whitespace") == 2 and annotations.count("make:spacy") == 1
    annotations.clear()
    assert register(store, file_source(str(corpus), "text", name="again"), annotator="spacy", limit=5)[0] == e
    assert annotations == []
    identities = store.sql("SELECT identity FROM datasets")["identity"]
    assert identities.is_unique and identities.str.fullmatch("[0-9a-f]{64}").all()


def test_stored_identity_is_recomputed_from_the_row(store, corpus):
    register(store, file_source(str(corpus), "text"), limit=4)
    register(store, builtin_source("glue/RTE:dev", str(DATA)))
    register(store, builtin_source("gum/ontogum:dev", str(DATA), window_words=30))
    for row in store.sql("SELECT checksum, format, options, annotator, identity FROM datasets").itertuples():
        options = json.loads(row.options) if isinstance(row.options, str) else row.options
        assert dataset_identity(checksum=row.checksum, format=row.format, options=options, annotator=row.annotator) == row.identity


# ---------------------------------------------------------------- concurrency: a lease on the identity

SECOND = """
import sys, time
from attnstore.ingest import file_source, register_dataset
from attnstore.ingest import annotate
from attnstore.store import open_store
url, root, corpus, name, gate, log = sys.argv[1:]
words = annotate.WhitespaceAnnotator.words
def slow(self, texts):
    import os
    while gate != "-" and not os.path.exists(gate):
        time.sleep(0.02)
    with open(log, "a") as fh:
        fh.write("".join(t + "\\n" for t in texts))
    return words(self, texts)
annotate.WhitespaceAnnotator.words = slow
store = open_store(db=url, root=root)
dataset_id, _ = register_dataset(store, file_source(corpus, "text", name=name), annotator="whitespace", progress=True, notify=print)
print("dataset", dataset_id)
"""


@pytest.mark.slow  # two real processes
def test_two_processes_one_file_two_names_register_it_once(store, db_url, corpus, tmp_path):
    url = db_url if db_url.startswith("sqlite") else store.engine.url.render_as_string(hide_password=False)
    root, gate, log = str(tmp_path / "z"), tmp_path / "go", tmp_path / "annotated.txt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

    def spawn(name: str, gated: bool) -> subprocess.Popen:
        args = [sys.executable, "-c", SECOND, url, root, str(corpus), name, str(gate) if gated else "-", str(log)]
        return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    identity = plan_dataset(file_source(str(corpus), "text")).identity("whitespace")
    first = spawn("first", gated=True)  # annotates only once the gate opens, holding the dataset's lease
    deadline = time.time() + 60
    engine = sa.create_engine(url)
    try:
        while time.time() < deadline and first.poll() is None:
            with engine.connect() as conn:
                if conn.execute(sa.text("SELECT count(*) FROM leases WHERE resource = :r"), {"r": f"dataset:{identity}"}).scalar():
                    break
            time.sleep(0.05)
        else:
            pytest.fail(f"the first process never took the dataset's lease: {first.communicate()[1][-2000:]}")
    finally:
        engine.dispose()
    second = spawn("second", gated=False)
    waiting: list[str] = []

    def read_until_waiting() -> None:
        for line in second.stderr:
            waiting.append(line)
            if line.startswith("waiting:"):
                return

    reader = threading.Thread(target=read_until_waiting, daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert waiting and waiting[-1].startswith("waiting: dataset second:sentences is being written by"), waiting
    gate.touch()
    out_first, err_first = first.communicate(timeout=120)
    out_second, err_second = second.communicate(timeout=120)
    assert first.returncode == 0, err_first[-2000:]
    assert second.returncode == 0, err_second[-2000:]
    assert out_first.splitlines()[-1] == out_second.splitlines()[-1]  # the same dataset id
    assert "has the content of stored dataset first:sentences" in out_second
    assert log.read_text(encoding="utf-8").splitlines() == LINES  # annotated once, by the first
    assert counts(store) == (1, len(LINES), N_WORDS)
    assert store.sql("SELECT count(*) AS n FROM leases")["n"][0] == 0


# ---------------------------------------------------------------- rows stored before revision 0009


def _migration():
    spec = importlib.util.spec_from_file_location("migration_0009", MIGRATION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_migration_backfill_agrees_with_ingest_for_every_builtin():
    """The migration's frozen copy gives every built-in dataset, as it was stored before 0009 (no label map,
    defaults left out), the identity a new ingest computes."""
    migration = _migration()
    for spec in BUILTIN:
        selection = {"limit": None, "sample": 5, "seed": 1}
        old = {**{k: v for k, v in spec.options.items() if k != "label_map"}, **selection}
        new = {**reading_options(spec.reader, spec.options), **selection}
        assert migration.canonical_options(spec.name, spec.reader.__name__, old) == new, spec.key
        annotator = "gold" if spec.annotation == "gold" else "spacy:en_core_web_sm@3.8.0"
        want = dataset_identity(checksum="c", format=spec.reader.__name__, options=new, annotator=annotator)
        assert migration.identity("c", spec.reader.__name__, new, annotator) == want
    for fmt, cli in (("pairs-tsv", dict(text_a=None, text_b=None, label=None, quoting="none")), ("tsv", dict(text_a="t", label=None))):
        new = reading_options(runner_module.FORMAT_READERS[fmt], cli)
        assert migration.canonical_options("x", fmt, {**cli, "limit": 3}) == {**new, "limit": 3}


def test_rows_stored_before_the_migration_are_found_after_it(db_url, tmp_path, corpus, annotations):
    """Datasets registered by the old code (found by name, split and checksum) get their identity from their
    columns: a new ingest of the same content reuses them; their examples and words survive the table copy."""
    from attnstore.ingest.corpus import file_checksum
    from attnstore.ingest.datasets import path_checksum

    migrate.upgrade(db_url, "0008")
    rte = DATA / "glue" / "RTE" / "dev.tsv"
    unselected = {"limit": None, "sample": None, "seed": None}
    rte_options = {k: v for k, v in builtin_source("glue/RTE:dev", str(DATA)).options.items() if k != "label_map"}
    gum = DATA / "gum_ontogum" / "dev"
    old_rows = [  # what the code before 0009 stored: found by (name, split, checksum), no label map
        ("glue/RTE", "dev", "read_pairs_tsv", path_checksum(rte), "whitespace", {**rte_options, **unselected}),
        ("first", "sentences", "text", file_checksum(corpus), "whitespace", {**unselected, "limit": 4}),
        ("gum/ontogum", "dev", "read_gum_documents", path_checksum(gum), "gold", {"window_words": 30, **unselected}),
    ]
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        for i, (name, split, fmt, checksum, annotator, options) in enumerate(old_rows, start=1):
            conn.execute(
                sa.text(
                    "INSERT INTO datasets (id, name, split, format, source, checksum, annotator, status, n_examples, options, created_at) "
                    "VALUES (:i, :n, :s, :f, 'old', :c, :a, 'complete', 1, :o, :t)"
                ),
                dict(i=i, n=name, s=split, f=fmt, c=checksum, a=annotator, o=json.dumps(options), t="2026-01-01 00:00:00"),
            )
            conn.execute(sa.text("INSERT INTO examples (id, dataset_id, position, text_a) VALUES (:i, :i, 0, 'not old')"), {"i": i})
            conn.execute(
                sa.text("INSERT INTO words (example_id, position, segment, sentence, form, annotator) VALUES (:i, 0, 0, 0, 'not', 'x')"),
                {"i": i},
            )
        if db_url.startswith("postgresql"):
            conn.execute(sa.text("SELECT setval('datasets_id_seq', 3)"))
            conn.execute(sa.text("SELECT setval('examples_id_seq', 3)"))
    engine.dispose()
    migrate.upgrade(db_url)
    store = open_store(db=db_url, root=str(tmp_path / "z"))
    try:
        assert counts(store) == (3, 3, 3)  # nothing lost to the table copy (SQLite: ON DELETE CASCADE)
        assert len(store.sql("SELECT * FROM negated_examples")) == 3 and len(store.sql("SELECT * FROM word_annotations")) == 3
        assert store.sql("SELECT identity FROM datasets")["identity"].is_unique
        assert register(store, builtin_source("glue/RTE:dev", str(DATA)))[0] == 1
        assert register(store, file_source(str(corpus), "text", name="renamed"), limit=4)[0] == 2
        assert register(store, builtin_source("gum/ontogum:dev", str(DATA), window_words=30))[0] == 3
        assert annotations == [] and counts(store) == (3, 3, 3)
    finally:
        store.close()


# ---------------------------------------------------------------- ingest: runs share the dataset


def test_ingest_under_two_dataset_names_runs_over_one_dataset(store, corpus, tiny_bert, annotations):
    from click.testing import CliRunner

    from attnstore.api.cli import main

    url = store.locations.db_url if store.engine.dialect.name == "sqlite" else store.engine.url.render_as_string(hide_password=False)
    base = ["ingest", "--corpus", str(corpus), "--format", "text", "--model", tiny_bert, "--annotate", "whitespace", "--no-progress"]
    where = ["--db", url, "--root", store.locations.array_root]
    first = CliRunner().invoke(main, [*base, "--dataset-name", "a", "--name", "run-a", *where])
    assert first.exit_code == 0, first.output
    annotations.clear()
    second = CliRunner().invoke(main, [*base, "--dataset-name", "b", "--split", "s", "--name", "run-b", *where])
    assert second.exit_code == 0, second.output
    assert annotations == []
    notes = [line for line in second.stderr.splitlines() if "reusing it" in line]
    assert len(notes) == 1 and "dataset b:s has the content of stored dataset a:sentences" in notes[0], second.stderr
    assert counts(store) == (1, len(LINES), N_WORDS)
    runs = store.sql("SELECT name, dataset_id FROM runs ORDER BY name")
    assert runs["dataset_id"].nunique() == 1 and list(runs["name"]) == ["run-a", "run-b"]
    manifest = store.run_info("run-b").manifest["corpus"]["dataset"]
    assert (manifest["name"], manifest["split"]) == ("a", "sentences") and len(manifest["identity"]) == 64
    assert store.run_info("run-b").n_stored == len(LINES)
