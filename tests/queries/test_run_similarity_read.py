"""K3 `run_similarity`'s read path: groups of examples in the first run's storage order, the next group read by a
thread while this one is compared. Whatever the grouping, storage orders and dtype, the values are the textbook
cosines of each example's maps read one by one (to 1e-12), and every example read is reported to a progress listener.
"""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa

from attnstore.queries import run_query
from attnstore.queries import run_similarity as module
from attnstore.queries.engine import keep
from attnstore.store import progress
from attnstore.tests.queries import reference
from attnstore.tests.queries.helpers import forbid_map_reads, hand_run, has_summaries, read_only_store, write_blocks

# The analysis, not the database: SQLite only (kept summaries are Zarr; each query's SQL meets PostgreSQL in test_conformance.py).
pytestmark = pytest.mark.one_backend

SPECIALS = {"cls": {"token": "[CLS]", "id": 101}, "sep": {"token": "[SEP]", "id": 102}}
LENGTHS = (5, 9, 3, 12, 7, 4, 10, 6)


def tokens_of(length: int) -> list[str]:
    return ["[CLS]", *(f"t{k}" for k in range(length - 2)), "[SEP]"]


def random_maps(length: int, seed: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.random((2, 3, length, length), dtype=np.float32) ** 4 + 1e-4
    return (raw / raw.sum(-1, keepdims=True)).astype(dtype)


def other_run(store, base: str, name: str, maps: list[np.ndarray], order) -> str:
    """A run over `base`'s dataset with the same tokens, its examples written in `order`."""
    info = store.run_info(base)
    run = hand_run(store, name, dataset_id=info.dataset_id, n_layers=2, n_heads=3, dtype=str(maps[0].dtype), specials=SPECIALS)
    ids = store.examples(base).set_index("example")["example_id"]
    base_tokens = store.token_table(base)
    blocks = []
    for position in order:
        rows = [
            dict(
                token=t.token,
                token_id=int(t.token_id),
                word_position=None if t.is_special else int(t.word_position),
                segment=0,
                is_special=bool(t.is_special),
                char_start=None,
                char_end=None,
            )
            for t in base_tokens[base_tokens["example"] == position].itertuples()
        ]
        blocks.append((ids[position], maps[position], rows))
    write_blocks(store, run.id, blocks)
    return name


def textbook(store, a: str, b: str, examples) -> np.ndarray:
    """Mean over `examples` of each head's cosine, every map read on its own, in float64."""
    total = np.zeros((2, 3))
    for example in examples:
        x = store.attention(a, example).astype(np.float64).reshape(2, 3, -1)
        y = store.attention(b, example).astype(np.float64).reshape(2, 3, -1)
        total += (x * y).sum(-1) / np.sqrt((x * x).sum(-1) * (y * y).sum(-1))
    return total / len(examples)


@pytest.fixture(params=["float16", "float32"])
def dtype(request):
    return request.param


@pytest.fixture
def store(db_url, tmp_path, store_snapshots, make_run, dtype):
    """A store with `two_runs` in it, built once per session and dtype on SQLite and copied for each test
    (tests/snapshots.py); every test here uses them."""

    def build(store):
        first = [random_maps(n, k, dtype) for k, n in enumerate(LENGTHS)]
        second = [random_maps(n, 100 + k, dtype) for k, n in enumerate(LENGTHS)]
        base = make_run(store, first, [tokens_of(n) for n in LENGTHS], name="first", specials=SPECIALS, dtype=dtype)
        return base, other_run(store, base, "second", second, order=(3, 7, 0, 5, 1, 6, 2, 4))  # another storage order

    store, runs = store_snapshots.open(db_url, tmp_path, f"test_run_similarity_read:{dtype}", build)
    assert runs == ("first", "second")
    yield store
    store.close()


@pytest.fixture
def two_runs(store):
    return "first", "second"


@pytest.mark.parametrize("group_cells", [module.BATCH_CELLS, 300, 1])  # one group; a few; one example each
def test_grouped_overlapped_reads_give_the_textbook_cosines(store, two_runs, monkeypatch, group_cells):
    base, other = two_runs
    monkeypatch.setattr(module, "BATCH_CELLS", group_cells)
    for run, against in ((base, other), (other, base)):
        frame = run_query(store, "run_similarity", run=run, other=against)
        expected = textbook(store, run, against, range(len(LENGTHS)))
        np.testing.assert_allclose(frame["similarity"].to_numpy().reshape(2, 3), expected, rtol=1e-12, atol=0)
        assert (frame["n_examples"] == len(LENGTHS)).all()
    sampled = run_query(store, "run_similarity", run=base, other=other, max_examples=3, seed=1)
    chosen = sorted(np.random.default_rng(1).choice(len(LENGTHS), size=3, replace=False).tolist())
    np.testing.assert_allclose(sampled["similarity"].to_numpy().reshape(2, 3), textbook(store, base, other, chosen), rtol=1e-12, atol=0)
    subset = run_query(store, "run_similarity", run=base, other=other, examples=[6, 1])
    np.testing.assert_allclose(subset["similarity"].to_numpy().reshape(2, 3), textbook(store, base, other, [1, 6]), rtol=1e-12, atol=0)


def test_groups_follow_the_first_runs_storage_order_and_every_read_is_reported(store, two_runs, monkeypatch):
    base, other = two_runs
    a, b = store.run_info(base), store.run_info(other)
    shared = module.shared_examples(store, a, b)
    groups = module.batches(shared, 6, limit=400)
    in_storage_order = store.examples(a.id).sort_values("offset")["example"].tolist()
    assert [e for group in groups for e in group] == in_storage_order and len(groups) > 2
    assert all(6 * sum(LENGTHS[e] ** 2 for e in group) <= 400 or len(group) == 1 for group in groups)
    seen = []
    with progress.reporting(seen.append):
        pairs = list(module.paired_maps(store, a, b, groups))
    assert [e for e, _, _ in pairs] == in_storage_order and sum(seen) == 2 * len(LENGTHS)  # both runs' examples
    for example, mine, theirs in pairs:
        np.testing.assert_array_equal(mine, store.attention(base, example))
        np.testing.assert_array_equal(theirs, store.attention(other, example))


def test_a_failing_read_is_raised_to_the_caller(store, two_runs, monkeypatch):
    base, other = two_runs

    def broken(self, run, examples=None):
        raise OSError("disk gone")
        yield  # a generator, as iter_attention is

    monkeypatch.setattr(type(store), "iter_attention", broken)
    with pytest.raises(OSError, match="disk gone"):
        run_query(store, "run_similarity", run=base, other=other)


def test_kept_pair_cosines_equal_the_naive_ones_and_a_second_call_reads_no_map(store, two_runs, monkeypatch):

    base, other = two_runs
    cases = [dict(), dict(max_examples=3, seed=1), dict(examples=[6, 1])]
    want = [reference.query(store, "run_similarity", run=base, other=other, **c) for c in cases]
    run_query(store, "run_similarity", run=base, other=other)  # builds the pair's cache
    with monkeypatch.context() as m:
        forbid_map_reads(m, store)
        for case, expected in zip(cases, want):
            got = run_query(store, "run_similarity", run=base, other=other, **case)
            assert got.equals(expected), case  # the same cosines, added in the same order: bit-identical
    with read_only_store(store) as reader:  # reads the kept cache; could not build one
        assert run_query(reader, "run_similarity", run=base, other=other).equals(want[0])


def test_the_pair_cache_is_rebuilt_when_either_run_grows(store, two_runs, monkeypatch):
    base, other = two_runs
    a, b = store.run_info(base), store.run_info(other)
    first = keep(store, a, module.PAIR_COSINES, other=b.name)
    assert first is not None and sorted(first.arrays["example"][:]) == list(range(len(LENGTHS)))
    counted = type(store).n_committed
    monkeypatch.setattr(type(store), "n_committed", lambda self, run: counted(self, run) + (run == b.id))
    read = []
    original = type(store).iter_attention

    def counting(self, *args, **kwargs):
        read.append(1)
        yield from original(self, *args, **kwargs)

    monkeypatch.setattr(type(store), "iter_attention", counting)
    again = keep(store, a, module.PAIR_COSINES, other=b.name)
    assert read and np.array_equal(again.arrays["cosine"][:], first.arrays["cosine"][:])  # read again (the stamp moved), same values


def test_a_read_only_store_without_a_cache_computes_alone(store, two_runs):

    base, other = two_runs
    with read_only_store(store) as reader:
        frame = run_query(reader, "run_similarity", run=base, other=other)
    np.testing.assert_allclose(frame["similarity"].to_numpy().reshape(2, 3), textbook(store, base, other, range(len(LENGTHS))), rtol=1e-12)
    assert not has_summaries(store, base)


def test_the_pair_cache_checks_tokens_a_range_at_a_time(store, two_runs, monkeypatch):
    """Building the pair's cosines reads the token rows of a range of examples at a time (not both runs' whole
    token tables); an example tokenised differently in the last range still means no cache (the query computes its
    sample alone, and refuses it where the sample holds that example)."""
    base, other = two_runs
    a, b = store.run_info(base), store.run_info(other)
    monkeypatch.setattr(module, "TOKEN_CHECK_EXAMPLES", 3)
    asked = []
    original = type(store).token_table

    def noting(self, run, examples=None):
        asked.append(sorted(examples))
        return original(self, run, examples)

    monkeypatch.setattr(type(store), "token_table", noting)
    assert keep(store, a, module.PAIR_COSINES, other=b.name) is not None
    ranges = [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert asked == [r for r in ranges for _ in (a, b)]
    last = ranges[-1][-1]
    with store.engine.begin() as conn:  # the other run's first token of `last` gets another id
        conn.execute(
            sa.text(
                "UPDATE tokens SET token_id = 7 WHERE run_id = :r AND position = 1 AND example_id = "
                "(SELECT id FROM examples WHERE dataset_id = :d AND position = :p)"
            ),
            {"r": b.id, "d": b.dataset_id, "p": last},
        )
    monkeypatch.setattr(type(store), "n_committed", lambda self, run: 99)  # a new stamp: the cache is built again
    assert keep(store, a, module.PAIR_COSINES, other=b.name) is None
    with pytest.raises(module.InvalidArgumentError, match=f"tokenised example {last} differently"):
        run_query(store, "run_similarity", run=base, other=other)


def test_the_pair_cache_is_saved_and_read_back_a_part_at_a_time(store, two_runs, monkeypatch):
    """The pair's cosines are saved a group of examples at a time and read back a few rows at a time (neither
    ever whole); the kept sums still equal the naive reference's bit for bit."""
    base, other = two_runs
    monkeypatch.setattr(module, "BATCH_CELLS", 2 * 3 * 12**2)
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 3)
    case = dict(max_examples=5, seed=2)
    want = reference.query(store, "run_similarity", run=base, other=other, **case)
    saved = []
    from attnstore.store.summaries import RunSummaries

    original = RunSummaries.keep

    def noting(self, name, parts, stamp, n_examples=None, **ranged):
        def counted():
            for part in parts:
                saved.append(len(part["example"]))
                yield part

        return original(self, name, counted(), stamp, n_examples, **ranged)

    monkeypatch.setattr(RunSummaries, "keep", noting)
    assert run_query(store, "run_similarity", run=base, other=other, **case).equals(want)  # builds the cache, then reads it
    assert len(saved) > 2 and max(saved) < len(LENGTHS) and sum(saved) == len(LENGTHS)
    with monkeypatch.context() as m:
        forbid_map_reads(m, store)
        assert run_query(store, "run_similarity", run=base, other=other, **case).equals(want)
