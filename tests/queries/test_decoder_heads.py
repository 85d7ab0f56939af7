"""previous_token_heads and streaming_heads on hand-built causal maps with known values."""

import pytest

from attnstore.queries import run_query
from attnstore.tests.queries.test_attention_sink import sink_maps
from attnstore.tests.queries.test_causal import SPECIALS, mark_causal


@pytest.fixture
def heads_run(store, make_run):
    tokens = [[f"t{i}" for i in range(n)] for n in (5, 3, 1)]
    run = make_run(store, [sink_maps(len(t)) for t in tokens], tokens, name="heads", specials=SPECIALS)
    mark_causal(store, run)
    return run


def test_previous_token_heads_by_hand(store, heads_run):
    df = run_query(store, "previous_token_heads", run=heads_run).set_index("head")
    assert df.loc[1, "previous"] == pytest.approx(1.0)  # head 1 attends to the previous token on every row i >= 1
    # head 0, rows i >= 1: A[i, i-1] = 0.5 at i = 1 (the sink is key 0), else 0.5 / i; the 1-token example is not counted
    assert df.loc[0, "previous"] == pytest.approx(((0.5 + 0.5 / 2 + 0.5 / 3 + 0.5 / 4) / 4 + (0.5 + 0.5 / 2) / 2) / 2)
    assert df.attrs["examples"] == 2


def test_streaming_heads_by_hand(store, heads_run):
    # sinks=1, recent=2: rows i >= 3 of the 5-token example (i = 3, 4) keep key 0 and keys i - 1, i
    df = run_query(store, "streaming_heads", run=heads_run, sinks=1, recent=2, threshold=0.9).set_index("head")
    assert df.loc[0, "kept"] == pytest.approx(((0.5 + 2 * 0.5 / 3) + (0.5 + 2 * 0.5 / 4)) / 2)
    assert df.loc[1, "kept"] == pytest.approx(1.0) and bool(df.loc[1, "streaming"]) and not bool(df.loc[0, "streaming"])
    assert df.attrs["examples"] == 1  # only the 5-token example has rows past sinks + recent
    with pytest.raises(Exception, match="recent=0: give a positive number of tokens"):
        run_query(store, "streaming_heads", run=heads_run, recent=0)


def test_entropy_by_position_by_hand(store, heads_run):
    import math

    df = run_query(store, "entropy_by_position", run=heads_run)
    assert sorted(df["bin"].unique()) == [0, 1, 2]  # rows 0 | 1-2 | 3-6 (the 5-token example's rows 3, 4)
    head0 = df[df["head"] == 0].set_index("bin")
    # head 0's row i >= 1: 0.5 on the sink and 0.5 / i on each of keys 1..i: H = -0.5 log 0.5 - 0.5 log(0.5 / i)
    h = lambda i: -0.5 * math.log(0.5) - 0.5 * math.log(0.5 / i)  # noqa: E731
    assert head0.loc[0, "entropy"] == pytest.approx(0.0) and head0.loc[0, "rows"] == 3  # row 0 of each example
    assert head0.loc[1, "entropy"] == pytest.approx((h(1) + h(2) + h(1) + h(2)) / 4) and head0.loc[1, "rows"] == 4
    assert head0.loc[2, "entropy"] == pytest.approx((h(3) + h(4)) / 2)
    assert head0.loc[2, "uniform_entropy"] == pytest.approx((math.log(4) + math.log(5)) / 2)
    assert (df[df["head"] == 1]["entropy"] == 0).all()  # one key per row
    assert (head0[["first_position", "last_position"]].to_numpy() == [[0, 0], [1, 2], [3, 6]]).all()
