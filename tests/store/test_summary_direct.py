"""A kept summary read straight from its chunk files (issue 29: a sample's rows without decoding whole chunks).

`DirectCells.read_rows` on N-D arrays whose chunks hold whole rows, and `ShardedRows.read_rows` on fields kept as
shards of inner chunks (rows of more than 64 bytes here: `score`, `zeros`), equal zarr's read for any set of rows;
`SummaryParts` gives the same `part` and `rows` through the direct readers as through zarr, including a chunk (or a
shard, or an inner chunk) zarr never wrote (all zeros) and the last, partial chunk; a damaged chunk or shard still
fails as zarr fails; a sample's rows decode blosc blocks or inner chunks, not whole chunks.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec

from attnstore.store import arrays, direct, sharded, summaries

from .test_integrity import damage


def summary_fields(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    zeros = rng.random((n, 3, 4))
    zeros[: summaries.SUMMARY_CHUNK_ROWS] = 0  # the first chunk holds only the fill value: zarr does not write it
    zeros[summaries.SUMMARY_CHUNK_ROWS + INNER : summaries.SUMMARY_CHUNK_ROWS + 2 * INNER] = 0  # nor this inner chunk of a shard
    return {
        "example": np.arange(n, dtype=np.int64) * 3 + 1,
        "score": rng.random((n, 3, 4)),
        "flag": rng.random((n, 2)) < 0.5,
        "count": rng.integers(0, 9, (n, 5), dtype=np.int32),
        "zeros": zeros,
        "noise": rng.integers(0, 256, (n, 40), dtype=np.uint8),  # incompressible: blosc stores it as it is (memcpyed)
        "wide": rng.random((n, 12), dtype=np.float32),  # 192 KiB chunks: not sharded, several blosc blocks each
    }


SHARDED = {"score", "zeros"}  # 4,096 rows of 96 bytes: shards of 8 inner chunks of 512 rows
INNER = 512
UNWRITTEN = [(0, summaries.SUMMARY_CHUNK_ROWS), (summaries.SUMMARY_CHUNK_ROWS + INNER, summaries.SUMMARY_CHUNK_ROWS + 2 * INNER)]


def write(root: Path, values: dict[str, np.ndarray], parts: int | None = summaries.SUMMARY_CHUNK_ROWS) -> summaries.SummaryParts:
    arrays.create_run_group(str(root), "x", dtype="float16", chunk_cells=1 << 12, codec=arrays.DEFAULT_CODEC, attributes={})
    path = f"{arrays.run_group_path('x')}/cells"
    writer = summaries.SummaryWriter(str(root), path, "kind")
    if parts is None:  # one part, as given (ragged fields included)
        writer.append(values)
    else:  # parts of `parts` examples (no ragged fields)
        for start in range(0, len(values["example"]), parts):
            writer.append({k: v[start : start + parts] for k, v in values.items()})
    writer.finish({"v": 1})
    saved = summaries.summary_parts(str(root), path, "kind", {"v": 1})
    assert saved is not None
    return saved


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    n = 3 * summaries.SUMMARY_CHUNK_ROWS + 123  # the last chunk partial
    values = summary_fields(n)
    return write(tmp_path_factory.mktemp("summary"), values), values


def test_every_field_of_a_local_summary_has_a_direct_reader(kept):
    saved, values = kept
    assert set(saved.arrays) == set(values)
    for key, reader in saved._direct.items():
        assert isinstance(reader, sharded.ShardedRows if key in SHARDED else direct.DirectCells), key
        assert (saved.arrays[key].shards is not None) == (key in SHARDED), key
        assert reader.trailing == values[key].shape[1:] and reader.width == int(np.prod(values[key].shape[1:]))


def test_rows_and_parts_equal_the_values_written(kept):
    saved, values = kept
    n = saved.n
    rng = np.random.default_rng(1)
    chunk = summaries.SUMMARY_CHUNK_ROWS
    samples = [np.array([0]), np.array([n - 1]), np.arange(chunk - 2, chunk + 3), np.sort(rng.choice(n, 50, replace=False))]
    samples += [np.array([5, 6, 7, 100, 101, n - 3, n - 2])]  # runs of consecutive rows and single ones
    for positions in samples:
        got = saved.rows(positions)
        for key, expected in values.items():
            assert got[key].dtype == expected.dtype and got[key].shape == expected[positions].shape, key
            np.testing.assert_array_equal(got[key], expected[positions], err_msg=key)
    for start, stop in [(0, chunk), (chunk, 2 * chunk), (3 * chunk, n), (10, 20), (chunk - 1, chunk + 1)]:
        part = saved.part(start, stop)
        for key, expected in values.items():
            np.testing.assert_array_equal(part[key], expected[start:stop], err_msg=f"{key} {start}..{stop}")
    np.testing.assert_array_equal(saved.column("example"), values["example"])


def test_direct_rows_equal_zarr_for_random_sets(kept):
    saved, values = kept
    rng = np.random.default_rng(2)
    for _ in range(20):
        positions = np.sort(rng.choice(saved.n, int(rng.integers(1, 300)), replace=False))
        for key, array in saved.arrays.items():
            got = saved._direct[key].read_rows(positions)
            if key == "zeros" and any(((lo <= positions) & (positions < hi)).any() for lo, hi in UNWRITTEN):
                assert got is None  # a shard, or an inner chunk, never written: left to zarr, which fills it
                continue
            np.testing.assert_array_equal(got, np.asarray(array.get_orthogonal_selection((positions,))), err_msg=key)


def test_a_sample_decodes_blocks_not_chunks(kept, monkeypatch):
    """A row of a 4,096-row chunk of 12 float32s (192 KiB) decompresses the blosc block it lies in; a row of a
    sharded field (4,096 rows of (3, 4) float64s, 384 KiB), its inner chunk of 512 rows only."""
    saved, values = kept
    decoded, inner = [], []
    real = direct.blosc.decompress  # both decode into a buffer: direct.py's of the blocks, sharded.py's of an inner chunk

    def counted(into):
        def decompress(src, dest):
            into.append(dest.nbytes)
            return real(src, dest)

        return decompress

    monkeypatch.setattr(direct.blosc, "decompress", counted(decoded))
    monkeypatch.setattr(sharded, "blosc", SimpleNamespace(decompress=counted(inner)))
    got = saved.rows(np.array([summaries.SUMMARY_CHUNK_ROWS + 7]), fields=("wide", "score"))
    np.testing.assert_array_equal(got["score"], values["score"][[summaries.SUMMARY_CHUNK_ROWS + 7]])
    assert decoded and max(decoded) < summaries.SUMMARY_CHUNK_ROWS * 12 * 4, decoded
    assert inner == [INNER * 12 * 8]


def test_a_sharded_row_checks_the_index_and_one_inner_chunk(kept, monkeypatch):
    """One row of a shard: its index (8 inner chunks x 16 bytes) and its inner chunk are checked, not the shard."""
    saved, values = kept
    checked = []
    real = sharded.google_crc32c.value
    monkeypatch.setattr(sharded.google_crc32c, "value", lambda data: checked.append(len(data)) or real(data))
    row = 2 * summaries.SUMMARY_CHUNK_ROWS + 3 * INNER + 5
    np.testing.assert_array_equal(saved._direct["score"].read_rows(np.array([row]))[0], values["score"][row])
    shard = Path(saved._direct["score"].shard_file(2))
    assert checked[0] == 8 * 16 and len(checked) == 2 and checked[1] < shard.stat().st_size / 3, checked


@pytest.mark.parametrize("codec", ["SHARD_CODEC", "INDEX_CODEC"])
@pytest.mark.parametrize("n", [2 * summaries.SUMMARY_CHUNK_ROWS, summaries.SUMMARY_CHUNK_ROWS + 700, 300])
def test_shards_written_by_the_summary_writer_are_the_bytes_zarr_writes(tmp_path, monkeypatch, n, codec):
    """The writer encodes whole shards itself (sharded.ShardEncoder) rather than through zarr's sharding codec: the
    files are byte for byte zarr's (a last shard cut short, its last inner chunk padded, included), and read back;
    with today's lz4 shards and with the zstd ones summaries were kept with before (4cd1d44 to 8571697, 2026-11-27)."""
    monkeypatch.setattr(summaries, "SHARD_CODEC", getattr(summaries, codec, None) or getattr(arrays, codec))
    rng = np.random.default_rng(5)
    values = {
        "example": np.arange(n, dtype=np.int64),
        "score": rng.random((n, 12, 12)),
        "flag": rng.random((n, 12, 12)) < 0.1,
        "zeros": np.zeros((n, 12, 12)),
    }
    values["zeros"][-(n // 3) :] = 1.5  # shards and inner chunks of the fill value only are not written, as zarr does
    saved = write(tmp_path / "ours", values, parts=summaries.SUMMARY_CHUNK_ROWS if n > 1000 else None)
    written = [key for key in ("score", "flag", "zeros") if saved.arrays[key].shards is not None]
    assert {"score", "zeros"} <= set(written)  # 1,152-byte rows: sharded even in a run of 300 examples
    for key in written:
        ours = saved.arrays[key]
        np.testing.assert_array_equal(ours[:], values[key], err_msg=key)
        theirs = zarr.create_array(
            store=str(tmp_path / f"zarr-{key}"),
            shape=ours.shape,
            dtype=ours.dtype,
            chunks=ours.chunks,
            shards=ours.shards,
            compressors=arrays.make_codec(summaries.SHARD_CODEC, str(ours.dtype)),
        )
        assert ours.metadata.codecs[0].codecs[1].cname.value == summaries.SHARD_CODEC["cname"]
        theirs[:] = values[key]
        folder = Path(ours.store_path.store.root) / ours.path / "c"
        for shard in range(-(-n // ours.shards[0])):
            name = "/".join(["c", str(shard), *("0" * (ours.ndim - 1))])
            theirs_file, ours_file = tmp_path / f"zarr-{key}" / name, folder.parent / name
            assert ours_file.exists() == theirs_file.exists(), (key, shard)
            assert not ours_file.exists() or ours_file.read_bytes() == theirs_file.read_bytes(), (key, shard)
        if key == "zeros" and n == 2 * summaries.SUMMARY_CHUNK_ROWS:
            assert not (folder / "0").exists()  # its first shard holds zeros only


def test_summary_layout_shards_large_rows_only():
    pattern = np.zeros((4096, 12, 12), np.float32)  # pattern_scores' fields: 576 bytes a row
    assert summaries.summary_layout(pattern, ragged=False, whole=False) == ((64, 12, 12), (4096, 12, 12))
    assert summaries.summary_layout(pattern[:408], ragged=False, whole=True) == ((64, 12, 12), (512, 12, 12))
    assert summaries.summary_layout(pattern[:100], ragged=False, whole=True) == ((128, 12, 12), None)  # 72 KiB: one chunk
    assert summaries.summary_layout(np.zeros(4096, np.int64), ragged=False, whole=False) == ((4096,), None)
    assert summaries.summary_layout(np.zeros((9000, 40), np.int32), ragged=True, whole=True) == ((16384, 40), None)


def test_ragged_fields_are_read_between_their_offsets(tmp_path):
    sizes = np.random.default_rng(3).integers(0, 5, 3 * summaries.SUMMARY_CHUNK_ROWS)  # some examples of no words
    values = {"example": np.arange(len(sizes), dtype=np.int64) * 2, "score": np.arange(len(sizes), dtype=np.float64)}
    values["word"] = np.arange(int(sizes.sum()), dtype=np.int32)
    values["word_start"] = np.r_[0, np.cumsum(sizes)].astype(np.int64)
    saved = write(tmp_path, values, parts=None)  # one part: `write` slices parts by example, not by word
    rng = np.random.default_rng(4)
    samples = [np.array([0]), np.array([len(sizes) - 1]), np.flatnonzero(sizes == 0)[:3], np.arange(4090, 4100)]
    samples += [np.sort(rng.choice(len(sizes), 200, replace=False))]
    for positions in samples:
        got = saved.rows(positions)
        want_sizes = sizes[positions]
        np.testing.assert_array_equal(got["word_start"], np.r_[0, np.cumsum(want_sizes)])
        np.testing.assert_array_equal(
            got["word"], np.concatenate([np.arange(values["word_start"][p], values["word_start"][p + 1]) for p in positions])
        )
        np.testing.assert_array_equal(got["example"], values["example"][positions])
        np.testing.assert_array_equal(got["score"], values["score"][positions])
    part = saved.part(1, 3)
    np.testing.assert_array_equal(part["word"], np.arange(values["word_start"][1], values["word_start"][3]))


@pytest.mark.parametrize("field", ["wide", "score"])
@pytest.mark.parametrize("how", ["flipped", "truncated", "index"])
def test_a_damaged_summary_chunk_fails_as_zarr_fails(tmp_path, how, field):
    """A chunk, or a shard (an inner chunk's bytes, its index, or its end cut off), damaged: the rows in it fail as
    zarr fails, the other chunks read."""
    values = summary_fields(2 * summaries.SUMMARY_CHUNK_ROWS)
    saved = write(tmp_path, values)
    folder = Path(saved.arrays[field].store_path.store.root) / saved.arrays[field].path
    path = folder / "c" / "1" / ("0" if field == "wide" else "0/0")
    if how == "index":  # a byte of a shard's index (of a chunk: its checksum)
        data = path.read_bytes()
        path.write_bytes(data[:-10] + bytes([data[-10] ^ 0x01]) + data[-9:])
    else:
        damage(path, how)
    with pytest.raises(Exception) as through_zarr:
        saved.arrays[field][summaries.SUMMARY_CHUNK_ROWS :]
    for positions in ([summaries.SUMMARY_CHUNK_ROWS + 1], [summaries.SUMMARY_CHUNK_ROWS + 1, summaries.SUMMARY_CHUNK_ROWS + 900]):
        with pytest.raises(type(through_zarr.value)):  # one row, and several runs of rows in the chunk (one check)
            saved.rows(np.array(positions), fields=(field,))
    with pytest.raises(type(through_zarr.value)):
        saved.part(summaries.SUMMARY_CHUNK_ROWS, 2 * summaries.SUMMARY_CHUNK_ROWS, fields=(field,))
    np.testing.assert_array_equal(saved.rows(np.array([3]))[field], values[field][[3]])  # the other chunk reads


def test_no_direct_reader_for_chunks_that_split_rows_or_big_endian_bytes(tmp_path):
    def made(name: str, shape: tuple, chunks: tuple, **kwargs):
        codec = arrays.make_codec(arrays.INDEX_CODEC, "float64")
        return zarr.create_array(store=str(tmp_path / name), shape=shape, chunks=chunks, dtype="float64", compressors=codec, **kwargs)

    split = made("a", (64, 6), (16, 3))
    split[:] = 1.0
    assert direct.direct_reader(split) is None
    assert direct.direct_reader(made("b", (64, 0), (16, 1))) is None  # rows of no cells
    big = made("c", (64, 3), (16, 3), serializer=BytesCodec(endian="big"))  # the dtype does not say so; the serializer does
    big[:] = np.arange(192.0).reshape(64, 3)
    assert direct.direct_reader(big) is None
    assert direct.direct_reader(made("d", (64, 3), (16, 3))) is not None


def test_the_rows_of_one_chunk_are_one_read_and_one_checksum(kept, monkeypatch):
    """Many rows of a chunk (a dense sample, or a summary just written, whose files the cache does not trust yet) are
    read as one span: the chunk's file is checked once, not once per row."""
    saved, values = kept
    checked = []
    real = direct.google_crc32c.value
    monkeypatch.setattr(direct.google_crc32c, "value", lambda data: checked.append(len(data)) or real(data))
    chunk = summaries.SUMMARY_CHUNK_ROWS
    positions = np.r_[np.arange(3, chunk, 7), np.arange(chunk + 1, 2 * chunk, 5)]  # every 7th row of one, 5th of the next
    np.testing.assert_array_equal(saved._direct["wide"].read_rows(positions), values["wide"][positions])
    assert len(checked) == 2


def test_only_the_fields_asked_for_are_read(kept, tmp_path):
    saved, values = kept
    got = saved.rows(np.array([2, 9000]), fields=("count",))
    assert set(got) == {"example", "count"}
    np.testing.assert_array_equal(got["count"], values["count"][[2, 9000]])
    assert set(saved.part(0, 10, fields=("flag",))) == {"example", "flag"}
    ragged = write(
        tmp_path,
        {"example": np.arange(3, dtype=np.int64), "word": np.arange(7, dtype=np.int32), "other": np.ones(3)}
        | {"word_start": np.array([0, 2, 3, 7], dtype=np.int64)},
        parts=None,
    )
    part = ragged.part(1, 3, fields=("word",))
    assert set(part) == {"example", "word", "word_start"} and part["word"].tolist() == [2, 3, 4, 5, 6]
    some = ragged.rows(np.array([0, 2]), fields=("word",))
    assert set(some) == {"example", "word", "word_start"} and some["word"].tolist() == [0, 1, 3, 4, 5, 6]
    assert some["word_start"].tolist() == [0, 2, 6]


def test_a_sample_announces_each_step_s_reads_before_making_them(kept, monkeypatch):
    """Cold, a sample's reads are in flight together: every touched shard's index is announced to the kernel
    (POSIX_FADV_WILLNEED) before any index is read, and every wanted inner chunk before any is read; a shard read in
    several batches (SHARDS_AT_ONCE) does so per batch. The rows are what was written."""
    saved, values = kept
    log: list[tuple[str, int, int]] = []
    real_pread = sharded.os.pread
    monkeypatch.setattr(sharded, "will_need", lambda fd, offset, length: log.append(("announce", offset, length)))
    monkeypatch.setattr(sharded.os, "pread", lambda fd, n, offset: log.append(("read", offset, n)) or real_pread(fd, n, offset))
    reader = saved._direct["score"]
    rows = np.array([5, summaries.SUMMARY_CHUNK_ROWS + 3 * INNER + 1, 2 * summaries.SUMMARY_CHUNK_ROWS + 2 * INNER + 9])
    np.testing.assert_array_equal(reader.read_rows(rows), values["score"][rows])
    kinds = [kind for kind, _, _ in log]
    index = reader.index_bytes
    assert kinds == ["announce"] * 3 + ["read", "announce"] * 3 + ["read"] * 3, log
    assert all(length == index for kind, _, length in log[:3]) and all(n == index for kind, _, n in log[3:9:2])
    announced, read = [(o, n) for k, o, n in log[4:9:2]], [(o, n) for k, o, n in log[9:]]
    shard_bytes = Path(reader.shard_file(1)).stat().st_size
    assert announced == read and all(n < shard_bytes / 4 for _, n in read)  # inner chunks, not whole shards
    log.clear()
    monkeypatch.setattr(sharded, "SHARDS_AT_ONCE", 2)
    np.testing.assert_array_equal(reader.read_rows(rows), values["score"][rows])
    assert [kind for kind, _, _ in log] == ["announce"] * 2 + ["read", "announce"] * 2 + ["read"] * 2 + [
        "announce",
        "read",
        "announce",
        "read",
    ]


def test_a_read_of_many_chunk_files_announces_them_a_window_ahead(kept, monkeypatch):
    """A whole column of many chunk files (a kept example column: ~2,000 at 8 M examples) announces a window of files
    (PREFETCH_BYTES of decoded cells, at most PREFETCH_FILES) before reading them; a read of fewer than ANNOUNCE_FROM
    chunks (one example's maps: one or two) announces nothing."""
    saved, values = kept
    announced: list[int] = []
    monkeypatch.setattr(direct, "will_need", lambda fd, offset, length: announced.append(length))
    monkeypatch.setattr(direct, "PREFETCH_FILES", 2)
    np.testing.assert_array_equal(saved.column("example"), values["example"])
    assert announced == [0] * 4  # 4 chunk files, whole, two at a time
    announced.clear()
    monkeypatch.setattr(direct, "PREFETCH_BYTES", 1)  # less than a chunk: one file at a time
    np.testing.assert_array_equal(saved.column("example"), values["example"])
    assert announced == [0] * 4
    announced.clear()
    np.testing.assert_array_equal(saved.part(10, 20)["example"], values["example"][10:20])
    chunk = summaries.SUMMARY_CHUNK_ROWS
    np.testing.assert_array_equal(saved.part(chunk - 2, chunk + 2)["example"], values["example"][chunk - 2 : chunk + 2])
    assert announced == []
