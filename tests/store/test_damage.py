"""Damage that `attnstore check` must list without raising, and that every command names in one line (issue 24,
items 8, 9 and 11): a missing chunk beside a damaged one, a run's zarr.json that is not JSON or names another data
type, and the temporary `.partial` files a killed writer leaves.

Hand-built runs (float32, 64-cell chunks: blocks of 64, 100 and 36 cells over chunks 0-3) on SQLite and PostgreSQL;
the same on an S3 root is in tests/store/test_s3.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.store import arrays
from attnstore.store import check as check_mod
from attnstore.store.bundle import export_runs, import_bundle, open_bundle
from attnstore.store.check import check_store
from attnstore.store.errors import DamagedDataError

from .test_integrity import TOKENS, _url, chunk_file, damage, maps_for


@pytest.fixture
def three(store, make_run):
    def build(checksum="crc32c", name="three"):
        return make_run(store, [maps_for(t, i) for i, t in enumerate(TOKENS)], TOKENS, name=name, checksum=checksum)

    return build


def cli(store, *args: str):
    return CliRunner().invoke(main, [*args, "--db", _url(store), "--root", store.locations.array_root])


def one_line_error(result) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


def problems_of(problems, chunk_suffix: str):
    return problems[problems["chunk"].fillna("").str.endswith(chunk_suffix)]


# ---------------------------------------------------------------- item 8: a missing chunk beside a damaged one

# (checksum, how chunk 3 is damaged); chunk 0 (example 0) is missing. Without checksums a truncated chunk is caught by
# its blosc header before decoding.
MIXED = [("crc32c", "flipped"), ("crc32c", "truncated"), (None, "truncated")]


@pytest.mark.parametrize("slab", [16, 2, 1], ids=["one-slab", "two-slabs", "slab-per-chunk"])
@pytest.mark.parametrize("checksum,how", MIXED, ids=[f"{c or 'no-checksum'}-{h}" for c, h in MIXED])
def test_check_reports_a_missing_chunk_beside_a_damaged_one(store, three, monkeypatch, slab, checksum, how):
    """The exact input of the crash: one group of chunks holds a missing chunk, and the same or another group a
    damaged one. `check` lists both, each with the examples it holds, and returns (exit 1), never raising."""
    monkeypatch.setattr(check_mod, "SLAB_CHUNKS", slab)
    run = three(checksum)
    info = store.run_info(run)
    damage(chunk_file(store, run, 0), "missing")
    damage(chunk_file(store, run, 2).parent / "3", how)  # the last chunk of example 2
    summary, problems = check_store(store)
    missing, damaged = problems_of(problems, "/c/0"), problems_of(problems, "/c/3")
    assert list(missing["example"]) == [0] and "is missing" in missing["problem"].iloc[0], problems.to_string()
    assert list(damaged["example"]) == [2], problems.to_string()
    assert damaged["problem"].str.contains("damaged|truncated").all()
    assert summary["problems"].tolist() == [len(problems)] and summary["examples"].tolist() == [3]
    assert not problems["example"].isin([1]).any()  # example 1's chunks (1, 2) are fine
    result = cli(store, "check", "--format", "csv")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert f"{info.array_path}/c/0" in result.output and f"{info.array_path}/c/3" in result.output


def test_every_bad_chunk_of_one_example_is_named(store, make_run):
    """An example over several chunks, two of them bad (one missing, one damaged): both are listed for it."""
    tokens = [["[CLS]", *"abcdef", "[SEP]"]]  # 2 x 2 x 8 x 8 = 256 cells: chunks 0-3
    run = make_run(store, [maps_for(tokens[0], 0)], tokens, name="long")
    assert check_store(store)[1].empty  # its last block ends on a chunk boundary: the index was still written
    folder = Path(store.locations.array_root) / store.run_info(run).array_path / "c"
    damage(folder / "1", "missing")
    damage(folder / "3", "flipped")
    problems = check_store(store)[1]
    assert sorted(problems["chunk"].str.rsplit("/", n=1).str[-1]) == ["1", "3"], problems.to_string()
    assert set(problems["example"]) == {0}


# ---------------------------------------------------------------- item 9: a run's zarr.json that is not valid

FIX = "restore it from a bundle or backup, or re-ingest the run"


def spoil_metadata(path: Path, how: str) -> None:
    if how == "not-json":
        path.write_text('{"zarr_format": 3, "node_type": "array", "shape": [', encoding="utf-8")  # cut off mid-write
    else:
        meta = json.loads(path.read_text(encoding="utf-8"))
        meta["data_type"] = {"int16": "int16", "float16": "float16", "unknown": "float99"}[how.split(":")[1]]
        path.write_text(json.dumps(meta), encoding="utf-8")


METADATA = ["not-json", "data-type:int16", "data-type:float16", "data-type:unknown"]


@pytest.mark.parametrize("how", METADATA)
def test_an_invalid_run_zarr_json_is_one_line_naming_the_file_and_check_lists_it(store, three, how):
    """query, attention and check on a run whose cells zarr.json is not JSON, or names another data type (float16
    for float32 chunks decodes as garbage of twice the length; int16 as integers): one line naming the file and the
    fix, and `check` lists it as damage of that run."""
    run = three()
    info = store.run_info(run)
    meta = Path(store.locations.array_root) / info.array_path / "zarr.json"
    spoil_metadata(meta, how)
    line = one_line_error(cli(store, "query", "entropy", "--run", run))
    assert str(meta) in line and FIX in line, line
    for args in (["tokens", "--run", run, "--example", "0"], ["show", run]):  # SQL only: unaffected
        assert cli(store, *args).exit_code == 0
    with pytest.raises(DamagedDataError, match="zarr.json is damaged") as err:
        store.attention(run, 1)
    assert str(meta) in str(err.value) and "\n" not in str(err.value)

    summary, problems = check_store(store)
    assert summary["problems"].tolist() == [1] and len(problems) == 1, problems.to_string()
    assert problems["run"].iloc[0] == run and problems["chunk"].iloc[0] == f"{info.array_path}/zarr.json"
    assert str(meta) in problems["problem"].iloc[0] and FIX in problems["problem"].iloc[0]
    result = cli(store, "check", "--format", "json")
    assert result.exit_code == 1 and "Traceback" not in result.output and f"{info.array_path}/zarr.json" in result.output


@pytest.mark.parametrize("node", ["group", "index", "root"])
def test_other_invalid_zarr_json_files_are_listed_by_check(store, three, node):
    """The run's group and index arrays (read by check and by plain-zarr readers), and the root group (opened by every
    new ingest) are checked too; queries read the cells only, so they still work."""
    run = three()
    group = Path(store.locations.array_root) / arrays.group_path_of(store.run_info(run).array_path)
    root = Path(store.locations.array_root)
    path = {"group": group / "zarr.json", "index": group / "offset" / "zarr.json", "root": root / "zarr.json"}[node]
    path.write_text("{not json", encoding="utf-8")
    problems = check_store(store)[1]
    assert len(problems) == 1 and str(path) in problems["problem"].iloc[0] and "is damaged" in problems["problem"].iloc[0], problems
    assert cli(store, "check").exit_code == 1
    assert cli(store, "query", "entropy", "--run", run).exit_code == 0


# ---------------------------------------------------------------- item 11: temporary files of killed writers

KILLED_WRITE = """
import os, pathlib, signal, sys
from attnstore.store import arrays
array = arrays.open_run_array(sys.argv[1], sys.argv[2], read_only=False)
def killed(self, target):  # zarr's LocalStore writes KEY.<hex>.partial, then renames it: die in between
    os.kill(os.getpid(), signal.SIGKILL)
pathlib.Path.replace = killed
array.resize((array.shape[0] + array.chunks[0],))
"""


def killed_writer_leftover(store, run: str) -> str:
    """Kill a real writer (zarr's own write path) between writing a key's temporary file and renaming it."""
    info = store.run_info(run)
    done = subprocess.run([sys.executable, "-c", KILLED_WRITE, store.locations.array_root, info.array_path], capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    base = Path(store.locations.array_root)
    left = [p.relative_to(base).as_posix() for p in base.rglob("*.partial")]
    assert len(left) == 1 and arrays.PARTIAL_FILE.search(left[0]), left
    return left[0]


def test_a_killed_writers_partial_file_is_reported_skipped_by_export_and_repaired(store, three, tmp_path):
    run = three()
    key = killed_writer_leftover(store, run)
    assert key.startswith(arrays.group_path_of(store.run_info(run).array_path) + "/")
    summary, problems = check_store(store)
    assert list(problems["chunk"]) == [key] and "leftover temporary file" in problems["problem"].iloc[0], problems
    result = cli(store, "check")
    assert result.exit_code == 1 and "leftover temporary file" in result.output
    np.testing.assert_array_equal(store.attention(run, 2), maps_for(TOKENS[2], 2))  # the run itself is intact

    export_runs(store, [run], str(tmp_path / "bundle"))
    with open_bundle(str(tmp_path / "bundle")) as bundle:
        assert not [name for name in bundle.files if ".partial" in name]
    assert not list((tmp_path / "bundle").rglob("*.partial"))

    repaired = cli(store, "check", "--repair")  # the command line's way to remove it
    assert repaired.exit_code == 0 and "removed 1 leftover temporary file(s)" in repaired.output, repaired.output
    assert not list(Path(store.locations.array_root).rglob("*.partial")) and check_store(store)[1].empty

    killed_writer_leftover(store, run)  # and the Python API's
    summary, problems = check_store(store, repair=True)
    assert problems.empty and len(problems.attrs["repaired"]) == 1
    assert not list(Path(store.locations.array_root).rglob("*.partial")) and check_store(store)[1].empty


def test_a_resumed_writer_removes_partial_files(store, make_run):
    name, writer = make_run(store, [maps_for(TOKENS[0], 0)], TOKENS[:1], name="cut", finish=False)
    writer.close()  # interrupted, like a killed ingest
    killed_writer_leftover(store, name)
    assert len(check_store(store)[1]) == 1
    store.writer.run_writer(name).finish(0.0)
    assert not list(Path(store.locations.array_root).rglob("*.partial"))
    assert check_store(store)[1].empty


def test_partial_files_of_a_run_being_written_or_of_a_recent_summary_are_left_alone(store, make_run, three):
    """They may be writes in flight: a live writer's (its run is `writing`), or a query keeping a summary (no lease)."""
    name, writer = make_run(store, [maps_for(TOKENS[0], 0)], TOKENS[:1], name="live", finish=False)
    try:
        key = killed_writer_leftover(store, name)
        assert check_store(store, [name], repair=True)[1].empty
        assert (Path(store.locations.array_root) / key).exists()
    finally:
        writer.close()
    run = three()
    summary = Path(store.locations.array_root) / arrays.group_path_of(store.run_info(run).array_path) / "summary" / "s"
    summary.mkdir(parents=True)
    (summary / "zarr.0123456789abcdef0123456789abcdef.partial").write_bytes(b"{}")
    assert check_store(store, [run], repair=True)[1].empty and len(list(summary.iterdir())) == 1


def test_an_old_bundle_holding_partial_files_imports_without_them(store, three, tmp_path):
    """Bundles exported before export skipped them: the import leaves them out."""
    import hashlib

    run = three()
    export_runs(store, [run], str(tmp_path / "b"))
    manifest_path = tmp_path / "b" / "manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    name = f"arrays/{store.run_info(run).array_path}/c/9.0123456789abcdef0123456789abcdef.partial"
    (tmp_path / "b" / name).write_bytes(b"half")
    manifest["files"][name] = {"sha256": hashlib.sha256(b"half").hexdigest(), "size": 4}
    manifest_path.write_text(json.dumps(manifest), encoding="utf-8")
    from attnstore.store import migrate, open_store

    url = f"sqlite:///{tmp_path / 'dst.sqlite'}"
    migrate.upgrade(url)
    dst = open_store(db=url, root=str(tmp_path / "dst.zarr"))
    assert import_bundle(dst, str(tmp_path / "b")).imported == (run,)
    assert not list((tmp_path / "dst.zarr").rglob("*.partial")) and check_store(dst)[1].empty
    dst.close()
