"""`attnstore serve` against issue 24: the Host header (DNS rebinding), run names with "/" in them, the error
answers in the OpenAPI schema, the byte bound of SQL results and the limit on heavy requests at once, and
queries that would read many examples' maps on a store that cannot keep what they read.

Each test feeds the exact input of the report (`Host: evil.example`, a run named `glue/MRPC-dev-x`,
`select zeroblob(1000000000)`, ...) on SQLite and PostgreSQL.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import warnings
from urllib.parse import quote

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
with warnings.catch_warnings():  # starlette's TestClient asks for httpx2; httpx still works
    warnings.filterwarnings("ignore", message=".*httpx2")
    from fastapi.testclient import TestClient

from attnstore.api.http.middleware import keep_run_segment  # noqa: E402
from attnstore.api.serve import ServeSettings, allowed_hosts_for, create_app  # noqa: E402
from attnstore.queries import run_query  # noqa: E402
from attnstore.store.errors import InvalidArgumentError  # noqa: E402
from attnstore.tests.snapshots import store_with  # noqa: E402

TOKENS = [["[CLS]", "the", "cat", "sat", "[SEP]"], ["[CLS]", "a", "dog", "bark", "##ed", "[SEP]"]]
WORDS = [
    [
        dict(form="the", upos="DET", deprel="det", head=1),
        dict(form="cat", upos="NOUN", deprel="nsubj", head=2),
        dict(form="sat", upos="VERB", deprel="root"),
    ],
    [
        dict(form="a", upos="DET", deprel="det", head=1),
        dict(form="dog", upos="NOUN", deprel="nsubj", head=2),
        dict(form="barked", upos="VERB", deprel="root"),
    ],
]
TOKEN_WORDS = [[None, 0, 1, 2, None], [None, 0, 1, 2, 2, None]]
# Names as the default run names look (ud/en_ewt-dev[sample=500,seed=0]-all-MiniLM-L6-v2, glue/MRPC-dev-...), and one
# with a literal "%2F" in it (sent as %252F): it must not be decoded twice.
NAMES = ["glue/MRPC-dev-x", "ud/en_ewt-dev[sample=5,seed=0]-all-MiniLM-L6-v2", "odd%2Fname"]


def maps_for(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for tokens in TOKENS:
        m = rng.random((2, 3, len(tokens), len(tokens))).astype(np.float32)
        out.append(m / m.sum(-1, keepdims=True))
    return out


@pytest.fixture
def named(store):
    """A store with one run per name of NAMES, each with its own maps."""
    return store, {name: maps_for(seed) for seed, name in enumerate(NAMES)}


def build_named(store, make_run):
    for seed, name in enumerate(NAMES):
        make_run(store, maps_for(seed), TOKENS, name=name, words_list=WORDS, token_words=TOKEN_WORDS)


# For a test of `named`: the store build_named fills, built once per session on SQLite and copied (tests/snapshots.py).
store = store_with("named", build_named)


def error_of(response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and "Traceback" not in body["error"]
    return body["error"]


@contextlib.contextmanager
def live(app):
    """The app under uvicorn on a free 127.0.0.1 port (a real server's raw path and Host header)."""
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started or not thread.is_alive():
                break
            thread.join(0.05)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


# ------------------------------------------------------------------ 1. the Host header (DNS rebinding)


@pytest.mark.one_backend
def test_a_request_for_another_host_is_refused(named):
    store, _ = named
    with TestClient(create_app(store), base_url="http://127.0.0.1:8000", raise_server_exceptions=False) as c:
        assert c.get("/api/runs").status_code == 200  # Host: 127.0.0.1:8000
        for host in ("127.0.0.1", "localhost", "localhost:8000", "LOCALHOST:8000", "[::1]", "[::1]:8000"):
            assert c.get("/api/runs", headers={"Host": host}).status_code == 200, host
        message = error_of(c.get("/api/runs", headers={"Host": "evil.example"}), 400)
        assert "'evil.example' is not one this server answers (127.0.0.1, localhost, [::1])" in message and "--allowed-host" in message
        for host in ("evil.example:8000", "127.0.0.1.evil.example", "localhost.evil.example", "[::1", "localhost:x", ""):
            error_of(c.get("/api/runs", headers={"Host": host}), 400)
        for path in ("/", "/static/app.js", "/openapi.json", "/api/sql?q=SELECT%201"):  # the viewer and the schema too
            error_of(c.get(path, headers={"Host": "evil.example"}), 400)
        assert c.get("/api/info").json()["limits"]["allowed_hosts"] == ["127.0.0.1", "localhost", "[::1]"]
    with TestClient(create_app(store, allowed_hosts=["attn.lab"]), base_url="http://attn.lab", raise_server_exceptions=False) as c:
        assert c.get("/api/runs").status_code == 200
        error_of(c.get("/api/runs", headers={"Host": "localhost"}), 400)
    with TestClient(create_app(store, ServeSettings(allowed_hosts=("*",))), raise_server_exceptions=False) as c:
        assert c.get("/api/runs", headers={"Host": "evil.example"}).status_code == 200  # "*": any, by choice


@pytest.mark.one_backend
def test_the_command_answers_the_bound_host_and_allowed_hosts(named, monkeypatch, capsys):
    import uvicorn
    from click.testing import CliRunner

    from attnstore.api.http import protocol
    from attnstore.api.serve import WORKER_ENV, serve, worker_app

    assert (
        allowed_hosts_for("127.0.0.1") == allowed_hosts_for("localhost") == allowed_hosts_for("::1") == ("127.0.0.1", "localhost", "[::1]")
    )
    assert allowed_hosts_for("10.1.2.3") == ("10.1.2.3",) and allowed_hosts_for("fe80::1") == ("[fe80::1]",)
    assert allowed_hosts_for("0.0.0.0", ("attn.lab", "FE80::2")) == ("127.0.0.1", "localhost", "[::1]", "attn.lab", "[fe80::2]")
    assert allowed_hosts_for("10.1.2.3", ("*",)) == ("*",)
    assert allowed_hosts_for("10.1.2.3", ("Attn.Lab:8080", "*.lab.example")) == ("10.1.2.3", "attn.lab", "*.lab.example")
    for bad in ("a*b", "*lab", "", "x:y"):
        with pytest.raises(InvalidArgumentError, match="--allowed-host"):
            allowed_hosts_for("127.0.0.1", (bad,))
    store, _ = named
    apps = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: apps.append((app, kw)))  # one worker
    monkeypatch.setattr(protocol, "run_workers", lambda app, workers, host, port, **kw: apps.append((worker_app(), {"host": host, **kw})))
    monkeypatch.setenv(WORKER_ENV, "")  # --workers N > 1 (the default on a machine of several cores) sets it; put back after
    where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    result = CliRunner().invoke(serve, [*where, "--allowed-host", "attn.lab", "--allowed-host", "other.lab"])
    assert result.exit_code == 0, result.output
    app, kw = apps[-1]
    assert kw["host"] == "127.0.0.1"
    with TestClient(app, raise_server_exceptions=False) as c:
        for host in ("attn.lab", "other.lab:8000", "127.0.0.1:8000", "localhost"):
            assert c.get("/api/runs", headers={"Host": host}).status_code == 200, host
        error_of(c.get("/api/runs", headers={"Host": "evil.example"}), 400)
        error_of(c.get("/api/runs"), 400)  # the test client's own `testserver`
        # the command shows the server's log: how far a query got through the maps
        capsys.readouterr()
        assert c.get(f"/api/runs/{quote(NAMES[0], safe='')}/queries/entropy?scan=1", headers={"Host": "attn.lab"}).status_code == 200
        shown = capsys.readouterr().err
        assert f"attnstore.serve: entropy over run {NAMES[0]!r}: reading the maps of up to 2 examples" in shown
        assert "2 examples read in" in shown
    result = CliRunner().invoke(serve, [*where, "--host", "0.0.0.0"])
    assert "add the names clients use with --allowed-host NAME" in result.output
    result = CliRunner().invoke(serve, [*where, "--allowed-host", "a*b"])
    assert result.exit_code == 1 and "--allowed-host 'a*b'" in result.output and len(result.output.strip().splitlines()) == 1
    assert "--allowed-host" in CliRunner().invoke(serve, ["--help"]).output


# ------------------------------------------------------------------ 2. run names with "/" (and brackets, and "%")


@pytest.mark.one_backend
def test_every_run_is_reachable_whatever_its_name(named):
    store, maps = named
    with TestClient(create_app(store, allowed_hosts=["testserver"]), raise_server_exceptions=False) as c:
        listed = {r["run"]: r["run_id"] for r in c.get("/api/runs").json()["runs"]}
        assert set(listed) == set(NAMES)
        for name in NAMES:
            sent = quote(name, safe="")  # glue%2FMRPC-dev-x, ud%2Fen_ewt-dev%5Bsample%3D5%2Cseed%3D0%5D-..., odd%252Fname
            for run in (sent, sent.replace("%2F", "%2f"), str(listed[name])):
                assert c.get(f"/api/runs/{run}").json()["run"]["name"] == name, run
                page = c.get(f"/api/runs/{run}/examples").json()
                assert page["run"] == name and [e["example"] for e in page["items"]] == [0, 1]
                one = c.get(f"/api/runs/{run}/examples/1").json()
                assert [t["token"] for t in one["tokens"]] == TOKENS[1]
                got = c.get(f"/api/runs/{run}/examples/1/attention", params={"layer": 1, "head": 2}).json()
                assert got["run"] == name
                np.testing.assert_array_equal(np.array(got["attention"], dtype=np.float32)[0, 0], maps[name][1][1, 2])
                npy = c.get(f"/api/runs/{run}/examples/0/attention", params={"format": "npy"})
                assert npy.status_code == 200 and "/" not in npy.headers["content-disposition"].split("filename=")[1]
                assert c.get(f"/api/runs/{run}/head_metrics").json()["run"] == name
                computed = c.get(f"/api/runs/{run}/head_metrics/entropy.entropy").json()
                expected = run_query(store, "entropy", run=name)["entropy"].to_numpy().reshape(2, 3)
                np.testing.assert_allclose(np.array(computed["values"]), expected)
                assert c.get(f"/api/runs/{run}/queries/entropy").json()["run"] == name
                assert {"value": "NOUN", "n": 2} in c.get(f"/api/runs/{run}/annotations").json()["upos"]
                hits = c.get(f"/api/runs/{run}/search", params={"upos": "NOUN", "layer": 0, "head": 1}).json()["hits"]
                assert [(h["example"], h["token"]) for h in hits] == [(0, "cat"), (1, "dog")]
            # sent undecoded, the "/" splits the path: no such endpoint, or no such run (never another run's data)
            assert c.get(f"/api/runs/{name}/examples/0").status_code == 404
        assert "no run 'odd/name'" in error_of(c.get("/api/runs/odd%2Fname"), 404)  # %2F decoded once, not twice


@pytest.mark.one_backend
def test_run_names_with_a_slash_through_a_live_server(named):
    """uvicorn's own raw path (and Host header): what a browser or curl sends."""
    import httpx

    store, maps = named
    with live(create_app(store.locations)) as base, httpx.Client(base_url=base, timeout=20) as http:  # opened read-only
        got = http.get("/api/runs/glue%2FMRPC-dev-x/examples/0/attention", params={"layer": 0, "head": 0}).json()
        np.testing.assert_array_equal(np.array(got["attention"], dtype=np.float32)[0, 0], maps["glue/MRPC-dev-x"][0][0, 0])
        bracketed = quote(NAMES[1], safe="")
        assert http.get(f"/api/runs/{bracketed}").json()["run"]["name"] == NAMES[1]
        assert http.get("/api/runs/ud%2Fen_ewt-dev[sample=5,seed=0]-all-MiniLM-L6-v2/examples/1").json()["run"] == NAMES[1]
        assert http.get("/api/runs", headers={"Host": "evil.example"}).status_code == 400
        assert http.get("/api/runs", headers={"Host": "localhost"}).status_code == 200


def test_run_segment_without_a_raw_path():
    """A server that gives no raw_path: the (decoded) segment is re-encoded, so the endpoint's decoding gives it back."""
    scope = {"type": "http", "path": "/api/runs/a b%c/examples/0", "root_path": ""}
    assert keep_run_segment(scope)["path"] == "/api/runs/a%20b%25c/examples/0"
    raw = {**scope, "path": "/api/runs/glue/MRPC/examples/0", "raw_path": b"/api/runs/glue%2FMRPC/examples/0"}
    assert keep_run_segment(raw)["path"] == "/api/runs/glue%2FMRPC/examples/0"
    other = {"type": "http", "path": "/api/sql", "raw_path": b"/api/sql", "root_path": ""}
    assert keep_run_segment(other) is other


# ------------------------------------------------------------------ 3. error answers in the OpenAPI schema


@pytest.mark.one_backend
def test_openapi_lists_every_error_answer_with_its_body(named):
    store, _ = named
    with TestClient(create_app(store, allowed_hosts=["testserver"]), raise_server_exceptions=False) as c:
        spec = c.get("/openapi.json").json()
    error_schema = spec["components"]["schemas"]["ApiError"]
    assert error_schema["required"] == ["error"] and error_schema["properties"]["error"]["type"] == "string"
    expected = {
        ("get", "/api/health"): set(),
        ("get", "/api/info"): set(),
        ("get", "/api/runs"): set(),
        ("get", "/api/queries"): set(),
        ("get", "/api/runs/{run}"): {"404"},
        ("get", "/api/runs/{run}/examples"): {"404"},
        ("get", "/api/runs/{run}/examples/{example}"): {"404"},
        ("get", "/api/runs/{run}/examples/{example}/attention"): {"404", "413"},
        ("get", "/api/runs/{run}/examples/{example}/tile"): {"404"},
        ("post", "/api/runs/{run}/scratch"): {"403", "404", "413", "501"},
        ("get", "/api/runs/{run}/head_metrics"): {"404"},
        ("get", "/api/runs/{run}/head_metrics/{metric}"): {"404", "409"},
        ("get", "/api/runs/{run}/queries/{name}"): {"404", "409", "413"},
        ("post", "/api/runs/{run}/queries/{name}/save"): {"403", "404", "409", "413"},
        ("get", "/api/runs/{run}/annotations"): {"404"},
        ("get", "/api/runs/{run}/search"): {"404"},
        ("get", "/api/sql"): {"413"},
        ("post", "/api/sql"): {"413"},
        ("get", "/api/label/next"): {"404"},
        ("post", "/api/label"): {"403", "404"},
        ("get", "/api/label/labellers"): set(),
    }
    operations = {(method, path): op for path, methods in spec["paths"].items() for method, op in methods.items()}
    assert set(operations) == set(expected)
    for key, specific in expected.items():
        responses = operations[key]["responses"]
        errors = {code for code in responses if not code.startswith("2")}
        assert errors == {"400", "500", "503"} | specific, key  # 400 (bad input, Host), 500, 503 (storage; busy) everywhere
        for code in errors:
            assert responses[code]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ApiError"}, (key, code)
            assert responses[code]["description"]
    assert "422" not in str(spec["paths"]) and "HTTPValidationError" not in spec["components"]["schemas"]  # answered 400
    run = operations[("get", "/api/runs/{run}")]["parameters"][0]
    assert run["name"] == "run" and run["in"] == "path" and "%2F" in run["description"]
    scan = {p["name"]: p for p in operations[("get", "/api/runs/{run}/queries/{name}")]["parameters"]}["scan"]
    assert scan["in"] == "query" and scan["schema"]["default"] is False


# ------------------------------------------------------------------ 4. SQL result bytes; heavy requests at once


def test_sql_results_are_bounded_in_bytes(named):
    store, _ = named
    with TestClient(create_app(store, allowed_hosts=["testserver"]), raise_server_exceptions=False) as c:
        assert c.get("/api/info").json()["limits"]["max_sql_bytes"] == 8_000_000
        started = time.monotonic()
        blob = c.get("/api/sql", params={"q": "select zeroblob(1000000000)"})  # the report's: 2 GB after 284 s
        assert blob.status_code in (400, 413) and time.monotonic() - started < 5  # refused at once (SQLite: not called)
        error_of(blob, blob.status_code)
        # a 2 MB value, built by ordinary string functions (both backends), over the 1 MB bound of one value
        doubling = "WITH RECURSIVE c(x) AS (SELECT CAST('x' AS TEXT) UNION ALL SELECT x || x FROM c WHERE length(x) < 2000000)"
        error_of(c.get("/api/sql", params={"q": doubling + " SELECT max(x) AS x FROM c"}), 413)
        assert c.get("/api/sql", params={"q": "SELECT 1 AS one"}).json()["rows"] == [[1]]
    with TestClient(create_app(store, ServeSettings(max_sql_bytes=2000), allowed_hosts=["testserver"]), raise_server_exceptions=False) as c:
        many = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 4000) SELECT x, 'some text' AS t FROM c"
        error_of(c.get("/api/sql", params={"q": many, "max_rows": 5000}), 413)
        assert c.get("/api/sql", params={"q": many, "max_rows": 10}).json()["n_rows"] == 10


@pytest.mark.one_backend
def test_heavy_requests_beyond_the_limit_answer_503_with_retry_after(named, monkeypatch):
    store, maps = named
    entered, release = threading.Event(), threading.Event()
    real = store.attention

    def slow(*args, **kwargs):
        entered.set()
        release.wait(20)
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "attention", slow)
    settings = ServeSettings(max_heavy_requests=1, heavy_wait_s=0.2)
    answers = {}
    with TestClient(create_app(store, settings, allowed_hosts=["testserver"]), raise_server_exceptions=False) as c:
        url = f"/api/runs/{quote(NAMES[0], safe='')}/examples/0/attention"
        holder = threading.Thread(target=lambda: answers.setdefault("held", c.get(url, params={"layer": 0, "head": 0})))
        holder.start()
        try:
            assert entered.wait(20)
            busy = c.get("/api/sql", params={"q": "SELECT 1"})
            assert error_of(busy, 503) == "server busy: 1 heavy requests running; retry in 5 s" and busy.headers["retry-after"] == "5"
            error_of(c.get(f"/api/runs/{quote(NAMES[0], safe='')}/queries/entropy"), 503)
            assert c.get("/api/runs").status_code == 200 and c.get("/api/info").status_code == 200  # light ones are served
        finally:
            release.set()
            holder.join(20)
        assert answers["held"].status_code == 200
        assert c.get("/api/sql", params={"q": "SELECT 1"}).status_code == 200  # the slot is free again
    assert ServeSettings().max_heavy_requests == 2


# ------------------------------------------------------------------ 5. queries that must read the maps


@pytest.mark.one_backend
def test_a_query_that_must_read_unkept_maps_asks_first(named, caplog):
    """On a read-only server nothing a query reads is kept: it answers 409 (with the command that prepares the
    store) before reading, unless asked with scan=1; once summarised, the same query reads no map."""
    from attnstore.queries.clark import CLARK
    from attnstore.queries.engine import keep

    store, _ = named
    run = NAMES[0]
    sent = quote(run, safe="")
    with TestClient(create_app(store.locations, allowed_hosts=["testserver"]), raise_server_exceptions=False) as c:
        refused = error_of(c.get(f"/api/runs/{sent}/queries/head_clusters"), 409)
        assert f"head_clusters over run {run!r} must read the maps of up to 2 examples" in refused
        assert f"`attnstore summarize --run {run}`" in refused and "docs/SERVE.md#preparing-a-store-for-serving" in refused
        assert "scan=1" in refused and "read-only" in refused
        error_of(c.get(f"/api/runs/{sent}/head_metrics/entropy.entropy"), 409)
        with caplog.at_level("INFO", logger="attnstore.serve"):
            body = c.get(f"/api/runs/{sent}/queries/entropy", params={"scan": 1}).json()
        assert "reading the maps of up to 2 examples" in caplog.text and "2 examples read in" in caplog.text
        scanned = np.array(body["rows"], dtype=float)
        assert c.get(f"/api/runs/{sent}/queries/entropy").status_code == 200  # kept in memory now: no read
        computed = c.get(f"/api/runs/{sent}/head_metrics/special_tokens.to_cls", params={"scan": "true"}).json()
        assert computed["source"] == "computed"
        words = c.get(f"/api/runs/{sent}/queries/word_maps", params={"example": 1, "layer": 0, "head": 0})
        assert words.status_code == 200  # one example's maps: read directly, never refused
    expected = run_query(store, "entropy", run=run).to_numpy(dtype=float)  # (the writable store keeps its summary)
    np.testing.assert_allclose(scanned, expected)
    keep(store, store.run_info(run), CLARK)  # as `attnstore summarize --run RUN --kind clark` does
    with TestClient(create_app(store.locations, allowed_hosts=["testserver"]), raise_server_exceptions=False) as c:
        body = c.get(f"/api/runs/{sent}/queries/entropy").json()  # read-only, summarised: no map read, no 409
        np.testing.assert_allclose(np.array(body["rows"], dtype=float), expected)
        assert c.get(f"/api/runs/{sent}/head_metrics/relative_position.to_next").json()["source"] == "computed"
        error_of(c.get(f"/api/runs/{sent}/queries/head_clusters"), 409)  # its own summary (head_js) is not kept
    with TestClient(create_app(store, allowed_hosts=["testserver"]), raise_server_exceptions=False) as c:
        assert c.get(f"/api/runs/{sent}/queries/head_clusters").status_code == 200  # writable: read once, kept
