"""The SQL in the README runs, on SQLite and PostgreSQL, against a store with saved metrics."""

import re
from pathlib import Path

import numpy as np

from attnstore.queries import run_query

README = Path(__file__).parents[1] / "README.md"


def sql_statements(text: str) -> list[str]:
    blocks = re.findall(r"```sql\n(.*?)```", text, flags=re.S)
    statements = []
    for block in blocks:
        body = "\n".join(line for line in block.splitlines() if not line.strip().startswith("--"))
        statements += [s.strip() for s in body.split(";") if s.strip()]
    return statements


def test_readme_sql_runs(store, make_run):
    maps = np.zeros((1, 2, 3, 3), dtype=np.float32)
    maps[0, 0, [1, 2], [0, 1]] = 1
    maps[0, 0, 0, 0] = 1
    maps[0, 1] = 1 / 3
    run = make_run(store, [maps], [["[CLS]", "x", "[SEP]"]], name="docs")
    for name in ("relative_position", "entropy"):
        store.save_head_metrics(run, run_query(store, name, run=run), prefix=name)
    statements = sql_statements(README.read_text(encoding="utf-8"))
    assert len(statements) == 2
    heads = store.sql(statements[0])
    assert heads[["layer", "head"]].values.tolist() == [[0, 0]]
    assert store.sql(statements[1]).shape[1] == 2
