"""Command output that fits a terminal (issue 24, item 14), through the commands: a wide per-head query
table is summarised with a note, --columns picks columns, csv keeps them all, `tokens` leaves out its
constant annotator column."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from attnstore.api.cli import main

TOKENS = [["[CLS]", "a", "b", "[SEP]"]]


def maps(length: int) -> np.ndarray:
    out = np.zeros((2, 3, length, length), dtype=np.float32)
    out[..., 0] = 1
    return out


@pytest.fixture
def where(store):
    url = store.locations.db_url if store.engine.dialect.name == "sqlite" else store.engine.url.render_as_string(hide_password=False)
    return ["--db", url, "--root", store.locations.array_root]


@pytest.fixture
def wide_query(monkeypatch):
    """A per-head query as wide as `dependency` on a treebank: layer, head and 44 columns."""
    from attnstore.queries import QUERIES, QuerySpec, load_all

    def wide(store, *, run):
        info = store.run_info(run)
        layer, head = np.meshgrid(np.arange(info.n_layers), np.arange(info.n_heads), indexing="ij")
        frame = pd.DataFrame({"layer": layer.ravel(), "head": head.ravel()})
        for i in range(44):
            frame[f"rel{i:02d}:dep2head"] = (layer.ravel() * 10 + head.ravel() + i) / 100
        return frame

    load_all()
    monkeypatch.setitem(QUERIES, "wide", QuerySpec("wide", wide, "46 columns", True))
    return "wide"


@pytest.mark.one_backend
def test_a_wide_query_table_fits_the_terminal(store, make_run, where, wide_query):
    run = make_run(store, [maps(4)], TOKENS, name="w")
    result = CliRunner().invoke(main, ["query", wide_query, "--run", run, *where], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 100 and lines[0].split() == ["column", "mean", "min", "max", "max_layer", "max_head"]
    assert lines[2].split() == ["rel00:dep2head", "0.0600", "0.0000", "0.1200", "1", "2"]
    assert "note: 44 columns x 6 heads are wider than the terminal (100 characters)" in result.stderr

    args = ["query", wide_query, "--run", run, "--columns", "layer,head,rel43:dep2head", *where]
    picked = CliRunner().invoke(main, args, env={"COLUMNS": "100"})
    assert picked.exit_code == 0, picked.output
    assert picked.stdout.splitlines()[0].split() == ["layer", "head", "rel43:dep2head"] and len(picked.stdout.splitlines()) == 2 + 6

    as_csv = CliRunner().invoke(main, ["query", wide_query, "--run", run, "--format", "csv", *where], env={"COLUMNS": "100"})
    assert as_csv.stdout.splitlines()[0].count(",") == 45 and "note:" not in as_csv.stderr


@pytest.mark.one_backend
def test_unknown_columns_are_one_line(store, make_run, where):
    run = make_run(store, [maps(4)], TOKENS, name="w")
    result = CliRunner().invoke(main, ["query", "entropy", "--run", run, "--columns", "layer,bogus", *where])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("Error: --columns: no column 'bogus'; columns: layer, head, entropy")


@pytest.mark.one_backend
def test_runs_and_tokens_take_columns(store, make_run, where):
    run = make_run(store, [maps(4)], TOKENS, name="w")
    runs = CliRunner().invoke(main, ["runs", "--columns", "run,n_layers", *where])
    assert runs.exit_code == 0, runs.output
    assert [line.split() for line in runs.stdout.splitlines()] == [["run", "n_layers"], ["-----", "----------"], ["w", "2"]]
    tokens = CliRunner().invoke(main, ["tokens", "--run", run, "--example", "0", "--columns", "position,token", *where])
    assert tokens.stdout.split() == ["position", "token", "----------", "-------", "0", "[CLS]", "1", "a", "2", "b", "3", "[SEP]"]


@pytest.mark.one_backend
def test_tokens_table_leaves_out_the_constant_annotator(store, make_run, where):
    run = make_run(store, [maps(4)], TOKENS, name="w")
    table = CliRunner().invoke(main, ["tokens", "--run", run, "--example", "0", *where])
    assert table.exit_code == 0, table.output
    assert "annotator" not in table.stdout.splitlines()[0]
    (note,) = [line for line in table.stderr.splitlines() if line.startswith("note:")]
    assert note.startswith("note: annotator is ") and "on every row that has one" in note
    as_csv = CliRunner().invoke(main, ["tokens", "--run", run, "--example", "0", "--format", "csv", *where])
    assert "annotator" in as_csv.stdout.splitlines()[0]
    # in a narrow terminal the table keeps the word, its POS and its dependency, and leaves out ids and offsets
    narrow = CliRunner().invoke(main, ["tokens", "--run", run, "--example", "0", *where], env={"COLUMNS": "80"})
    header = narrow.stdout.splitlines()[0].split()
    assert header[:7] == ["position", "token", "word_position", "word", "upos", "head", "deprel"] and "token_id" not in header
    assert as_csv.stdout.splitlines()[0].split(",")[:3] == ["position", "token", "token_id"]  # csv keeps the frame's order


@pytest.mark.one_backend
def test_output_into_a_new_folder_is_written_and_an_unwritable_one_fails_before_the_query(store, make_run, where, tmp_path, monkeypatch):
    """--output makes its folder (as `view --out` does); a path that cannot be written is one Error line, given before
    the query runs, so nothing is computed and lost and --save saves nothing."""
    run = make_run(store, [maps(4)], TOKENS, name="o")
    target = tmp_path / "new" / "deeper" / "entropy.csv"
    written = CliRunner().invoke(main, ["query", "entropy", "--run", run, "--format", "csv", "--output", str(target), *where])
    assert written.exit_code == 0, written.output
    assert pd.read_csv(target).shape[0] == 2 * 3 and f"wrote 6 rows to {target}" in written.stderr

    import dataclasses

    from attnstore.queries import QUERIES

    ran = []
    spec = QUERIES["entropy"]
    monkeypatch.setitem(QUERIES, "entropy", dataclasses.replace(spec, func=lambda *a, **k: ran.append(1) or spec.func(*a, **k)))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for bad, says in ((blocker / "x.csv", "cannot write --output"), (tmp_path / "new", "is a directory")):
        result = CliRunner().invoke(main, ["query", "entropy", "--run", run, "--save", "--output", str(bad), *where])
        assert result.exit_code != 0 and says in result.output and "Traceback" not in result.output, result.output
        assert [line for line in result.output.splitlines() if line.startswith("Error:")] == [result.output.strip().splitlines()[-1]]
    assert ran == [] and store.head_metrics(run).empty
    again = CliRunner().invoke(main, ["query", "entropy", "--run", run, "--output", str(tmp_path / "again.csv"), *where])
    assert again.exit_code == 0 and ran == [1], again.output  # the query the refusals never reached
