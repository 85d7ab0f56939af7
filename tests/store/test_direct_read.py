"""`store.attention`'s read path (issue 29, store/direct.py): chunk files read and checked in the calling thread, only
the blosc blocks holding the wanted cells decompressed, the example's (offset, length) from a window kept per store.

Equal to zarr's read for every codec attnstore writes (and others blosc writes), any range of cells; anything off
(a missing, flipped or truncated chunk) is left to zarr, which names it; a run that grows and a pinned snapshot are
seen; a zarr.json changed after the first read is opened again.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from attnstore.store import arrays, direct
from attnstore.store.errors import DamagedDataError, InvalidArgumentError, NotFoundError

from .test_integrity import TOKENS, damage, maps_for

CODECS = {
    "default": dict(arrays.DEFAULT_CODEC),
    "small-blocks": {**arrays.DEFAULT_CODEC, "blocksize": 4096},  # many blosc blocks per chunk
    "noshuffle": {**arrays.DEFAULT_CODEC, "shuffle": "noshuffle", "blocksize": 8192},
    "bitshuffle-lz4": {**arrays.DEFAULT_CODEC, "cname": "lz4", "shuffle": "bitshuffle", "blocksize": 8192},
}


def cells_array(tmp_path: Path, dtype: str, codec: dict, chunk: int, n: int):
    rng = np.random.default_rng(0)
    values = rng.random(n).astype(dtype)
    values[n // 3 : n // 2] = 0  # a stretch that compresses to nothing beside one that hardly compresses
    array = arrays.create_run_array(str(tmp_path), "runs/x/cells", dtype=dtype, chunk_cells=chunk, codec=codec, attributes={}, shape=n)
    array[:] = values
    return arrays.open_run_array(str(tmp_path), "runs/x/cells"), values


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("codec", list(CODECS))
def test_direct_reads_equal_zarr_for_any_range(tmp_path, dtype, codec):
    chunk = 1 << 14
    array, values = cells_array(tmp_path, dtype, CODECS[codec], chunk, 3 * chunk + 1000)  # the last chunk partial
    reader = direct.direct_reader(array)
    assert reader is not None
    rng = np.random.default_rng(1)
    n = len(values)
    ranges = [(0, n), (0, 1), (n - 1, n), (chunk - 1, chunk + 1), (chunk, 2 * chunk), (5, chunk - 5), (2 * chunk - 3, 3 * chunk + 7)]
    ranges += [tuple(sorted(int(v) for v in rng.integers(0, n + 1, 2))) for _ in range(40)]
    for a, b in ranges:
        if a == b:
            continue
        got = reader.read(a, b)
        assert got is not None and got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, values[a:b], err_msg=f"cells {a}..{b}")


def test_the_default_chunk_of_a_run_is_read_by_its_blocks(tmp_path):
    """attnstore's own chunks: 2**20 float16 cells, eight 256 KiB blosc blocks; a range inside one block, one over a
    block boundary, the whole chunk."""
    chunk = arrays.DEFAULT_CHUNK_CELLS
    array, values = cells_array(tmp_path, "float16", arrays.DEFAULT_CODEC, chunk, chunk + 10)
    reader = direct.direct_reader(array)
    assert reader is not None
    block = (1 << 18) // 2
    for a, b in [(10, 20), (block - 5, block + 5), (3 * block, 6 * block + 1), (0, chunk), (chunk - 3, chunk + 10)]:
        np.testing.assert_array_equal(reader.read(a, b), values[a:b])


@pytest.mark.parametrize("threads", ["1", "3"])
@pytest.mark.parametrize("how", ["missing", "flipped", "truncated"])
def test_a_damaged_chunk_is_left_to_zarr(tmp_path, how, threads, monkeypatch):
    """A read of one chunk, of three (on the reading thread) and of all six (ANNOUNCE_FROM or more: decoded on the
    pool, unless ATTNSTORE_DECODE_THREADS=1) gives None when one chunk is damaged; zarr then names it."""
    monkeypatch.setenv(direct.DECODE_THREADS_ENV, threads)
    chunk = 1 << 12
    array, values = cells_array(tmp_path, "float32", arrays.DEFAULT_CODEC, chunk, 6 * chunk)
    reader = direct.direct_reader(array)
    assert reader is not None
    damage(tmp_path / "runs" / "x" / "cells" / "c" / "1", how)
    assert reader.read(chunk + 5, chunk + 10) is None and reader.read(0, 3 * chunk) is None and reader.read(0, 6 * chunk) is None
    np.testing.assert_array_equal(reader.read(2 * chunk, 6 * chunk), values[2 * chunk :])  # the others still read
    with pytest.raises(DamagedDataError, match="chunk runs/x/cells/c/1 is"):
        arrays.read_cells(array, chunk + 5, chunk + 10, lambda a, b: "here")


def test_a_read_of_many_chunks_decodes_them_on_the_pool(tmp_path, monkeypatch):
    """ANNOUNCE_FROM or more chunks: each checked and decoded on the pool's threads, into its own part of the result
    (equal to the cells written); fewer, or ATTNSTORE_DECODE_THREADS=1: on the reading thread."""
    chunk = 1 << 12
    array, values = cells_array(tmp_path, "float16", CODECS["small-blocks"], chunk, 9 * chunk + 7)
    reader = direct.direct_reader(array)
    assert reader is not None
    threads: list[str] = []
    real = direct.DirectCells._chunk

    def chunk_on(self, *args):
        threads.append(threading.current_thread().name)
        return real(self, *args)

    monkeypatch.setattr(direct.DirectCells, "_chunk", chunk_on)
    monkeypatch.setenv(direct.DECODE_THREADS_ENV, "3")
    np.testing.assert_array_equal(reader.read(5, len(values)), values[5:])
    assert len(threads) == 10 and all(name.startswith("attnstore-decode") for name in threads), threads
    threads.clear()
    np.testing.assert_array_equal(reader.read(chunk + 5, 3 * chunk + 5), values[chunk + 5 : 3 * chunk + 5])  # 3 chunks
    assert threads == [threading.current_thread().name] * 3
    threads.clear()
    monkeypatch.setenv(direct.DECODE_THREADS_ENV, "1")
    np.testing.assert_array_equal(reader.read(0, len(values)), values)
    assert threads == [threading.current_thread().name] * 10


def test_the_decode_threads_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(direct.DECODE_THREADS_ENV, "2")
    assert direct.decode_threads() == 2 and direct.decode_pool() is not None
    monkeypatch.setenv(direct.DECODE_THREADS_ENV, "1")
    assert direct.decode_pool() is None
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(direct.DECODE_THREADS_ENV, bad)
        with pytest.raises(InvalidArgumentError, match=f"ATTNSTORE_DECODE_THREADS='{bad}': give a whole number of threads, 1 or more"):
            direct.decode_threads()


def test_no_direct_reader_where_zarr_must_read(tmp_path):
    """The lossy u8 filter, no checksum: zarr reads them (the u8 run through its filter, the other with its blosc
    header checked before decoding)."""
    lossy, _ = cells_array(tmp_path / "u8", "float16", arrays.LOSSY_U8_CODEC, 1 << 12, 1 << 13)
    plain = {k: v for k, v in arrays.DEFAULT_CODEC.items() if k != "checksum"}
    unchecked, _ = cells_array(tmp_path / "plain", "float16", plain, 1 << 12, 1 << 13)
    assert direct.direct_reader(lossy) is None and direct.direct_reader(unchecked) is None


def add_example(store, run: str, writer, position: int, maps) -> None:
    """Commit one more example of a run made with make_run(..., finish=False) through its writer."""
    info = store.run_info(run)
    example_id = int(
        store.sql("SELECT id FROM examples WHERE dataset_id = :d AND position = :p", {"d": info.dataset_id, "p": position}).iloc[0, 0]
    )
    rows = [
        dict(token=t, token_id=1000 + k, word_position=None, segment=0, is_special=False, char_start=None, char_end=None)
        for k, t in enumerate(TOKENS[position])
    ]
    writer.add(example_id, maps, rows)
    writer.commit(final=True)  # its partial chunk too; the next block starts on the next chunk, as a resumed run's


def test_attention_sees_a_run_grow_and_keeps_to_a_pinned_snapshot(store, make_run):
    maps = [maps_for(t, i) for i, t in enumerate(TOKENS)]
    run, writer = make_run(store, maps, TOKENS, name="growing", write=1, finish=False)
    np.testing.assert_array_equal(store.attention(run, 0), maps[0])  # the window of positions 0.. is now kept
    with pytest.raises(NotFoundError, match="has no example 1"):
        store.attention(run, 1)
    add_example(store, run, writer, 1, maps[1])
    np.testing.assert_array_equal(store.attention(run, 1), maps[1])
    with store.pinned(run):
        add_example(store, run, writer, 2, maps[2])
        with pytest.raises(NotFoundError, match="has no example 2"):
            store.attention(run, 2)  # committed after the snapshot began
        np.testing.assert_array_equal(store.attention(run, 0, layer=1, head=[1]), maps[0][[1]][:, [1]])
    np.testing.assert_array_equal(store.attention(run, 2), maps[2])


def test_a_kept_window_costs_no_sql(store, make_run):
    """After the first read of a run, another example of the same window of positions runs no SQL statement."""
    maps = [maps_for(t, i) for i, t in enumerate(TOKENS)]
    run = make_run(store, maps, TOKENS, name="quiet")
    store.attention(run, 0)
    statements: list[str] = []

    def seen(conn, cursor, statement, *args):
        statements.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", seen)
    try:
        for example in (1, 2, 0):
            np.testing.assert_array_equal(store.attention(run, example), maps[example])
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", seen)
    assert statements == []


def test_a_zarr_json_damaged_after_the_first_read_is_named(store, make_run):
    maps = [maps_for(t, i) for i, t in enumerate(TOKENS)]
    run = make_run(store, maps, TOKENS, name="spoiled")
    store.attention(run, 0)
    meta = Path(store.locations.array_root) / store.run_info(run).array_path / "zarr.json"
    meta.write_text('{"zarr_format": 3, "node_type": "array", "shape": [', encoding="utf-8")
    with pytest.raises(DamagedDataError, match="zarr.json is damaged"):
        store.attention(run, 1)


def test_a_chunk_damaged_after_the_first_read_is_named(store, make_run):
    maps = [maps_for(t, i) for i, t in enumerate(TOKENS)]
    run = make_run(store, maps, TOKENS, name="flipped")
    np.testing.assert_array_equal(store.attention(run, 2), maps[2])
    info = store.run_info(run)
    offset = int(store.examples(run).set_index("example").loc[2, "offset"])
    damage(Path(store.locations.array_root) / info.array_path / "c" / str(offset // info.chunk_cells), "flipped")
    with pytest.raises(DamagedDataError, match=r"run 'flipped', example 2: chunk .* is damaged"):
        store.attention(run, 2)


# ------------------------------------------------------------------ the cache of decoded blocks (one example's reads)


def settle(folder: Path) -> None:
    """Every chunk file of `folder` as if written a minute ago (the cache keeps only chunks unchanged for a while)."""
    for path in folder.rglob("c/*"):
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 60 * 10**9))


@pytest.fixture
def cache():
    return direct.new_block_cache(64)


def test_a_kept_read_is_served_from_the_cache_and_equal(tmp_path, cache):
    chunk = 1 << 14
    array, values = cells_array(tmp_path, "float16", CODECS["small-blocks"], chunk, 3 * chunk + 1000)
    settle(tmp_path / "runs" / "x" / "cells")
    reader = direct.direct_reader(array)
    for a, b in [(5, 900), (chunk - 7, chunk + 2000), (3 * chunk, 3 * chunk + 1000)]:
        first = reader.read(a, b, cache)
        assert cache.used == 0 or a > 5, "a block read once was kept"
        second = reader.read(a, b, cache)  # read again: now kept
        hits = cache.hits
        third = reader.read(a, b, cache)
        assert cache.hits > hits, f"cells {a}..{b} were decoded again"
        for got in (first, second, third):
            np.testing.assert_array_equal(got, values[a:b])
    third[:] = 0  # the caller's array: changing it changes nothing kept
    np.testing.assert_array_equal(reader.read(3 * chunk, 3 * chunk + 1000, cache), values[3 * chunk : 3 * chunk + 1000])
    # cells inside blocks already kept come from the cache too; a whole-run pass neither uses nor fills it
    hits, used = cache.hits, cache.used
    np.testing.assert_array_equal(reader.read(10, 20, cache), values[10:20])
    assert cache.hits > hits
    np.testing.assert_array_equal(reader.read(0, len(values)), values)
    assert cache.used == used


def test_a_chunk_changed_after_it_was_kept_is_read_again(tmp_path, cache):
    chunk = 1 << 14
    array, values = cells_array(tmp_path, "float16", CODECS["small-blocks"], chunk, 2 * chunk)
    folder = tmp_path / "runs" / "x" / "cells"
    settle(folder)
    reader = direct.direct_reader(array)
    reader.read(100, 200, cache)
    reader.read(100, 200, cache)
    assert cache.used > 0
    damage(folder / "c" / "0", "flipped")  # the file's stamp changes: its kept blocks are not used
    assert reader.read(100, 200, cache) is None  # left to zarr, which names the damage
    with pytest.raises(DamagedDataError):
        arrays.read_cells(array, 100, 200, lambda a, b: "cells")


def test_a_chunk_written_moments_ago_is_not_kept(tmp_path, cache):
    """A file rewritten within one timestamp tick keeps its modification time: only settled chunks are kept."""
    array, values = cells_array(tmp_path, "float16", CODECS["small-blocks"], 1 << 14, 1 << 14)
    reader = direct.direct_reader(array)
    for _ in range(3):
        np.testing.assert_array_equal(reader.read(0, 500, cache), values[:500])
    assert cache.used == 0


def test_the_cache_stays_within_its_budget(tmp_path):
    chunk = 1 << 14
    array, values = cells_array(tmp_path, "float32", CODECS["small-blocks"], chunk, 8 * chunk)
    settle(tmp_path / "runs" / "x" / "cells")
    kept = direct.new_block_cache(0.02)  # 20 KiB: a few 4 KiB blocks
    reader = direct.direct_reader(array)
    for a in range(0, len(values) - 3000, 2500):
        for _ in range(2):
            np.testing.assert_array_equal(reader.read(a, a + 3000, kept), values[a : a + 3000])
            assert kept.used <= kept.budget
    assert 0 < len(kept.blocks) <= kept.budget // 4096


def test_the_cache_budget_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(direct.READ_CACHE_ENV, "0")
    assert direct.new_block_cache().budget == 0
    monkeypatch.setenv(direct.READ_CACHE_ENV, "lots")
    with pytest.raises(InvalidArgumentError, match="ATTNSTORE_READ_CACHE_MB='lots': give a number of megabytes"):
        direct.new_block_cache()


def test_each_store_has_its_own_cache_of_decoded_blocks(store, make_run, monkeypatch):
    """One-example reads fill the cache of the store that read them: a second store in the process starts empty and
    evicts nothing of the first's, and its budget is read when that store first needs it."""
    from attnstore.store import Store

    tokens = [[f"w{i}" for i in range(64)]] * 3
    maps = [maps_for(t, i) for i, t in enumerate(tokens)]
    run = make_run(store, maps, tokens, name="cached", chunk_cells=1 << 15, codec=CODECS["small-blocks"])
    settle(Path(store.locations.array_root))
    for _ in range(3):
        store.attention(run, 1)
    assert store.block_cache.used > 0 and store.block_cache.hits > 0
    monkeypatch.setenv(direct.READ_CACHE_ENV, "1")
    other = Store(store.locations)
    assert other.block_cache is not store.block_cache and other.block_cache.used == 0
    assert other.block_cache.budget == 1 << 20 and store.block_cache.budget == direct.DEFAULT_READ_CACHE_MB << 20
    np.testing.assert_array_equal(other.attention(run, 1), store.attention(run, 1))
    assert store.set_read_cache(0).budget == 0 and store.block_cache.used == 0


def test_a_chunk_checked_whole_once_is_then_read_block_by_block(tmp_path, cache, monkeypatch):
    """After one read checked a settled chunk's CRC32C over all its bytes, reads of other cells of the same unchanged
    file read only their blocks (no second checksum); a file changed since is read and checked whole again."""
    chunk = 1 << 14
    array, values = cells_array(tmp_path, "float16", CODECS["small-blocks"], chunk, 2 * chunk)
    folder = tmp_path / "runs" / "x" / "cells"
    settle(folder)
    reader = direct.direct_reader(array)
    checked = []
    real = direct.google_crc32c.value
    monkeypatch.setattr(direct.google_crc32c, "value", lambda data: checked.append(len(data)) or real(data))
    np.testing.assert_array_equal(reader.read(10, 900, cache), values[10:900])
    assert len(checked) == 1
    for a, b in [(5000, 7000), (chunk - 100, chunk - 1), (0, chunk)]:  # other blocks of chunk 0, and all of it
        np.testing.assert_array_equal(reader.read(a, b, cache), values[a:b])
    assert len(checked) == 1, "an unchanged chunk was checked again"
    np.testing.assert_array_equal(reader.read(chunk + 5, chunk + 50, cache), values[chunk + 5 : chunk + 50])
    assert len(checked) == 2  # chunk 1: checked on its first read
    damage(folder / "c" / "0", "flipped")
    settle(folder)  # even an old-looking file: its stamp (size, time, inode) changed
    assert reader.read(3000, 3500, cache) is None and len(checked) == 3  # read whole, checked, refused
    np.testing.assert_array_equal(reader.read(chunk + 60, chunk + 90, direct.new_block_cache(0)), values[chunk + 60 : chunk + 90])
    assert len(checked) == 4  # no cache: every read checks its chunk
