"""Zarr layout 2: a run's group describes itself, so plain zarr / xarray read it without attnstore or SQL.
A run in layout 1 (a bare array at runs/<uuid>, before 2026-11-23) is refused in one line naming
`attnstore db upgrade-arrays` by every read and write of its arrays (what reads SQL only still works);
that command converts it (chunks copied byte for byte), and the run then reads as it did.

Hand-built runs (float32, 64-cell chunks) on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
import zarr
from click.testing import CliRunner
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from attnstore.api.cli import main
from attnstore.queries import run_query
from attnstore.store import arrays
from attnstore.store.check import LAYOUT_1, check_store
from attnstore.store.errors import OldLayoutError
from attnstore.store.layout import upgrade_arrays
from attnstore.store.schema import Run
from attnstore.tests.snapshots import store_with

TOKENS = [["[CLS]", "a", "b", "[SEP]"], ["[CLS]", "c", "d", "e", "[SEP]"], ["[CLS]", "f", "[SEP]"], ["[CLS]", "g", "h", "[SEP]"]]


def maps_for(tokens, seed):
    rng = np.random.default_rng(seed)
    raw = rng.random((2, 3, len(tokens), len(tokens))).astype(np.float32)
    return raw / raw.sum(-1, keepdims=True)


MAPS = [maps_for(t, i) for i, t in enumerate(TOKENS)]


def build_run(store, make_run):
    return make_run(store, MAPS, TOKENS, name="four")


# For a test of `run`, the store with the run, built once per session on SQLite and copied (tests/snapshots.py).
store = store_with("run", build_run)


@pytest.fixture
def run(store):
    return "four"


def plain_read(root: str, run_name: str, example: int) -> np.ndarray:
    """The docs/SHARING.md recipe: one example's maps with nothing but zarr."""
    group = zarr.open_group(root, path=f"runs/{run_name}", mode="r")
    i = int(np.flatnonzero(group["example"][:] == example)[0])
    offset, length = int(group["offset"][i]), int(group["length"][i])
    n_layers, n_heads = group.attrs["n_layers"], group.attrs["n_heads"]
    cells = group["cells"][offset : offset + n_layers * n_heads * length * length]
    return cells.reshape(n_layers, n_heads, length, length)


def test_a_run_group_describes_itself(store, run):
    root = store.locations.array_root
    info = store.run_info(run)
    assert info.array_path == "runs/four/cells"
    assert arrays.root_layout(zarr.open_group(root, mode="r").attrs.asdict()) == 2
    group = zarr.open_group(root, path="runs/four", mode="r")
    attrs = group.attrs.asdict()
    assert attrs["run"] == "four" and attrs["run_uid"] == info.manifest["uid"]
    assert (attrs["n_layers"], attrs["n_heads"], attrs["dtype"], attrs["axes"]) == (2, 3, "float32", ["layer", "head", "query", "key"])
    assert attrs["model"] == info.model and attrs["dataset"]["name"] == info.dataset and attrs["status"] == "complete"
    assert attrs["codec"]["cname"] == "zstd" and attrs["n_examples"] == 4
    # Real lengths, not a nominal 2**46: cells end where the last block ends.
    sizes = [m.size for m in MAPS]
    assert group["cells"].shape == (sum(sizes),)
    assert group["example"][:].tolist() == [0, 1, 2, 3]
    assert group["offset"][:].tolist() == np.cumsum([0, *sizes[:-1]]).tolist()
    assert group["length"][:].tolist() == [len(t) for t in TOKENS]
    ids = [int(t) for e in range(4) for t in store.tokens(run, e)["token_id"]]
    assert group["token_id"][:].tolist() == ids
    assert group["token_start"][:].tolist() == np.cumsum([0, *[len(t) for t in TOKENS[:-1]]]).tolist()
    assert group["cells"].metadata.dimension_names == ("cell",)
    assert group["offset"].metadata.dimension_names == ("example",)
    for e, maps in enumerate(MAPS):
        np.testing.assert_array_equal(plain_read(root, "four", e), maps)
        np.testing.assert_array_equal(store.attention(run, e), maps)


def test_xarray_opens_a_run_group(store, run):
    xr = pytest.importorskip("xarray")
    ds = xr.open_zarr(store.locations.array_root, group="runs/four", consolidated=False)
    assert set(ds.sizes) == {"cell", "example", "token"}
    row = ds.sel(example=1)
    offset, length = int(row.offset), int(row.length)
    maps = ds.cells[offset : offset + 2 * 3 * length * length].values.reshape(2, 3, length, length)
    np.testing.assert_array_equal(maps, MAPS[1])
    start = int(row.token_start)
    assert ds.token_id[start : start + length].values.tolist() == store.tokens(run, 1)["token_id"].tolist()


def test_unsafe_run_names_get_distinct_readable_slugs():
    assert arrays.run_slug("MRPC-dev-all-MiniLM-L6-v2") == "MRPC-dev-all-MiniLM-L6-v2"
    a, b = arrays.run_slug("ewt dev/1"), arrays.run_slug("ewt dev_1")
    assert a.startswith("ewt_dev_1-") and b.startswith("ewt_dev_1-") and a != b
    assert arrays.run_slug("..") != ".." and "/" not in arrays.run_slug("../../etc")


def test_an_interrupted_run_index_holds_only_what_was_committed(store, make_run):
    _, writer = make_run(store, MAPS[:2], TOKENS[:2], name="partial", finish=False)
    try:
        group = zarr.open_group(store.locations.array_root, path="runs/partial", mode="r")
        assert group["example"][:].tolist() == [0, 1] and group.attrs["status"] == "running"
    finally:
        writer.close()
    summary, problems = check_store(store, ["partial"])
    assert problems.empty, problems


LEGACY_CAPACITY_CELLS = 1 << 46  # layout 1 created each run's array with this nominal length
REFUSAL = (
    "run 'four' is stored in Zarr layout 1, which this version no longer reads: "
    "run `attnstore db upgrade-arrays` to convert it (a byte-for-byte chunk copy)"
)


def make_legacy(store, run_name: str) -> str:
    """Turn a layout-2 run into what layout 1 wrote: one bare array at runs/<uuid>, nominal length 2**46."""
    info = store.run_info(run_name)
    root = store.locations.array_root
    kv = arrays.open_root(root, read_only=False)
    cells = arrays.open_run_array(root, info.array_path)
    legacy_path = f"runs/{uuid.uuid4().hex}"
    legacy = zarr.create_array(
        store=kv,
        name=legacy_path,
        shape=(LEGACY_CAPACITY_CELLS,),
        chunks=cells.chunks,
        dtype=cells.dtype,
        compressors=cells.compressors,
        fill_value=0,
        dimension_names=("cell",),
        attributes={"block_axes": list(arrays.AXES), "run": info.name},
    )
    for i in sorted(arrays.present_chunks(cells)):
        data = sync(kv.get(arrays.chunk_key(cells, i), prototype=default_buffer_prototype()))
        sync(kv.set(arrays.chunk_key(legacy, i), data))
    sync(kv.delete_dir(arrays.group_path_of(info.array_path)))
    with store.session() as s:
        s.execute(sa.update(Run).where(Run.id == info.id).values(array_path=legacy_path))
    return legacy_path


def refused(call) -> None:
    """`call()` raises the one line that names `attnstore db upgrade-arrays`."""
    with pytest.raises(OldLayoutError) as caught:
        call()
    assert str(caught.value) == REFUSAL


def test_a_layout_1_run_is_refused_until_upgraded_then_reads_as_before(store, run):
    before = run_query(store, "entropy", run=run)
    legacy_path = make_legacy(store, run)
    root = Path(store.locations.array_root)
    assert json.loads((root / legacy_path / "zarr.json").read_text())["shape"] == [2**46]
    refused(lambda: store.attention(run, 0))  # refused before its info is kept: the same store reads it once upgraded

    report = upgrade_arrays(store)
    assert report[["run", "layout", "action"]].values.tolist() == [["four", 1, "converted to layout 2"]]
    info = store.run_info(run)
    assert info.array_path == "runs/four/cells" and not (root / legacy_path).exists()
    for e, maps in enumerate(MAPS):
        np.testing.assert_array_equal(store.attention(run, e), maps)
        np.testing.assert_array_equal(plain_read(str(root), "four", e), maps)
    assert zarr.open_array(str(root), path="runs/four/cells", mode="r").shape == (sum(m.size for m in MAPS),)
    assert check_store(store)[1].empty
    assert run_query(store, "entropy", run=run).equals(before)
    again = upgrade_arrays(store)
    assert again["action"].tolist() == ["already layout 2"]


def test_every_read_and_write_of_a_layout_1_runs_arrays_is_refused_in_one_line(store, run):
    make_legacy(store, run)
    refused(lambda: store.attention(run, 1, layer=0))
    refused(lambda: next(store.iter_attention(run)))
    refused(lambda: run_query(store, "entropy", run=run))  # a query, whether it would read summaries or maps
    refused(lambda: run_query(store, "word_maps", run=run, example=0, layer=1, head=1))
    refused(lambda: store.summaries(run))
    refused(lambda: store.saliency_info(run))
    refused(lambda: next(store.iter_saliency(run)))
    refused(lambda: store.writer.run_writer(run))  # a resumed ingest
    # what reads SQL only works as ever
    assert store.runs()["run"].tolist() == ["four"] and store.run_info(run).as_dict()["array_path"].startswith("runs/")
    assert store.tokens(run, 1)["token"].tolist() == TOKENS[1] and len(store.examples(run)) == 4
    assert store.sql("SELECT count(*) AS n FROM sequences")["n"].tolist() == [4]


def test_computing_saliency_of_a_layout_1_run_is_refused(store, run):
    pytest.importorskip("torch")
    from attnstore.ingest.saliency import compute_saliency

    make_legacy(store, run)
    refused(lambda: compute_saliency(store, run))


def test_check_reports_a_layout_1_run_as_needing_the_upgrade(store, run, make_run):
    make_run(store, MAPS[:2], TOKENS[:2], name="other")
    make_legacy(store, run)
    summary, problems = check_store(store)
    assert problems[["run", "problem"]].values.tolist() == [["four", LAYOUT_1]] and "upgrade-arrays" in LAYOUT_1
    assert summary.set_index("run").loc["other", "problems"] == 0  # the other runs are checked as ever
    args = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    result = CliRunner().invoke(main, ["check", *args])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "attnstore db upgrade-arrays" in result.output
    upgrade_arrays(store)
    assert check_store(store)[1].empty


def test_cli_refuses_a_layout_1_run_in_one_line_and_upgrade_arrays_converts_it(store, run):
    make_legacy(store, run)
    args = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    runner = CliRunner()
    for command in (["query", "entropy", "--run", "four"], ["summarize", "--run", "four"]):
        result = runner.invoke(main, [*command, *args])
        assert result.exit_code == 1 and result.output.strip() == f"Error: {REFUSAL}", (command, result.output)
    for command in (["runs"], ["show", "four"], ["tokens", "--run", "four", "--example", "0"], ["sql", "SELECT name FROM runs"]):
        result = runner.invoke(main, [*command, *args])
        assert result.exit_code == 0, (command, result.output)
        assert ("[CLS]" if command[0] == "tokens" else "four") in result.output, (command, result.output)
    result = runner.invoke(main, ["db", "upgrade-arrays", *args])
    assert result.exit_code == 0, result.output
    assert "converted to layout 2" in result.output
    result = runner.invoke(main, ["query", "entropy", "--run", "four", "--format", "csv", *args])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["db", "upgrade-arrays", "--run", "nope", *args])
    assert result.exit_code == 1 and "nope" in result.output and "Traceback" not in result.output


def test_check_finds_an_index_that_disagrees_with_sql_and_rebuild_fixes_it(store, run):
    offsets = zarr.open_array(store.locations.array_root, path="runs/four/offset", mode="r+")
    offsets[2] = offsets[2] + 1
    summary, problems = check_store(store)
    assert len(problems) == 1 and "offset of entry 2" in problems["problem"].iloc[0] and "--rebuild-index" in problems["problem"].iloc[0]
    assert upgrade_arrays(store, rebuild_index=True)["action"].tolist() == ["index rebuilt from SQL"]
    assert check_store(store)[1].empty


@pytest.mark.parametrize("step", [1, 3, 4096])
def test_check_finds_a_wrong_token_id_in_the_index_reading_sql_a_step_at_a_time(store, run, monkeypatch, step):
    blocks = store.writer.block_steps
    monkeypatch.setattr(store.writer, "block_steps", lambda run_id, _default=None: blocks(run_id, step))
    assert check_store(store)[1].empty
    token_ids = zarr.open_array(store.locations.array_root, path="runs/four/token_id", mode="r+")
    token_ids[-1] = token_ids[-1] + 1  # the last example's last token
    problems = check_store(store)[1]
    assert problems["problem"].tolist() == [
        "the Zarr index's token ids differ from SQL's tokens; run `attnstore db upgrade-arrays --rebuild-index`"
    ]
    upgrade_arrays(store, rebuild_index=True)
    assert check_store(store)[1].empty


@pytest.mark.parametrize(
    "layer, head",
    [(None, None), (1, None), (0, 2), (-1, -2), ([1, 0], None), ([0], [2, 0]), ([1, 1], [1]), (None, [2, 1]), (0, [0, 2]), (1, 1)],
)
def test_reading_a_slice_reads_only_its_cells_and_equals_slicing_the_block(store, run, layer, head):
    full = MAPS[1]
    rows = slice(None) if layer is None else ([layer] if isinstance(layer, int) else layer)
    cols = slice(None) if head is None else ([head] if isinstance(head, int) else head)
    np.testing.assert_array_equal(store.attention(run, 1, layer=layer, head=head), full[rows][:, cols])


def test_plain_zarr_reads_a_zipped_root(store, run, tmp_path):
    """The recipe works on a zip of the array root too (zarr's ZipStore), e.g. a root mailed to a colleague."""
    import shutil

    archive = shutil.make_archive(str(tmp_path / "attention"), "zip", root_dir=store.locations.array_root)
    zipped = zarr.storage.ZipStore(archive, mode="r")
    try:
        group = zarr.open_group(zipped, path="runs/four", mode="r")
        assert group.attrs["run"] == "four"
        i = int(np.flatnonzero(group["example"][:] == 2)[0])
        offset, length = int(group["offset"][i]), int(group["length"][i])
        np.testing.assert_array_equal(group["cells"][offset : offset + 2 * 3 * length * length].reshape(2, 3, length, length), MAPS[2])
    finally:
        zipped.close()
