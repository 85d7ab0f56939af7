"""Damaged, missing and truncated chunks; write leases; queries on runs being written or empty.

Hand-built runs (float32, 64-cell chunks) on SQLite and PostgreSQL; the fault-injection suite
with real processes is tests/test_faults.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.queries import run_query
from attnstore.store import leases
from attnstore.store.check import check_store
from attnstore.store.errors import BusyError, DamagedDataError, IncompleteRunWarning, LeaseLostError, NotFoundError
from attnstore.store.schema import Lease, utcnow

TOKENS = [["[CLS]", "a", "b", "[SEP]"], ["[CLS]", "c", "d", "e", "[SEP]"], ["[CLS]", "f", "[SEP]"]]


def maps_for(tokens, seed):
    rng = np.random.default_rng(seed)
    raw = rng.random((2, 2, len(tokens), len(tokens))).astype(np.float32)
    return raw / raw.sum(-1, keepdims=True)


@pytest.fixture
def three(store, make_run):
    def build(checksum="crc32c"):
        return make_run(store, [maps_for(t, i) for i, t in enumerate(TOKENS)], TOKENS, name="three", checksum=checksum)

    return build


def chunk_file(store, run, example) -> Path:
    """The file of the first chunk of `example`'s block."""
    info = store.run_info(run)
    offset = int(store.examples(run).set_index("example").loc[example, "offset"])
    return Path(store.locations.array_root) / info.array_path / "c" / str(offset // info.chunk_cells)


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "missing":
        path.unlink()
    elif how == "flipped":
        path.write_bytes(data[:20] + bytes([data[20] ^ 0x40]) + data[21:])
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])


CASES = [("crc32c", "missing"), ("crc32c", "flipped"), ("crc32c", "truncated"), (None, "missing"), (None, "truncated")]


@pytest.mark.parametrize("checksum,how", CASES, ids=[f"{c or 'no-checksum'}-{h}" for c, h in CASES])
def test_damaged_chunk_is_an_error_naming_run_example_and_chunk(store, three, checksum, how):
    run = three(checksum)
    path = chunk_file(store, run, 1)
    good = store.attention(run, 0)
    damage(path, how)
    with pytest.raises(DamagedDataError) as err:
        store.attention(run, 1)
    message = str(err.value)
    assert f"run 'three', example 1: chunk {store.run_info(run).array_path}/c/{path.name}" in message
    assert "attnstore check" in message and "\n" not in message
    with pytest.raises(DamagedDataError, match="run 'three', example"):
        run_query(store, "entropy", run=run)
    if path.name != chunk_file(store, run, 0).name:  # an undamaged example still reads
        np.testing.assert_array_equal(store.attention(run, 0), good)
    summary, problems = check_store(store)
    assert summary["problems"].iloc[0] >= 1 and 1 in set(problems["example"])
    assert problems["chunk"].str.endswith(f"/c/{path.name}").any()


def test_truncated_chunk_without_checksum_never_crashes_the_process(store, three, tmp_path):
    """Decoding a truncated blosc chunk can segfault: run the read in a child and require a clean error."""
    run = three(None)
    damage(chunk_file(store, run, 1), "truncated")
    code = (
        "import sys; from attnstore.store import open_store; s = open_store(db=sys.argv[1], root=sys.argv[2])\n"
        "try:\n    s.attention('three', 1)\nexcept Exception as e:\n    print(type(e).__name__); sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, _url(store), store.locations.array_root], capture_output=True, text=True)
    assert done.returncode == 3 and done.stdout.strip() == "DamagedDataError", (done.returncode, done.stderr[-500:])


def test_wrong_values_with_a_valid_checksum_are_found_by_check(store, three):
    """Chunks rewritten by a stray writer decode fine but do not hold attention distributions."""
    run = three()
    info = store.run_info(run)
    array = store._array(info, read_only=False)
    offset = int(store.examples(run).set_index("example").loc[2, "offset"])
    array[offset : offset + 4] = np.float32(0.9)
    summary, problems = check_store(store)
    assert list(problems["example"]) == [2] and "row-sum" in problems["problem"].iloc[0]
    result = CliRunner().invoke(main, ["check", "--db", _url(store), "--root", store.locations.array_root])
    assert result.exit_code == 1 and "1 problem(s)" in result.output


def test_check_on_a_healthy_store(store, three):
    three()
    summary, problems = check_store(store)
    assert problems.empty
    assert summary.to_dict("records") == [
        dict(run="three", state="complete", examples=3, chunks=summary["chunks"][0], checksums="crc32c", problems=0)
    ]
    assert summary["chunks"][0] == -(-(2 * 2 * (16 + 25 + 9)) // 64)  # every chunk the blocks cover


def _steps_of(store, monkeypatch, step):
    """`check` reads SQL's blocks `step` at a time (what it carries from one step to the next is then tested)."""
    blocks = store.writer.block_steps
    monkeypatch.setattr(store.writer, "block_steps", lambda run_id, _default=None: blocks(run_id, step))


@pytest.mark.parametrize("step", [1, 2, 4096])
def test_check_reads_a_step_at_a_time_and_finds_the_same(store, three, monkeypatch, step):
    """Blocks 16, 25 and 9 cells x 4 in 64-cell chunks: chunks shared across steps are counted once, a missing
    chunk is named once per example it holds, and two blocks at one offset (the damage of a stray writer of
    SQL) are found whichever step each comes in."""
    run = three()
    _steps_of(store, monkeypatch, step)
    summary, problems = check_store(store)
    assert problems.empty and summary["chunks"][0] == 4 and summary["examples"][0] == 3
    path = chunk_file(store, run, 2)  # the chunk example 2 starts in, which example 1 ends in
    damage(path, "missing")
    summary, problems = check_store(store)
    assert sorted(problems["example"].dropna().astype(int)) == [1, 2] and problems["chunk"].str.endswith(f"/c/{path.name}").all()
    assert summary["chunks"][0] == 4 and summary["examples"][0] == 3
    info = store.run_info(run)
    with store.engine.begin() as conn:  # example 2's row now says it starts where example 1 does
        offsets = dict(conn.execute(sa.text('SELECT example_id, "offset" FROM sequences WHERE run_id = :r'), {"r": info.id}).all())
        first, second, third = sorted(offsets, key=offsets.get)
        conn.execute(sa.text('UPDATE sequences SET "offset" = :o WHERE example_id = :e'), {"o": offsets[second], "e": third})
    problems = check_store(store)[1]
    assert problems["problem"].str.contains("block overlaps the block of example").any()


# ---------------------------------------------------------------- leases


def test_one_writer_per_run(store, make_run):
    name, writer = make_run(store, [maps_for(TOKENS[0], 0)], TOKENS[:1], name="open", finish=False)
    with pytest.raises(BusyError, match=rf"run 'open' is being written by .*/pid {os.getpid()} since "):
        store.writer.run_writer(name)
    assert store.run_state(name)[0] == "writing"
    writer.close()
    assert store.run_state(name)[0] == "interrupted"
    store.writer.run_writer(name).finish(0.0)  # free again: resumes and completes
    assert store.run_state(name)[0] == "complete"


def _put_lease(store, resource, *, host, pid, age_seconds):
    when = utcnow() - timedelta(seconds=age_seconds)
    with store.engine.begin() as conn:
        conn.execute(sa.insert(Lease).values(resource=resource, token="x" * 32, host=host, pid=pid, acquired_at=when, heartbeat_at=when))


def test_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(store):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    _put_lease(store, "run:r", host=leases.HOST, pid=child.pid, age_seconds=0)
    store.writer.lease("run:r", "run 'r'").release()


def test_lease_of_another_host_is_stale_only_after_the_stale_period(store):
    _put_lease(store, "run:fresh", host="elsewhere", pid=1, age_seconds=1)
    with pytest.raises(BusyError, match="run 'fresh' is being written by elsewhere/pid 1 since"):
        store.writer.lease("run:fresh", "run 'fresh'")
    _put_lease(store, "run:old", host="elsewhere", pid=1, age_seconds=leases.STALE_AFTER.total_seconds() + 5)
    store.writer.lease("run:old", "run 'old'").release()


def test_a_writer_whose_lease_was_taken_over_writes_nothing_more(store, make_run):
    name, writer = make_run(store, [maps_for(TOKENS[0], 0)], TOKENS[:1], name="stolen", finish=False)
    with store.engine.begin() as conn:
        conn.execute(sa.update(Lease).where(Lease.resource == "run:stolen").values(token="y" * 32))
    before = store.run_info(name).n_stored
    with pytest.raises(LeaseLostError, match="another process took over this write"):
        writer.commit(final=True)
    assert store.run_info(name).n_stored == before


# ---------------------------------------------------------------- reading runs being written


def test_query_on_a_run_being_written_warns_and_reads_a_snapshot(store, make_run):
    name, writer = make_run(store, [maps_for(t, i) for i, t in enumerate(TOKENS[:2])], TOKENS[:2], name="partial", finish=False)
    with pytest.warns(IncompleteRunWarning, match="run 'partial' is still being written: results cover the 2 examples"):
        frame = run_query(store, "entropy", run=name)
    assert frame.attrs == {"run_state": "writing", "n_examples": 2}
    writer.close()
    with pytest.warns(IncompleteRunWarning, match="was interrupted"):
        run_query(store, "entropy", run=name)


def test_snapshot_hides_examples_committed_after_it_began(store):
    info, ids = _open_run(store, "growing", 2)
    writer = store.writer.run_writer(info.name)
    writer.add(ids[0], maps_for(TOKENS[0], 0), _token_rows(TOKENS[0]))
    writer.commit(final=True)
    with store.pinned(info.name):
        before = store.examples(info.name)
        pinned_info, pinned_count = store.run_info(info.name), store.n_committed(info.id)
        writer.add(ids[1], maps_for(TOKENS[0], 1), _token_rows(TOKENS[0]))
        writer.commit(final=True)
        assert store.examples(info.name).equals(before) and len(before) == 1
        assert len(store.token_table(info.name)) == len(TOKENS[0])
        assert [e for e, _ in store.iter_attention(info.name)] == [0]
        assert store.storage_order(info.name).tolist() == [0]
        # the run's info and count are read once per snapshot (by name or id), as they were when it began
        assert store.run_info(info.id) is store.run_info(info.name) is pinned_info and pinned_info.n_stored == 1
        assert store.n_committed(info.name) == pinned_count == 1
    assert len(store.examples(info.name)) == 2 and store.storage_order(info.name).tolist() == [0, 1]
    assert store.run_info(info.name).n_stored == 2 and store.n_committed(info.id) == 2
    writer.close()


def test_query_on_a_run_with_no_stored_example_is_a_clear_error(store):
    _open_run(store, "empty", 1)
    with pytest.raises(NotFoundError, match="run 'empty' has no stored examples to query: its ingest was interrupted"):
        run_query(store, "relative_position", run="empty")
    result = CliRunner().invoke(main, ["query", "entropy", "--run", "empty", "--db", _url(store), "--root", store.locations.array_root])
    assert result.exit_code == 1 and "has no stored examples" in result.output
    assert len(result.output.strip().splitlines()) == 1


def _url(store) -> str:
    if store.engine.dialect.name == "sqlite":
        return store.locations.db_url
    return store.engine.url.render_as_string(hide_password=False)


def _token_rows(tokens):
    return [dict(token=t, token_id=1, word_position=None, segment=0, is_special=False, char_start=None, char_end=None) for t in tokens]


def _open_run(store, name: str, n_examples: int):
    """A run (2 layers x 2 heads) over a dataset of n examples with nothing stored yet: (info, example ids)."""
    from attnstore.store.records import ExampleInput

    model_id = store.writer.find_or_create_model(
        name="m",
        source="t",
        weights_sha256="0" * 64,
        architecture="A",
        n_layers=2,
        n_heads=2,
        max_length=8,
        tokenizer="t",
        special_tokens={},
    )
    dataset_id, _ = store.writer.find_or_create_dataset(
        name=f"d-{name}", split="s", checksum="c", format="text", source="t", annotator="whitespace"
    )
    store.writer.add_examples(dataset_id, [ExampleInput(position=i, text_a="a") for i in range(n_examples)], "whitespace")
    store.writer.complete_dataset(dataset_id)
    info = store.writer.start_run(
        name=name,
        model_id=model_id,
        dataset_id=dataset_id,
        dtype="float32",
        codec={"name": "blosc", "cname": "zstd", "clevel": 1, "shuffle": "shuffle", "checksum": "crc32c"},
        chunk_cells=64,
        max_length=8,
        truncation="truncate",
        attn_implementation="eager",
        batch_size=1,
        code_version="t",
        corpus_checksum="c",
        manifest={},
    )
    ids = store.sql("SELECT id FROM examples WHERE dataset_id = :d ORDER BY position", {"d": dataset_id})["id"].tolist()
    return info, ids


def test_overlapped_commits_lag_one_batch_and_never_commit_rows_whose_write_failed(store):
    """commit(wait=False), as ingest's writer thread calls it: a batch's chunks are written while the rows of the
    batch before commit. A failed background write is one StorageIOError, and no row of its examples (or of any
    later one) is ever committed."""
    from attnstore.store.errors import StorageIOError

    info, ids = _open_run(store, "overlap", 3)
    writer = store.writer.run_writer(info.name)
    for i in range(2):  # 2x2x4x4 = 64 cells each: one whole chunk per example
        writer.add(ids[i], maps_for(TOKENS[0], i), _token_rows(TOKENS[0]))
        assert writer.commit(wait=False) == i  # the rows of the batch before
    assert store.n_committed(info.id) == 1 and writer.commit() == 1  # a commit that waits catches up
    array = writer.blocks.array

    class FullDisk:
        def __getattr__(self, name):
            return getattr(array, name)

        def __setitem__(self, key, value):
            raise OSError(28, "No space left on device")

    writer.blocks.array = FullDisk()
    writer.add(ids[2], maps_for(TOKENS[0], 2), _token_rows(TOKENS[0]))
    assert writer.commit(wait=False) == 0  # its write fails in the background
    writer.blocks.array = array  # space again: too late for the chunk that failed
    for commit in (lambda: writer.commit(wait=False), writer.commit, lambda: writer.commit(final=True)):
        with pytest.raises(StorageIOError, match="No space left on device.*resume"):
            commit()
    writer.close()
    assert store.n_committed(info.id) == 2 and sorted(store.examples(info.name)["example"]) == [0, 1]


def test_a_run_whose_last_block_ends_on_a_chunk_boundary_has_its_index_written(store, make_run):
    """Its rows are all committed before `finish` (every chunk was whole): the final commit still writes the index
    entries it queued, so `check` finds the Zarr index and SQL in agreement (it reported "lists 0 examples, SQL 1")."""
    import zarr

    tokens = [["[CLS]", *"abcdef", "[SEP]"]]  # 2 x 2 x 8 x 8 = 256 cells: exactly 4 chunks of 64
    run = make_run(store, [maps_for(tokens[0], 0)], tokens, name="whole")
    group = zarr.open_group(store.locations.array_root, path="runs/whole", mode="r")
    assert group["example"][:].tolist() == [0] and not group.attrs.get("index_pending")
    assert check_store(store, [run])[1].empty
