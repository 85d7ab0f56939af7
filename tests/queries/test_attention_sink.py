"""attention_sink on hand-built causal maps with a known sink: head 0 puts half of every row on the first token and
spreads the rest over the row's other keys; head 1 attends to the previous token (row 0: itself)."""

import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.tests.queries.test_causal import SPECIALS, mark_causal


def sink_maps(length: int) -> np.ndarray:
    maps = np.zeros((1, 2, length, length), dtype=np.float32)
    maps[0, 0, 0, 0] = 1
    for i in range(1, length):
        maps[0, 0, i, 0] = 0.5
        maps[0, 0, i, 1 : i + 1] = 0.5 / i
        maps[0, 1, i, i - 1] = 1
    maps[0, 1, 0, 0] = 1
    return maps


@pytest.fixture
def sink_run(store, make_run):
    tokens = [["a", "b", "c", "d", "e"], ["f", "g", "h"], ["i"]]  # 5, 3 and 1 tokens
    run = make_run(store, [sink_maps(len(t)) for t in tokens], tokens, name="sinks", specials=SPECIALS)
    mark_causal(store, run)
    return run


def test_positions_and_gu_et_al_sink_score_by_hand(store, sink_run):
    df = run_query(store, "attention_sink", run=sink_run, window=3, epsilon=0.6).set_index("head")
    # head 0, position 0: example of 5 tokens, rows 0..4 see it: (1 + 0.5 * 4) / 5 = 0.6; of 3: (1 + 0.5 * 2) / 3; of 1: 1
    assert df.loc[0, "position_0"] == pytest.approx(((1 + 2) / 5 + 2 / 3 + 1) / 3)
    # position 1 (rows 1.. see it): 5 tokens: rows 1..4 give 0.5/1, 0.5/2, 0.5/3, 0.5/4; 3 tokens: 0.5, 0.25
    assert df.loc[0, "position_1"] == pytest.approx((0.5 * (1 + 1 / 2 + 1 / 3 + 1 / 4) / 4 + 0.5 * (1 + 1 / 2) / 2) / 2)
    assert df.loc[0, "position_3"] == pytest.approx(0.5 * (1 / 3 + 1 / 4) / 2)  # only the 5-token example has it
    # head 1 (previous token): position 0 is seen by row 0 (itself) and row 1
    assert df.loc[1, "position_0"] == pytest.approx((2 / 5 + 2 / 3 + 1) / 3)
    # Gu et al. on the first 3 tokens of the two examples that have 3: head 0's first token: (1 + 0.5 + 0.5) / 3 = 2/3
    assert df.loc[0, "importance"] == pytest.approx(2 / 3) and df.loc[0, "sink_share"] == 1.0
    assert df.loc[1, "importance"] == pytest.approx(2 / 3)  # rows 0 and 1 of the previous-token head: 2/3 as well
    assert df.attrs["windowed_examples"] == 2 and df.attrs["short_examples"] == 1
    assert df.attrs["sink_percentage"] == pytest.approx(100.0) and df.attrs["window"] == 3
    strict = run_query(store, "attention_sink", run=sink_run, window=3, epsilon=0.7)
    assert strict.attrs["sink_percentage"] == 0.0 and (strict["sink_share"] == 0).all()


def test_a_window_longer_than_every_example_leaves_the_score_empty_and_bad_windows_are_refused(store, sink_run):
    df = run_query(store, "attention_sink", run=sink_run, window=64)
    assert df["importance"].isna().all() and df.attrs["windowed_examples"] == 0 and np.isnan(df.attrs["sink_percentage"])
    assert df["position_0"].notna().all()
    with pytest.raises(Exception, match="window=0: give a positive number of tokens"):
        run_query(store, "attention_sink", run=sink_run, window=0)


def test_learned_sink_mass_of_a_model_with_sink_logits(store, make_run):
    """Rows that sum to less than 1 (learned sink logits, gpt-oss): `learned_sink` is 1 - the row's sum, averaged over
    the rows, then the examples; NaN on a run whose model has none."""
    import sqlalchemy as sa

    from attnstore.store.schema import Run

    tokens = [["a", "b", "c", "d", "e"], ["f", "g", "h"]]
    maps = [sink_maps(len(t)) for t in tokens]
    for m in maps:
        m[0, 0] *= 0.75  # head 0 leaves a quarter of every row on the sink
        m[0, 1, 1:] *= 0.5  # head 1 half of every row but the first
    run = make_run(store, maps, tokens, name="learned", specials=SPECIALS)
    mark_causal(store, run)
    manifest = {**store.run_info(run).manifest, "capture": {"path": "streaming", "sink_logits": True}}  # as ingest records it
    with store.engine.begin() as conn:
        conn.execute(sa.update(Run).where(Run.name == run).values(manifest=manifest))
    from attnstore.store import open_store

    fresh = open_store(db=store.locations.db_url, root=store.locations.array_root)  # the run's info is read again
    try:
        df = run_query(fresh, "attention_sink", run=run).set_index("head")
    finally:
        fresh.close()
    plain = make_run(store, [sink_maps(len(t)) for t in tokens], tokens, name="plain", specials=SPECIALS)
    assert run_query(store, "attention_sink", run=plain)["learned_sink"].isna().all()  # no sink logits: no column values
    assert df.loc[0, "learned_sink"] == pytest.approx(0.25)
    # head 1: 5 tokens: rows 1..4 of 5 leave 0.5 -> 0.4; 3 tokens: rows 1..2 of 3 -> 1/3
    assert df.loc[1, "learned_sink"] == pytest.approx((0.4 + 1 / 3) / 2)
    assert df.loc[0, "position_0"] == pytest.approx(0.75 * ((1 + 2) / 5 + 2 / 3) / 2)
