"""Per-row statistics (store/row_stats.py, ingest/row_stats.py) on hand-built causal maps: their fields by hand, and
the decoder queries answering from them without reading a map, equal to the same queries over the maps."""

import math

import numpy as np
import pytest

from attnstore.ingest.row_stats import from_maps
from attnstore.queries import run_query
from attnstore.store import row_stats as fmt
from attnstore.tests.queries.test_attention_sink import sink_maps
from attnstore.tests.queries.test_causal import SPECIALS, mark_causal

# The analysis, not the database: SQLite only (kept summaries are Zarr; each query's SQL meets PostgreSQL in test_conformance.py).
pytestmark = pytest.mark.one_backend

FLOAT16 = 2**-10  # relative: a stored value's rounding, with room for a sum of a few


def test_fields_of_a_sink_head_and_a_previous_token_head_by_hand():
    """sink_maps(6): head 0 puts 0.5 on key 0 and 0.5 / i on keys 1..i of row i >= 1; head 1 all on key i - 1."""
    stats, top = from_maps(sink_maps(6))
    assert stats.shape == (6, 1, 2, len(fmt.FIELDS)) and stats.dtype == np.float16 and top.shape == (6, 1, 2, fmt.TOP_K)
    s = stats.astype(np.float64)
    row = lambda i, h, name: s[i, 0, h, fmt.FIELD[name]]  # noqa: E731
    approx = lambda v: pytest.approx(v, rel=FLOAT16, abs=1e-7)  # noqa: E731
    assert row(4, 0, "first_0") == approx(0.5) and row(4, 0, "first_3") == approx(0.5 / 4) and row(2, 0, "first_3") == 0
    assert row(4, 0, "entropy") == approx(-0.5 * math.log(0.5) - 0.5 * math.log(0.5 / 4)) and row(4, 1, "entropy") == 0
    assert all(abs(row(i, h, "learned_sink")) < 1e-6 for i in range(6) for h in (0, 1))  # rows that sum to 1
    # row 5 of head 0 by distance: d = 0 (key 5) 0.1; d = 1 0.1; d = 2..3 (keys 3, 2) 0.2; d = 4..7 (keys 1, 0) 0.1 + 0.5
    assert [row(5, 0, f"distance_{b}") for b in range(4)] == [approx(0.1), approx(0.1), approx(0.2), approx(0.6)]
    assert sum(row(5, 0, f"distance_{b}") for b in range(4, fmt.DISTANCE_BINS)) == 0
    assert row(5, 1, "distance_1") == approx(1.0)  # the previous token
    # key 0 of head 0: 1 + 0.5 x 5 over the 6 rows that see it; key 5 of head 1: no row after it attends to it
    assert row(0, 0, "column") == approx(3.5 / 6) and row(5, 1, "column") == 0 and row(4, 1, "column") == approx(1 / 2)
    assert top[5, 0, 0, 0] == 0 and row(5, 0, "top_0") == approx(0.5)  # the sink first
    assert top[5, 0, 1].tolist() == [4, -1, -1, -1, -1, -1, -1, -1]  # one key has weight: the rest are none
    assert top[1, 0, 0, :2].tolist() == [0, 1] and top[1, 0, 0, 2] == -1


def test_duplicate_and_induction_fields_by_hand():
    """Ids 5 7 5 7 9 under one uniform head: row 2 (id 5, last at 0) has duplicate A[2, 0] and induction A[2, 1], row
    3 (id 7, last at 1) A[3, 1] and A[3, 2]; rows whose id did not occur before, 0. Without ids both fields are 0."""
    n = 5
    maps = (np.tril(np.ones((n, n), np.float32)) / np.arange(1, n + 1, dtype=np.float32)[:, None])[None, None]
    stats, _ = from_maps(maps, [5, 7, 5, 7, 9])
    duplicate, induction = (stats[:, 0, 0, fmt.FIELD[name]].astype(np.float64) for name in ("duplicate", "induction"))
    assert duplicate.tolist() == pytest.approx([0, 0, 1 / 3, 1 / 4, 0], rel=FLOAT16)
    assert induction.tolist() == pytest.approx([0, 0, 1 / 3, 1 / 4, 0], rel=FLOAT16)
    maps[0, 0, 3] = [0.1, 0.2, 0.3, 0.4, 0]  # row 3 by key: its duplicate key 1 and induction key 2 now differ
    stats, _ = from_maps(maps, [5, 7, 5, 7, 9])
    assert stats[3, 0, 0, fmt.FIELD["duplicate"]] == pytest.approx(0.2, rel=FLOAT16)
    assert stats[3, 0, 0, fmt.FIELD["induction"]] == pytest.approx(0.3, rel=FLOAT16)
    assert not from_maps(maps)[0][..., [fmt.FIELD["duplicate"], fmt.FIELD["induction"]]].any()
    assert fmt.BYTES_PER_ROW_HEAD == 100  # the decoder-analyses issue's limit per row and head


@pytest.fixture
def runs(store, make_run):
    """The same hand-built causal maps as two runs: "rows" keeps row statistics, "plain" only the maps."""
    tokens = [[f"t{i}" for i in range(n)] for n in (9, 5, 3, 1)]
    maps = []
    for t in tokens:  # and a third head spread uniformly: every row's entropy log(i + 1)
        n = len(t)
        uniform = np.tril(np.ones((n, n), np.float32)) / np.arange(1, n + 1, dtype=np.float32)[:, None]
        maps.append(np.concatenate([sink_maps(n), uniform[None, None]], axis=1))
    words = [[dict(form=t, upos="PUNCT" if i % 3 == 0 else "NOUN") for i, t in enumerate(ts)] for ts in tokens]
    names = {}
    for kind in ("rows", "plain"):
        names[kind] = make_run(store, maps, tokens, name=kind, specials=SPECIALS, words_list=words, row_stats=kind == "rows")
        mark_causal(store, names[kind])
    return names


QUERIES = [
    ("attention_sink", {"window": 3, "epsilon": 0.6}),
    ("attention_sink", {}),
    ("previous_token_heads", {}),
    ("streaming_heads", {"sinks": 1, "recent": 2}),
    ("streaming_heads", {"sinks": 4, "recent": 4}),
    ("entropy_by_position", {}),
    ("heavy_hitters", {}),
]


@pytest.mark.parametrize("query,params", QUERIES, ids=[f"{q}-{'-'.join(map(str, p.values())) or 'defaults'}" for q, p in QUERIES])
def test_queries_answer_from_row_stats_without_reading_a_map(store, runs, monkeypatch, query, params):
    from attnstore.store.store import Store

    expected = run_query(store, query, run=runs["plain"], **params)
    checked = run_query(store, query, run=runs["rows"], weights="maps", **params)  # the rows run's own maps

    def no_maps(*args, **kwargs):
        raise AssertionError("a query over row statistics read a map")

    monkeypatch.setattr(Store, "iter_attention", no_maps)
    got = run_query(store, query, run=runs["rows"], **params)
    for frame in (got, checked):
        assert list(frame.columns) == list(expected.columns)
        numeric = expected.select_dtypes("number").columns
        np.testing.assert_allclose(frame[numeric].to_numpy(float), expected[numeric].to_numpy(float), rtol=2 * FLOAT16, atol=1e-6)
        non_numeric = [c for c in expected.columns if c not in numeric]
        assert frame[non_numeric].equals(expected[non_numeric])
    for key, value in expected.attrs.items():
        if isinstance(value, float):
            assert got.attrs[key] == pytest.approx(value, rel=2 * FLOAT16, nan_ok=True), key
        elif key != "note":
            assert got.attrs[key] == value, key


def test_hand_values_from_row_stats(store, runs):
    """A few of test_decoder_heads' and test_attention_sink's hand values, from the rows run."""
    df = run_query(store, "previous_token_heads", run=runs["rows"]).set_index("head")
    assert df.loc[1, "previous"] == pytest.approx(1.0, rel=FLOAT16)
    entropy = run_query(store, "entropy_by_position", run=runs["rows"])
    uniform = entropy[entropy["head"] == 2]
    np.testing.assert_allclose(uniform["entropy"], uniform["uniform_entropy"], rtol=FLOAT16)  # the uniform head's bound


def test_parameters_the_bins_cannot_give_read_the_maps(store, runs, monkeypatch):
    """recent=3 is no power of 2 and sinks=5 past the first positions kept: those calls read the maps, and agree."""
    expected = run_query(store, "streaming_heads", run=runs["plain"], sinks=5, recent=3)
    got = run_query(store, "streaming_heads", run=runs["rows"], sinks=5, recent=3)
    np.testing.assert_allclose(got["kept"], expected["kept"], rtol=1e-6)


def test_weights_maps_keeps_its_own_summary(store, runs):
    from attnstore.queries.attention_sink import SINKS

    run_query(store, "attention_sink", run=runs["rows"])
    run_query(store, "attention_sink", run=runs["rows"], weights="maps")
    kept = {name for name, _ in store.summaries(runs["rows"]).stamped()}
    assert SINKS.key({}) != SINKS.key({"weights": "maps"})
    assert {SINKS.key({}), SINKS.key({"weights": "maps"})} <= kept


def test_a_writer_refuses_row_stats_a_run_does_not_keep_and_the_reader_says_so(store, runs, make_run):
    from attnstore.store.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="keeps no per-row attention statistics"):
        next(store.iter_row_stats(runs["plain"]))
    example, some = next(store.iter_row_stats(runs["rows"], fields=("entropy", "first"), top=False))  # a few fields only
    whole = dict(store.iter_row_stats(runs["rows"]))[example]
    assert some.top is None and some.stats.shape[-1] == 5 and np.array_equal(some.fields(fmt.FIRST), whole.fields(fmt.FIRST))
    assert np.array_equal(some.field("entropy"), whole.field("entropy"))
    with pytest.raises(KeyError, match="row statistic 'column' was not read"):
        some.field("column")
    tokens = [["a", "b"]]
    run, writer = make_run(store, [sink_maps(2)], tokens, name="unfinished", specials=SPECIALS, row_stats=True, finish=False)
    try:
        ids = store.sql("SELECT id FROM examples WHERE dataset_id = :d", {"d": store.run_info(run).dataset_id})["id"]
        with pytest.raises(InvalidArgumentError, match="keeps row statistics: example .* was given none"):
            writer.add(int(ids.iloc[0]), sink_maps(2)[0:1].reshape(1, 2, 2, 2), [dict(token="a")] * 2)
        stats, top = from_maps(sink_maps(2))
        with pytest.raises(InvalidArgumentError, match="row statistics of shapes"):
            writer.add(int(ids.iloc[0]), sink_maps(2)[0:1].reshape(1, 2, 2, 2), [dict(token="a")] * 2, rows=(stats[:1], top[:1]))
    finally:
        writer.close()


def test_check_names_row_stats_cut_short(store, runs):
    """A row_stats array missing a committed token's values: `check` names it and the fix, in one line."""
    from attnstore.store import arrays
    from attnstore.store.check import check_run

    info = store.run_info(runs["rows"])
    assert check_run(store, runs["rows"]).problems == []
    stats = arrays.TokenArray(store.locations.array_root, info.array_path, fmt.STATS, read_only=False)
    stats.array.resize((stats.length() - 1, *stats.array.shape[1:]))
    (problem,) = check_run(store, runs["rows"]).problems
    assert "row_stats holds" in problem["problem"] and "ingest the run again for its row statistics" in problem["problem"]


def test_a_run_kept_before_the_last_fields_goes_on_in_its_own_format(store, make_run, monkeypatch):
    """A run whose row_stats array was made with the first 32 fields (before `duplicate` and `induction`), resumed by
    this version: each example's statistics are written in the run's own 32 fields."""
    tokens = [["a", "b", "a"]]
    with monkeypatch.context() as patched:
        patched.setattr(fmt, "FIELDS", fmt.FIELDS[:32])  # the array made as an older version made it
        run, writer = make_run(store, [sink_maps(3)], tokens, name="older", specials=SPECIALS, row_stats=True, write=0, finish=False)
    try:
        example = int(store.sql("SELECT id FROM examples WHERE dataset_id = :d", {"d": store.run_info(run).dataset_id})["id"].iloc[0])
        stats, top = from_maps(sink_maps(3), [5, 6, 5])
        assert stats.shape[-1] == len(fmt.FIELDS) == 34
        rows = [
            dict(token=t, token_id=i, word_position=k, segment=0, is_special=False, char_start=None, char_end=None)
            for k, (t, i) in enumerate(zip(tokens[0], (5, 6, 5)))
        ]
        writer.add(example, sink_maps(3), rows, rows=(stats, top))
        writer.finish(0.0)
    finally:
        writer.close()
    ((_, kept),) = store.iter_row_stats(run)
    assert kept.stats.shape == (3, 1, 2, 32) and np.array_equal(kept.stats, stats[..., :32])
