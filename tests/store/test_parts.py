"""Writers on disjoint parts of one run (a distributed ingest's workers, ingest/distributed.py), on hand-made maps:
each writes only inside the cells it was allotted and commits under the coordinator's lease; the coordinator
writes the index and completes the run; a run cut off mid-way resumes past everything allotted."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from attnstore.store import arrays, block_writer
from attnstore.store.check import check_store
from attnstore.store.errors import InvalidArgumentError, LeaseLostError
from attnstore.store.leases import LeaseCheck
from attnstore.store.run_blocks import write_index_from_sql

LENGTHS = [3, 5, 4, 6, 2, 5]
N_LAYERS, N_HEADS, CHUNK = 2, 2, 64


def hand_made() -> tuple[list[np.ndarray], list[list[str]]]:
    rng = np.random.default_rng(7)
    maps = []
    for n in LENGTHS:
        m = rng.random((N_LAYERS, N_HEADS, n, n), dtype=np.float32) + 0.05
        maps.append(m / m.sum(-1, keepdims=True))
    return maps, [[f"w{i}" for i in range(n)] for n in LENGTHS]


def token_rows(tokens: list[str]) -> list[dict]:
    return [
        dict(token=t, token_id=1000 + i, word_position=i, segment=0, is_special=False, char_start=None, char_end=None)
        for i, t in enumerate(tokens)
    ]


def allot(coordinator, parts: list[list[int]]) -> list[tuple[int, int]]:
    """What the coordinator does before sending parts: disjoint chunk-aligned ranges, each as long as its examples
    placed in order need (`block_writer.placed_end`), the array grown to cover them."""
    ranges, start = [], coordinator.blocks.next_offset
    for positions in parts:
        sizes = [N_LAYERS * N_HEADS * LENGTHS[p] ** 2 for p in positions]
        ranges.append((start, block_writer.placed_end(start, sizes, coordinator.blocks.block_cells)))
        start = block_writer.resume_offset(ranges[-1][1], CHUNK)
    coordinator.blocks.array.resize((ranges[-1][1],))
    coordinator.index.group.attrs.update({arrays.INDEX_PENDING: True})
    return ranges


def write_part(store, coordinator, cells, positions, ids, maps, tokens, lease=None) -> None:
    lease = lease or LeaseCheck(store.engine, coordinator.lease.resource, coordinator.lease.what, coordinator.lease.token)
    writer = store.writer.run_writer(coordinator.info.id, lease, part=cells)
    for p in positions:
        writer.add(ids[p], maps[p], token_rows(tokens[p]))
        writer.commit()
    writer.commit(final=True)


def example_ids(store, name) -> dict[int, int]:
    info = store.run_info(name)
    rows = store.sql("SELECT position, id FROM examples WHERE dataset_id = :d", {"d": info.dataset_id})
    return dict(rows.values.tolist())


# Blosc blocks of 16 float32 cells, 4 to a chunk: each example is placed in the fewest blocks, with gaps between.
SMALL_BLOCKS = {**arrays.DEFAULT_CODEC, "blocksize": 64}


@pytest.mark.parametrize("codec", [None, SMALL_BLOCKS], ids=["one-block-chunks", "placed-in-blocks"])
def test_two_writers_on_disjoint_parts_make_one_whole_run(store, make_run, codec):
    maps, tokens = hand_made()
    name, coordinator = make_run(store, maps, tokens, write=0, finish=False, chunk_cells=CHUNK, codec=codec)
    assert coordinator.blocks.block_cells == (16 if codec else None)
    ids = example_ids(store, name)
    parts = [[0, 1, 2], [3, 4, 5]]
    ranges = allot(coordinator, parts)
    errors: list[BaseException] = []

    def work(cells, positions):
        try:
            write_part(store, coordinator, cells, positions, ids, maps, tokens)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(cells, positions)) for cells, positions in zip(ranges, parts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    coordinator.finish(0.0, rebuild_index=True)

    got = dict(store.iter_attention(name))
    assert sorted(got) == list(range(len(LENGTHS)))
    for p, m in enumerate(maps):
        np.testing.assert_array_equal(got[p], m)
    frame = store.examples(name).sort_values("offset")
    assert list(frame["example"]) == [0, 1, 2, 3, 4, 5]  # storage order is plan order
    assert list(frame["offset"])[3] == ranges[1][0] and ranges[1][0] % CHUNK == 0  # the second part starts on its chunk
    if codec:  # every example in the fewest blocks; some moved on past a gap of zeros
        start, cells = frame["offset"].to_numpy(), N_LAYERS * N_HEADS * frame["length"].to_numpy() ** 2
        assert ((start + cells - 1) // 16 - start // 16 + 1 == -(-cells // 16)).all()
        assert (start[1:3] > start[:2] + cells[:2]).any()
    index = arrays.RunIndex(store.locations.array_root, store.run_info(name).array_path, 0, 0, read_only=True)
    assert list(index.read()["offset"]) == list(frame["offset"]) and not index.group.attrs.get(arrays.INDEX_PENDING)
    _, problems = check_store(store, [name])
    assert problems.empty, problems.to_string()
    assert store.sql("SELECT count(*) AS n FROM leases")["n"][0] == 0


def test_a_part_writer_never_writes_outside_its_cells(store, make_run):
    maps, tokens = hand_made()
    name, coordinator = make_run(store, maps, tokens, write=0, finish=False, chunk_cells=CHUNK)
    ids = example_ids(store, name)
    (start, stop), *_ = allot(coordinator, [[0, 1]])
    with pytest.raises(InvalidArgumentError, match="do not fit the cells"):
        write_part(store, coordinator, (start, stop - 1), [0, 1], ids, maps, tokens)
    assert store.sql("SELECT count(*) AS n FROM sequences")["n"][0] == 0
    coordinator.close()


def test_a_part_writer_that_lost_the_lease_writes_and_commits_nothing(store, make_run):
    maps, tokens = hand_made()
    name, coordinator = make_run(store, maps, tokens, write=0, finish=False, chunk_cells=CHUNK)
    ids = example_ids(store, name)
    (cells,) = allot(coordinator, [[3]])
    stale = LeaseCheck(store.engine, coordinator.lease.resource, coordinator.lease.what, "a-token-taken-over")
    with pytest.raises(LeaseLostError, match="another process took over"):
        write_part(store, coordinator, cells, [3], ids, maps, tokens, lease=stale)
    assert store.sql("SELECT count(*) AS n FROM sequences")["n"][0] == 0
    array = coordinator.blocks.array
    assert not arrays.present_chunks(array) & set(arrays.chunk_range(array, *cells))
    coordinator.close()


def test_a_cut_off_distributed_run_resumes_past_everything_allotted(store, make_run):
    maps, tokens = hand_made()
    name, coordinator = make_run(store, maps, tokens, write=0, finish=False, chunk_cells=CHUNK)
    ids = example_ids(store, name)
    first, second = allot(coordinator, [[0, 1, 2], [3, 4, 5]])
    write_part(store, coordinator, first, [0, 1, 2], ids, maps, tokens)
    coordinator.close()  # the coordinator is gone: the second part was sent, but never written
    store.writer.fail_run(name)
    _, problems = check_store(store, [name])
    assert problems.empty, problems.to_string()  # SQL ahead of an index written only at the end is expected

    writer = store.writer.run_writer(name)  # a plain one-process resume
    assert writer.blocks.next_offset >= second[1]  # never inside cells a cut-off worker may still write
    assert not writer.index.group.attrs.get(arrays.INDEX_PENDING)  # the index was brought up to SQL first
    for p in (3, 4, 5):
        writer.add(ids[p], maps[p], token_rows(tokens[p]))
        writer.commit()
    writer.finish(0.0)
    got = dict(store.iter_attention(name))
    for p, m in enumerate(maps):
        np.testing.assert_array_equal(got[p], m)
    _, problems = check_store(store, [name])
    assert problems.empty, problems.to_string()


@pytest.mark.parametrize("step", [1, 4, 4096])
def test_the_index_is_rebuilt_from_sql_a_step_of_blocks_at_a_time(store, make_run, step):
    maps, tokens = hand_made()
    name, coordinator = make_run(store, maps, tokens, write=0, finish=False, chunk_cells=CHUNK)
    ids = example_ids(store, name)
    parts = [[3, 4, 5], [0, 1, 2]]  # storage order is not example order
    for cells, positions in zip(allot(coordinator, parts), parts):
        write_part(store, coordinator, cells, positions, ids, maps, tokens)
    info = store.run_info(name)
    index = write_index_from_sql(store.writer, info, step=step)

    got = arrays.RunIndex(store.locations.array_root, info.array_path, 0, 0, read_only=True).read()
    order = [3, 4, 5, 0, 1, 2]
    assert got["example"].tolist() == order and got["length"].tolist() == [LENGTHS[p] for p in order]
    assert got["offset"].tolist() == store.examples(name).set_index("example").loc[order, "offset"].tolist()
    assert got["token_start"].tolist() == np.concatenate([[0], np.cumsum([LENGTHS[p] for p in order])[:-1]]).tolist()
    assert got["token_id"].tolist() == [1000 + i for p in order for i in range(LENGTHS[p])]
    assert (index.n, index.n_tokens) == (6, sum(LENGTHS)) and not index.group.attrs.get(arrays.INDEX_PENDING)


def test_storage_order_streams_the_committed_examples_in_offset_order(store, make_run):
    maps, tokens = hand_made()
    name, coordinator = make_run(store, maps, tokens, write=0, finish=False, chunk_cells=CHUNK)
    ids = example_ids(store, name)
    parts = [[3, 5], [0, 1, 2]]
    for cells, positions in zip(allot(coordinator, parts), parts):
        write_part(store, coordinator, cells, positions, ids, maps, tokens)
    coordinator.add_skipped(ids[4], 600)  # no maps: not in the order
    coordinator.commit()

    order = store.storage_order(name)
    assert order.dtype == np.int64 and order.tolist() == [3, 5, 0, 1, 2]
    frame = store.examples(name, texts=False)
    assert frame.loc[~frame["skipped"]].sort_values("offset")["example"].tolist() == order.tolist()
    assert frame.loc[frame["skipped"], "example"].tolist() == [4]


@pytest.mark.parametrize("step", [0, -1, 2.5, True])
def test_a_rebuild_step_that_is_not_a_positive_whole_number_is_refused_and_the_index_is_kept(store, make_run, step):
    maps, tokens = hand_made()
    name = make_run(store, maps, tokens, chunk_cells=CHUNK)
    info = store.run_info(name)
    before = arrays.RunIndex(store.locations.array_root, info.array_path, 0, 0, read_only=True).read()
    with pytest.raises(InvalidArgumentError, match=f"step must be a whole number of blocks, at least 1, not {step!r}"):
        write_index_from_sql(store.writer, info, step=step)
    after = arrays.RunIndex(store.locations.array_root, info.array_path, 0, 0, read_only=True).read()
    assert all(np.array_equal(before[k], after[k]) for k in before) and len(after["example"]) == len(LENGTHS)


def test_a_part_sized_without_the_gaps_is_refused_before_it_overflows(store, make_run):
    # Examples 1 and 2 (100 and 64 cells) in blocks of 16: 2 goes to 112, not 100 ([100, 164) would touch 5 blocks
    # where 4 suffice), so the part needs 176 cells, not the 164 of their sizes.
    maps, tokens = hand_made()
    name, coordinator = make_run(store, maps, tokens, write=0, finish=False, chunk_cells=CHUNK, codec=SMALL_BLOCKS)
    ids = example_ids(store, name)
    (start, stop), *_ = allot(coordinator, [[1, 2]])
    assert stop - start == block_writer.placed_end(0, [100, 64], 16) == 176
    with pytest.raises(InvalidArgumentError, match="do not fit the cells"):
        write_part(store, coordinator, (start, start + 164), [1, 2], ids, maps, tokens)
    # nothing committed: example 1's last chunk was still buffered (a commit waits for whole chunks) when 2 was refused
    assert store.sql("SELECT count(*) AS n FROM sequences")["n"][0] == 0
    coordinator.close()
