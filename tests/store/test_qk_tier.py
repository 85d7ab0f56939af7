"""The Q/K tier's store side (store/qk.py) on hand-made queries and keys, without a model: what a run writes, what a
read rebuilds (exact softmax of q.k scale over the causal, windowed keys), blocks of rows, check, and bad input."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from attnstore.store import qk
from attnstore.store.errors import InvalidArgumentError
from attnstore.store.records import ExampleInput
from attnstore.tests.queries.helpers import hand_run

LAYERS, HEADS, KV, DIM = 2, 4, 2, 3
SCALES, WINDOWS = [0.5, 0.25], [None, 2]
LENGTHS = [4, 6, 1]


def softmax_maps(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """(layer, head, L, L): softmax over the keys each row sees, computed the long way in float64."""
    n = q.shape[0]
    out = np.zeros((LAYERS, HEADS, n, n))
    for layer in range(LAYERS):
        for head in range(HEADS):
            for i in range(n):
                seen = [j for j in range(i + 1) if WINDOWS[layer] is None or i - j < WINDOWS[layer]]
                logits = np.array([q[i, layer, head] @ k[j, layer, head // (HEADS // KV)] * SCALES[layer] for j in seen], dtype=np.float64)
                out[layer, head, i, seen] = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    return out


def lse_of(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    n = q.shape[0]
    lse = np.zeros((n, LAYERS, HEADS), dtype=np.float32)
    for layer in range(LAYERS):
        for head in range(HEADS):
            for i in range(n):
                seen = [j for j in range(i + 1) if WINDOWS[layer] is None or i - j < WINDOWS[layer]]
                logits = np.array([q[i, layer, head] @ k[j, layer, head // (HEADS // KV)] * SCALES[layer] for j in seen])
                lse[i, layer, head] = np.log(np.exp(logits - logits.max()).sum()) + logits.max()
    return lse


@pytest.fixture
def qk_run(store):
    return write_qk_run(store)


def write_qk_run(store):
    """A run in the Q/K tier (float32) of three examples (4, 6 and 1 tokens), written as ingest writes one."""
    rng = np.random.default_rng(0)
    dataset_id, _ = store.writer.find_or_create_dataset(
        name="hand-qk", split="test", checksum=uuid.uuid4().hex, format="text", source="tests", annotator="whitespace"
    )
    words = [
        [
            dict(
                position=i,
                segment=0,
                form=f"w{i}",
                lemma=None,
                upos=None,
                xpos=None,
                head=None,
                deprel=None,
                char_start=None,
                char_end=None,
            )
            for i in range(n)
        ]
        for n in LENGTHS
    ]
    store.writer.add_examples(
        dataset_id,
        [ExampleInput(position=p, text_a=" ".join(w["form"] for w in ws), words=tuple(ws)) for p, ws in enumerate(words)],
        "whitespace",
    )
    store.writer.complete_dataset(dataset_id)
    entry = qk.qk_entry(dtype="float32", n_kv_heads=KV, head_dim=DIM, scales=SCALES, windows=WINDOWS)
    info = hand_run(
        store, "qk", dataset_id=dataset_id, n_layers=LAYERS, n_heads=HEADS, dtype="float32", specials={}, manifest={"qk": entry}
    )
    ids = dict(store.sql("SELECT position, id FROM examples WHERE dataset_id = :d", {"d": dataset_id}).values.tolist())
    writer = store.writer.run_writer(info.id)
    values = []
    for position, n in enumerate(LENGTHS):
        q = rng.normal(size=(n, LAYERS, HEADS, DIM)).astype(np.float32)
        k = rng.normal(size=(n, LAYERS, KV, DIM)).astype(np.float32)
        tokens = [
            dict(token=f"w{i}", token_id=1000 + i, word_position=i, segment=0, is_special=False, char_start=None, char_end=None)
            for i in range(n)
        ]
        writer.add(ids[position], None, tokens, qk=(q, k, lse_of(q, k)))
        writer.commit()
        values.append((q, k))
    writer.finish(0.0)
    return values


def test_reads_rebuild_the_softmax_of_the_stored_queries_and_keys(store, qk_run):
    from attnstore.store.check import check_run

    info = store.run_info("qk")
    assert info.tier == "qk" and info.qk["window"] == WINDOWS
    for example, (q, k) in enumerate(qk_run):
        expected = softmax_maps(q, k)
        maps = store.attention("qk", example)
        assert maps.dtype == np.float32 and maps.shape == expected.shape
        np.testing.assert_allclose(maps, expected, atol=1e-6)
        np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-6)
        assert (maps[1][..., np.tril(np.ones((len(q), len(q)), bool), -2)] == 0).all()  # layer 1's window of 2
    np.testing.assert_array_equal(
        store.attention("qk", 1, layer=1, head=[3, 0], rows=range(2, 5)), store.attention("qk", 1)[1:, [3, 0], 2:5]
    )
    streamed = dict(store.iter_attention("qk", [2, 0]))
    assert sorted(streamed) == [0, 2] and np.array_equal(streamed[0], store.attention("qk", 0))
    assert check_run(store, "qk").problems == []
    with pytest.raises(InvalidArgumentError, match=r"rows range\(3, 9\).*within the example's 4 tokens"):
        store.attention("qk", 0, rows=range(3, 9))


@pytest.mark.parametrize("block", [1, 2, 256])
def test_maps_rebuilt_in_row_blocks_and_a_layer_at_a_time_are_the_softmax(store, qk_run, monkeypatch, block):
    """Row blocks of 1, 2 and 256 rows (each against the keys its rows see: causal and layer 1's window of 2), and a
    layer at a time into one reused buffer (`LayerMaps`, as a `by_layer` kind reads a Q/K run): the same maps; the
    Clark sums of a `LayerMaps` equal those of its array bit for bit."""
    from attnstore.queries import clark
    from attnstore.queries.clark import example_sums

    monkeypatch.setattr(qk, "REBUILD_ROWS", block)
    monkeypatch.setattr(clark, "CAUSAL_ROWS", block)  # a causal layer's p log p over the keys each row block sees
    streamed = dict(store.iter_attention("qk", by_layer=True))
    assert sorted(streamed) == [0, 1, 2]
    for example, (q, k) in enumerate(qk_run):
        expected = softmax_maps(q, k)
        np.testing.assert_allclose(store.attention("qk", example), expected, atol=1e-6)
        lazy = streamed[example]
        assert isinstance(lazy, qk.LayerMaps) and lazy.shape == expected.shape and lazy.dtype == np.float32
        for layer in (1, 0, 1):  # the buffer reused: a windowed layer, then a causal one, then the windowed one again
            np.testing.assert_allclose(lazy.layer(layer), expected[layer], atol=1e-6)
        np.testing.assert_array_equal(np.asarray(lazy), store.attention("qk", example))
        flags = [np.arange(len(q)) == 0, np.zeros(len(q), bool), np.arange(len(q)) % 3 == 2]
        by_layer, whole = example_sums(lazy, *flags), example_sums(np.asarray(lazy), *flags)
        assert all(np.array_equal(by_layer[f], whole[f]) for f in whole)


def test_pooled_maps_are_the_max_pool_of_the_rebuilt_ones(store, qk_run, monkeypatch):
    """`store.pooled_attention` (the long-map tiles): on a Q/K run, from the logits without the map, each block's largest
    weight exactly as max-pooling the rebuilt map gives it, causal and windowed, from any block of rows, in one chunk
    of rows or several (on threads); on a dense run, the pooled rows read."""
    for chunk in (qk.POOL_CHUNK_ROWS, 2):  # 2: the 6-token example's rows in three chunks
        monkeypatch.setattr(qk, "POOL_CHUNK_ROWS", chunk)
        for example, (q, _) in enumerate(qk_run):
            n = len(q)
            for layer in range(LAYERS):
                for head in (0, 3):
                    for factor, first in ((1, 0), (2, 0), (2, 2), (4, 0), (8, 0)):
                        if first >= n:
                            continue
                        rows = range(first, n)
                        full = store.attention("qk", example, layer=[layer], head=[head], rows=rows)[0, 0]
                        pooled = store.pooled_attention("qk", example, layer, head, rows, factor)
                        np.testing.assert_allclose(pooled, qk.max_pool(full, factor), rtol=1e-6, atol=0)
    assert qk.max_pool(np.arange(12.0).reshape(3, 4), 2).tolist() == [[5.0, 7.0], [9.0, 11.0]]  # edges padded with 0
    values = np.random.default_rng(0).normal(size=(37, 70)).astype(np.float32)
    for factor in (2, 3, 8, 64):  # against each block's max taken one block at a time, edges padded with -inf
        expected = [[values[r : r + factor, c : c + factor].max() for c in range(0, 70, factor)] for r in range(0, 37, factor)]
        assert qk.max_pool(values, factor, fill=-np.inf).tolist() == expected
    with pytest.raises(InvalidArgumentError, match=r"starting on a multiple of 2"):
        store.pooled_attention("qk", 1, 0, 0, range(1, 6), 2)


def test_a_qk_run_on_s3_reads_as_on_a_local_root(store, qk_run, s3_root, tmp_path):
    """The Q/K arrays written to and read from object storage (the test S3 server): maps, blocks of rows and pooled
    tiles equal the local run's, and `check` passes there."""
    from attnstore.store import migrate, open_store
    from attnstore.store.check import check_run

    url = f"sqlite:///{tmp_path / 's3.sqlite'}"
    migrate.upgrade(url)
    with open_store(db=url, root=s3_root) as remote:
        write_qk_run(remote)
        for example in range(len(LENGTHS)):
            np.testing.assert_array_equal(remote.attention("qk", example), store.attention("qk", example))
        rows = range(2, 6)
        np.testing.assert_array_equal(
            remote.attention("qk", 1, layer=1, head=[0, 3], rows=rows), store.attention("qk", 1, layer=1, head=[0, 3], rows=rows)
        )
        np.testing.assert_array_equal(
            remote.pooled_attention("qk", 1, 0, 2, range(0, 6), 2), store.pooled_attention("qk", 1, 0, 2, range(0, 6), 2)
        )
        assert check_run(remote, "qk").problems == []


def test_pooled_maps_of_a_dense_run(store, make_run):
    rng = np.random.default_rng(1)
    maps = rng.dirichlet(np.ones(5), size=(1, 2, 5)).astype(np.float32)
    make_run(store, [maps], [[f"t{i}" for i in range(5)]], name="dense", specials={})
    np.testing.assert_array_equal(store.pooled_attention("dense", 0, 0, 1, range(0, 5), 2), qk.max_pool(maps[0, 1], 2))


def test_the_writer_refuses_maps_and_ill_shaped_queries_on_a_qk_run(store, qk_run):
    info = store.run_info("qk")
    writer = store.writer.run_writer(info.id)
    tokens = [dict(token="w0", token_id=1000, word_position=0, segment=0, is_special=False, char_start=None, char_end=None)]
    try:
        with pytest.raises(InvalidArgumentError, match="is in the qk tier: example 9 needs queries, keys and log-sum-exps"):
            writer.add(9, np.ones((LAYERS, HEADS, 1, 1), np.float32), tokens)
        bad = (np.zeros((1, LAYERS, HEADS, DIM + 1)), np.zeros((1, LAYERS, KV, DIM)), np.zeros((1, LAYERS, HEADS)))
        with pytest.raises(InvalidArgumentError, match="do not fit"):
            writer.add(9, None, tokens, qk=bad)
    finally:
        writer.close()


def test_qk_entry_and_bytes():
    entry = qk.qk_entry(dtype="float16", n_kv_heads=3, head_dim=64, scales=[0.125] * 30, windows=[None] * 30)
    # SmolLM2 at 8,192 tokens: (9 + 3) x 64 x 2 + 4 x 9 bytes per token and layer, against 9 x 8,192 x 2 for the maps
    assert qk.stored_bytes(8192, 30, 9, entry) / (30 * 9 * 8192 * 8192 * 2) == pytest.approx(0.0107, abs=1e-4)
    with pytest.raises(ValueError, match="Q/K dtype must be one of"):
        qk.qk_entry(dtype="int8", n_kv_heads=3, head_dim=64, scales=[], windows=[])


def test_rebuilds_in_several_threads_run_blas_on_one_thread_and_leave_it_as_they_found_it():
    import threading

    from threadpoolctl import threadpool_info, threadpool_limits

    from attnstore.store.qk import _one_blas_thread

    def blas_threads() -> set[int]:
        return {info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"}

    if not blas_threads():
        pytest.skip("numpy has no BLAS that threadpoolctl controls here")
    with threadpool_limits(limits=2, user_api="blas"):
        first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
        seen = []

        def first():
            with _one_blas_thread:
                first_in.set()
                second_in.wait(5)
            first_out.set()

        def second():
            first_in.wait(5)
            with _one_blas_thread:
                second_in.set()
                first_out.wait(5)
                seen.append(blas_threads())  # the first has left, this one is still inside: still one thread

        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert seen == [{1}]
        assert blas_threads() == {2}
