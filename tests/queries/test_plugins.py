"""Queries from installed packages (queries/engine/registry.py, entry-point group `attnstore.queries`): a real package,
built and installed by pip from tests/fixtures/query_plugin (CONTRIBUTING.md's example), is listed by `attnstore
queries` and runs from the command line, over HTTP and from Python; a plugin that fails to load, or takes a built-in
query's name, is left out with one warning, and every other query works."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from attnstore.queries import QUERIES, run_query
from attnstore.queries.engine import registry

FIXTURE = Path(__file__).parents[1] / "fixtures" / "query_plugin"
TOKENS = [["[CLS]", "a", "b", "[SEP]"], ["[CLS]", "c", "[SEP]"]]

pytestmark = pytest.mark.slow  # pip builds and installs a package; the command line runs in fresh interpreters


def install(target: Path, source: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A folder with the example plugin installed in it (as `pip install` puts it in site-packages)."""
    target = tmp_path_factory.mktemp("site")
    install(target, FIXTURE)
    assert (target / "attnstore_mean_distance").is_dir() and list(target.glob("attnstore_mean_distance-0.1.0.dist-info"))
    return target


@pytest.fixture
def plugins_from(monkeypatch):
    """Make the registry look at the entry points of `folder` (on sys.path), and forget them afterwards."""
    registry.load_all(plugins=False)
    saved = dict(QUERIES)  # the built-in queries, restored afterwards

    def use(folder: Path) -> None:
        monkeypatch.syspath_prepend(str(folder))
        registry._loaded.discard("plugins")

    yield use
    QUERIES.clear()
    QUERIES.update(saved)
    registry._loaded.discard("plugins")
    for name in [m for m in sys.modules if m.startswith(("attnstore_mean_distance", "broken_plugin", "taken_plugin"))]:
        del sys.modules[name]


@pytest.fixture
def run(store, make_run):
    maps = [np.eye(4, dtype=np.float32)[::-1].copy()[None, None].repeat(2, 1), np.full((1, 2, 3, 3), 1 / 3, np.float32)]
    return make_run(store, maps, TOKENS, name="plugged")


def expected_distance() -> float:
    """Example 0 attends from token i to 3 - i (distances 3, 1, 1, 3: 8), example 1 uniformly over 3 tokens (the 9
    distances |i - j| weighted 1/3: 8/3): their sum over the 7 query tokens."""
    first = 3 + 1 + 1 + 3
    second = sum(abs(i - j) / 3 for i in range(3) for j in range(3))
    return (first + second) / 7


@pytest.mark.one_backend
def test_a_plugin_query_runs_from_python_the_cli_and_http(site, plugins_from, store, run):
    plugins_from(site)
    spec = registry.get_query("mean_attention_distance")
    assert spec.source == "attnstore-mean-distance" and spec.per_head
    frame = run_query(store, "mean_attention_distance", run=run)
    assert frame.shape == (2, 3) and np.allclose(frame["distance"], expected_distance())
    assert "note" not in frame.attrs

    from fastapi.testclient import TestClient

    from attnstore.api.serve import create_app

    with TestClient(create_app(store, allowed_hosts=["testserver"])) as client:
        listed = {q["name"] for q in client.get("/api/queries").json()["queries"]}
        assert "mean_attention_distance" in listed and "entropy" in listed
        got = client.get("/api/runs/plugged/queries/mean_attention_distance").json()
        assert got["columns"] == ["layer", "head", "distance"] and np.isclose(got["rows"][0][2], expected_distance())

    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    command = [sys.executable, "-m", "attnstore.api.cli"]
    listing = subprocess.run([*command, "queries"], env=env, capture_output=True, text=True, check=True).stdout
    line = next(line for line in listing.splitlines() if line.startswith("mean_attention_distance"))
    assert "(from attnstore-mean-distance)" in line
    result = subprocess.run(
        [*command, "query", "mean_attention_distance", "--run", run, "--format", "csv", *where], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    assert lines[0] == "layer,head,distance" and [line.rsplit(",", 1)[0] for line in lines[1:]] == ["0,0", "0,1"]
    assert np.allclose([float(line.rsplit(",", 1)[1]) for line in lines[1:]], expected_distance())
    without = subprocess.run([*command, "queries"], capture_output=True, text=True, check=True).stdout
    assert "mean_attention_distance" not in without  # not installed there: nothing of it


@pytest.mark.one_backend
def test_a_broken_plugin_or_a_taken_name_is_left_out_with_one_warning(tmp_path, plugins_from, store, run):
    target = tmp_path / "site"
    for name, body in (
        ("broken_plugin", "raise RuntimeError('this plugin needs a GPU')\n"),
        (
            "taken_plugin",
            "from attnstore.queries import register\n\n@register('entropy')\ndef entropy(store, *, run):\n    '''Not the real one.'''\n",
        ),
    ):
        package = tmp_path / name
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text(body)
        (package / "pyproject.toml").write_text(
            f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n[project]\nname = "{name}"\n'
            f'version = "1"\n[project.entry-points."attnstore.queries"]\n{name} = "{name}"\n'
        )
        install(target, package)
    plugins_from(target)
    real_entropy = QUERIES["entropy"].func
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry.load_all()
    messages = sorted(str(w.message) for w in caught if issubclass(w.category, registry.PluginWarning))
    assert len(messages) == 2, messages
    assert messages[0].startswith("query plugin 'broken_plugin' (broken_plugin, package broken_plugin) was not loaded: ")
    assert "RuntimeError: this plugin needs a GPU; fix or uninstall that package" in messages[0]
    assert "query 'entropy' of taken_plugin (taken_plugin) is registered already, by attnstore.queries.clark (attnstore)" in messages[1]
    assert QUERIES["entropy"].source == "attnstore" and QUERIES["entropy"].func is real_entropy
    assert len(run_query(store, "entropy", run=run)) == 2
