"""Per-example sums kept with a run (queries/engine/): relative_position, special_tokens and entropy read them
instead of the maps, with the results of their naive references (tests/queries/reference.py), for any subset and
either averaging; kept under a fingerprint of the kind, its version, its parameters and the run's committed state.

Random ragged maps with [CLS], [SEP] and punctuation, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import zarr

from attnstore.queries import clark, run_query
from attnstore.queries import engine as summary_module
from attnstore.queries import errors as query_errors
from attnstore.queries.engine import kept as engine_kept
from attnstore.queries.engine import passes as engine_passes
from attnstore.store import open_store
from attnstore.tests.queries import reference
from attnstore.tests.snapshots import store_with

TOKENS = [
    ["[CLS]", "a", ",", "b", "[SEP]"],
    ["[CLS]", "c", "[SEP]", "d", ".", "[SEP]"],
    ["[CLS]", "e", "f", "g", "h", "[SEP]"],
    ["[CLS]", "i", "[SEP]"],
]
QUERIES = ("relative_position", "special_tokens", "entropy")


def random_maps(tokens, seed):
    rng = np.random.default_rng(seed)
    raw = rng.random((3, 2, len(tokens), len(tokens)), dtype=np.float32) ** 3 + 1e-3
    return (raw / raw.sum(-1, keepdims=True)).astype(np.float16)


MAPS = [random_maps(t, i) for i, t in enumerate(TOKENS)]


def same(a, b):
    assert list(a.columns) == list(b.columns)
    for column in a.columns:
        np.testing.assert_allclose(a[column].to_numpy(float), b[column].to_numpy(float), rtol=1e-12, atol=1e-15, equal_nan=True)


def build_run(store, make_run):
    return make_run(store, MAPS, TOKENS, name="sums", dtype="float16")


# For a test of `run`, the store with the run, built once per session on SQLite and copied (tests/snapshots.py).
store = store_with("run", build_run)


@pytest.fixture
def run(store):
    return "sums"


@pytest.mark.parametrize("name", QUERIES)
@pytest.mark.parametrize("average", ["example", "token"])
@pytest.mark.parametrize("examples", [None, [2, 0], [3]])
@pytest.mark.parametrize("range_size", [4096, 3])  # 3: the sums are kept and read in parts of 3 and 1 examples
def test_kept_sums_give_the_naive_results(store, run, monkeypatch, name, average, examples, range_size):
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", range_size)
    kept = run_query(store, name, run=run, average=average, examples=examples)
    same(kept, reference.query(store, name, run=run, average=average, examples=examples))


def test_sums_are_kept_with_the_run_and_read_without_decoding_maps(store, run, monkeypatch):
    first = run_query(store, "entropy", run=run)
    group = zarr.open_group(store.locations.array_root, path="runs/sums/summary/clark", mode="r")
    assert group.attrs["stamp"] == {"version": 3, "n_examples": 4}
    assert group["example"][:].tolist() == [0, 1, 2, 3] and group["length"][:].tolist() == [5, 6, 6, 3]
    assert group["entropy"].shape == (4, 3, 2)

    def no_maps(*args, **kwargs):
        raise AssertionError("the maps were read")

    monkeypatch.setattr(type(store), "iter_attention", no_maps)
    same(run_query(store, "entropy", run=run), first)
    run_query(store, "special_tokens", run=run, average="token")
    run_query(store, "relative_position", run=run, examples=[1])


def test_examples_read_only_the_kept_parts_that_hold_them(store, run, monkeypatch):
    """With ranges of 2 examples, `examples=[3]` reads example 3's row of the kept summary only (no part: the rows of a
    summary without ragged fields), and finds the examples in the summary's example column, not in the run's storage
    order streamed from SQL."""
    from attnstore.store.summaries import SummaryParts

    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 2)
    run_query(store, "entropy", run=run)  # keeps the summary
    read, rows = [], SummaryParts.rows
    monkeypatch.setattr(SummaryParts, "part", lambda *a: (_ for _ in ()).throw(AssertionError("a whole part was read")))

    def counted(self, positions, *args, **kwargs):
        read.append(positions.tolist())
        return rows(self, positions, *args, **kwargs)

    monkeypatch.setattr(SummaryParts, "rows", counted)
    monkeypatch.setattr(type(store), "storage_order", lambda *a: (_ for _ in ()).throw(AssertionError("read from SQL")))
    with pytest.raises(query_errors.NotFoundError, match=r"no stored example\(s\) \[9\]"):
        run_query(store, "entropy", run=run, examples=[3, 9])
    got = run_query(store, "entropy", run=run, examples=[3])
    monkeypatch.undo()
    same(got, reference.query(store, "entropy", run=run, examples=[3]))
    assert read == [[3]]


def test_a_sample_reads_the_kept_example_column_once(store, run, make_run, monkeypatch):
    """A sampled query's two steps (`kept_order` to draw the sample, then `summary_parts` for its rows) read the kept
    summary's example column once, shared read-only; another run's is read for it."""
    from attnstore.store.summaries import SummaryParts

    run_query(store, "entropy", run=run)  # keeps the summary
    other = make_run(store, MAPS[:3], TOKENS[:3], name="other", dtype="float16")
    run_query(store, "entropy", run=other)
    kind = summary_module.kind_named("clark")
    reads, column = [], SummaryParts.column
    monkeypatch.setattr(SummaryParts, "column", lambda self, key: reads.append(key) or column(self, key))
    engine_kept._LAST_ORDERS.pop(store, None)  # what the queries above left for this store
    order = summary_module.kept_order(store, store.run_info(run), kind, {})
    parts = list(summary_module.summary_parts(store, store.run_info(run), kind, [2, 0]))
    assert sorted(order.tolist()) == [0, 1, 2, 3] and reads == ["example"]
    assert sorted(np.concatenate([part["example"] for part in parts]).tolist()) == [0, 2]
    with pytest.raises(ValueError):
        order[0] = 9
    assert sorted(summary_module.kept_order(store, store.run_info(other), kind, {}).tolist()) == [0, 1, 2]
    assert reads == ["example", "example"]


@pytest.mark.parametrize(
    "positions",
    [
        [5, 3, 9, 0],
        [0, 1, 2],
        [],
        [7],
        [10**9, 3, 5],
        [4, 4, 1],
        [2, 0, 1, 3],
        [2, 2, 0, 1],
        list(np.random.default_rng(0).permutation(50000)[:40000]),
    ],
    ids=["dense", "ascending", "empty", "one", "sparse", "repeated", "every-position", "repeated-to-max", "large"],
)
def test_ascending_sorts_as_np_sort(positions):
    got = summary_module.ascending(np.asarray(positions, dtype=np.int64))
    assert got.dtype == np.int64 and got.tolist() == sorted(positions)


@pytest.mark.parametrize(
    "positions, every",
    [([2, 0, 1], True), ([0], True), ([0, 2], False), ([1, 2], False), ([0, 0, 2], False), ([2, 1, 1], False), ([], False)],
)
def test_every_position_means_each_of_0_to_n_minus_1_once(positions, every):
    assert summary_module.every_position(np.asarray(positions, dtype=np.int64)) is every


@pytest.mark.parametrize("n, size, seed", [(9, 4, 0), (1001, 1000, 3), (50000, 7, 11)])
def test_a_sample_drawn_from_the_count_is_the_one_drawn_from_the_sorted_positions(n, size, seed):
    """patterns.sample_examples draws from range(n) where the positions are 0..n-1 (no arange of 8 M built): numpy's
    `choice` of an array draws indices, then takes them, so the sample is the one drawn from the sorted positions."""
    positions = summary_module.ascending(np.random.default_rng(1).permutation(n))
    want = np.sort(np.random.default_rng(seed).choice(positions, size=size, replace=False))
    got = np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("examples", [[2, 0], [3, 1, 0], [1]])
def test_a_sample_s_rows_in_batches_are_the_rows_of_its_ranges(store, run, monkeypatch, examples):
    """`batched` hands a sample's kept rows as a part per few ranges: concatenated, the same rows in the same order as
    the parts of one range each (what `summary` and integer totals take)."""
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", 2)  # 4 examples: 2 ranges
    run_query(store, "entropy", run=run)  # keeps the summary
    kind, info = summary_module.kind_named("clark"), store.run_info(run)
    ranged = list(summary_module.summary_parts(store, info, kind, examples))
    batched = list(summary_module.summary_parts(store, info, kind, examples, batched=True))
    rows_of = summary_module.kept_order(store, info, kind, {}).tolist()
    assert len(ranged) == len({rows_of.index(e) // 2 for e in examples}) and 1 <= len(batched) <= len(ranged)
    assert all(len(part["example"]) <= 2 for part in batched)
    whole, together = summary_module.concatenate(kind, ranged), summary_module.concatenate(kind, batched)
    assert set(together) == set(whole)
    for name, values in whole.items():
        np.testing.assert_array_equal(together[name], values, err_msg=name)


def test_a_kind_that_declares_integer_totals_must_give_integers(store, run, monkeypatch):
    run_query(store, "entropy", run=run)
    kind = summary_module.kind_named("clark")
    monkeypatch.setitem(summary_module.KINDS, "clark", dataclasses.replace(kind, integer_totals=True))
    with pytest.raises(TypeError, match="declares integer_totals but its totals are not all integers"):
        summary_module.summary_totals(store, store.run_info(run), summary_module.KINDS["clark"], [0, 2])


def test_sums_of_a_run_that_has_grown_since_are_built_again(store, run, monkeypatch):
    run_query(store, "relative_position", run=run)
    group = zarr.open_group(store.locations.array_root, path="runs/sums/summary/clark", mode="r+")
    group.attrs["stamp"] = {"version": 3, "n_examples": 3}  # as if built before the 4th example
    same(run_query(store, "relative_position", run=run), reference.query(store, "relative_position", run=run))
    assert zarr.open_group(store.locations.array_root, path="runs/sums/summary/clark", mode="r").attrs["stamp"]["n_examples"] == 4


def test_other_punctuation_is_kept_under_its_own_fingerprint_and_read_only_stores_compute_alone(store, run, monkeypatch):
    reader = open_store(db=store.locations.db_url, root=store.locations.array_root, read_only=True)
    try:
        result = run_query(reader, "entropy", run=run)
    finally:
        reader.close()
    assert not zarr.open_group(store.locations.array_root, path="runs/sums", mode="r").get("summary")  # nothing kept
    same(result, reference.query(store, "entropy", run=run))
    other = run_query(store, "special_tokens", run=run, punct=",;")
    same(other, reference.query(store, "special_tokens", run=run, punct=",;"))
    key = clark.CLARK.key({"punct": ",;"})
    assert key.startswith("clark.") and key != clark.CLARK.key({"punct": ".,"}) == "clark"
    group = zarr.open_group(store.locations.array_root, path=f"runs/sums/summary/{key}", mode="r")
    assert group.attrs["stamp"] == {"version": 3, "n_examples": 4, "params": {"punct": ",;"}}
    assert not zarr.open_group(store.locations.array_root, path="runs/sums/summary", mode="r").get("clark")  # the default's: not built
    with monkeypatch.context() as m:  # read back, no map decoded
        m.setattr(type(store), "iter_attention", lambda *a, **k: pytest.fail("the maps were read"))
        same(run_query(store, "special_tokens", run=run, punct=",;"), other)
    same(run_query(store, "special_tokens", run=run), reference.query(store, "special_tokens", run=run))
    assert zarr.open_group(store.locations.array_root, path="runs/sums/summary", mode="r").get("clark")


def test_large_summaries_are_chunked_by_example_and_read_back_whole(store, run, monkeypatch):
    from attnstore.store import summaries

    monkeypatch.setattr(summaries, "SUMMARY_CHUNK_BYTES", 2 * 3 * 2 * 8)  # two examples' (layer, head) float64 sums per chunk
    first = run_query(store, "entropy", run=run)
    group = zarr.open_group(store.locations.array_root, path="runs/sums/summary/clark", mode="r")
    assert group["entropy"].chunks == (2, 3, 2) and group["entropy"].shape == (4, 3, 2)
    same(run_query(store, "entropy", run=run), first)
    same(first, reference.query(store, "entropy", run=run))


def test_a_small_run_s_summary_is_not_padded_to_a_full_range(store, run):
    """4 examples: chunks of 4 rows (the next power of two), not 4,096 that zarr would encode and compare per field."""
    run_query(store, "entropy", run=run)
    group = zarr.open_group(store.locations.array_root, path="runs/sums/summary/clark", mode="r")
    assert group["entropy"].chunks == (4, 3, 2) and group["example"].chunks == (4,)


@pytest.mark.parametrize("threads", ["1", "3"])
def test_the_reduce_on_a_pool_gives_the_one_thread_sums_exactly(store, run, monkeypatch, threads):
    """The Clark kind reduces on a pool of threads while the reading thread decodes (ATTNSTORE_REDUCE_THREADS: 1 keeps
    it on the reading thread); the sums are bit for bit those of the one-thread pass, in storage order."""
    info = store.run_info(run)
    monkeypatch.setenv(engine_passes.REDUCE_THREADS_ENV, "1")
    one = summary_module.summarise_examples(store, info, clark.CLARK)
    monkeypatch.setenv(engine_passes.REDUCE_THREADS_ENV, threads)
    assert (engine_passes._reduce_pool() is None) == (threads == "1")
    pooled = summary_module.summarise_examples(store, info, clark.CLARK)
    assert list(pooled) == list(one)
    for field in one:
        np.testing.assert_array_equal(pooled[field], one[field], err_msg=field)


def test_an_error_in_a_pooled_pass_is_raised_and_a_bad_thread_count_is_named(store, run, monkeypatch):
    from attnstore.queries.errors import InvalidArgumentError

    info = store.run_info(run)
    monkeypatch.setenv(engine_passes.REDUCE_THREADS_ENV, "2")

    def failing_prepare(*args, **kwargs):
        raise RuntimeError("token table unreadable")

    def failing_reduce(context, example, maps):
        raise RuntimeError(f"example {example} failed")

    broken = summary_module.SummaryKind("broken", 1, failing_prepare, clark._clark_reduce, threads=True)
    with pytest.raises(RuntimeError, match="token table unreadable"):
        summary_module.summarise_examples(store, info, broken)
    with pytest.raises(RuntimeError, match="token table unreadable"):  # no example to reduce: still raised
        summary_module.summarise_examples(store, info, broken, examples=[])
    broken = summary_module.SummaryKind("broken", 1, clark._clark_prepare, failing_reduce, threads=True)
    with pytest.raises(RuntimeError, match="example 0 failed"):
        summary_module.summarise_examples(store, info, broken)
    monkeypatch.setenv(engine_passes.REDUCE_THREADS_ENV, "many")
    with pytest.raises(InvalidArgumentError, match="ATTNSTORE_REDUCE_THREADS='many': give a whole number of threads"):
        summary_module.reduce_threads()


@pytest.mark.one_backend
def test_a_forked_child_reduces_on_a_pool_of_its_own(store, run, monkeypatch):
    """The parent's pool threads do not exist in a forked child: its pass makes a new pool instead of waiting forever."""
    import multiprocessing

    info = store.run_info(run)
    monkeypatch.setenv(engine_passes.REDUCE_THREADS_ENV, "2")
    parent = summary_module.summarise_examples(store, info, clark.CLARK)  # the parent's pool exists now
    assert engine_passes.REDUCE_POOL.executor is not None
    store.engine.dispose()  # a forked child must not share the parent's database connections
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        child = pool.apply_async(_child_pass, (store.locations.db_url, store.locations.array_root, run)).get(timeout=60)
    for field in parent:
        np.testing.assert_array_equal(child[field], parent[field], err_msg=field)


def _child_pass(db: str, root: str, run: str) -> dict:
    store = open_store(db=db, root=root, read_only=True)
    try:
        return summary_module.summarise_examples(store, store.run_info(run), clark.CLARK)
    finally:
        store.close()


def test_maps_are_read_ahead_while_the_prepare_runs_and_within_the_budget(monkeypatch):
    """While the kind's `prepare` runs on the pool, the reading thread reads on (up to READ_AHEAD_CELLS cells) instead
    of waiting at two examples per thread; once it is done, at most two per thread are in flight again."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv(engine_passes.REDUCE_THREADS_ENV, "2")
    monkeypatch.setattr("attnstore.queries.engine.passes.READ_AHEAD_CELLS", 100)
    read, seen_by_prepare = [], []
    six_read = threading.Event()

    def pairs():
        for example in range(12):
            read.append(example)
            if len(read) == 6:
                six_read.set()
            yield example, np.zeros(10)  # 10 cells each: the budget holds 10 examples

    def prepare():
        six_read.wait(timeout=10)  # past the 4 examples in flight of a pool of 2: only the read-ahead gets there
        seen_by_prepare.append(len(read))
        return "context"

    kind = summary_module.SummaryKind("probe", 1, None, lambda context, example, maps: {"x": np.asarray(example)}, threads=True)
    with ThreadPoolExecutor(2) as pool:
        context = pool.submit(prepare)
        out = [(e, int(r["x"])) for e, r in engine_passes.reduced(kind, context, pairs(), pool)]
    assert out == [(e, e) for e in range(12)]
    assert 6 <= seen_by_prepare[0] <= 11  # read on while it ran, within the budget (10 examples, the 11th over it)


def test_token_flags_strip_subword_marks_and_mark_punctuation_per_distinct_token(store, make_run):
    """token_flags reads its four columns (`token_roles`) and decides punctuation once per distinct token text, after
    stripping a WordPiece "##", byte-level "Ġ" or SentencePiece "▁" mark; roles come from the recorded special ids."""
    from attnstore.queries.common import token_flags

    tokens = [["[CLS]", "Ġ,", "##.", ".", "a", ",", "▁.", "[SEP]"], ["[CLS]", "Ġ,", "b", "[SEP]"]]
    run = make_run(store, [random_maps(t, i) for i, t in enumerate(tokens)], tokens, name="flags", dtype="float16")
    info = store.run_info(run)
    flags = token_flags(store, info, ".,")
    assert flags[0].punct.tolist() == [False, True, True, True, False, True, True, False]
    assert flags[1].punct.tolist() == [False, True, False, False]
    assert flags[0].cls.tolist() == [True] + [False] * 7 and flags[0].sep.tolist() == [False] * 7 + [True]
    assert token_flags(store, info, ",")[0].punct.tolist() == [False, True, False, False, False, True, False, False]
    assert list(token_flags(store, info, ".,", examples=[1])) == [1]
