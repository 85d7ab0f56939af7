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
