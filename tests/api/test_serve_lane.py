"""The fast lane (api/http/lane.py): a plain GET request of the maps, examples, search, query and metric endpoints is answered before
FastAPI's routing, with FastAPI's own answer byte for byte; anything else (an error, an odd or unknown parameter,
another method, a refused Host) is FastAPI's. And `serve --workers N`'s sockets (api/http/protocol.py): one per worker
on one port, new connections spread over all of them."""

from __future__ import annotations

import socket
import warnings
from urllib.parse import quote

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*httpx2")
    from fastapi.testclient import TestClient

from attnstore.api.http import lane as lane_module  # noqa: E402
from attnstore.api.http.protocol import listening_sockets  # noqa: E402
from attnstore.api.serve import ServeSettings, create_app  # noqa: E402

from .test_serve_guards import NAMES, TOKEN_WORDS, TOKENS, WORDS, maps_for  # noqa: E402

RUN = f"/api/runs/{quote(NAMES[0], safe='')}"  # a name with a "/" in it, sent as %2F

# Requests the lane answers once what they read is kept (the first of each may need SQL: FastAPI's, on a thread).
PLAIN = [
    f"{RUN}/examples",
    f"{RUN}/examples?limit=5",
    f"{RUN}/examples?offset=1&limit=1",
    f"{RUN}/examples/0",
    f"{RUN}/examples/1",
    f"{RUN}/examples/1/attention",
    f"{RUN}/examples/1/attention?layer=1&head=2",
    f"{RUN}/examples/1/attention?layer=1&head=2&digits=3",
    f"{RUN}/examples/0/attention?layer=0-1&head=0,2&format=npy",
    f"{RUN}/examples/1/attention?format=npy",
    f"{RUN}/search?upos=NOUN",
    f"{RUN}/search?upos=NOUN&layer=0&head=1&k=2",
    f"{RUN}/search?word=dog&pieces=all&limit=1&offset=0",
    f"{RUN}/queries/entropy",
    f"{RUN}/head_metrics/entropy.entropy",
]

# Requests the lane leaves to FastAPI: errors, and forms its strict parsers do not take (answered all the same).
ELSEWHERE = [
    f"{RUN}/examples/9",  # 404
    f"{RUN}/examples/9/attention",  # 404
    f"{RUN}/examples/1/attention?layer=7",  # 400: out of range
    f"{RUN}/examples/1/attention?format=xml",  # 400: fails validation
    f"{RUN}/examples/1/attention?digits=0",  # 400: fails validation
    f"{RUN}/examples/1/attention?digits=9",  # 400: fails validation
    f"{RUN}/examples?limit=0",  # 400: fails validation
    f"{RUN}/examples?limit=100000",  # 400: fails validation
    f"{RUN}/examples?offset=-1",  # 400: fails validation
    f"{RUN}/examples/01",  # a leading zero: pydantic reads 1
    f"{RUN}/examples?limit=+2",  # a sign: pydantic reads 2
    f"{RUN}/examples?truncated=1",  # pydantic reads true
    f"{RUN}/examples?q=dog",  # a filtered page scans rows: on a thread
    f"{RUN}/examples/1/attention?layer=1&layer=0",  # a repeated parameter
    f"{RUN}/examples/1/attention?layer=",  # an empty one
    f"{RUN}/examples/1/attention?colour=red",  # an unknown one (FastAPI ignores it)
    f"{RUN}/examples/1/attention?layer=1&head=2&",
    f"{RUN}/search",  # 400: no criterion
    f"{RUN}/search?upos=NOUN&layer=0",  # 400: a layer without a head
    f"{RUN}/search?upos=NOUN&pieces=some",  # 400
    f"{RUN}/search?upos=NOUN&k=0",  # 400: fails validation
    f"{RUN}/queries/entropy?max_rows=5",  # a query's parameters: FastAPI's
    f"{RUN}/queries/no_such_query",  # 404
    f"{RUN}/head_metrics/no_such.metric",  # 404
    f"{RUN}/head_metrics/entropy.entropy?params=%7B%7D",
    "/api/runs/no-such-run/examples",  # 404
    "/api/runs/no-such-run/examples/0/attention",  # 404
    "/api/runs/glue/MRPC-dev-x/examples",  # a "/" not encoded: no such route
]


@pytest.fixture
def apps(store, make_run):
    make_run(store, maps_for(0), TOKENS, name=NAMES[0], words_list=WORDS, token_words=TOKEN_WORDS)
    settings = ServeSettings(info_ttl_s=3600)  # on PostgreSQL what is kept is read again after info_ttl_s
    with_lane = create_app(store, settings, allowed_hosts=["testserver"])
    without = create_app(store, ServeSettings(info_ttl_s=3600, fast_lane=False), allowed_hosts=["testserver"])
    with TestClient(with_lane) as fast, TestClient(without) as slow:
        yield fast, slow


@pytest.fixture
def lane_answers(monkeypatch):
    """The paths (with query) the lane answered."""
    answered: list[str] = []
    real = lane_module.FastLane.answer

    def counting(self, scope):
        response = real(self, scope)
        if response is not None:
            query = scope.get("query_string", b"").decode()
            answered.append(scope["path"] + ("?" + query if query else ""))
        return response

    monkeypatch.setattr(lane_module.FastLane, "answer", counting)
    return answered


def same_answer(fast: TestClient, slow: TestClient, url: str) -> int:
    a, b = fast.get(url), slow.get(url)
    assert a.status_code == b.status_code, f"{url}: {a.status_code} in the lane, {b.status_code} from FastAPI"
    assert a.content == b.content, url
    strip = ("date",)
    assert [(k, v) for k, v in a.headers.items() if k not in strip] == [(k, v) for k, v in b.headers.items() if k not in strip], url
    return a.status_code


def test_a_plain_request_is_answered_in_the_lane_as_fastapi_answers_it(apps, lane_answers):
    fast, slow = apps
    for url in PLAIN:
        fast.get(url)  # the first may read SQL: FastAPI's, on its thread pool; now it is kept
        fast.get(url)  # ... unless it built a query's summary: its build lease changed the database, so read once more
        lane_answers.clear()
        assert same_answer(fast, slow, url) == 200
        assert len(lane_answers) == 1, f"{url}: not answered in the lane"


def test_anything_else_is_fastapis_with_the_same_answer(apps, lane_answers):
    fast, slow = apps
    for url in PLAIN:  # what the lane would read is kept
        fast.get(url)
    lane_answers.clear()
    statuses = {url: same_answer(fast, slow, url) for url in ELSEWHERE}
    assert lane_answers == [], f"answered in the lane: {lane_answers}"
    assert statuses[f"{RUN}/examples/9"] == 404 and statuses[f"{RUN}/examples/1/attention?format=xml"] == 400
    assert statuses[f"{RUN}/examples/01"] == 200 and statuses[f"{RUN}/examples?truncated=1"] == 200


def test_other_methods_and_refused_hosts_never_reach_the_lane(apps, lane_answers):
    fast, _ = apps
    url = f"{RUN}/examples/1/attention?layer=1&head=2"
    assert fast.get(url).status_code == 200
    lane_answers.clear()
    assert fast.post(url).status_code == 405
    assert fast.head(url).status_code in (200, 405)
    refused = fast.get(url, headers={"Host": "attacker.example"})
    assert refused.status_code == 400 and "not one this server answers" in refused.json()["error"]
    assert lane_answers == []


def test_the_lane_waits_for_nothing_it_does_not_keep(apps, lane_answers):
    """A first request of a page needs SQL: the lane gives it to FastAPI (which reads it on a thread)."""
    fast, _ = apps
    assert fast.get(f"{RUN}/examples?limit=2").status_code == 200
    assert lane_answers == []
    assert fast.get(f"{RUN}/examples?limit=2").status_code == 200
    assert len(lane_answers) == 1


def test_each_worker_has_its_own_socket_and_connections_reach_every_one():
    """`serve --workers N`: N sockets on one port (SO_REUSEPORT); 32 connections are spread over both by the kernel's
    hash of their addresses (all on one: a chance of 2 in 2^32)."""
    sockets = listening_sockets("127.0.0.1", 0, 1)
    port = sockets[0].getsockname()[1]
    sockets[0].close()
    sockets = listening_sockets("127.0.0.1", port, 2)
    clients = []
    try:
        for sock in sockets:
            sock.listen(64)
            sock.setblocking(False)
        for _ in range(32):
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        accepted = []
        for sock in sockets:
            n = 0
            while True:
                try:
                    conn, _ = sock.accept()
                except BlockingIOError:
                    break
                conn.close()
                n += 1
            accepted.append(n)
        assert sum(accepted) == 32 and min(accepted) > 0, accepted
        with pytest.raises(OSError):  # a port another program holds without SO_REUSEPORT is refused
            plain = socket.socket()
            plain.bind(("127.0.0.1", 0))
            try:
                listening_sockets("127.0.0.1", plain.getsockname()[1], 2)
            finally:
                plain.close()
    finally:
        for c in clients:
            c.close()
        for sock in sockets:
            sock.close()


@pytest.mark.one_backend
def test_serve_with_workers_on_a_taken_port_fails_in_one_line(store):
    """`serve --workers 2` where another program holds the port: one line naming it and what to do, no worker started."""
    from click.testing import CliRunner

    from attnstore.api.serve import serve

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = held.getsockname()[1]
    try:
        where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
        result = CliRunner().invoke(serve, [*where, "--workers", "2", "--port", str(port), "--no-access-log"])
    finally:
        held.close()
    assert result.exit_code == 1, result.output
    error = [line for line in result.output.strip().splitlines() if line.startswith("Error")]
    assert error == [
        f"Error: cannot listen on 127.0.0.1:{port}: the port is in use (another server, perhaps another `attnstore serve`, "
        "listens there); pick another --port"
    ], result.output
