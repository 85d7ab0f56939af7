"""What makes `attnstore serve` fast under load (issue 29): `GET /api/health`, maps of one head or one layer as `.npy`
equal to their JSON, the JSON of float16 maps written from a table of every value's text (the same bytes as before),
what the server keeps between requests read afresh when the store changes, and `--workers 2` on a live server."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

with warnings.catch_warnings():  # starlette's TestClient asks for httpx2; httpx still works
    warnings.filterwarnings("ignore", message=".*httpx2")
    from fastapi.testclient import TestClient

from attnstore.api.http.encoding import dumps, float16_json, npy_bytes  # noqa: E402
from attnstore.api.serve import ServeSettings, create_app, default_workers  # noqa: E402

TOKENS = [["[CLS]", "a", "b", "c", "[SEP]"], ["[CLS]", "d", "e", "f", "g", "h", "[SEP]"]]


def maps_of(length: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    maps = rng.random((2, 3, length, length)).astype(np.float32)
    return maps / maps.sum(-1, keepdims=True)


@pytest.fixture(params=["float16", "float32"])
def fast(request, store, make_run):
    maps = [maps_of(len(t), seed) for seed, t in enumerate(TOKENS)]
    make_run(store, maps, TOKENS, name="fast", dtype=request.param)
    return store, request.param


@pytest.mark.one_backend
def test_health_answers_without_reading_the_store(fast):
    store, _ = fast
    with TestClient(create_app(store, allowed_hosts=["testserver"])) as c:
        got = c.get("/api/health")
        assert got.status_code == 200 and got.json() == {"status": "ok"} and got.headers["content-type"] == "application/json"
    assert "/api/health" in c.app.openapi()["paths"]


@pytest.mark.one_backend
def test_npy_of_one_head_and_one_layer_equals_the_json(fast):
    store, dtype = fast
    with TestClient(create_app(store, allowed_hosts=["testserver"])) as c:
        for example in (0, 1):
            for params, layer, head in (
                ({"layer": 1, "head": 2}, [1], [2]),
                ({"layer": 0}, [0], None),
                ({"head": "0,2"}, None, [0, 2]),
                ({}, None, None),
            ):
                as_json = c.get(f"/api/runs/fast/examples/{example}/attention", params=params).json()
                got = c.get(f"/api/runs/fast/examples/{example}/attention", params={**params, "format": "npy"})
                assert got.status_code == 200 and got.headers["content-type"] == "application/octet-stream"
                array = np.load(io.BytesIO(got.content))
                assert str(array.dtype) == dtype == as_json["dtype"] and list(array.shape) == as_json["shape"]
                assert array.astype(np.float64).tolist() == as_json["attention"]  # exactly: every value, every digit
                assert np.array_equal(array, store.attention("fast", example, layer=layer, head=head))
            rounded = c.get(f"/api/runs/fast/examples/{example}/attention", params={"layer": 1, "digits": 3}).json()
            assert rounded["attention"] == np.round(store.attention("fast", example, layer=1).astype(np.float64), 3).tolist()


def test_npy_bytes_are_np_saves():
    """The `.npy` answers' bytes (`npy_bytes`, one copy of the data) equal `np.save`'s, for several dtypes and shapes,
    a strided view and a 0-d array."""
    import io

    rng = np.random.default_rng(0)
    for dtype in (np.float16, np.float32, np.float64, np.uint8):
        strided = np.arange(24, dtype=dtype).reshape(2, 3, 4)[:, ::2]
        for values in [rng.random(shape).astype(dtype) for shape in ((1, 1, 3, 3), (6, 12, 57, 57), (0,), (2, 3), ())] + [strided]:
            saved = io.BytesIO()
            np.save(saved, values, allow_pickle=False)
            assert npy_bytes(values) == saved.getvalue(), (dtype, values.shape)


def test_float16_json_is_the_bytes_of_json_dumps():
    """Every finite float16 value, at every rounding, and arrays of several shapes: the same text as the conversion
    to float64, rounding and `json.dumps` it replaces; None where that cannot apply (NaN, another dtype)."""
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = every[np.isfinite(every)].reshape(-1, 31)
    for digits in (None, 1, 2, 4, 8):
        reference = finite.astype(np.float64) if digits is None else np.round(finite.astype(np.float64), digits)
        assert float16_json(finite, digits) == dumps(reference.tolist())
    rng = np.random.default_rng(0)
    for shape in ((3,), (1, 1, 4, 4), (2, 3, 5, 5), (2, 1, 1, 1)):
        values = rng.random(shape).astype(np.float16)
        assert float16_json(values, 4) == dumps(np.round(values.astype(np.float64), 4).tolist())
    with_nan = rng.random((2, 2)).astype(np.float16)
    with_nan[1, 0] = np.nan
    assert float16_json(with_nan) is None and float16_json(with_nan.astype(np.float32)) is None


@pytest.mark.one_backend
def test_what_is_kept_is_read_afresh_when_the_store_changes(fast, make_run):
    """Runs' info and examples' tokens are kept between requests only while the SQLite file is unchanged: a run added
    by another writer is answered at once."""
    store, _ = fast
    with TestClient(create_app(store.locations, allowed_hosts=["testserver"])) as c:
        assert c.get("/api/runs/fast/examples/1").json()["tokens"][1]["token"] == "d"
        assert c.get("/api/runs/later").status_code == 404
        make_run(store, [maps_of(5, 9)], [TOKENS[0]], name="later")
        assert c.get("/api/runs/later").json()["run"]["n_stored"] == 1
        assert c.get("/api/runs/later/examples/0").json()["tokens"][1]["token"] == "a"
        assert ServeSettings().info_ttl_s == 1.0


def test_default_workers_is_the_cpu_count_within_bounds():
    assert 1 <= default_workers() <= min(8, os.cpu_count() or 1)


def two_workers(store, *options: str) -> tuple[subprocess.Popen, str]:
    """`attnstore serve --workers 2` over `store` on a free 127.0.0.1 port, answering: (the server, its base URL); the
    caller stops it (SIGINT)."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "attnstore.api.cli", "serve", "--port", str(port), "--workers", "2", "--no-access-log", *options]
    command += ["--db", store.locations.db_url, "--root", store.locations.array_root]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if server.poll() is not None:
            raise AssertionError(server.stdout.read() if server.stdout else "the server exited")
        try:
            if httpx.get(base + "/api/health", timeout=2).status_code == 200:
                return server, base
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.kill()
            raise AssertionError("the server did not answer within 60 s")
        time.sleep(0.2)


@pytest.mark.one_backend
@pytest.mark.slow  # a live server of two worker processes
def test_two_worker_processes_serve_every_request(fast):
    """`attnstore serve --workers 2` on 127.0.0.1: both processes answer (the health check, maps equal to the store's,
    tokens) over many connections, without Nagle's 40 ms per answer; Ctrl-C stops them all, within seconds."""
    import httpx

    store, _ = fast
    server, base = two_workers(store)
    try:
        expected = store.attention("fast", 1, layer=[1], head=[2])
        for n in range(40):  # a new connection each: the kernel hands them to either process
            with httpx.Client(timeout=10) as http:
                got = http.get(f"{base}/api/runs/fast/examples/1/attention", params={"layer": 1, "head": 2, "format": "npy"})
                assert got.status_code == 200 and np.array_equal(np.load(io.BytesIO(got.content)), expected), n
                assert http.get(f"{base}/api/runs/fast/examples/{n % 2}").json()["tokens"][0]["token"] == "[CLS]"
        with httpx.Client(timeout=10) as http:  # one kept-alive connection: no 40 ms delayed ACK per answer (Nagle)
            took = []
            for _ in range(20):
                t0 = time.perf_counter()
                assert http.get(f"{base}/api/health").status_code == 200
                took.append(time.perf_counter() - t0)
            assert min(took) < 0.030, took  # with Nagle's algorithm on, every answer took >= 40 ms
    finally:
        server.send_signal(signal.SIGINT)
        try:
            output, _ = server.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
    assert server.returncode == 0, output
    assert "2 worker processes" in output and output.count("Application startup complete") == 2, output
