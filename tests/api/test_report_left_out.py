"""A report section whose option was not given does not disappear without a word: the report's text and stderr name
the section and the option that adds it (api/report.py `left_out`), on hand-built runs, without the model."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")
pytestmark = [pytest.mark.one_backend, pytest.mark.slow]  # figures: the reports draw theirs; not in make test-fast


@pytest.fixture
def small_run(store, make_run):
    rng = np.random.default_rng(0)
    tokens = [["[CLS]", "the", "cat", "sat", ".", "[SEP]"], ["[CLS]", "a", "dog", "ran", "[SEP]"]]
    maps = [rng.dirichlet(np.ones(len(t)), size=(2, 3, len(t))).astype(np.float32) for t in tokens]
    return make_run(store, maps, tokens, name="small")


def test_the_primer_report_names_what_it_left_out(store, small_run, tmp_path, capsys):
    from attnstore.api.primer_report import primer_report

    text = primer_report(store, small_run, tmp_path / "primer").read_text()
    err = capsys.readouterr().err
    for section, option in (
        ("trees from heads (Htut et al. 2019)", "--tree-run RUN"),
        ("attention vs attribution", "--attribution-run RUN"),
        ("the pruning curve", "--prune MODEL:TASK"),
    ):
        line = f"Left out: {section}; {option}"
        assert line in text and f"report primer: {line}" in err
    assert "## Trees from heads (Htut et al. 2019)" in text and "## Head importance and pruning" in text


def test_a_given_option_leaves_nothing_out_but_its_own_baseline(store, small_run, tmp_path, capsys):
    from attnstore.api.primer_report import primer_report

    text = primer_report(store, small_run, tmp_path / "primer", tree_run=small_run).read_text()
    err = capsys.readouterr().err
    assert "Left out: trees from heads" not in text
    assert "Left out: the trees' random-init baseline; --random-tree-run RUN" in err
    assert "Not drawn: run 'small' has no gold dependency trees" in text  # a run without trees: said in its place


def test_the_kovaleva_and_clark_reports_name_what_they_left_out(store, small_run, tmp_path, capsys, monkeypatch):
    from attnstore.api import kovaleva_report, report

    text = kovaleva_report.kovaleva_report(store, str(tmp_path / "k"), {"MRPC": small_run}, {"RTE": small_run}).read_text()
    err = capsys.readouterr().err
    assert "Left out: Fig. 3 (frame heads); --frame-run RUN" in text and "report kovaleva: Left out: Fig. 3" in err
    assert "Left out: Fig. 5 and the fine-tuned Fig. 6; --finetuned-run TASK=RUN" in text
    assert "Left out: the fine-tuned run(s) of RTE, which have no pre-trained run; give --run RTE=RUN" in text
    line = report.left_out("clark", "Table 2 (coreference)", "--coref-run RUN adds it")
    assert line == "Left out: Table 2 (coreference); --coref-run RUN adds it." and "report clark: " + line in capsys.readouterr().err
