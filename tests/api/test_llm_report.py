"""`attnstore report llm` on hand-built causal runs with known heads: every table and figure written, the head types
those of the rules, and the sections it cannot fill named with the option that fills them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnstore.tests.queries.helpers import repeated_run
from attnstore.tests.queries.test_causal import mark_causal

pytest.importorskip("matplotlib")
pytestmark = [pytest.mark.slow, pytest.mark.one_backend]  # renders figures


@pytest.fixture
def text_run(store, make_run):
    """1 layer x 3 heads over two causal examples: head 0 on the first token, head 1 on the previous token, head 2
    uniform; hidden-state peaks with the first token's largest."""
    maps, peaks = [], []
    for n in (6, 5):
        m = np.zeros((1, 3, n, n), np.float32)
        m[0, 0, :, 0] = 1
        m[0, 1, 0, 0] = 1
        m[0, 1, np.arange(1, n), np.arange(n - 1)] = 1
        m[0, 2] = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
        maps.append(m)
        value = np.ones((n, 1)) * 2.0
        value[0] = 900.0
        peaks.append(np.stack([value, np.full((n, 1), 5.0), np.ones((n, 1))], -1))
    tokens = [[f"w{i}" for i in range(len(m[0, 0]))] for m in maps]
    run = make_run(store, maps, tokens, name="text", specials={}, peaks_list=peaks)
    mark_causal(store, run)
    return run


def test_llm_report_writes_every_table_and_figure(store, make_run, text_run, tmp_path, capsys):
    from attnstore.api.llm_report import llm_report

    repeated = repeated_run(store, make_run)
    path = llm_report(store, text_run, str(tmp_path / "llm"), repeated_run=repeated)
    folder = path.parent
    for stem in ("sinks", "head_types", "induction_curve"):
        assert (folder / f"{stem}.png").stat().st_size > 5000 and (folder / f"{stem}.svg").exists()
    types = pd.read_csv(folder / "head_types.csv")
    # the repeated run's head 0 is an induction head, head 1 a duplicate-token head; on text head 1 is previous-token,
    # head 0 a sink; head 2 (uniform) is none of them (no row past 4 + 64 keys to call it streaming)
    assert types["type"].tolist() == ["induction", "duplicate", "other"]
    curve = pd.read_csv(folder / "induction_curve.csv")
    assert curve["T"].tolist() == [2, 3] and curve["best_induction"].tolist() == [1.0, 1.0]
    sinks = pd.read_csv(folder / "sinks_by_layer.csv")
    assert sinks.loc[0, "ratio"] == 900.0 and sinks.loc[0, "position"] == 0 and sinks.loc[0, "dim"] == 5
    text = path.read_text()
    assert "Left out: retrieval heads (Wu et al. 2024); give --needle-run" in text
    assert "report llm: Left out: retrieval heads" in capsys.readouterr().err


def test_without_a_repeated_run_the_induction_section_says_how_to_get_it(store, text_run, tmp_path):
    from attnstore.api.llm_report import llm_report

    text = llm_report(store, text_run, str(tmp_path / "llm")).read_text()
    assert "Left out: induction and duplicate-token heads; give --repeated-run" in text
    types = pd.read_csv(tmp_path / "llm" / "head_types.csv")
    assert types["type"].tolist() == ["sink", "previous token", "other"]
