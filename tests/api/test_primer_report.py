"""`attnstore report primer` on the real model's shared runs: every section's table is the query's numbers, figures
are written, and a section whose data is not stored says so in its place."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.queries import run_query

pytestmark = [pytest.mark.model, pytest.mark.one_backend]


def test_primer_report_tables_are_the_queries_numbers(tmp_path, real_runs):
    pytest.importorskip("matplotlib")
    from attnstore.api.primer_report import primer_report

    store = real_runs("mrpc", "ewt", "ewt-copy")
    out = tmp_path / "primer"
    readme = primer_report(store, "mrpc", out, tree_run="ewt", random_tree_run="ewt-copy", attribution_run="mrpc", prune=("nope", "MRPC"))
    text = readme.read_text()
    for heading in ("Norm-based attention", "Attention rollout", "Head confidence and roles", "Trees from heads"):
        assert f"## {heading}" in text
    assert "Not drawn: run 'mrpc' has no saliency" in text  # attribution needs `attnstore saliency` on a fine-tuned run
    assert "Not drawn: no pruning steps of 'nope' on MRPC are stored" in text
    for name in ("norms", "rollout", "head_roles", "trees"):
        assert (out / f"{name}.png").stat().st_size > 0 and (out / f"{name}.svg").exists()
    norms = run_query(store, "norm_attention", run="mrpc")
    by_layer = pd.read_csv(out / "norms_by_layer.csv").set_index("layer")
    np.testing.assert_allclose(by_layer["share_cls"], norms.groupby("layer")["share_cls"].mean(), rtol=1e-12)
    rollout = pd.read_csv(out / "rollout.csv")
    np.testing.assert_allclose(rollout["to_cls"], run_query(store, "rollout", run="mrpc")["to_cls"], rtol=1e-12)
    trees = pd.read_csv(out / "trees.csv")
    assert trees.iloc[0]["relation"] == "all" and (out / "trees_random_init.csv").exists()


def test_the_command_refuses_a_bad_prune_spec(tmp_path):
    result = CliRunner().invoke(
        main, ["report", "primer", "--run", "x", "--prune", "MRPC", "--out", str(tmp_path / "o"), "--home", str(tmp_path)]
    )
    assert result.exit_code != 0 and "give MODEL:TASK" in result.output
