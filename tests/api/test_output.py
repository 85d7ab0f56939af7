"""CLI output: tables readable (text left, numbers right, integers as integers), JSON with real numbers and
unescaped text, empty results that say so."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from attnstore.api.common import TABLE_CELL_WIDTH, emit


def test_table_aligns_text_left_numbers_right_and_keeps_integers(capsys):
    frame = pd.DataFrame({"name": ["a", "longer"], "parent": [np.nan, 3.0], "score": [0.5, 12.25], "n": [1, 20]})
    emit(frame, "table")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "parent", "score", "n"]
    assert lines[2] == "a                  0.5000    1"
    assert lines[3] == "longer         3  12.2500   20"  # the id column made float by a missing value prints as 3


def test_long_text_is_cut_in_tables_only(capsys):
    text = "x" * (TABLE_CELL_WIDTH + 10)
    frame = pd.DataFrame({"text": [text]})
    emit(frame, "table")
    row = capsys.readouterr().out.splitlines()[2]
    assert row == "x" * (TABLE_CELL_WIDTH - 1) + "…"
    emit(frame, "csv")
    assert text in capsys.readouterr().out


def test_json_has_numbers_nulls_and_unescaped_text(capsys):
    frame = pd.DataFrame(
        {"dataset": ["glue/MRPC"], "layer": [np.int64(3)], "value": [np.nan], "ok": [True], "when": [pd.Timestamp("2026-01-02T03:04:05")]}
    )
    emit(frame, "json")
    out = capsys.readouterr().out
    assert "glue/MRPC" in out and "\\/" not in out
    assert json.loads(out) == [{"dataset": "glue/MRPC", "layer": 3, "value": None, "ok": True, "when": "2026-01-02T03:04:05"}]


def test_empty_results_say_so(capsys):
    emit(pd.DataFrame(columns=["run", "status"]), "table")
    assert capsys.readouterr().out.strip() == "(no rows; columns: run, status)"
    emit(pd.DataFrame(columns=["run"]), "json")
    assert json.loads(capsys.readouterr().out) == []


def test_a_missing_optional_package_is_one_line_naming_its_extra():
    import click
    import pytest

    from attnstore.api.common import friendly_errors

    @friendly_errors
    def needs_torch():
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    with pytest.raises(click.ClickException, match=r"needs the 'ingest' extra \(torch is not installed\): pip install torch==2.13.0"):
        needs_torch()


# --- tables that fit a terminal (issue 24, item 14) -------------------------------------------------------------


def per_head_frame(n_columns: int = 44, n_layers: int = 6, n_heads: int = 12) -> pd.DataFrame:
    """Like the `dependency` query's table: layer, head and 44 accuracy columns (`relation:direction`)."""
    rng = np.random.default_rng(0)
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    frame = pd.DataFrame({"layer": layer.ravel(), "head": head.ravel()})
    for i in range(n_columns):
        frame[f"relation_{i}:{'dep2head' if i % 2 else 'head2dep'}"] = rng.random(len(frame))
    return frame


def test_a_wide_per_head_table_is_summarised_to_fit_the_terminal(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    frame = per_head_frame()
    frame.loc[29, "relation_3:dep2head"] = 1.5  # the max of that column: layer 2, head 5
    emit(frame, "table")
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert max(map(len, lines)) <= 100
    assert lines[0].split() == ["column", "mean", "min", "max", "max_layer", "max_head"]
    assert len(lines) == 2 + 44
    row = next(line for line in lines if line.startswith("relation_3:dep2head"))
    assert row.split()[3:] == ["1.5000", "2", "5"]
    assert captured.err.startswith("note: 44 columns x 72 heads are wider than the terminal (100 characters)")
    assert "--columns A,B" in captured.err and "--format csv or json" in captured.err


def test_csv_and_json_keep_every_column_of_a_wide_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    frame = per_head_frame()
    emit(frame, "csv")
    out = capsys.readouterr()
    assert out.out.splitlines()[0].count(",") == 45 and len(out.out.split()) == 73 and not out.err
    emit(frame, "json")
    assert len(json.loads(capsys.readouterr().out)[0]) == 46


def test_without_a_terminal_the_table_is_whole(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # pytest's stdout is not a terminal: a pipe or a file gets every column
    emit(per_head_frame(), "table")
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].split()[:3] == ["layer", "head", "relation_0:head2dep"] and not captured.err


def test_columns_selects_columns_in_every_format(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    frame = per_head_frame()
    emit(frame, "table", columns="layer,head,relation_3:dep2head")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["layer", "head", "relation_3:dep2head"] and len(lines) == 2 + 72
    emit(frame, "csv", columns="head,layer")
    assert capsys.readouterr().out.splitlines()[:2] == ["head,layer", "0,0"]
    import click
    import pytest

    with pytest.raises(click.ClickException, match=r"--columns: no column 'nope'; columns: layer, head, relation_0:head2dep"):
        emit(frame, "table", columns="layer,nope")


def test_a_wide_table_of_another_shape_keeps_its_leading_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    frame = pd.DataFrame({f"column_{i}": ["some text value"] * 3 for i in range(8)})
    emit(frame, "table")
    captured = capsys.readouterr()
    assert max(map(len, captured.out.splitlines())) <= 60
    assert captured.out.splitlines()[0].split() == ["column_0", "column_1", "column_2"]
    assert captured.err.startswith("note: 5 more column(s) do not fit in 60 characters: column_3, column_4, column_5, column_6, column_7")


def test_layer_and_head_stay_integers_in_every_format(capsys):
    # a baseline row without a head made pandas turn layer/head into floats (coreference_summary did)
    frame = pd.DataFrame({"method": ["head 3-7", "nearest"], "layer": [3.0, np.nan], "head": [7.0, np.nan], "all": [0.5, 0.25]})
    emit(frame, "csv")
    assert capsys.readouterr().out.split() == ["method,layer,head,all", "head", "3-7,3,7,0.5", "nearest,,,0.25"]
    emit(frame, "json")
    records = json.loads(capsys.readouterr().out)
    assert records[0]["layer"] == 3 and isinstance(records[0]["layer"], int) and records[1]["head"] is None
    emit(frame, "table")
    assert capsys.readouterr().out.splitlines()[2].split() == ["head", "3-7", "3", "7", "0.5000"]


def test_a_constant_column_becomes_a_note_in_tables(capsys):
    frame = pd.DataFrame({"token": ["[CLS]", "cat", "[SEP]"], "annotator": [None, "spacy:en_core_web_sm@3.8.0", None]})
    emit(frame, "table", constant=("annotator",))
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].split() == ["token"]
    assert captured.err.strip() == (
        "note: annotator is spacy:en_core_web_sm@3.8.0 on every row that has one (column left out; --columns to show it)"
    )
    emit(frame, "csv", constant=("annotator",))
    assert capsys.readouterr().out.splitlines()[0] == "token,annotator"
