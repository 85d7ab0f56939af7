"""induction_heads and duplicate_token_heads on a hand-built repeated-token run with a known stripe per head, and the
one line a run over any other dataset gets."""

import json

import pandas as pd
import pytest

from attnstore.queries import run_query
from attnstore.queries.errors import InvalidArgumentError
from attnstore.tests.queries.helpers import repeated_run
from attnstore.tests.snapshots import store_with

store = store_with("run", repeated_run)


@pytest.fixture
def run(store):
    return "repeated"


def test_induction_heads_by_hand(store, run):
    df = run_query(store, "induction_heads", run=run).set_index("head")
    assert df.loc[0, "induction"] == 1.0 and df.loc[1, "induction"] == 0.0
    # head 2 (previous token) lands on i - T + 1 only where T = 2: i - 1 is then the induction key
    assert df.loc[2, "induction_T2"] == 1.0 and df.loc[2, "induction_T3"] == 0.0
    assert df.loc[2, "induction"] == pytest.approx(1 / 3)  # the mean over the 3 repeated examples
    assert df.attrs["examples_per_length"] == {2: 1, 3: 2}  # the 4th example is no repetition: not counted
    assert df.attrs["loss_gain"] == {}  # a hand run keeps no per-token loss
    assert list(df.columns) == ["layer", "induction", "induction_T2", "induction_T3"]


def test_duplicate_token_heads_by_hand(store, run):
    df = run_query(store, "duplicate_token_heads", run=run).set_index("head")
    assert df["duplicate"].tolist() == [0.0, 1.0, 0.0]
    assert df["previous"].tolist() == [pytest.approx(1 / 3), 0.0, 1.0]  # head 0's induction key is i - 1 where T = 2
    assert df.loc[1, "duplicate_T2"] == 1.0 and df.loc[1, "duplicate_T3"] == 1.0


def test_examples_select_lengths(store, run):
    df = run_query(store, "induction_heads", run=run, examples=[2]).set_index("head")
    assert list(df.columns) == ["layer", "induction", "induction_T2"] and df.loc[2, "induction"] == 1.0


def test_a_run_over_another_dataset_is_refused_in_one_line(store, make_run):
    import numpy as np

    other = make_run(store, [np.full((1, 3, 2, 2), 0.5, np.float32)], [["a", "b"]], name="text", specials={})
    line = (
        r"^query 'induction_heads' needs a run over a repeated_tokens dataset; run 'text' is over hand-text:test \(text\): "
        r"ingest --dataset generated/repeated_tokens:T20,50,200"
    )
    with pytest.raises(InvalidArgumentError, match=line):
        run_query(store, "induction_heads", run=other)


def test_only_unrepeated_examples_are_refused(store, run):
    with pytest.raises(InvalidArgumentError, match="holds no complete repeated example"):
        run_query(store, "induction_heads", run=run, examples=[3])


@pytest.mark.parametrize("query", ["induction_heads", "duplicate_token_heads"])
def test_a_run_with_row_stats_answers_from_them_without_reading_a_map(store, run, make_run, monkeypatch, query):
    """The same maps with their per-row statistics (store/row_stats.py `duplicate`, `induction`, `distance_1`): the
    same scores, no map read."""
    from attnstore.store.store import Store

    expected = run_query(store, query, run=run)
    rows = repeated_run(store, make_run, name="repeated-rows", row_stats=True)

    def no_maps(*args, **kwargs):
        raise AssertionError("a query over row statistics read a map")

    monkeypatch.setattr(Store, "iter_attention", no_maps)
    got = run_query(store, query, run=rows)
    pd.testing.assert_frame_equal(got, expected, check_exact=False, rtol=2**-10)
    assert got.attrs == expected.attrs


def test_a_run_kept_before_the_induction_fields_reads_its_maps(store, run, make_run, monkeypatch):
    """Row statistics kept before `duplicate` and `induction` existed (their manifest lists 32 fields): induction_heads
    reads the maps, previous_token_heads still the statistics."""
    import sqlalchemy as sa

    from attnstore.store import row_stats as fmt
    from attnstore.store.store import Store

    rows = repeated_run(store, make_run, name="repeated-old-rows", row_stats=True)
    info = store.run_info(rows)
    manifest = {**info.manifest, "row_stats": {**info.manifest["row_stats"], "fields": list(fmt.FIELDS[:32])}}
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE runs SET manifest = :m WHERE id = :i"), {"m": json.dumps(manifest), "i": info.id})
    assert store.run_info(rows).row_stats_fields == fmt.FIELDS[:32]
    read = []
    real = Store.iter_row_stats
    monkeypatch.setattr(Store, "iter_row_stats", lambda self, *a, **k: read.append(a) or real(self, *a, **k))
    pd.testing.assert_frame_equal(run_query(store, "induction_heads", run=rows), run_query(store, "induction_heads", run=run))
    assert read == []
    run_query(store, "previous_token_heads", run=rows)
    assert len(read) == 1
