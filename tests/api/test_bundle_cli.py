"""`attnstore export` / `attnstore import` through click: a round trip, and every bad input as one line that writes nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.store import migrate, open_store

TOKENS = [["[CLS]", "a", "dog", "[SEP]"], ["[CLS]", "b", "[SEP]"]]


def maps(length: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    m = rng.random((2, 2, length, length)).astype(np.float32) + 0.01
    return m / m.sum(-1, keepdims=True)


@pytest.fixture
def source(tmp_path, make_run):
    """A SQLite store with one complete run 'r' and the CLI options that reach it."""
    url = f"sqlite:///{tmp_path / 'src' / 'meta.sqlite'}"
    (tmp_path / "src").mkdir()
    migrate.upgrade(url)
    store = open_store(db=url, root=str(tmp_path / "src" / "attention.zarr"))
    make_run(store, [maps(len(t), i) for i, t in enumerate(TOKENS)], TOKENS, name="r")
    return store, ["--db", url, "--root", str(tmp_path / "src" / "attention.zarr")]


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.output, result.output
    return lines[0]


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()} if folder.exists() else {}


def test_export_then_import_then_import_again(tmp_path, source):
    store, opts = source
    bundle = tmp_path / "r.zip"
    out = invoke("export", "--run", "r", "--to", bundle, *opts)
    assert out.exit_code == 0, out.output
    assert "exported 1 run(s) ('r')" in out.output and bundle.is_file()

    home = tmp_path / "colleague"
    first = invoke("import", bundle, "--home", home)
    assert first.exit_code == 0, first.output
    assert "imported run(s) 'r'" in first.output
    again = invoke("import", bundle, "--home", home)
    assert again.exit_code == 0 and "already imported: r; nothing to do" in again.output
    dst = open_store(home=str(home))
    assert np.array_equal(dst.attention("r", 1), store.attention("r", 1))
    listed = invoke("runs", "--home", home, "--format", "json")
    assert [r["run"] for r in json.loads(listed.output)] == ["r"]


def test_bad_inputs_are_one_line_errors_and_write_nothing(tmp_path, source, make_run):
    store, opts = source
    good = tmp_path / "good"
    assert invoke("export", "--run", "r", "--to", good, *opts).exit_code == 0

    # unknown run, refused export target, nothing to export
    assert "no run 'nope'" in one_line_error(invoke("export", "--run", "nope", "--to", tmp_path / "x.zip", *opts))
    assert "already exists" in one_line_error(invoke("export", "--run", "r", "--to", good, *opts))
    assert "nothing to export" in one_line_error(invoke("export", "--to", tmp_path / "x.zip", *opts))
    assert not (tmp_path / "x.zip").exists()

    # bad bundles, into a store that does not exist yet: it is not even created
    fresh = tmp_path / "fresh"
    assert "no bundle at" in one_line_error(invoke("import", tmp_path / "missing.zip", "--home", fresh))
    damaged = tmp_path / "damaged"
    shutil.copytree(good, damaged)
    chunk = next(p for p in sorted(damaged.rglob("*")) if p.is_file() and p.parent.name == "c")
    chunk.write_bytes(chunk.read_bytes()[:-1] + bytes([chunk.read_bytes()[-1] ^ 1]))
    message = one_line_error(invoke("import", damaged, "--home", fresh))
    assert chunk.relative_to(damaged).as_posix() in message and "checksum" in message
    newer = tmp_path / "newer"
    shutil.copytree(good, newer)
    manifest = json.loads((newer / "manifest.json").read_text(encoding="utf-8"))
    (newer / "manifest.json").write_text(json.dumps({**manifest, "format_version": 7}), encoding="utf-8")
    assert "format version 7" in one_line_error(invoke("import", newer, "--home", fresh))
    newer_schema = tmp_path / "newer-schema"  # issue 24 item 11: exported from a database this attnstore cannot read
    shutil.copytree(good, newer_schema)
    (newer_schema / "manifest.json").write_text(json.dumps({**manifest, "schema_revision": "0099_future"}), encoding="utf-8")
    message = one_line_error(invoke("import", newer_schema, "--home", fresh))
    assert "schema revision '0099_future'" in message and f"revision {manifest['schema_revision']!r}" in message, message
    assert "upgrade attnstore" in message
    assert not fresh.exists()

    # a target that holds another run 'r', or that is read-only: refused, unchanged
    target = tmp_path / "target"
    target.mkdir()
    url = f"sqlite:///{target / 'meta.sqlite'}"
    migrate.upgrade(url)
    make_run(open_store(db=url, root=str(target / "attention.zarr")), [maps(3, 9)], [["[CLS]", "z", "[SEP]"]], name="r")
    before = tree(target)
    message = one_line_error(invoke("import", good, "--home", target))
    assert "run 'r' already exists" in message and "--rename r=NEW_NAME" in message
    assert "read-only" in one_line_error(invoke("import", good, "--home", target, "--read-only"))
    assert tree(target) == before
    renamed = invoke("import", good, "--home", target, "--rename", "r=r-shared")
    assert renamed.exit_code == 0 and "'r-shared'" in renamed.output
    assert invoke("import", good, "--home", target, "--rename", "r").exit_code == 2  # usage error: not OLD=NEW


def test_an_incomplete_run_is_not_exported(tmp_path, source, make_run):
    store, opts = source
    _, writer = make_run(store, [maps(3, 1)], [["[CLS]", "x", "[SEP]"]], name="busy", finish=False)
    try:
        assert "'busy' is running, not complete" in one_line_error(invoke("export", "--run", "busy", "--to", tmp_path / "b.zip", *opts))
    finally:
        writer.close()
    assert not list(tmp_path.glob("b.zip*"))


def test_s3_without_the_extra_is_the_install_line(tmp_path, source, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "s3fs" else real(name, *a))
    _, opts = source
    message = one_line_error(invoke("export", "--run", "r", "--to", "s3://bucket/bundle", *opts))
    assert "'s3' extra" in message and "pip install" in message
    message = one_line_error(invoke("import", "s3://bucket/bundle", "--home", tmp_path / "h"))
    assert "'s3' extra" in message
