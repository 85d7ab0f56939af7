"""`attnstore serve` against what an attacker sends: unbounded bodies and validation errors that quote them, a form
posted from another site to a state-changing route, pages framed by another site, and a second server started on a
port already in use (api/http/middleware.py `RequestGuard`, api/http/protocol.py `claim_port`).

Each test feeds the request of the report it answers (a 30 MB body to /api/label, a 1 MB text to /scratch, an HTML
form's POST to .../save, `SO_REUSEPORT` sockets on the port).
"""

from __future__ import annotations

import socket
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
with warnings.catch_warnings():  # starlette's TestClient asks for httpx2; httpx still works
    warnings.filterwarnings("ignore", message=".*httpx2")
    from fastapi.testclient import TestClient

from attnstore.api.cli import main  # noqa: E402
from attnstore.api.serve import ServeSettings, create_app  # noqa: E402

TOKENS = [["[CLS]", "the", "cat", "sat", "[SEP]"], ["[CLS]", "a", "dog", "barked", "[SEP]"]]
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def saving(store, make_run):
    rng = np.random.default_rng(0)
    maps = []
    for tokens in TOKENS:
        m = rng.random((2, 3, len(tokens), len(tokens))).astype(np.float32)
        maps.append(m / m.sum(-1, keepdims=True))
    make_run(store, maps, TOKENS, name="r")
    app = create_app(store.locations, ServeSettings(allow_save=True, max_body_bytes=64 * 1024), allowed_hosts=["testserver"])
    with TestClient(app, raise_server_exceptions=False) as client:
        yield store, client


def error_of(response, status: int) -> str:
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert set(body) == {"error"} and "\n" not in body["error"] and "Traceback" not in body["error"]
    return body["error"]


@pytest.mark.one_backend
def test_a_body_over_the_limit_is_refused_before_it_is_read(saving):
    _, client = saving
    big = b'{"labeller": "' + b"x" * (1 << 20) + b'"}'  # 1 MB, declared in Content-Length
    got = client.post("/api/label", content=big, headers=JSON)
    assert "over 65536 bytes" in error_of(got, 413) and len(got.content) < 300

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(40):
            yield b"x" * 4096

    got = client.post("/api/label", content=chunks(), headers=JSON)
    assert "over 65536 bytes" in error_of(got, 413) and len(got.content) < 300
    assert client.get("/api/health").status_code == 200  # the worker is still there


@pytest.mark.one_backend
def test_a_request_that_fails_validation_is_not_echoed(saving):
    _, client = saving
    body = {name: "y" * 10_000 for name in ("labeller", "run", "example", "layer", "head", "label")}  # 60 KB, every field wrong
    got = client.post("/api/label", json=body)
    message = error_of(got, 400)
    assert len(got.content) < 1500, len(got.content)
    assert "characters)" in message  # each value it quotes is cut short, saying how long it was
    text = "word " * 12_000  # 60 KB: under the body limit, over the typed text's
    got = client.post("/api/runs/r/scratch", json={"text": text, "maps": "xml"})
    assert len(got.content) < 1500 and got.status_code == 400


def test_a_cross_site_form_cannot_save(saving):
    """Both backends: nothing is written by any of the refused requests."""
    store, client = saving
    url = "/api/runs/r/queries/entropy/save"
    form = {"Content-Type": "application/x-www-form-urlencoded"}  # what an HTML form sends, with no CORS preflight
    assert "Content-Type: application/json" in error_of(client.post(url, headers=form, content=b""), 415)
    assert "Content-Type: application/json" in error_of(client.post(url), 415)  # no type at all
    assert "Content-Type: application/json" in error_of(client.post(url, headers={"Content-Type": "text/plain"}), 415)
    assert "Content-Type: application/json" in error_of(client.post(url, headers={"Content-Type": "multipart/form-data; boundary=x"}), 415)
    assert "another site" in error_of(client.post(url, headers={**JSON, "Origin": "http://evil.example"}), 403)
    assert "another site" in error_of(client.post(url, headers={**JSON, "Origin": "null"}), 403)
    assert "another site" in error_of(client.post(url, headers={**JSON, "Origin": "http://testserver:8001"}), 403)  # another port
    assert "another site" in error_of(client.post(url, headers={**JSON, "Sec-Fetch-Site": "cross-site"}), 403)
    assert "another site" in error_of(client.post("/api/label", json={}, headers={"Origin": "https://evil.example"}), 403)
    assert store.head_metrics("r").empty
    # the server's own page (same origin) and a JSON client without Origin (curl, scripts) may
    same = client.post(url, headers={**JSON, "Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"})
    assert same.status_code == 200 and same.json()["saved"] > 0
    assert client.post(url, headers=JSON).status_code == 200
    assert client.get("/api/runs/r").status_code == 200  # GET is untouched


@pytest.mark.one_backend
def test_every_state_changing_endpoint_is_guarded(saving):
    from attnstore.api.http.middleware import GUARDED_METHODS

    _, client = saving
    methods = {method.upper() for path in client.app.openapi()["paths"].values() for method in path} - {"GET", "HEAD", "OPTIONS"}
    assert methods and methods <= GUARDED_METHODS
    assert client.delete("/api/runs").status_code == 405 and client.put("/api/label", json={}).status_code == 405


@pytest.mark.one_backend
def test_pages_may_not_be_framed(saving):
    _, client = saving
    for path in ("/", "/label", "/api/runs", "/static/app.js"):
        got = client.get(path)
        assert got.status_code == 200, path
        assert got.headers["x-frame-options"] == "DENY" and "frame-ancestors 'none'" in got.headers["content-security-policy"]
        assert got.headers["x-content-type-options"] == "nosniff"
    refused = client.post("/api/label", content=b"x", headers={"Content-Type": "text/plain"})
    assert refused.headers["x-frame-options"] == "DENY"


@pytest.mark.one_backend
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_second_server_on_a_busy_port_is_refused(store, workers):
    """A port another server listens on, with SO_REUSEPORT as `serve --workers N`'s own sockets have it (with which a
    second server joined the first one's port and took half its connections), is refused in one line."""
    with socket.socket() as first:
        first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        first.bind(("127.0.0.1", 0))
        first.listen()
        port = first.getsockname()[1]
        where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
        got = CliRunner().invoke(main, ["serve", "--port", str(port), "--workers", workers, *where])
    assert got.exit_code == 1, got.output
    lines = [line for line in got.output.splitlines() if line.startswith("Error")]
    assert lines == [f"Error: cannot listen on 127.0.0.1:{port}: the port is in use (another server, perhaps another "
                     "`attnstore serve`, listens there); pick another --port"], got.output  # fmt: skip


def test_an_example_a_page_listed_is_never_answered_404_later(store, make_run):
    """A client that saw a run's example listed must not get 404 for it next, whatever another worker (or this one's
    cache of the run, read within `info_ttl_s` on PostgreSQL) last read: a "no such example" reads the run again."""
    rng = np.random.default_rng(1)
    maps = []
    for tokens in TOKENS:
        m = rng.random((2, 3, len(tokens), len(tokens))).astype(np.float32)
        maps.append(m / m.sum(-1, keepdims=True))
    name, writer = make_run(store, maps, TOKENS, name="growing", write=1, finish=False)
    app = create_app(store, ServeSettings(info_ttl_s=3600), allowed_hosts=["testserver"])
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/api/runs/growing/examples").json()["total"] == 1
        assert client.get("/api/runs/growing/examples/1").status_code == 404  # not stored yet
        ids = dict(
            store.sql(
                "SELECT e.position, e.id FROM examples e JOIN runs r ON r.dataset_id = e.dataset_id WHERE r.name = 'growing'"
            ).values.tolist()
        )
        rows = [
            dict(token=t, token_id=1000 + i, word_position=None, segment=0, is_special=False, char_start=None, char_end=None)
            for i, t in enumerate(TOKENS[1])
        ]
        writer.add(ids[1], maps[1], rows)
        writer.commit(final=True)  # what another worker, or another process, sees at once
        got = client.get("/api/runs/growing/examples/1")
        assert got.status_code == 200, got.text
        assert [t["token"] for t in got.json()["tokens"]] == TOKENS[1]
        assert client.get("/api/runs/growing/examples").json()["total"] == 2  # and the page after it does not go back
    writer.finish(0.0)


@pytest.mark.one_backend
def test_an_example_s_huge_text_is_answered_cut(store, make_run):
    """A corpus line or a bundle can store a text of any size: a page of examples (and one example) answers its first
    `max_text_chars` characters, saying so, so an answer stays bounded in bytes."""
    import sqlalchemy as sa

    tokens = [["[CLS]", "a", "[SEP]"], ["[CLS]", "b", "[SEP]"]]
    make_run(store, [np.full((1, 1, 3, 3), 1 / 3, np.float32)] * 2, tokens, name="texts")
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE examples SET text_a = :t WHERE position = 0"), {"t": "w " * 1_000_000})  # 2 MB
    app = create_app(store, ServeSettings(max_text_chars=1000), allowed_hosts=["testserver"])
    with TestClient(app, raise_server_exceptions=False) as client:
        for url in ("/api/runs/texts/examples?limit=1", "/api/runs/texts/examples?limit=1&q=w", "/api/runs/texts/examples/0"):
            got = client.get(url)
            assert got.status_code == 200 and len(got.content) < 4000, (url, len(got.content))
            item = got.json()["items"][0] if "items" in got.json() else got.json()["example"]
            assert len(item["text_a"]) == 1000 and item["texts_cut"] is True
        assert "texts_cut" not in client.get("/api/runs/texts/examples/1").json()["example"]
