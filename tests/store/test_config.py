from pathlib import Path

from attnstore.store.config import redact, resolve_locations


def test_default_is_an_embedded_store_in_the_working_directory(monkeypatch, tmp_path):
    for var in ("ATTNSTORE_HOME", "ATTNSTORE_DB", "ATTNSTORE_ROOT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    loc = resolve_locations()
    assert loc.db_url == f"sqlite:///{tmp_path / 'attnstore-data' / 'meta.sqlite'}"
    assert loc.array_root == str(tmp_path / "attnstore-data" / "attention.zarr")


def test_option_beats_environment_beats_default(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNSTORE_DB", "postgresql+psycopg://u@h/env")
    monkeypatch.setenv("ATTNSTORE_ROOT", "s3://bucket/env")
    assert resolve_locations().db_url == "postgresql+psycopg://u@h/env"
    assert resolve_locations().array_root == "s3://bucket/env"
    loc = resolve_locations(db="sqlite:////x/opt.sqlite", root="/opt/root")
    assert (loc.db_url, loc.array_root) == ("sqlite:////x/opt.sqlite", "/opt/root")


def test_home_env_moves_both(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTNSTORE_DB", raising=False)
    monkeypatch.delenv("ATTNSTORE_ROOT", raising=False)
    monkeypatch.setenv("ATTNSTORE_HOME", str(tmp_path / "h"))
    loc = resolve_locations()
    assert loc.db_url.endswith(str(Path(tmp_path / "h" / "meta.sqlite")))
    assert loc.array_root == str(tmp_path / "h" / "attention.zarr")


def test_bare_path_means_sqlite_and_passwords_are_hidden(tmp_path):
    assert resolve_locations(db=str(tmp_path / "m.sqlite")).db_url == f"sqlite:///{tmp_path / 'm.sqlite'}"
    assert redact("postgresql+psycopg://bob:secret@db/x") == "postgresql+psycopg://bob:***@db/x"
