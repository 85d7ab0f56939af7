"""`attnstore report primer`'s pruning and attribution sections on hand-built stores: the pruning curve draws each
stored procedure (the authors' default first) from ablation_results rows that record it; the attribution table puts
the authors' |gradient x input| first, the signed product beside it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytestmark = [pytest.mark.one_backend, pytest.mark.slow]  # figures: the reports draw theirs; not in make test-fast

TOKENS = [["[CLS]", "a", "bb", "c", "[SEP]"], ["[CLS]", "dd", "e", "[SEP]"]]


def maps() -> list[np.ndarray]:
    out = []
    for toks, row in ((TOKENS[0], [0.1, 0.5, 0.2, 0.1, 0.1]), (TOKENS[1], [0.2, 0.5, 0.1, 0.2])):
        n = len(toks)
        m = np.full((1, 2, n, n), 1 / n, dtype=np.float32)
        m[0, 0, 0] = row
        out.append(m)
    return out


def test_the_report_draws_both_pruning_procedures_and_absolute_attribution_first(tmp_path, store, make_run):
    pytest.importorskip("matplotlib")
    import sqlalchemy as sa

    from attnstore.api.primer_report import primer_report
    from attnstore.tests.queries.helpers import write_saliency

    run = make_run(store, maps(), TOKENS, name="hand")
    write_saliency(store, run, [np.array([0.0, -3.0, 2.0, 1.0, 0.0]), np.array([0.0, 2.0, 1.0, 0.0])])
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO models (name, source, weights_sha256, architecture, n_layers, n_heads, max_length, tokenizer, "
                "special_tokens, init, task, created_at) "
                "VALUES ('m', 'm', 'x', 'Bert', 1, 8, 8, 'T', '{}', 'finetuned', 'SST-2', CURRENT_TIMESTAMP)"
            )
        )
        model_id = conn.execute(sa.text("SELECT id FROM models WHERE name = 'm'")).scalar_one()

    def rows(config, score, procedure):
        return [
            dict(
                model_id=model_id, task="SST-2", split="dev", mode="zero" if config != "none" else "none", config=config,
                disabled_heads=[], metric="accuracy", score=score, baseline_score=83.0, n_examples=872, **procedure,
            )
        ]  # fmt: skip

    store.writer.add_ablation_results(rows("none", 83.0, {}))
    authors = dict(importance_split="train", importance_examples=4000, importance_schedule="once")
    other = dict(importance_split="dev", importance_examples=872, importance_schedule="iterative")
    for n, (a, b) in zip((4, 8), ((80.0, 81.0), (70.0, 77.0))):
        store.writer.add_ablation_results(rows(f"prune:{n}", a, authors))
        store.writer.add_ablation_results(rows(f"prune[importance=dev,reestimate]:{n}", b, other))
    out = tmp_path / "primer"
    text = primer_report(store, run, out, attribution_run=run, prune=("m", "SST-2")).read_text()
    table = pd.read_csv(out / "pruning_zero.csv")
    once = "accuracy, importance on train (4,000 ex.), estimated once (the authors')"
    again = "accuracy, importance on dev (872 ex.), re-estimated each step"
    assert list(table.columns) == ["n_pruned", once, again]  # the authors' procedure first
    assert table[once].tolist() == [83.0, 80.0, 70.0] and table[again].tolist() == [83.0, 81.0, 77.0]
    assert (out / "pruning_zero.png").stat().st_size > 0 and "![pruning](pruning_zero.png)" in text
    summary = pd.read_csv(out / "attribution_summary.csv")
    assert summary["saliency"].tolist() == ["absolute (default, the authors')", "signed"]
    # head 0 ranks a > bb > c, as the magnitudes do (tau 1), not as the signs (bb > c > a: -1/3); example 1 tau 1 both
    assert summary["best_tau"].tolist() == pytest.approx([1.0, 1 / 3])
    layers = pd.read_csv(out / "attribution_layers.csv")
    assert layers.loc[0, "absolute_best_tau"] == pytest.approx(1.0) and layers.loc[0, "signed_best_tau"] == pytest.approx(1 / 3)


def test_the_curve_draws_one_line_per_procedure_with_a_legend(tmp_path):
    pytest.importorskip("matplotlib")
    from attnstore.api.ablation_report import draw_pruning

    steps = pd.DataFrame(
        {
            "n_pruned": [0, 8, 16] * 2,
            "metric": ["accuracy"] * 6,
            "score": [83, 82, 75, 83, 83, 80.0],
            "procedure": ["train, once"] * 3 + ["dev, re-estimated"] * 3,
        }
    )
    fig = draw_pruning(steps, "m", "SST-2", "zero", majority={"accuracy": 50.9})
    (ax,) = fig.axes
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["accuracy: train, once", "accuracy: dev, re-estimated", "accuracy: majority class (50.9)"]
    assert ax.get_legend() is not None and ax.get_xlabel() and ax.get_ylabel()
    styles = {line.get_label(): (line.get_linestyle(), line.get_marker()) for line in ax.get_lines()}
    assert styles["accuracy: train, once"] != styles["accuracy: dev, re-estimated"]
