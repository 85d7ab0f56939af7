import numpy as np
import pytest

from attnstore.store import arrays, block_writer
from attnstore.store.errors import InvalidArgumentError, NotFoundError


def new_array(tmp_path, chunk=16, dtype="float16"):
    return arrays.create_run_array(
        str(tmp_path), "runs/a", dtype=dtype, chunk_cells=chunk, codec=arrays.DEFAULT_CODEC, attributes={"run": "t"}
    )


def test_array_is_zarr_v3_with_named_dimension(tmp_path):
    arr = new_array(tmp_path)
    assert arr.metadata.zarr_format == 3
    assert arr.metadata.dimension_names == ("cell",)
    assert arr.attrs["block_axes"] == ["layer", "head", "query", "key"]


def test_writer_writes_whole_chunks_until_final_flush(tmp_path):
    arr = new_array(tmp_path, chunk=16)
    w = block_writer.BlockWriter(arr, 0)
    a = np.arange(1 * 1 * 3 * 3, dtype=np.float16).reshape(1, 1, 3, 3)  # 9 cells
    b = np.arange(100, 100 + 1 * 1 * 4 * 4, dtype=np.float16).reshape(1, 1, 4, 4)  # 16 cells
    assert w.append(a) == 0 and w.append(b) == 9
    assert w.flush() == 16  # one whole chunk durable; 9 cells still buffered
    assert w.next_offset == 25
    assert w.flush(final=True) == 32  # tail written, next write starts at a fresh chunk
    np.testing.assert_array_equal(arrays.read_block(arr, 0, a.shape), a)
    np.testing.assert_array_equal(arrays.read_block(arr, 9, b.shape), b)


def test_iter_blocks_streams_in_offset_order_across_slabs(tmp_path):
    arr = new_array(tmp_path, chunk=8, dtype="float32")
    w = block_writer.BlockWriter(arr, 0)
    blocks = [np.full((1, 2, n, n), n, dtype=np.float32) for n in (1, 2, 3, 4, 2)]
    refs = [arrays.BlockRef(i, w.append(b), b.shape[-1]) for i, b in enumerate(blocks)]
    w.flush(final=True)
    got = list(arrays.iter_blocks(arr, reversed(refs), 1, 2, slab_cells=20))
    assert [k for k, _ in got] == [0, 1, 2, 3, 4]
    for (_, block), expected in zip(got, blocks):
        np.testing.assert_array_equal(block, expected)
    taken = []

    def one_at_a_time():  # references already in offset order, made as the reads reach them
        for ref in refs:
            taken.append(ref.key)
            yield ref

    lazily = arrays.iter_blocks(arr, one_at_a_time(), 1, 2, slab_cells=20, ordered=True)
    first_key, first_block = next(lazily)
    assert first_key == 0 and len(taken) < len(refs)  # the first slab is read before the last reference is made
    assert [first_key, *(k for k, _ in lazily)] == [0, 1, 2, 3, 4]


def test_resume_offset_never_points_into_a_written_chunk():
    assert block_writer.resume_offset(0, 16) == 0
    assert block_writer.resume_offset(1, 16) == 16
    assert block_writer.resume_offset(16, 16) == 16
    assert block_writer.resume_offset(17, 16) == 32


def test_unaligned_start_and_missing_array_are_errors(tmp_path):
    arr = new_array(tmp_path)
    with pytest.raises(InvalidArgumentError):
        block_writer.BlockWriter(arr, 3)
    with pytest.raises(NotFoundError, match="not found under"):
        arrays.open_run_array(str(tmp_path), "runs/missing")


def test_an_opened_run_array_still_writes_chunks_equal_to_the_fill_value(tmp_path):
    """zarr applies `config` only when it creates an array: open_run_array must set it again, or a chunk of
    zeros written by a resumed run would be skipped and later look like damage."""
    arrays.create_run_array(str(tmp_path), "runs/z/cells", dtype="float16", chunk_cells=4, codec=arrays.DEFAULT_CODEC, attributes={})
    opened = arrays.open_run_array(str(tmp_path), "runs/z/cells", read_only=False)
    writer = block_writer.BlockWriter(opened, 0)
    writer.append(np.zeros((1, 1, 2, 4), dtype=np.float16))
    writer.flush(final=True)
    assert sorted(arrays.present_chunks(opened)) == [0, 1]


class _FailingWrites:
    """A cells array whose writes starting at an offset in `full_at` fail with ENOSPC (everything else passes through)."""

    def __init__(self, array, full_at):
        self._array = array
        self.full_at = full_at

    def __getattr__(self, name):
        return getattr(self._array, name)

    def __setitem__(self, key, value):
        if key.start in self.full_at:
            raise OSError(28, "No space left on device")
        self._array[key] = value


def _chunk_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name.startswith("attnstore-chunks")]


def test_background_flush_lags_one_write_and_keeps_every_cell(tmp_path):
    arr = new_array(tmp_path, chunk=16)
    w = block_writer.BlockWriter(arr, 0)
    blocks = [np.arange(i * 100, i * 100 + n * n, dtype=np.float16).reshape(1, 1, n, n) for i, n in enumerate((3, 4, 5, 2, 4))]
    assert [w.append(b) for b in blocks[:2]] == [0, 9]
    assert w.flush(wait=False) == 0  # chunk 0 is being written: nothing durable yet
    assert arr.shape[0] >= 16  # grown before the write starts, so a writer taking over starts past it
    assert w.next_offset == 25 and w.append(blocks[2]) == 25  # the 9 buffered cells moved to a new buffer
    assert w.flush(wait=False) == 16  # chunk 0 done; chunks 1 and 2 in flight
    assert w.settle() == 48 and w.durable_offset == 48
    assert w.append(blocks[3]) == 50 and w.append(blocks[4]) == 54
    assert w.flush(final=True) == 80  # the final flush waits, and the next write starts at a fresh chunk
    assert not _chunk_threads()
    for b, offset in zip(blocks, (0, 9, 25, 50, 54)):
        np.testing.assert_array_equal(arrays.read_block(arr, offset, b.shape), b)


def test_a_failed_background_write_is_raised_and_nothing_after_it_is_durable(tmp_path):
    arr = _FailingWrites(new_array(tmp_path, chunk=16), full_at={16})
    w = block_writer.BlockWriter(arr, 0)
    w.append(np.ones((1, 1, 4, 4), np.float16))
    assert w.flush(wait=False) == 0 and w.settle() == 16
    w.append(np.ones((1, 1, 4, 4), np.float16))
    assert w.flush(wait=False) == 16  # the write of cells 16..32 fails in the background
    w.append(np.ones((1, 1, 4, 4), np.float16))
    # The failure surfaces at the next flush; the failed chunk's cells are gone from the buffer, so every later
    # flush fails too (a later chunk written past it would make its examples look durable).
    for flush in (lambda: w.flush(wait=False), w.flush, lambda: w.flush(final=True), w.settle):
        with pytest.raises(OSError, match="No space left"):
            flush()
    assert w.durable_offset == 16
    w.close()
    assert not _chunk_threads()


# A batch of zarr I/O where one request fails at once and another is still running (a full disk, an object store that
# does not answer): zarr raises the first error and leaves the other request on its event loop. Like s3fs's requests,
# this one still has cleanup to await when it is closed.
LEFT_RUNNING = """
import asyncio, sys
from zarr.core.sync import sync
import attnstore.store.arrays

async def request():
    try:
        await asyncio.sleep(30)
    finally:
        await asyncio.sleep(0)

async def fails():
    raise OSError(28, "No space left on device")

async def batch():
    await asyncio.gather(request(), fails())

try:
    sync(batch())
except OSError as exc:
    print(f"Error: {exc}", file=sys.stderr)
    sys.exit(1)
"""


def test_io_left_running_after_an_error_prints_nothing_at_exit():
    """Issue 24 item 10: after the one-line error, exit prints no "Task was destroyed but it is pending!" and no
    "Exception ignored in: <coroutine ...>" traceback (requests still in flight are cancelled before zarr closes its loop)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LEFT_RUNNING], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr == "Error: [Errno 28] No space left on device\n", done.stderr


def test_placed_offset_puts_a_block_in_the_fewest_blosc_blocks():
    # blosc blocks of 8 cells: [0, 8), [8, 16), ...
    assert block_writer.placed_offset(0, 5, 8) == 0
    assert block_writer.placed_offset(3, 5, 8) == 3  # [3, 8): one block, the fewest
    assert block_writer.placed_offset(4, 5, 8) == 8  # [4, 9) would touch two: to the next block's start
    assert block_writer.placed_offset(4, 12, 8) == 4  # [4, 16): two blocks, as few as 12 cells need
    assert block_writer.placed_offset(5, 12, 8) == 8  # [5, 17) would touch three
    assert block_writer.placed_offset(8, 20, 8) == 8 and block_writer.placed_offset(9, 16, 8) == 16
    assert block_writer.placed_offset(5, 12, None) == 5 and block_writer.placed_offset(5, 0, 8) == 5  # no blocks known; nothing to place


def test_placed_offsets_of_a_subset_end_no_later():
    # A distributed part is sized by placing all its new examples; its worker places those it stores, in order.
    rng = np.random.default_rng(0)
    for _ in range(300):
        sizes = rng.integers(1, 40, size=int(rng.integers(1, 12))).tolist()
        keep = rng.random(len(sizes)) < 0.6
        ends = []
        for chosen in (sizes, [n for n, k in zip(sizes, keep) if k]):
            free = start = int(rng.integers(0, 3)) * 16
            for n in chosen:
                at = block_writer.placed_offset(free, n, 16)
                assert at >= free and (at + n - 1) // 16 - at // 16 + 1 == -(-n // 16) or at == free
                free = at + n
            ends.append(free - start)
        assert ends[1] <= ends[0]


def test_block_cells_only_where_a_chunk_holds_several_blocks(tmp_path):
    assert arrays.block_cells(new_array(tmp_path / "small", chunk=16)) is None  # the chunk is one block
    default = new_array(tmp_path / "default", chunk=arrays.DEFAULT_CHUNK_CELLS)
    assert arrays.block_cells(default) == arrays.DEFAULT_CODEC["blocksize"] // 2 == 131072
    lossy = arrays.create_run_array(
        str(tmp_path / "u8"), "runs/a", dtype="float16", chunk_cells=1 << 20, codec=arrays.LOSSY_U8_CODEC, attributes={}
    )
    assert arrays.block_cells(lossy) is None  # read through zarr a whole chunk at a time: nothing to gain
    wide = new_array(tmp_path / "f32", chunk=arrays.DEFAULT_CHUNK_CELLS, dtype="float32")
    assert arrays.block_cells(wide) == 1 << 16


def test_writer_pads_so_each_example_lies_in_the_fewest_blocks(tmp_path):
    codec = {**arrays.DEFAULT_CODEC, "blocksize": 16}  # 8 float16 cells a blosc block, 4 blocks a chunk
    arr = arrays.create_run_array(str(tmp_path), "runs/a", dtype="float16", chunk_cells=32, codec=codec, attributes={})
    w = block_writer.BlockWriter(arr, 0)
    assert w.block_cells == 8
    blocks = [np.full((1, 1, n, n), n, dtype=np.float16) for n in (2, 3, 2, 1, 3)]  # 4, 9, 4, 1, 9 cells
    offsets = [w.append(b) for b in blocks]
    # 9 at 4: [4, 13) lies in two blocks, as 9 cells need; 4 at 13 would touch two, so at 16 (cells 13-15 zeros);
    # 9 at 21: [21, 30) in two blocks again
    assert offsets == [0, 4, 16, 20, 21]
    assert w.next_offset == 30 and w.offset_for(4) == 32 and w.offset_for(2) == 30
    w.flush(final=True)
    for offset, b in zip(offsets, blocks):
        np.testing.assert_array_equal(arrays.read_block(arr, offset, b.shape), b)
    np.testing.assert_array_equal(arr[13:16], 0)  # the gap
