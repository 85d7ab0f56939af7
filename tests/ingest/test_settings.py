"""RunSettings (ingest/settings.py): one checked value carries ingest's options from the command line to the runner,
the manifest and the run's row; and corpus formats dispatch through one table (ingest/corpus.py FORMAT_READERS)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from attnstore.api.ingest_cli import ingest as ingest_command
from attnstore.ingest import ingest
from attnstore.ingest.corpus import FORMAT_READERS, FORMATS, read_conllu, read_corpus, read_jsonl, read_pairs_tsv, read_text, read_tsv
from attnstore.ingest.errors import CorpusError, InvalidArgumentError
from attnstore.ingest.manifest import build_manifest
from attnstore.ingest.model import DEFAULT_MODEL
from attnstore.ingest.settings import RUN_FIELDS, STORAGE_FIELDS, RunSettings
from attnstore.store import arrays
from attnstore.store.schema import Run

FIXTURES = Path(__file__).parents[1] / "fixtures"
MRPC = FIXTURES / "mrpc_dev_head.tsv"
FILE = dict(corpus="c.tsv", fmt="pairs-tsv")


def test_defaults_are_the_command_lines():
    s = RunSettings(**FILE)
    assert (s.model, s.annotator, s.batch_size, s.truncation, s.dtype, s.seed) == (DEFAULT_MODEL, "spacy", 32, "truncate", "float16", 0)
    assert s.codec == arrays.DEFAULT_CODEC and s.codec is not arrays.DEFAULT_CODEC
    assert s.chunk_cells == arrays.DEFAULT_CHUNK_CELLS and s.max_length is None and s.tokenization is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(tokenization="chars"), "--tokenize must be one of ('text', 'words'), not 'chars'"),
        (dict(truncation="cut"), "truncation must be one of ('truncate', 'skip'), not 'cut'"),
        (dict(dtype="int8"), "dtype must be one of ('float16', 'float32'), not 'int8'"),
        (dict(batch_size=0), "--batch-size, --limit and --sample must be positive"),
        (dict(limit=0), "--batch-size, --limit and --sample must be positive"),
        (dict(window_words=-1), "--window-words must be positive, or 0 for whole documents"),
        (dict(limit=2, sample=3), "use either --limit or --sample, not both"),
        (dict(corpus=None), "give either --corpus FILE (with --format) or --dataset NAME:SPLIT"),
        (dict(dataset="glue/MRPC:dev"), "give either --corpus FILE (with --format) or --dataset NAME:SPLIT"),
        (dict(fmt=None), "--corpus needs --format (text, tsv, pairs-tsv, conllu or jsonl)"),
        (dict(chunk_cells=0), "--chunk-cells must be a positive number of cells, not 0"),
        (dict(chunk_cells=True), "--chunk-cells must be a positive number of cells, not True"),
        (dict(name="a\tb"), "run name 'a\\tb' is not usable"),
        (dict(codec={"name": "lz4"}), "unsupported codec {'name': 'lz4'}; only blosc codecs are supported"),
        (dict(window_words=50), "--window-words cuts gum/ontogum documents into windows; c.tsv has none: leave it out"),
        (
            dict(corpus=None, fmt=None, dataset="glue/MRPC:dev", window_words=50),
            "--window-words cuts gum/ontogum documents into windows; glue/MRPC:dev has none",
        ),
    ],
)
def test_bad_settings_fail_when_made_in_one_line(options, message):
    with pytest.raises(InvalidArgumentError) as info:
        RunSettings(**{**FILE, **options})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_settings_are_frozen_and_own_their_mappings():
    reading = {"quoting": "csv"}
    s = RunSettings(**FILE, read_options=reading)
    reading["quoting"] = "none"
    assert s.read_options == {"quoting": "csv"}
    with pytest.raises(AttributeError):
        s.batch_size = 4  # type: ignore[misc]


def test_of_takes_ingests_keywords_and_keeps_the_rest_as_reader_options():
    s = RunSettings.of(corpus="c.tsv", fmt="pairs-tsv", limit=8, text_a="#1 String", quoting="csv")
    assert s == RunSettings(corpus="c.tsv", fmt="pairs-tsv", limit=8, read_options={"text_a": "#1 String", "quoting": "csv"})
    with pytest.raises(InvalidArgumentError, match="use either --limit or --sample"):
        RunSettings.of(corpus="c.tsv", fmt="text", limit=1, sample=1)


def test_resolved_fills_in_what_depends_on_the_model_and_corpus():
    s = RunSettings(**FILE)
    assert (s.resolved(model_max_length=512, gold=False).max_length, s.resolved(model_max_length=512, gold=False).tokenization) == (
        512,
        "text",
    )
    assert s.resolved(model_max_length=128, gold=True).tokenization == "words"
    given = RunSettings(**FILE, max_length=64, tokenization="text").resolved(model_max_length=512, gold=True)
    assert (given.max_length, given.tokenization) == (64, "text")
    for bad in (2, 513):
        with pytest.raises(InvalidArgumentError, match="^--max-length must be between 3 and the model's limit 512$"):
            RunSettings(**FILE, max_length=bad).resolved(model_max_length=512, gold=False)


def test_run_fields_are_run_columns_and_need_resolved_settings():
    with pytest.raises(ValueError, match="resolved"):
        RunSettings(**FILE).run_fields()
    fields = RunSettings(**FILE, batch_size=4).resolved(model_max_length=512, gold=False).run_fields()
    assert list(fields) == [*RUN_FIELDS, *STORAGE_FIELDS]
    assert set(fields) <= set(Run.__table__.columns.keys())
    assert fields["batch_size"] == 4 and fields["codec"] == arrays.DEFAULT_CODEC


def test_manifest_records_the_settings_in_their_places():
    class Loaded:
        name, source, weights_sha256, architecture, n_layers, n_heads = "m", "/m", "0" * 64, "BertModel", 2, 4
        tokenizer, special_tokens, attn_implementation = object(), {}, "eager"

    settings = RunSettings(**FILE, dtype="float32", chunk_cells=4096).resolved(model_max_length=64, gold=False)
    m = build_manifest(loaded=Loaded(), settings=settings, corpus="/c.tsv", fmt="pairs-tsv", corpus_checksum="ab", annotator="whitespace")
    assert list(m)[:10] == ["model", "tokenizer", "attn_implementation", *RUN_FIELDS, "corpus", "storage"]
    assert {k: m[k] for k in RUN_FIELDS} == {
        "tokenization": "text",
        "dtype": "float32",
        "max_length": 64,
        "truncation": "truncate",
        "batch_size": 32,
    }
    assert m["storage"] == {
        "codec": arrays.DEFAULT_CODEC,
        "chunk_cells": 4096,
        "layout": "flat (layer, head, query, key) blocks at offsets",
    }
    assert m["corpus"] == {"path": "/c.tsv", "format": "pairs-tsv", "sha256": "ab", "annotator": "whitespace"}


def test_every_ingest_option_is_a_setting_or_named_by_the_command():
    """The command passes its options to RunSettings by name: an option that is not a field fails at once."""
    fields = set(inspect.signature(RunSettings).parameters)
    own = set(inspect.signature(ingest_command.callback).parameters) - {"options"}
    for param in ingest_command.params:
        if param.name not in own and param.name not in {"home", "root", "db", "read_only"}:
            assert param.name in fields, param.name


def test_ingest_takes_settings_or_keywords_not_both():
    with pytest.raises(TypeError, match="not both"):
        ingest(None, RunSettings(**FILE), limit=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="use either --limit or --sample"):
        ingest(None, corpus="c.tsv", fmt="text", limit=1, sample=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_settings_and_keywords_make_the_same_run(store, tiny_bert):
    pytest.importorskip("torch")
    common = dict(corpus=str(MRPC), fmt="pairs-tsv", model=tiny_bert, annotator="whitespace", batch_size=4, limit=6)
    by_keywords = ingest(store, **common, name="k", quoting="none", progress=False).run
    by_settings = ingest(store, RunSettings(**common, name="s", read_options={"quoting": "none"}), progress=False).run
    rows = store.sql("SELECT * FROM runs ORDER BY id")
    skip = {"id", "name", "array_path", "manifest", "started_at", "finished_at", "ingest_seconds"}
    assert [rows.iloc[0][c] for c in rows.columns if c not in skip] == [rows.iloc[1][c] for c in rows.columns if c not in skip]
    assert (by_keywords.n_stored, by_settings.n_stored) == (6, 6) and by_keywords.dataset_id == by_settings.dataset_id


def test_formats_dispatch_through_one_table(tmp_path):
    assert FORMAT_READERS == {"text": read_text, "tsv": read_tsv, "pairs-tsv": read_pairs_tsv, "conllu": read_conllu, "jsonl": read_jsonl}
    assert FORMATS == ("text", "tsv", "pairs-tsv", "conllu", "jsonl")  # the command line's choices, in this order
    text = tmp_path / "t.txt"
    text.write_text("a b\n\nc\n", encoding="utf-8")
    # readers without reading options (text, CoNLL-U) are given none, whatever read_corpus gets
    assert [e.text_a for e in read_corpus(text, "text", quoting="none")] == ["a b", "c"]
    assert len(list(read_corpus(FIXTURES / "ewt_dev_excerpt.conllu", "conllu", text_a="x"))) == 6
    assert [e.text_b for e in read_corpus(MRPC, "pairs-tsv", text_a="#2 String", text_b="#1 String")][0].startswith("He said")
    with pytest.raises(TypeError):
        list(read_corpus(MRPC, "pairs-tsv", no_such_option=1))
    with pytest.raises(CorpusError, match="unknown format 'xml'.*use one of text, tsv, pairs-tsv, conllu, jsonl"):
        read_corpus(text, "xml")
