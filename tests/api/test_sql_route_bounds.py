"""`/api/sql` against issue 49 item 6: `SELECT repeat('x', 300000000)` took a server worker to 1 GB before its 413.
The server's process now never holds the value (PostgreSQL refuses it itself; SQLite never builds it): the answer is
413 in one line, and the worker's peak memory grows by a few MB. Both backends.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # a server in a subprocess, measured

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

WORKER = """
import resource, sys, time, warnings
warnings.filterwarnings("ignore")
from fastapi.testclient import TestClient
from attnstore.api.serve import create_app
from attnstore.store import open_store

store = open_store(db=sys.argv[1], root=sys.argv[2])
with TestClient(create_app(store, allowed_hosts=["testserver"]), raise_server_exceptions=False) as client:
    client.get("/api/sql", params={"q": "SELECT 1 AS one"})  # everything imported and warm
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    answer = client.get("/api/sql", params={"q": sys.argv[3]})
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
    print(answer.status_code, grown, round(time.monotonic() - started, 1))
    print(answer.json().get("error"))
"""


def test_a_300_mb_value_is_413_without_the_worker_holding_it(store, make_run):
    maps = np.full((1, 2, 3, 3), 1 / 3, dtype=np.float32)
    make_run(store, [maps], [["[CLS]", "a", "[SEP]"]], name="r")
    pg = store.engine.dialect.name == "postgresql"
    db = store.engine.url.render_as_string(hide_password=False) if pg else store.locations.db_url
    query = "SELECT repeat('x', 300000000) AS big" if pg else "SELECT printf('%.*c', 300000000, 'x') AS big"
    done = subprocess.run(
        [sys.executable, "-c", WORKER, db, store.locations.array_root, query], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures, error = done.stdout.strip().splitlines()
    status, grown_mb, _seconds = figures.split()
    assert status == "413" and "is over 1,000,000 bytes" in error and "\n" not in error, done.stdout
    assert int(grown_mb) < 100, done.stdout  # it grew by ~1 GB when the value was read before it was measured
