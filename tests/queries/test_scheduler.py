"""The per-example pass on Dask distributed (queries/engine/passes.py): a LocalCluster of 2 worker processes
summarises ranges of a run on SQLite and PostgreSQL, with results exactly equal to the one-process pass."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.queries import run_query
from attnstore.queries.clark import CLARK
from attnstore.queries.engine import summarise_examples, summary
from attnstore.queries.engine.passes import check_scheduler, split, use_scheduler
from attnstore.queries.errors import InvalidArgumentError
from attnstore.store import open_store

distributed = pytest.importorskip("distributed")

TOKENS = [["[CLS]", *(["a", ",", "b", "."] * (1 + i % 3))[: 2 + i % 5], "[SEP]"] for i in range(9)]


def random_maps(tokens, seed):
    rng = np.random.default_rng(seed)
    raw = rng.random((3, 2, len(tokens), len(tokens)), dtype=np.float32) ** 3 + 1e-3
    return (raw / raw.sum(-1, keepdims=True)).astype(np.float16)


@pytest.fixture(scope="module")
def cluster():
    """Two single-threaded worker processes, as `--scheduler local:2` starts; shared by the tests here."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as local:
        yield local.scheduler_address


@pytest.fixture
def run(store, make_run):
    return make_run(store, [random_maps(t, i) for i, t in enumerate(TOKENS)], TOKENS, name="spread", dtype="float16")


def test_ranges_are_contiguous_and_cover_every_example():
    assert split([5, 1, 9, 2, 7], 2) == [[5, 1, 9], [2, 7]]
    assert split([3], 8) == [[3]]
    assert sum(split(list(range(100)), 8), []) == list(range(100))


def test_the_pass_on_two_workers_equals_one_process_exactly(store, run, cluster):
    info = store.run_info(run)
    alone = summarise_examples(store, info, CLARK)
    with use_scheduler(cluster):
        spread = summary(store, info, CLARK)
    assert spread.keys() == alone.keys()
    for field in alone:
        np.testing.assert_array_equal(spread[field], alone[field], err_msg=field)
    # and it was kept with the run: the next query reads it without a scheduler
    assert zarr.open_group(store.locations.array_root, path="runs/spread/summary/clark", mode="r").attrs["stamp"]["n_examples"] == 9


@pytest.mark.parametrize("name", ["relative_position", "special_tokens", "entropy"])
def test_queries_on_a_read_only_store_use_the_workers_and_keep_nothing(store, run, cluster, name):
    reader = open_store(db=store.locations.db_url, root=store.locations.array_root, read_only=True)
    try:
        with use_scheduler(cluster):
            spread = run_query(reader, name, run=run, examples=[8, 0, 3])
        local = run_query(reader, name, run=run, examples=[8, 0, 3])  # in process: nothing kept, no scheduler
    finally:
        reader.close()
    assert "summary" not in zarr.open_group(store.locations.array_root, path="runs/spread", mode="r")
    for column in local.columns:
        np.testing.assert_allclose(spread[column].to_numpy(float), local[column].to_numpy(float), rtol=1e-12, atol=1e-15)


@pytest.mark.slow  # a Dask cluster of worker processes
def test_summarize_command_with_a_local_cluster(store, run):
    where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    result = CliRunner().invoke(main, ["summarize", "--run", run, "--kind", "clark", "--scheduler", "local:2", *where])
    assert result.exit_code == 0, result.output
    assert "spread: summary clark covers 9 examples" in result.output
    stamp = zarr.open_group(store.locations.array_root, path="runs/spread/summary/clark", mode="r").attrs["stamp"]
    assert stamp["n_examples"] == 9


def test_bad_scheduler_specs_are_one_line_errors(store, run):
    for spec in ("local:0", "locl", "tcp://host", "http://x:1"):
        with pytest.raises(InvalidArgumentError, match="use local, local:N .* or tcp://HOST:PORT"):
            check_scheduler(spec)
    where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    result = CliRunner().invoke(main, ["query", "entropy", "--run", run, "--scheduler", "local:x", *where])
    assert result.exit_code != 0 and "scheduler 'local:x' is not understood" in result.output
    # unknown summary kind
    result = CliRunner().invoke(main, ["summarize", "--run", run, "--kind", "nope", *where])
    assert result.exit_code != 0 and "no summary kind 'nope'; kinds: " in result.output and "clark" in result.output


@pytest.mark.one_backend
@pytest.mark.slow  # waits out a connection timeout
def test_an_unreachable_scheduler_is_a_bounded_one_line_error(store, run, monkeypatch):
    from attnstore.store import cluster

    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 2)  # the bound, shortened: the test waits it out
    monkeypatch.setenv("ATTNSTORE_SCHEDULER", "tcp://127.0.0.1:9")  # nothing listens on the discard port
    info = store.run_info(run)
    with pytest.raises(InvalidArgumentError, match=r"cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        summary(store, info, CLARK)
