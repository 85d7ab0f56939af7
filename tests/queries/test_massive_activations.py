"""massive_activations on hand-made hidden-state peaks with known values, and the one line for a run without them."""

import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.queries.errors import InvalidArgumentError


def peaks(values, dims, medians):
    return np.stack([np.asarray(values, float), np.asarray(dims, float), np.asarray(medians, float)], -1)


@pytest.fixture
def peaks_run(store, make_run):
    maps = [np.full((2, 1, n, n), 1 / n, np.float32) for n in (3, 2)]
    tokens = [["a", "b", "c"], ["d", "e"]]
    # (token, layer): layer 0's largest magnitude is -90 on example 1's first token; layer 1's 500 on example 0's token 2
    per_example = [
        peaks([[10, 20], [-30, 40], [50, 500]], [[1, 2], [3, 4], [5, 6]], [[1, 1], [2, 2], [3, 3]]),
        peaks([[-90, 7], [60, 8]], [[7, 8], [9, 1]], [[4, 4], [5, 5]]),
    ]
    return make_run(store, maps, tokens, name="peaks", specials={}, peaks_list=per_example)


def test_massive_activations_by_hand(store, peaks_run):
    df = run_query(store, "massive_activations", run=peaks_run).set_index("layer")
    assert df.loc[0, ["peak", "example", "position", "dim"]].tolist() == [-90.0, 1, 0, 7] and df.loc[0, "token"] == "d"
    assert df.loc[1, ["peak", "example", "position", "dim"]].tolist() == [500.0, 0, 2, 6] and df.loc[1, "token"] == "c"
    assert df.loc[0, "top2"] == 60.0 and df.loc[0, "top3"] == 50.0 and df.loc[1, "top2"] == 40.0
    assert df.loc[0, "median"] == 3.0 and df.loc[0, "ratio"] == 30.0  # median of 1, 2, 3, 4, 5
    # layer 0: example 0's own peak is on token 2, example 1's on token 0; layer 1: tokens 2 and 1
    assert df.loc[0, "first_token_share"] == 0.5 and df.loc[1, "first_token_share"] == 0.0
    some = run_query(store, "massive_activations", run=peaks_run, examples=[0]).set_index("layer")
    assert some.loc[0, "peak"] == 50.0 and some.loc[0, "median"] == 2.0
    with pytest.raises(InvalidArgumentError, match=r"^examples=\[\] selects no stored example of run 'peaks'"):
        run_query(store, "massive_activations", run=peaks_run, examples=[])


def test_a_run_without_peaks_is_refused_in_one_line(store, make_run):
    run = make_run(store, [np.full((1, 1, 2, 2), 0.5, np.float32)], [["a", "b"]], name="plain", specials={})
    with pytest.raises(InvalidArgumentError, match=r"^run 'plain' keeps no hidden-state peaks \(not a causal LM"):
        run_query(store, "massive_activations", run=run)
