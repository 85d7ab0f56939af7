"""`attnstore report kovaleva` on real maps of a few fixture examples: every section is written."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from attnstore.api.cli import main

pytestmark = pytest.mark.model
PATTERN_CNN = Path(__file__).parents[2] / "docs" / "results" / "all-MiniLM-L6-v2" / "pattern_cnn.pt"  # the published weights


def test_kovaleva_report_writes_every_figure(tmp_path, real_runs, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib")
    monkeypatch.setattr(matplotlib, "use", lambda *a, **k: pytest.fail("the report switched matplotlib's backend"))
    # the session's real-model runs (tests/conftest.py): MRPC, RTE, FrameNet exemplars, and a second run over the
    # same MRPC examples (float32) standing in for a fine-tuned model's run; the report only reads them
    real_runs("mrpc", "rte", "frames", "mrpc-again")
    url, root = real_runs.url, real_runs.root
    out = tmp_path / "report"
    result = CliRunner().invoke(
        main,
        [
            "report",
            "kovaleva",
            "--run",
            "MRPC=mrpc",
            "--run",
            "RTE=rte",
            "--finetuned-run",
            "MRPC=mrpc-again",
            "--frame-run",
            "frames",
            "--pattern-model",
            str(PATTERN_CNN),
            "--out",
            str(out),
            "--db",
            url,
            "--root",
            root,
        ],
    )
    assert result.exit_code == 0, result.output
    index = (out / "README.md").read_text()
    assert "Not produced" not in index, index
    pytest.importorskip("torch")
    assert "Fig. 2: attention pattern classes per task (CNN)" in index and "(rules)" in index
    stems = ("fig2_pattern_classes", "fig2_pattern_classes_uncertainty", "fig2_pattern_classes_rules", "fig3_frame_heads")
    for stem in (*stems, "fig5_similarity", "fig6_features", "fig6_features_finetuned", "fig7_cls_attention"):
        assert (out / f"{stem}.png").exists() and (out / f"{stem}.svg").exists() and (out / f"{stem}.csv").exists(), stem
    assert (out / "token_to_token.csv").exists()


def test_a_missing_or_wrong_pattern_model_is_one_line_before_any_work(tmp_path, store):
    pytest.importorskip("torch")
    where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    command = ["report", "kovaleva", "--run", "MRPC=nope", "--out", str(tmp_path / "out"), *where]
    missing = CliRunner().invoke(main, [*command, "--pattern-model", str(tmp_path / "none.pt")])
    assert missing.exit_code != 0 and "no CNN weights at" in missing.output and "patterns train-cnn" in missing.output
    (tmp_path / "bad.pt").write_bytes(b"not weights")
    bad = CliRunner().invoke(main, [*command, "--pattern-model", str(tmp_path / "bad.pt")])
    assert bad.exit_code != 0 and "is not a pattern CNN file" in bad.output and "Traceback" not in bad.output
    assert not (tmp_path / "out").exists()  # nothing written
