"""`attnstore sql` takes the README's own SQL (issue 49 item 9): a statement starting with a `--` comment, from a
file (`-f`), from standard input (`-`, or piped in with no QUERY), after `--`, or as QUERY itself; on SQLite and
PostgreSQL. Words that look like options are still refused as options."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.queries import run_query

README = Path(__file__).parents[2] / "README.md"
TOKENS = [["[CLS]", "the", "dog", "bar", "##ks", "[SEP]"], ["[CLS]", "a", "cat", "[SEP]"]]
TOKEN_WORDS = [[None, 0, 1, 2, 2, None], [None, 0, 1, None]]
WORDS = [
    [
        dict(form="the", upos="DET", deprel="det", head=1),
        dict(form="dog", upos="NOUN", deprel="nsubj", head=2),
        dict(form="barks", upos="VERB", deprel="root"),
    ],
    [dict(form="a", upos="DET", deprel="det", head=1), dict(form="cat", upos="NOUN", deprel="root")],
]


def readme_statements() -> list[str]:
    """The statements of the README's "SQL over the metadata" block, each with the comment line above it."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"SQL over the metadata.*?```sql\n(.*?)```", text, re.S)
    assert block, "README.md has no SQL block after 'SQL over the metadata'"
    statements = [s.strip() + "\n" for s in re.split(r"(?<=;)\n", block.group(1)) if s.strip()]
    assert len(statements) == 2 and all(s.startswith("-- ") for s in statements), statements
    return statements


def previous_token_maps(length: int) -> np.ndarray:
    """(1 layer, 2 heads, L, L): head 0 looks at the previous token (the first token at itself), head 1 is uniform."""
    maps = np.zeros((1, 2, length, length), dtype=np.float32)
    for q in range(length):
        maps[0, 0, q, max(q - 1, 0)] = 1.0
    maps[0, 1] = 1.0 / length
    return maps


@pytest.fixture
def filled(store, make_run):
    run = make_run(store, [previous_token_maps(len(t)) for t in TOKENS], TOKENS, name="r", words_list=WORDS, token_words=TOKEN_WORDS)
    for name in ("relative_position", "entropy"):  # the README's two `--save` commands
        store.save_head_metrics(run, run_query(store, name, run=run), prefix=name)
    return store


def rows_of(result) -> list[dict]:
    assert result.exit_code == 0, result.output
    return list(csv.DictReader(io.StringIO(result.stdout)))


def test_the_readmes_sql_runs_from_a_file_stdin_and_the_command_line(filled, tmp_path):
    args = ["sql", "--db", filled.locations.db_url, "--root", filled.locations.array_root, "--format", "csv"]
    if filled.engine.dialect.name == "postgresql":
        args[2] = filled.engine.url.render_as_string(hide_password=False)
    runner = CliRunner()
    heads, split = readme_statements()
    answers = []
    for number, statement in enumerate((heads, split)):
        path = tmp_path / f"q{number}.sql"
        path.write_text(statement, encoding="utf-8")
        forms = [
            runner.invoke(main, [*args, "-f", str(path)]),
            runner.invoke(main, [*args, "--file", str(path)]),
            runner.invoke(main, [*args, "-"], input=statement),
            runner.invoke(main, [*args, "-f", "-"], input=statement),
            runner.invoke(main, args, input=statement),  # piped in, no QUERY
            runner.invoke(main, [*args, "--", statement]),
            runner.invoke(main, [*args, statement]),  # a QUERY starting with `--` is the statement, not an option
        ]
        found = [rows_of(r) for r in forms]
        assert all(f == found[0] for f in found), found
        answers.append(found[0])
    heads_rows, split_rows = answers
    assert [(r["layer"], r["head"]) for r in heads_rows] == [("0", "0")]  # the previous-token head
    assert set(heads_rows[0]) == {"layer", "head", "to_previous", "entropy"} and float(heads_rows[0]["to_previous"]) > 0.5
    rates = {r["upos"]: float(r["split_rate"]) for r in split_rows}
    assert rates == {"DET": 0.0, "NOUN": 0.0, "VERB": 1.0}  # "barks" is two wordpieces


def test_option_lookalikes_and_bad_input_are_one_line_errors(filled, tmp_path):
    args = ["sql", "--db", filled.locations.db_url, "--root", filled.locations.array_root]
    if filled.engine.dialect.name == "postgresql":
        args[2] = filled.engine.url.render_as_string(hide_password=False)
    runner = CliRunner()
    typo = runner.invoke(main, [*args, "--max-row", "5", "SELECT 1"])
    assert typo.exit_code == 2 and "No such option '--max-row'" in typo.output and "--max-rows" in typo.output
    two = runner.invoke(main, [*args, "SELECT 1", "SELECT 2"])
    assert two.exit_code == 2 and "give one QUERY (quote it)" in two.output
    (tmp_path / "q.sql").write_text("SELECT 1 AS one;\n", encoding="utf-8")
    both = runner.invoke(main, [*args, "-f", str(tmp_path / "q.sql"), "SELECT 1"])
    assert both.exit_code == 2 and "not both" in both.output
    empty = runner.invoke(main, [*args, "-"], input="  \n")
    assert empty.exit_code == 1 and empty.output.strip() == "Error: SQL error: no statement in standard input"
    missing = runner.invoke(main, [*args, "-f", str(tmp_path / "nope.sql")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    two_statements = runner.invoke(main, [*args, "-f", "-"], input="SELECT 1; SELECT 2;")
    assert two_statements.exit_code == 1 and "one statement at a time" in two_statements.output
    assert "Traceback" not in two_statements.output and two_statements.output.count("\n") == 1
    bom = tmp_path / "bom.sql"
    bom.write_bytes("\ufeff-- saved by an editor with a byte order mark\nSELECT 7 AS seven".encode())
    assert rows_of(runner.invoke(main, [*args, "--format", "csv", "-f", str(bom)])) == [{"seven": "7"}]
