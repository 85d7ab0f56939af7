import numpy as np

from attnstore.queries import run_query


def test_relative_position_exact_values(store, hand_run):
    df = run_query(store, "relative_position", run=hand_run).sort_values(["layer", "head"])
    # 8 query tokens, 6 with a previous (and 6 with a next) token, over the L=5 and L=3 examples
    np.testing.assert_allclose(df["to_previous"], [2 / 6, 1.0, (4 / 5 + 2 / 3) / 6, 0.0], atol=1e-6)
    np.testing.assert_allclose(df["to_self"], [2 / 8, 2 / 8, 2 / 8, 2 / 8], atol=1e-6)
    np.testing.assert_allclose(df["to_next"], [0.0, 0.0, (4 / 5 + 2 / 3) / 6, 2 / 6], atol=1e-6)


def test_saved_metrics_are_queryable_with_sql(store, hand_run):
    df = run_query(store, "relative_position", run=hand_run)
    n = store.save_head_metrics(hand_run, df, prefix="relative_position")
    assert n == 3 * 4
    # saving again replaces rather than duplicates
    assert store.save_head_metrics(hand_run, df, prefix="relative_position") == 12
    hits = store.sql(
        "SELECT layer, head, value FROM head_metrics WHERE metric = 'relative_position.to_previous' AND value > 0.5"
    )
    assert hits[["layer", "head"]].values.tolist() == [[0, 1]]
    assert len(store.head_metrics(hand_run)) == 12
