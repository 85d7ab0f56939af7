import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.queries.errors import InvalidArgumentError


def test_relative_position_per_example_exact_values(store, hand_run):
    """Default (Clark et al.'s code): per example, sums over its L query tokens divided by L; then the mean over examples."""
    df = run_query(store, "relative_position", run=hand_run).sort_values(["layer", "head"])
    per = lambda x5, x3: (x5 / 5 + x3 / 3) / 2  # noqa: E731 (sums in the L=5 and L=3 examples)
    # L0H0 all to [CLS]; L0H1 previous token (row 0: itself); L1H0 uniform; L1H1 all to the last token
    np.testing.assert_allclose(df["to_previous"], [per(1, 1), per(4, 2), per(4 / 5, 2 / 3), 0.0], atol=1e-6)
    np.testing.assert_allclose(df["to_self"], [per(1, 1)] * 4, atol=1e-6)
    np.testing.assert_allclose(df["to_next"], [0.0, 0.0, per(4 / 5, 2 / 3), per(1, 1)], atol=1e-6)
    # a perfect previous-token head scores (L-1)/L per example, not 1: the first token has no previous token
    assert df["to_previous"].iloc[1] == pytest.approx((4 / 5 + 2 / 3) / 2)


def test_relative_position_pooled_exact_values(store, hand_run):
    df = run_query(store, "relative_position", run=hand_run, average="token").sort_values(["layer", "head"])
    # 8 query tokens, 6 with a previous (and 6 with a next) token, over the L=5 and L=3 examples
    np.testing.assert_allclose(df["to_previous"], [2 / 6, 1.0, (4 / 5 + 2 / 3) / 6, 0.0], atol=1e-6)
    np.testing.assert_allclose(df["to_self"], [2 / 8, 2 / 8, 2 / 8, 2 / 8], atol=1e-6)
    np.testing.assert_allclose(df["to_next"], [0.0, 0.0, (4 / 5 + 2 / 3) / 6, 2 / 6], atol=1e-6)


def test_unknown_average_is_refused(store, hand_run):
    with pytest.raises(InvalidArgumentError, match="average='tokens'"):
        run_query(store, "relative_position", run=hand_run, average="tokens")


def test_saved_metrics_are_queryable_with_sql(store, hand_run):
    df = run_query(store, "relative_position", run=hand_run)
    n = store.save_head_metrics(hand_run, df, prefix="relative_position")
    assert n == 3 * 4
    # saving again replaces rather than duplicates
    assert store.save_head_metrics(hand_run, df, prefix="relative_position") == 12
    hits = store.sql("SELECT layer, head, value FROM head_metrics WHERE metric = 'relative_position.to_previous' AND value > 0.5")
    assert hits[["layer", "head"]].values.tolist() == [[0, 1]]
    assert len(store.head_metrics(hand_run)) == 12
