"""Fault injection: kill -9 at random moments, concurrent writers, queries during ingest, a full
disk, a read-only store. Each test ends in "nothing lost, nothing duplicated, maps identical to a
clean run" or in a clean one-line error. See docs/RELIABILITY.md for the guarantees these back.

Ingests run as real `attnstore ingest` processes (so kill -9 is real) with a tiny random BERT
(2 layers x 2 heads) over a synthetic corpus; the clean reference is the same ingest in-process.
Most are forked from a process that has imported attnstore, torch and transformers once (`Forks`): a
fresh interpreter spends ~4 s of CPU importing them, and this module starts about 70 ingests. The tests
of what a whole process prints at its end (a full disk, a read-only root) still run fresh interpreters.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from attnstore.queries import run_query
from attnstore.store import leases, migrate, open_store
from attnstore.store.check import check_store
from attnstore.store.errors import IncompleteRunWarning, NotFoundError
from attnstore.store.identity import dataset_lease_name

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # about 70 real ingest processes: `make test-fast` leaves them out

N_EXAMPLES = 300
WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "house", "it", "was", "red", "and", "big"]
INGEST = ["--format", "text", "--annotate", "whitespace", "--batch-size", "2", "--chunk-cells", "1024", "--no-progress"]
KILLS_PER_BACKEND = 20


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """A random 2-layer, 2-head BERT with a WordPiece vocabulary of a few words, saved like a real model."""
    import torch

    folder = tmp_path_factory.mktemp("tiny-bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, ".", ","]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, max_position_embeddings=64
    )
    transformers.BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = random.Random(7)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))) + " ." for _ in range(N_EXAMPLES)]
    path = tmp_path_factory.mktemp("corpus") / "sentences.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny_loaded(tiny_model):
    from attnstore.ingest.model import load_model

    return load_model(tiny_model)


def ingest_here(store, corpus, loaded, name: str = "k") -> None:
    """`ingest_cmd`'s ingest in this process: for a store a test starts from, where the process is not the subject."""
    from attnstore.ingest import ingest

    ingest(
        store,
        corpus=str(corpus),
        fmt="text",
        annotator="whitespace",
        batch_size=2,
        chunk_cells=1024,
        name=name,
        progress=False,
        loaded=loaded,
    )


@pytest.fixture(scope="module")
def clean(tmp_path_factory, tiny_loaded, corpus):
    """The reference: the same ingest, uninterrupted, in this process."""
    folder = tmp_path_factory.mktemp("clean")
    url = f"sqlite:///{folder / 'meta.sqlite'}"
    migrate.upgrade(url)
    store = open_store(db=url, root=str(folder / "attention.zarr"))
    ingest_here(store, corpus, tiny_loaded)
    return store


def maps_of(store, run: str) -> dict[int, np.ndarray]:
    return {example: maps.copy() for example, maps in store.iter_attention(run)}


def assert_same_as_clean(store, clean, run: str = "k") -> None:
    """Nothing lost, nothing duplicated, every map and token identical to the clean run, check finds nothing."""
    info = store.run_info(run)
    assert info.status == "complete" and info.n_stored == N_EXAMPLES
    examples = store.examples(run)
    assert sorted(examples["example"]) == list(range(N_EXAMPLES)) and examples["example_id"].is_unique
    got, want = maps_of(store, run), maps_of(clean, "k")
    assert got.keys() == want.keys()
    for example in want:
        np.testing.assert_array_equal(got[example], want[example], err_msg=f"example {example}")
    tokens, clean_tokens = store.token_table(run), clean.token_table("k")
    assert tokens[["example", "position", "token_id"]].equals(clean_tokens[["example", "position", "token_id"]])
    summary, problems = check_store(store, [run])
    assert problems.empty, problems.to_string()
    assert store.sql("SELECT count(*) AS n FROM leases")["n"][0] == 0


def cli(url: str, root: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "attnstore.api.cli", *args, "--db", url, "--root", str(root)]


def ingest_cmd(url, root, corpus, tiny_model, name="k"):
    return cli(url, root, "ingest", "--corpus", str(corpus), "--model", tiny_model, "--name", name, *INGEST)


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


# The forking process: reads [argv, stderr file, gate file or null] lines, forks a child that (once the gate file
# exists, if one is named) runs `attnstore <argv>` (stdout to /dev/null, stderr to the file, atexit handlers run as
# at a normal exit), prints its pid, and writes each child's exit code (negative: killed by that signal) to
# "<stderr file>.rc" when it ends.
FORKS = r"""
import atexit, json, os, select, sys, time, traceback
import attnstore.api.cli, attnstore.ingest, torch, transformers  # what every ingest imports: once here
from transformers import AutoConfig, AutoModel, AutoTokenizer, BertModel, BertTokenizerFast  # what loading a model imports (1.9 s)
rc_of = {}
def reap():
    while rc_of:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        path = rc_of.pop(pid)
        with open(path + ".tmp", "w") as f:
            f.write(str(os.waitstatus_to_exitcode(status)))
        os.replace(path + ".tmp", path)
while True:
    ready = select.select([sys.stdin], [], [], 0.02)[0]
    reap()
    if not ready:
        continue
    line = sys.stdin.readline()
    if not line:
        break
    argv, err, gate = json.loads(line)
    pid = os.fork()
    if pid == 0:
        while gate and not os.path.exists(gate):
            time.sleep(0.01)
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        sys.argv, code = ["attnstore", *argv], 1
        try:
            attnstore.api.cli.main()
            code = 0
        except SystemExit as exc:  # click's exit: a code, or a message (code 1) as a fresh interpreter would print it
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    rc_of[pid] = err + ".rc"
    print(pid, flush=True)
while rc_of:  # stdin closed: wait for children still running (a failed test's), without spinning
    reap()
    time.sleep(0.02)
"""


class Forked:
    """An `attnstore` process forked by `Forks`, used as a subprocess.Popen is here."""

    def __init__(self, pid: int, err: Path) -> None:
        self.pid, self.err, self.returncode = pid, err, None

    def poll(self) -> int | None:
        rc = Path(f"{self.err}.rc")
        if self.returncode is None and rc.exists():
            self.returncode = int(rc.read_text())
        return self.returncode

    def wait(self, timeout: float) -> int:
        deadline = time.time() + timeout
        while self.poll() is None:
            if time.time() > deadline:
                raise subprocess.TimeoutExpired(f"attnstore (pid {self.pid})", timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    @property
    def stderr(self) -> io.StringIO:
        """What the process wrote to stderr so far, read whole (no file left open)."""
        return io.StringIO(self.err.read_text(encoding="utf-8", errors="replace"))


class Forks:
    """Starts `attnstore` commands as processes forked from one that imported attnstore, torch and transformers."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.n = folder, 0
        self.proc = subprocess.Popen([sys.executable, "-c", FORKS], env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def start(self, cmd: list[str], gate: Path | None = None) -> Forked:
        """`cmd` (an `attnstore` command line) in a forked process; with `gate`, it waits for that file to exist."""
        assert cmd[1:3] == ["-m", "attnstore.api.cli"], cmd
        self.n += 1
        err = self.folder / f"stderr-{self.n}"
        self.proc.stdin.write(json.dumps([cmd[3:], str(err), gate and str(gate)]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line.strip().isdigit(), f"the forking process ended: {line!r}"
        return Forked(int(line), err)

    def run(self, cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
        proc = self.start(cmd)
        proc.wait(timeout)
        with proc.stderr as err:
            return subprocess.CompletedProcess(cmd, proc.returncode, "", err.read())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def forks(tmp_path_factory):
    forks = Forks(tmp_path_factory.mktemp("forks"))
    yield forks
    forks.close()


def lease_held(url: str, resource: str) -> bool:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT count(*) FROM leases WHERE resource = :r"), {"r": resource}).scalar() > 0
    except sa.exc.SQLAlchemyError:
        return False
    finally:
        engine.dispose()


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 60.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def fresh(db_url, store, tmp_path):
    """A migrated database (copied from the session's migrated template, as `store`'s is) and an array root."""
    store.close()
    return db_url, tmp_path / "attention.zarr"


# ---------------------------------------------------------------- kill -9


def test_kill_9_at_random_moments_loses_and_duplicates_nothing(fresh, corpus, tiny_model, clean, forks):
    url, root = fresh
    rng = random.Random(20261122 + ("postgresql" in url))
    cmd = ingest_cmd(url, root, corpus, tiny_model)
    kills = 0
    for _ in range(4 * KILLS_PER_BACKEND):
        proc = forks.start(cmd)
        if rng.random() < 0.2:  # anywhere: start-up, model load, dataset registration
            time.sleep(rng.uniform(0, 1.5))
        else:  # while writing: after the run's lease is taken
            wait_for(lambda: lease_held(url, "run:k"), proc)
            time.sleep(rng.uniform(0, 0.3))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=60)
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr.read()[-2000:]
        if proc.returncode == 0 or kills >= KILLS_PER_BACKEND:
            break
    assert kills >= KILLS_PER_BACKEND
    done = forks.run(cmd)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same_as_clean(open_store(db=url, root=str(root)), clean)


# ---------------------------------------------------------------- concurrent writers


# The second writer is started (forked, attnstore imported) before the first, then released through a gate file
# once the first holds the run's lease: on a loaded machine a cold start could otherwise take longer than the whole
# first ingest.


def test_second_writer_of_a_run_fails_at_once_and_the_first_is_intact(fresh, corpus, tiny_model, clean, tmp_path, forks):
    url, root = fresh
    gate = tmp_path / "go"
    second = forks.start(ingest_cmd(url, root, corpus, tiny_model), gate=gate)
    first = forks.start(ingest_cmd(url, root, corpus, tiny_model))
    assert wait_for(lambda: lease_held(url, "run:k"), first)
    started = time.time()
    gate.touch()
    second.wait(timeout=120)
    assert second.returncode == 1
    message = second.stderr.read().strip()
    assert "run 'k' is being written by" in message and f"pid {first.pid}" in message, message
    assert len(message.splitlines()) == 1 and "Traceback" not in message
    assert first.poll() is None or time.time() - started < 30  # it failed while the first was still writing
    first.wait(timeout=300)
    assert first.returncode == 0, first.stderr.read()[-2000:]
    assert_same_as_clean(open_store(db=url, root=str(root)), clean)


def test_two_writers_started_together_one_wins(fresh, corpus, tiny_model, clean, tmp_path, forks):
    """Both processes are started (forked, attnstore imported) first, then released through one gate file, so they race
    for the dataset and the run from the same moment. One writes the run; the other either fails at once in one line
    (it met the run's lease) or, where the first finished before it looked (a loaded machine can slow one process
    that much), finds the run complete and stores nothing. Never two writers, never a half-written or doubled run."""
    url, root = fresh
    gate = tmp_path / "go"
    procs = [forks.start(ingest_cmd(url, root, corpus, tiny_model), gate=gate) for _ in range(2)]
    gate.touch()
    for p in procs:
        p.wait(timeout=300)
    codes = sorted(p.returncode for p in procs)
    errors = [p.stderr.read() for p in procs if p.returncode]
    assert codes in ([0, 1], [0, 0]), errors
    for message in errors:
        assert "is being written by" in message and "Traceback" not in message and len(message.strip().splitlines()) == 1, message
    assert_same_as_clean(open_store(db=url, root=str(root)), clean)


def test_a_loader_killed_between_commit_and_release_leaves_no_lease(fresh, corpus, tiny_model, tiny_loaded, clean, forks):
    """The dataset's loader was killed after storing it but before releasing its lease (found by
    the kill -9 test in CI): the next ingest finds the dataset complete, never takes that lease,
    and must still clear the dead holder's row."""
    url, root = fresh
    store = open_store(db=url, root=str(root))
    ingest_here(store, corpus, tiny_loaded)  # the dataset and a first run, stored (the next ingest is a real process)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    identity = store.sql("SELECT identity FROM datasets")["identity"][0]
    when = datetime.now(UTC).replace(tzinfo=None)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO leases (resource, token, host, pid, acquired_at, heartbeat_at) VALUES (:r, :t, :h, :p, :w, :w)"),
            {"r": dataset_lease_name(identity), "t": "d" * 32, "h": leases.HOST, "p": dead.pid, "w": when},
        )
    again = forks.run(ingest_cmd(url, root, corpus, tiny_model, name="k2"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert_same_as_clean(open_store(db=url, root=str(root)), clean, "k2")  # asserts no lease row is left


def test_two_runs_of_one_new_dataset_at_once_register_it_once(fresh, corpus, tiny_model, clean, forks):
    url, root = fresh
    procs = [forks.start(ingest_cmd(url, root, corpus, tiny_model, name=name)) for name in ("k", "k2")]
    for p in procs:
        p.wait(timeout=300)
        assert p.returncode == 0, p.stderr.read()[-2000:]
    store = open_store(db=url, root=str(root))
    assert store.sql("SELECT count(*) AS n FROM datasets")["n"][0] == 1
    assert store.sql("SELECT count(*) AS n FROM examples")["n"][0] == N_EXAMPLES
    assert_same_as_clean(store, clean, "k")
    assert_same_as_clean(store, clean, "k2")


# ---------------------------------------------------------------- reading while writing


def test_queries_during_ingest_see_consistent_snapshots(fresh, corpus, tiny_model, clean, forks):
    url, root = fresh
    proc = forks.start(ingest_cmd(url, root, corpus, tiny_model))
    partial = 0
    store = None
    while proc.poll() is None:
        try:
            store = store or open_store(db=url, root=str(root))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                frame = run_query(store, "relative_position", run="k")
            n = frame.attrs["n_examples"]
            if frame.attrs["run_state"] != "complete":
                assert any(issubclass(w.category, IncompleteRunWarning) for w in caught)
                partial += 1
            examples = store.examples("k")
            assert len(examples) >= n and examples["example_id"].is_unique
            last = int(examples["example"].iloc[-1])
            np.testing.assert_array_equal(store.attention("k", last), clean.attention("k", last))
        except NotFoundError as exc:  # no run yet, or no example stored yet
            assert "no run" in str(exc) or "no stored examples" in str(exc), str(exc)
        time.sleep(0.05)
    assert proc.returncode == 0, proc.stderr.read()[-2000:]
    assert partial > 0
    final = run_query(open_store(db=url, root=str(root)), "relative_position", run="k")
    assert final.equals(run_query(clean, "relative_position", run="k"))


# ---------------------------------------------------------------- full disk, read-only


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); needs root/CAP_SYS_ADMIN")


@pytest.fixture
def tmpfs(tmp_path):
    mounted: list[Path] = []

    def mount(name: str, size: str) -> Path:
        path = tmp_path / name
        _mount_tmpfs(path, size)
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_full_disk_is_one_line_interrupted_and_resumable_after_a_second_attempt(fresh, corpus, tiny_model, clean, tmpfs, forks):
    """A full disk is one error line naming it and saying the run resumes; the run is left interrupted with some examples
    stored. Issue 24 item 10: the same ingest again before space is freed (its resumed writer first rewrites the index
    arrays, on the full disk) prints the one error line on stderr and nothing else: no traceback, no asyncio noise
    ("Task was destroyed but it is pending!", "Exception ignored in"). Once there is space it resumes to what one clean
    ingest stores. (One test for both attempts: each failing ingest here is a fresh process with torch, ~5 s, since
    what a whole interpreter prints up to its exit is checked; the resume, checked by its exit code and what it
    stored, is forked as the module's other ingests are.)"""
    url, _ = fresh
    root = tmpfs("small", "256k") / "attention.zarr"
    cmd = ingest_cmd(url, root, corpus, tiny_model)
    for attempt in range(2):
        full = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
        lines = full.stderr.strip().splitlines()
        assert full.returncode == 1 and len(lines) == 1, (attempt, full.stderr[-3000:])
        assert lines[0].startswith("Error: cannot write the ") and "No space left on device" in lines[0] and "resume" in lines[0]
        store = open_store(db=url, root=str(root))
        assert store.run_state("k")[0] == "interrupted" and store.run_info("k").status == "interrupted"
        assert 0 < store.run_info("k").n_stored < N_EXAMPLES
        store.close()
    subprocess.run(["mount", "-o", "remount,size=64m", str(root.parent)], check=True)
    again = forks.run(cmd)
    assert again.returncode == 0, again.stderr[-2000:]
    assert_same_as_clean(open_store(db=url, root=str(root)), clean)


def test_read_only_store_can_be_read_but_not_written(tmp_path, corpus, tiny_model, tiny_loaded, clean, tmpfs):
    from click.testing import CliRunner

    from attnstore.api.cli import main

    home = tmpfs("share", "64m")
    url, root = f"sqlite:///{home / 'meta.sqlite'}", home / "attention.zarr"
    migrate.upgrade(url)
    with open_store(db=url, root=str(root)) as writable:  # closed before the file system turns read-only
        ingest_here(writable, corpus, tiny_loaded)
    subprocess.run(["mount", "-o", "remount,ro", str(home)], check=True)
    store = open_store(db=url, root=str(root))
    assert store.read_only
    assert run_query(store, "entropy", run="k").equals(run_query(clean, "entropy", run="k"))
    runner = CliRunner()
    for args in (["runs"], ["sql", "SELECT count(*) AS n FROM tokens"], ["check"], ["query", "relative_position", "--run", "k"]):
        result = runner.invoke(main, [*args, "--db", url, "--root", str(root)])
        assert result.exit_code == 0, (args, result.output)
    result = runner.invoke(
        main,
        [
            "ingest",
            "--corpus",
            str(corpus),
            "--format",
            "text",
            "--annotate",
            "whitespace",
            "--model",
            tiny_model,
            "--name",
            "new",
            "--db",
            url,
            "--root",
            str(root),
        ],
    )
    assert result.exit_code == 1 and "read-only" in result.output and len(result.output.strip().splitlines()) == 1


def test_writer_given_a_read_only_array_root_fails_cleanly(fresh, corpus, tiny_model, tmpfs):
    url, _ = fresh
    share = tmpfs("ro", "1m")
    subprocess.run(["mount", "-o", "remount,ro", str(share)], check=True)
    done = subprocess.run(
        ingest_cmd(url, share / "attention.zarr", corpus, tiny_model), env=ENV, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and "read-only" in done.stderr and "Traceback" not in done.stderr, done.stderr
    store = open_store(db=url, root=str(share / "attention.zarr"))
    assert store.runs().empty and store.sql("SELECT count(*) AS n FROM datasets")["n"][0] == 0
