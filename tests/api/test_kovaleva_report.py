"""`attnstore report kovaleva` on real maps of a few fixture examples: every section is written."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.ingest import ingest

pytestmark = pytest.mark.model
DATA = str(Path(__file__).parents[1] / "fixtures" / "data")


def test_kovaleva_report_writes_every_figure(tmp_path, loaded_model, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib")
    monkeypatch.setattr(matplotlib, "use", lambda *a, **k: pytest.fail("the report switched matplotlib's backend"))
    from attnstore.store import migrate, open_store

    url = f"sqlite:///{tmp_path / 'meta.sqlite'}"
    migrate.upgrade(url)
    store = open_store(db=url, root=str(tmp_path / "attention.zarr"))
    for key, name in (("glue/MRPC:dev", "mrpc"), ("glue/RTE:dev", "rte"), ("framenet/1.5:exemplars", "frames")):
        ingest(store, dataset=key, data_dir=DATA, loaded=loaded_model, name=name, progress=False)
    # a second run over the same MRPC examples stands in for a fine-tuned model's run
    ingest(store, dataset="glue/MRPC:dev", data_dir=DATA, loaded=loaded_model, name="mrpc-again", dtype="float32", progress=False)
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
            "--out",
            str(out),
            "--db",
            url,
            "--root",
            str(tmp_path / "attention.zarr"),
        ],
    )
    assert result.exit_code == 0, result.output
    index = (out / "README.md").read_text()
    assert "Not produced" not in index, index
    for stem in ("fig3_frame_heads", "fig5_similarity", "fig6_features", "fig6_features_finetuned", "fig7_cls_attention"):
        assert (out / f"{stem}.png").exists() and (out / f"{stem}.svg").exists() and (out / f"{stem}.csv").exists(), stem
    assert (out / "token_to_token.csv").exists()
