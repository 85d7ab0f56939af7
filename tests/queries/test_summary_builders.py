"""Several builders of one kept summary at once (threads, processes, two server workers): one builds it under the
summary's lease (store/store.py `_building`), the others wait and read what it kept; a summary found incomplete (a
field missing or cut short, or kept without the record of its rows) is never read, `attnstore check` names it,
`check --repair` removes it and the next query builds it again.

Hand-made maps with [CLS], [SEP] and punctuation, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.queries import engine as summary_module
from attnstore.queries import run_query
from attnstore.store.check import check_store
from attnstore.store.writer import summary_lease_name
from attnstore.tests.queries.test_summary import MAPS, TOKENS, same

SUMMARY = "runs/sums/summary/clark"


@pytest.fixture
def run(store, make_run):
    return make_run(store, MAPS, TOKENS, name="sums", dtype="float16")


def counting(monkeypatch) -> list[int]:
    """Examples reduced by this process's summary passes, as the passes report them."""
    reduced: list[int] = []
    original = summary_module.summarise_examples

    def counted(store, info, kind, examples=None, params=None):
        out = original(store, info, kind, examples, params)
        reduced.append(len(out["example"]))
        return out

    monkeypatch.setattr("attnstore.queries.engine.passes.summarise_examples", counted)
    return reduced


def test_a_builder_waits_for_the_one_building_and_then_reads(store, run, monkeypatch):
    """A query that finds the summary's lease held waits without writing; once it is free it builds, stamps a complete
    summary, and gives what a query gives alone."""
    info = store.run_info(run)
    kind = summary_module.kind_named("clark")
    lease = store.writer.lease(summary_lease_name(info.id, "clark"), "a builder in this test")
    got: dict = {}
    waiting = threading.Thread(target=lambda: got.update(frame=run_query(store, "entropy", run=run)))
    waiting.start()
    waiting.join(1.5)
    assert waiting.is_alive(), "the second builder did not wait for the lease"
    assert not summary_module.is_kept(store, info, kind)
    lease.release()
    waiting.join(60)
    assert not waiting.is_alive() and summary_module.is_kept(store, info, kind)
    same(got["frame"], run_query(store, "entropy", run=run))
    assert check_store(store)[1].empty
    assert store.sql("SELECT count(*) AS n FROM leases")["n"][0] == 0


def test_threads_asking_the_same_first_query_build_it_once(store, run, monkeypatch):
    reduced = counting(monkeypatch)
    frames: list = []
    errors: list = []

    def ask():
        try:
            frames.append(run_query(store, "entropy", run=run))
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(frames) == 4
    assert sum(reduced) == len(TOKENS)  # one build; the others read it
    for frame in frames[1:]:
        same(frame, frames[0])
    assert check_store(store)[1].empty


# One interpreter imports what a query needs once; for each attempt it forks two processes that count the examples their
# summary passes reduce, open the store, say they are ready and wait for the gate file, then ask the same first query
# (a fresh interpreter per process spent ~1 s of CPU importing the same modules, 20 times a test).
ASK = """
import atexit, json, os, sys, time, traceback
from attnstore.queries import run_query
from attnstore.queries.engine import passes
from attnstore.store import open_store
def ask(db, root, gate, answer):
    reduced = []
    original = passes.summarise_examples
    def counted(store, info, kind, examples=None, params=None):
        out = original(store, info, kind, examples, params)
        reduced.append(len(out["example"]))
        return out
    passes.summarise_examples = counted  # what a pass calls, range by range
    store = open_store(db=db, root=root)
    open(answer + ".ready", "w").close()
    while not os.path.exists(gate):  # both processes start their query at once, when the test makes this file
        time.sleep(0.001)
    frame = run_query(store, "entropy", run="sums")
    with open(answer + ".tmp", "w") as f:
        json.dump({"reduced": sum(reduced), "frame": frame.to_dict(orient="list")}, f)
    os.replace(answer + ".tmp", answer)
    store.close()
for line in sys.stdin:  # an attempt: the gate file and each process's answer file
    gate, *answers = json.loads(line)
    pids = []
    for answer in answers:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ask(sys.argv[1], sys.argv[2], gate, answer)
                code = 0
            except BaseException:
                with open(answer + ".err", "w") as f:
                    traceback.print_exc(file=f)
            finally:
                atexit._run_exitfuncs()
                os._exit(code)
        pids.append(pid)
    codes = {}
    while not all(pid in codes or os.path.exists(a + ".ready") for pid, a in zip(pids, answers)):  # each ready, or ended
        for pid in pids:
            if pid not in codes and (done := os.waitpid(pid, os.WNOHANG))[0]:
                codes[pid] = os.waitstatus_to_exitcode(done[1])
        time.sleep(0.001)
    print("ready", flush=True)
    print(json.dumps([codes[pid] if pid in codes else os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]), flush=True)
"""


@pytest.mark.slow
def test_two_processes_asking_the_same_first_query(store, run, tmp_path):
    """The report's case (the loser exited with a traceback in 21 of 21 tries), five times on each backend."""
    import select

    asker = subprocess.Popen(
        [sys.executable, "-c", ASK, store.locations.db_url, store.locations.array_root],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def line() -> str:
        assert select.select([asker.stdout], [], [], 120)[0], "the two processes did not end within 120 s"
        return asker.stdout.readline()

    try:
        first = None
        for attempt in range(5):
            shutil.rmtree(os.path.join(store.locations.array_root, "runs", "sums", "summary"), ignore_errors=True)
            gate = tmp_path / f"go-{attempt}"  # made once both processes have opened the store
            answers = [tmp_path / f"answer-{attempt}-{i}" for i in range(2)]
            asker.stdin.write(json.dumps([str(gate), *map(str, answers)]) + "\n")
            asker.stdin.flush()
            assert line() == "ready\n"  # (or both ended: their errors are asserted below)
            gate.touch()
            codes = json.loads(line())
            for code, answer in zip(codes, answers):
                err = answer.with_name(answer.name + ".err")
                assert code == 0, err.read_text()[-3000:] if err.exists() else code
            answers = [json.loads(answer.read_text()) for answer in answers]
            assert sorted(a["reduced"] for a in answers) == [0, len(TOKENS)]  # one built it, the other read it
            assert answers[0]["frame"] == answers[1]["frame"]
            first = first or answers[0]["frame"]
            assert answers[0]["frame"] == first
            assert check_store(store)[1].empty
    finally:
        asker.stdin.close()
        asker.wait(timeout=60)


def test_an_incomplete_summary_is_named_by_check_and_built_again(store, run):
    expected = run_query(store, "entropy", run=run)
    folder = os.path.join(store.locations.array_root, SUMMARY)
    shutil.rmtree(os.path.join(folder, "entropy"))  # what two builders writing one group at once left: a field gone
    summary, problems = check_store(store)
    assert len(problems) == 1 and summary["problems"].tolist() == [1]
    assert problems["problem"][0] == (
        "kept summary 'clark' is incomplete: field(s) ['entropy'] missing; it is not read (the next query rebuilds it); "
        "`attnstore check --repair` removes it"
    )
    same(run_query(store, "entropy", run=run), expected)  # rebuilt, not a KeyError
    assert check_store(store)[1].empty

    group = zarr.open_group(store.locations.array_root, path=SUMMARY, mode="r+")
    group["to_self"].resize((2, *group["to_self"].shape[1:]))  # a field cut short
    where = ["--db", store.locations.db_url, "--root", store.locations.array_root]
    got = CliRunner().invoke(main, ["check", "--format", "csv", *where])
    assert got.exit_code == 1 and "field 'to_self' holds 2 rows, 4 were written" in got.output
    got = CliRunner().invoke(main, ["check", "--repair", *where])
    assert got.exit_code == 0, got.output
    assert "removed 1 leftover temporary file(s) or incomplete summaries: runs/sums/summary/clark" in got.output
    assert not os.path.exists(folder)
    same(run_query(store, "entropy", run=run), expected)


def test_a_summary_kept_without_its_rows_record_is_built_again(store, run, monkeypatch):
    """Summaries kept before the record of their rows existed cannot be told complete: they are built again once."""
    expected = run_query(store, "entropy", run=run)
    group = zarr.open_group(store.locations.array_root, path=SUMMARY, mode="r+")
    attributes = dict(group.attrs)
    del attributes["rows"]
    group.attrs.clear()
    group.attrs.update(attributes)
    assert "without a record of its rows" in check_store(store)[1]["problem"][0]
    reduced = counting(monkeypatch)
    same(run_query(store, "entropy", run=run), expected)
    assert sum(reduced) == len(TOKENS)
    assert check_store(store)[1].empty


@pytest.mark.slow
@pytest.mark.one_backend
def test_two_server_workers_asked_the_same_first_query(store, run):
    """`serve --allow-save --workers 2`, six first requests for `entropy` at once (the report: 500s in 6 of 6 tries
    and a summary left stamped but incomplete in 3): every answer is 200 and the same, and the store checks clean."""
    import httpx

    from attnstore.tests.api.test_serve_workers import two_workers

    server, base = two_workers(store, "--allow-save")
    try:
        for _ in range(3):
            shutil.rmtree(os.path.join(store.locations.array_root, "runs", "sums", "summary"), ignore_errors=True)
            answers: list = [None] * 6

            def ask(i: int, answers: list = answers) -> None:
                with httpx.Client(timeout=60) as http:  # a connection each: the kernel hands them to either worker
                    answers[i] = http.get(f"{base}/api/runs/sums/queries/entropy")

            threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(90)
            assert [a.status_code for a in answers] == [200] * 6, [a.text[:300] for a in answers if a.status_code != 200]
            rows = [a.json()["rows"] for a in answers]
            assert all(r == rows[0] for r in rows)
            column = answers[0].json()["columns"].index("entropy")
            assert check_store(store)[1].empty
        assert len(rows[0]) == 6 and np.isfinite([row[column] for row in rows[0]]).all()
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
