"""The command line: help everywhere, db commands, queries, and bad input that leaves the store intact."""

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from attnstore.api.cli import main

FIXTURES = Path(__file__).parents[1] / "fixtures"
DOCS = Path(__file__).parents[2] / "docs" / "CLI.md"


def all_commands(group=main, prefix=()):
    """Every command, lazily loaded ones included (group.commands holds only those loaded so far)."""
    ctx = click.Context(group, info_name="attnstore")
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from all_commands(cmd, prefix + (name,))


def test_all_commands_include_the_lazily_loaded_ones():
    names = {" ".join(path) for path, _ in all_commands()}
    assert {"ingest", "probe train", "finetune", "serve", "export", "patterns classify", "report table1"} <= names


def test_every_command_has_help_and_is_documented():
    docs = DOCS.read_text(encoding="utf-8")
    runner = CliRunner()
    for path, cmd in all_commands():
        result = runner.invoke(main, [*path, "--help"])
        assert result.exit_code == 0, path
        assert cmd.help, f"{' '.join(path)} has no help text"
        assert f"attnstore {' '.join(path)}" in docs, f"`attnstore {' '.join(path)}` is missing from docs/CLI.md"


def test_db_upgrade_then_current(db_url):
    runner = CliRunner()
    first = runner.invoke(main, ["db", "upgrade", "--db", db_url])
    assert first.exit_code == 0 and "upgraded from empty to revision" in first.output
    again = runner.invoke(main, ["db", "upgrade", "--db", db_url])
    assert "already at revision" in again.output
    current = runner.invoke(main, ["db", "current", "--db", db_url])
    assert current.exit_code == 0 and "up to date" in current.output


def test_db_upgrade_creates_the_array_root_too(tmp_path):
    result = CliRunner().invoke(main, ["db", "upgrade", "--home", str(tmp_path / "h")])
    assert result.exit_code == 0 and (tmp_path / "h" / "attention.zarr").is_dir() and "arrays in" in result.output


def test_ingest_creates_the_embedded_store_on_a_fresh_machine(tmp_path, tiny_bert):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b\n", encoding="utf-8")
    home = tmp_path / "fresh"
    runner = CliRunner()
    result = runner.invoke(
        main,
        [
            "ingest",
            "--home",
            str(home),
            "--corpus",
            str(corpus),
            "--format",
            "text",
            "--annotate",
            "whitespace",
            "--model",
            tiny_bert,
            "--name",
            "r",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "creating a new store" in result.output and (home / "meta.sqlite").is_file()
    assert "r" in runner.invoke(main, ["runs", "--home", str(home)]).output
    # a read command never creates a store
    empty = tmp_path / "nothing"
    result = runner.invoke(main, ["runs", "--home", str(empty)])
    assert result.exit_code == 1 and not (empty / "meta.sqlite").exists()


def test_ingest_summary_counts_new_examples_apart_from_the_runs_stored_ones(tmp_path, tiny_bert):
    """The summary line: the examples this command took, then the whole run's stored / truncated / skipped counts (a
    run whose every example is skipped stored none; the line once said "stored 2 examples ... (0 stored")."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c d e f\ng h i j k\n", encoding="utf-8")
    base = ["ingest", "--home", str(tmp_path / "h"), "--corpus", str(corpus), "--format", "text", "--annotate", "whitespace"]
    args = [*base, "--model", tiny_bert, "--max-length", "4", "--truncation", "skip", "--name", "s", "--no-progress"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "run 's': 2 new examples in " in result.output and "(the run: 0 stored, 0 truncated, 2 skipped;" in result.output


def test_out_of_date_database_exits_with_the_command(db_url, tmp_path):
    from attnstore.store import migrate

    migrate.upgrade(db_url, "0001")
    result = CliRunner().invoke(main, ["runs", "--db", db_url, "--root", str(tmp_path)])
    assert result.exit_code == 1
    assert "expected" in result.output and "attnstore db upgrade --db" in result.output
    assert "out of date" in CliRunner().invoke(main, ["db", "current", "--db", db_url]).output


@pytest.fixture(scope="module")
def populated(tmp_path_factory):
    """A store with one small real run (text format, whitespace words)."""
    home = tmp_path_factory.mktemp("home")
    corpus = home / "three.txt"
    corpus.write_text("The cat sat.\nDogs bark loudly, don't they?\nCafé au lait.\n", encoding="utf-8")
    runner = CliRunner()
    assert runner.invoke(main, ["db", "upgrade", "--home", str(home)]).exit_code == 0
    result = runner.invoke(
        main,
        [
            "ingest",
            "--home",
            str(home),
            "--corpus",
            str(corpus),
            "--format",
            "text",
            "--annotate",
            "whitespace",
            "--name",
            "three",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    return home


def snapshot(home):
    from attnstore import open_store

    store = open_store(home=str(home))
    state = (
        store.runs().drop(columns=["started_at", "finished_at"]).to_json(),
        store.sql("SELECT count(*) AS n FROM datasets").n[0],
        store.sql("SELECT count(*) AS n FROM examples").n[0],
        store.attention("three", 1).tobytes(),
    )
    store.close()
    return state


def bad_file(home, name, data: bytes):
    path = home / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.model
def test_bad_input_is_one_line_nonzero_and_harmless(populated):
    home = populated
    before = snapshot(home)
    cases = [
        (["--corpus", bad_file(home, "empty.txt", b"\n\n"), "--format", "text"], "empty.txt: the corpus has no examples"),
        (
            ["--corpus", bad_file(home, "bad.tsv", b"sentence1\tsentence2\nA\tB\nC\n"), "--format", "pairs-tsv"],
            "bad.tsv:3: expected 2 tab-separated fields, found 1",
        ),
        (["--corpus", bad_file(home, "latin.txt", b"ok\nna\xefve\n"), "--format", "text"], "latin.txt:2: not valid UTF-8"),
        (
            ["--corpus", bad_file(home, "bad.conllu", b"1\tA\ta\tX\tX\t_\t0\troot\t_\n"), "--format", "conllu"],
            "bad.conllu:1: expected 10 tab-separated CoNLL-U columns, found 9",
        ),
        (["--corpus", str(home / "three.txt"), "--format", "text", "--model", str(home / "no-such-model")], "model directory"),
        (["--corpus", str(home / "three.txt"), "--format", "text", "--model", "not-a/real-model"], "cannot load model 'not-a/real-model'"),
    ]
    runner = CliRunner()
    for args, message in cases:
        result = runner.invoke(main, ["ingest", "--home", str(home), "--annotate", "whitespace", "--no-progress", *args])
        assert result.exit_code != 0, args
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
        assert message in lines[0]
    for args, message in [
        (["query", "entropy", "--run", "nope"], "no run 'nope'"),
        (["query", "entropyy", "--run", "three"], "no query named 'entropyy'"),
        (["tokens", "--run", "three", "--example", "99"], "has no example 99"),
        (["query", "special_tokens", "--run", "three", "--param", "bogus=1"], "has no parameter 'bogus'"),
    ]:
        result = runner.invoke(main, [*args, "--home", str(home)])
        assert result.exit_code == 1 and message in result.output and len(result.output.strip().splitlines()) == 1
    assert snapshot(home) == before


@pytest.mark.model
def test_query_formats_and_save(populated):
    runner = CliRunner()
    home = str(populated)
    as_json = runner.invoke(main, ["query", "relative_position", "--run", "three", "--format", "json", "--home", home])
    rows = json.loads(as_json.output)
    assert len(rows) == 6 * 12 and set(rows[0]) == {"layer", "head", "to_previous", "to_self", "to_next"}
    as_csv = runner.invoke(main, ["query", "entropy", "--run", "three", "--format", "csv", "--save", "--home", home])
    assert as_csv.output.splitlines()[0] == "layer,head,entropy,entropy_from_cls,uniform_entropy,uniform_entropy_from_cls"
    from attnstore import open_store

    saved = open_store(home=home).head_metrics("three", "entropy.entropy")
    assert len(saved) == 72
    listing = runner.invoke(main, ["queries"])
    assert "special_tokens" in listing.output and "relative_position" in listing.output
    shown = json.loads(runner.invoke(main, ["show", "three", "--home", home]).output)
    assert shown["manifest"]["model"]["name"] == "all-MiniLM-L6-v2"
