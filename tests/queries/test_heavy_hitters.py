"""heavy_hitters on hand-built causal maps: a sink head and a previous-token head over 10 tokens with known UPOS."""

import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.tests.queries.test_causal import mark_causal

UPOS = ["DET", "NOUN", "VERB", "ADP", "DET", "NOUN", "ADJ", "NOUN", "PUNCT", "NOUN"]


def hitter_maps(n: int) -> np.ndarray:
    """(1 layer, 2 heads, n, n): head 0 puts every row on token 0; head 1 on the previous token (row 0 on itself)."""
    maps = np.zeros((1, 2, n, n), dtype=np.float32)
    maps[0, 0, :, 0] = 1.0
    maps[0, 1, 0, 0] = 1.0
    maps[0, 1, np.arange(1, n), np.arange(n - 1)] = 1.0
    return maps


@pytest.fixture
def hitters_run(store, make_run):
    tokens = [[f"w{i}" for i in range(10)]]
    words = [[dict(form=f"w{i}", upos=u) for i, u in enumerate(UPOS)]]
    run = make_run(store, [hitter_maps(10)], tokens, name="hitters", specials={}, words_list=words)
    mark_causal(store, run)
    return run


def test_heavy_hitters_by_hand(store, hitters_run):
    df = run_query(store, "heavy_hitters", run=hitters_run).set_index("head")
    # head 0: key 0 takes all 10 rows; top 10 % = 1 key (key 0), top 20 % = 2 keys
    assert df.loc[0, "mass_top10"] == 1.0 and df.loc[0, "mass_top20"] == 1.0 and df.loc[0, "first_in_top10"] == 1.0
    assert df.loc[0, "top10_function"] == 1.0 and df.loc[0, "top10_punct"] == 0.0  # key 0 is a DET
    # head 1: key k < 9 gets one row (key 0 two) over the 10 - k rows that see it: key 8 scores 1/2, key 7 1/3
    assert df.loc[1, "mass_top10"] == pytest.approx(0.1) and df.loc[1, "mass_top20"] == pytest.approx(0.2)
    assert df.loc[1, "first_in_top10"] == 0.0 and df.loc[1, "top10_punct"] == 1.0  # key 8 is the PUNCT


def test_a_run_without_upos_gives_nan_types(store, make_run):
    run = make_run(store, [hitter_maps(4)], [["a", "b", "c", "d"]], name="plain", specials={})
    df = run_query(store, "heavy_hitters", run=run)
    assert df["top10_punct"].isna().all() and df["top10_function"].isna().all()
    # bidirectional: every key is seen by all 4 rows; head 0's key 0 takes everything
    assert df.loc[0, "mass_top10"] == 1.0
