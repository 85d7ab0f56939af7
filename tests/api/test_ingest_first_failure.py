"""A failed first ingest (issue 49, item 12): `attnstore ingest` into a SQLite store that does not exist yet creates
it; when the command then fails before storing any example, what it created is removed, so no empty store is left
behind to mislead the next command. A store holding examples (an interrupted ingest resumes from it), and a store
or folder that existed before the command, are kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import attnstore.ingest
from attnstore.api.cli import main

pytestmark = pytest.mark.one_backend


def ingest_args(tmp_path: Path, case: str) -> list[str]:
    if case == "missing corpus":
        return ["--corpus", str(tmp_path / "nonexistent.txt"), "--format", "text"]
    corpus = tmp_path / "corpus.tsv"
    if case == "bad line":
        corpus.write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tthe cat sat.\ta cat sat.\nonly one column\n")
        return ["--corpus", str(corpus), "--format", "pairs-tsv", "--annotate", "whitespace"]
    assert case == "bad model"
    corpus.write_text("the cat sat.\n")
    return ["--corpus", str(corpus), "--format", "text", "--model", str(tmp_path / "no-such-model"), "--annotate", "whitespace"]


def run(args: list[str], **env):
    return CliRunner().invoke(main, ["ingest", *args, "--no-progress"], env={"HF_HUB_OFFLINE": "1", **env})


@pytest.mark.parametrize("case", ["missing corpus", "bad line", "bad model"])
def test_a_failed_first_ingest_leaves_no_store_behind(tmp_path, case):
    home = tmp_path / "home" / "attn"  # ATTNSTORE_HOME, two folders that do not exist yet
    result = run(ingest_args(tmp_path, case), ATTNSTORE_HOME=str(home))
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("creating a new store: ") and lines[-1].startswith("Error: "), result.output
    assert f"nothing was stored: removed the new store this command created ({home / 'meta.sqlite'})" in result.output
    assert not (tmp_path / "home").exists()  # the folders it made, too
    # the next command finds no store, rather than an empty one
    assert "creating a new store" in run(ingest_args(tmp_path, case), ATTNSTORE_HOME=str(home)).output


def test_what_existed_before_is_kept(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    root = tmp_path / "arrays"
    root.mkdir()
    (root / "keep.txt").write_text("mine")
    # a new database file beside the user's own files, with an array root that exists: only the database goes
    result = run(ingest_args(tmp_path, "missing corpus"), ATTNSTORE_HOME=str(home), ATTNSTORE_ROOT=str(root))
    assert result.exit_code == 1 and "removed the new store" in result.output, result.output
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt"] and (root / "keep.txt").read_text() == "mine"
    # a store that exists, empty: a failed ingest leaves it as it was
    assert CliRunner().invoke(main, ["db", "upgrade", "--home", str(home)]).exit_code == 0
    result = run(ingest_args(tmp_path, "missing corpus"), ATTNSTORE_HOME=str(home))
    assert result.exit_code == 1 and "removed" not in result.output, result.output
    assert (home / "meta.sqlite").exists() and (home / "attention.zarr").is_dir()


def test_an_interrupted_first_ingest_keeps_what_it_stored(tmp_path, tiny_bert, monkeypatch):
    from attnstore.ingest.runner import ingest as real_ingest

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat.\na dog ran.\n")
    args = ["--corpus", str(corpus), "--format", "text", "--model", tiny_bert, "--annotate", "whitespace", "--name", "tiny"]

    def interrupted_at_once(store, settings, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(attnstore.ingest, "ingest", interrupted_at_once, raising=False)
    result = run(args, ATTNSTORE_HOME=str(tmp_path / "a"))
    assert result.exit_code == 130 and "interrupted before anything was stored" in result.output, result.output
    assert not (tmp_path / "a").exists()

    def interrupted_after_storing(store, settings, **kwargs):
        real_ingest(store, settings, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(attnstore.ingest, "ingest", interrupted_after_storing, raising=False)
    result = run(args, ATTNSTORE_HOME=str(tmp_path / "b"))
    assert result.exit_code == 130 and "stored examples are kept" in result.output, result.output
    assert "removed" not in result.output
    listed = CliRunner().invoke(main, ["runs", "--home", str(tmp_path / "b"), "--format", "csv"])
    assert listed.exit_code == 0 and "tiny" in listed.output, listed.output
