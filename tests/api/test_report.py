"""`attnstore report clark` on small real runs (UD and GUM excerpts, the real model)."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from attnstore.api.cli import main

pytestmark = pytest.mark.model
DATA = str(Path(__file__).parents[1] / "fixtures" / "data")


def test_clark_report_writes_tables_and_figures(tmp_path, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib")
    backend = matplotlib.get_backend()
    monkeypatch.setattr(matplotlib, "use", lambda *a, **k: pytest.fail("the report switched matplotlib's backend"))
    home, out = str(tmp_path / "store"), tmp_path / "report"
    runner = CliRunner()
    assert runner.invoke(main, ["db", "upgrade", "--home", home]).exit_code == 0
    for dataset in ("ud/en_ewt:dev", "gum/ontogum:dev"):
        result = runner.invoke(main, ["ingest", "--dataset", dataset, "--data-dir", DATA, "--home", home, "--no-progress"])
        assert result.exit_code == 0, result.output
    result = runner.invoke(
        main,
        [
            "report",
            "clark",
            "--run",
            "ud/en_ewt-dev-all-MiniLM-L6-v2",
            "--coref-run",
            "gum/ontogum-dev-all-MiniLM-L6-v2",
            "--out",
            str(out),
            "--min-count",
            "1",
            "--home",
            home,
        ],
    )
    assert result.exit_code == 0, result.output
    readme = (out / "README.md").read_text(encoding="utf-8")
    assert "all-MiniLM-L6-v2 on ud/en_ewt:dev (6 examples" in readme and "gum/ontogum:dev" in readme
    assert "| det " in readme or "det" in (out / "table1_dependency.csv").read_text()
    for stem in ("fig2_special_tokens", "fig4_entropy", "fig6_mds"):
        assert (out / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "<svg" in (out / f"{stem}.svg").read_text(encoding="utf-8")[:1000]
    for table in ("table1_dependency", "table2_coreference", "special_tokens", "relative_position_strong"):
        assert (out / f"{table}.csv").stat().st_size > 0
    coref = (out / "table2_coreference.csv").read_text().splitlines()
    assert not [line for line in coref if line.startswith("n,")]  # counts are a sentence, not a row of the table
    assert "Accuracy over the mentions that have an antecedent in their window: " in readme and " pronoun, " in readme
    assert matplotlib.get_backend() == backend
    assert "0-based, as in the data, in tables (`layer-head`) and on figure axes alike" in readme
