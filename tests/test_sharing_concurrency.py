"""Two ingests and an export at once, into one PostgreSQL store and one array root: nothing lost, nothing duplicated.

Real processes (the CLI in subprocesses) with a tiny random BERT: two runs of one new corpus start
together (one loads the dataset under its lease, the other waits and reuses it) while a third
process exports a complete run. Afterwards every run is complete with every example once, the store
checks clean, and the bundle imports into a fresh SQLite store with identical maps.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.store import migrate, open_store
from attnstore.store.check import check_store

pytestmark = pytest.mark.model

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def corpus(path, n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    lines = [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 20)))) for _ in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    code = "from attnstore.api.cli import main; main()"
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_ingests_and_an_export_at_once(pg_databases, tmp_path, tiny_bert):
    url = pg_databases()
    migrate.upgrade(url)
    where = ["--db", url, "--root", str(tmp_path / "attention.zarr")]
    ingest = ["ingest", "--format", "text", "--model", tiny_bert, "--annotate", "whitespace", "--no-progress", "--batch-size", "8"]
    first = CliRunner().invoke(main, [*ingest, "--corpus", corpus(tmp_path / "base.txt", 30, 0), "--name", "base", *where])
    assert first.exit_code == 0, first.output

    shared = corpus(tmp_path / "shared.txt", 400, 1)
    procs = {
        "ingest-a": cli(*ingest, "--corpus", shared, "--name", "a", *where),
        "ingest-b": cli(*ingest, "--corpus", shared, "--name", "b", *where),
        "export": cli("export", "--run", "base", "--to", str(tmp_path / "base.zip"), *where),
    }
    results = {name: p.communicate(timeout=300) for name, p in procs.items()}
    for name, p in procs.items():
        assert p.returncode == 0, f"{name}: {results[name][1][-2000:]}"

    store = open_store(db=url, root=str(tmp_path / "attention.zarr"))
    try:
        datasets = store.sql("SELECT split, n_examples FROM datasets ORDER BY split")
        assert datasets.values.tolist() == [["base", 30], ["shared", 400]]  # one dataset for both runs
        counts = store.sql(
            "SELECT r.name, r.status, r.n_stored, count(DISTINCT s.example_id) AS examples, count(s.example_id) AS rows "
            "FROM runs r JOIN sequences s ON s.run_id = r.id GROUP BY r.name, r.status, r.n_stored ORDER BY r.name"
        )
        assert counts.values.tolist() == [
            ["a", "complete", 400, 400, 400],
            ["b", "complete", 400, 400, 400],
            ["base", "complete", 30, 30, 30],
        ]
        assert store.sql("SELECT count(*) AS n FROM examples")["n"][0] == 430
        duplicates = store.sql("SELECT run_id, example_id, position, count(*) AS n FROM tokens GROUP BY 1, 2, 3 HAVING count(*) > 1")
        assert duplicates.empty
        assert store.sql("SELECT count(*) AS n FROM leases")["n"][0] == 0
        assert check_store(store)[1].empty
        for e in (0, 199, 399):  # the two runs of one model over one dataset hold the same maps
            np.testing.assert_array_equal(store.attention("a", e), store.attention("b", e))

        other = f"sqlite:///{tmp_path / 'other.sqlite'}"
        imported = CliRunner().invoke(main, ["import", str(tmp_path / "base.zip"), "--db", other, "--root", str(tmp_path / "other.zarr")])
        assert imported.exit_code == 0, imported.output
        copy = open_store(db=other, root=str(tmp_path / "other.zarr"))
        try:
            for e in range(30):
                np.testing.assert_array_equal(copy.attention("base", e), store.attention("base", e))
        finally:
            copy.close()
    finally:
        store.close()
