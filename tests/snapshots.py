"""Stores that a module's tests build the same way, built once per session and copied for each test (on SQLite).

Imported as `attnstore.tests.snapshots` (the tests run with --import-mode=importlib); tests/conftest.py's
`store_snapshots` fixture holds the session's StoreSnapshots."""

from __future__ import annotations

import shutil
import sqlite3

import pytest


class StoreSnapshots:
    """Stores a module's tests build the same way (a run made by `make_run`, say), built once per session (per xdist
    worker) on SQLite and copied for each test that asks: its SQLite file and array root cost a few milliseconds to
    copy, where building them again cost 0.15-0.5 s a test. On PostgreSQL each test builds its own, as before.

    `store_snapshots.open(db_url, tmp_path, key, build)` -> (store, what `build(store)` returned); the caller closes
    the store. `key` names what `build` makes (its module and parameters): the same key, the same store. With
    `build=None`: the plain `store` fixture's empty store (and None).
    A test module uses it in its own `store` fixture (`store_with` below), which replaces conftest.py's there."""

    def __init__(self, factory, migrated):
        self.factory, self.migrated = factory, migrated
        self.built: dict[str, tuple] = {}

    def open(self, db_url: str, tmp_path, key: str, build=None):
        from attnstore.store import open_store

        root = tmp_path / "attention.zarr"
        if build is None or not db_url.startswith("sqlite:"):
            store = open_store(db=db_url, root=str(root))
            return store, None if build is None else build(store)
        assert db_url == f"sqlite:///{tmp_path / 'meta.sqlite'}", db_url
        if key not in self.built:
            folder = self.factory.mktemp("snapshot")
            shutil.copyfile(self.migrated, folder / "meta.sqlite")
            with open_store(db=f"sqlite:///{folder / 'meta.sqlite'}", root=str(folder / "attention.zarr")) as built:
                value = build(built)
            conn = sqlite3.connect(folder / "meta.sqlite")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the main file, so copying it copies the store
            conn.close()
            self.built[key] = (folder, value)
        folder, value = self.built[key]
        shutil.copyfile(folder / "meta.sqlite", tmp_path / "meta.sqlite")
        shutil.rmtree(root, ignore_errors=True)
        if (folder / "attention.zarr").exists():
            shutil.copytree(folder / "attention.zarr", root)
        return open_store(db=db_url, root=str(root)), value


def store_with(needed: str, build, *, helper: str = "make_run"):
    """A test module's `store` fixture (`store = store_with("run", build)`), replacing conftest.py's there: for a test
    that asks for the fixture `needed`, the store `build(store, <the fixture named helper>)` fills, built once per
    session on SQLite and copied for the test (StoreSnapshots; on PostgreSQL built for the test); for any other test
    conftest.py's empty store. `needed` is then a fixture that names (or reads) what build made."""

    @pytest.fixture
    def store(request, db_url, tmp_path, store_snapshots):
        fill = None
        if needed in request.fixturenames:
            with_helper = request.getfixturevalue(helper)
            fill = lambda s: build(s, with_helper)  # noqa: E731
        key = f"{build.__module__}.{build.__qualname__}@{id(build)}:{needed}"  # the builder: one store per builder
        opened, _ = store_snapshots.open(db_url, tmp_path, key, fill)
        yield opened
        opened.close()

    return store
