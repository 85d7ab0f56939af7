"""End to end with the real model: stored maps equal a fresh eager forward pass; runs resume."""

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from attnstore.ingest import ingest, passes

pytestmark = pytest.mark.model
FIXTURES = Path(__file__).parents[1] / "fixtures"
MRPC = FIXTURES / "mrpc_dev_head.tsv"
EWT = FIXTURES / "ewt_dev_excerpt.conllu"


def fresh_forward(loaded, token_ids, segments):
    import torch

    with torch.inference_mode():
        out = loaded.model(input_ids=torch.tensor([list(token_ids)]), token_type_ids=torch.tensor([list(segments)]), output_attentions=True)
    return torch.stack(out.attentions, 1)[0].numpy()


def assert_matches_model(store, run, loaded, example):
    toks = store.tokens(run, example)
    maps = store.attention(run, example).astype(np.float32)
    assert maps.shape == (loaded.n_layers, loaded.n_heads, len(toks), len(toks))  # never padded
    np.testing.assert_allclose(maps, fresh_forward(loaded, toks["token_id"], toks["segment"]), atol=1e-3)
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=5e-3)
    special = toks["is_special"].to_numpy(bool)
    assert special.sum() >= 2
    assert (maps[..., special].sum(axis=2) > 0).all()  # special tokens are never masked out


@pytest.mark.one_backend
def test_stored_maps_equal_a_fresh_forward_pass(store, loaded_model):
    result = ingest(store, corpus=str(MRPC), fmt="pairs-tsv", loaded=loaded_model, batch_size=5, progress=False)
    run = result.run
    assert (run.status, run.n_stored, run.n_truncated, run.n_skipped) == ("complete", 12, 0, 0)
    assert run.manifest["model"]["weights_sha256"] == loaded_model.weights_sha256
    assert run.manifest["attn_implementation"] == "eager" and run.manifest["dtype"] == "float16"
    assert run.manifest["corpus"]["annotator"].startswith("spacy:")
    for example in range(12):
        assert_matches_model(store, run.name, loaded_model, example)
    # each example lies in the fewest blosc blocks (256 KiB, 131,072 float16 cells): a first read decodes no more
    frame, block = store.examples(run.name).sort_values("offset"), 1 << 17
    start, cells = frame["offset"].to_numpy(), 6 * 12 * frame["length"].to_numpy() ** 2
    assert ((start + cells - 1) // block - start // block + 1 == -(-cells // block)).all()
    assert (start[1:] > start[:-1] + cells[:-1]).any()  # some were moved on (a gap of zeros before them)
    toks = store.tokens(run.name, 0)
    assert set(toks["segment"]) == {0, 1} and toks["upos"].notna().sum() > 10
    again = ingest(store, corpus=str(MRPC), fmt="pairs-tsv", loaded=loaded_model, progress=False)
    assert again.already_complete and store.run_info(run.name).n_stored == 12


@pytest.mark.one_backend
def test_gold_conllu_annotation_is_used(store, loaded_model):
    run = ingest(store, corpus=str(EWT), fmt="conllu", loaded=loaded_model, progress=False).run
    assert run.manifest["corpus"]["annotator"] == "gold"
    toks = store.tokens(run.name, 2)
    did = toks[toks["word"] == "did"].iloc[0]
    nt = toks[toks["word"] == "n't"]
    assert did["upos"] == "AUX" and did["annotator"] == "gold"
    assert list(nt["token"]) == ["n", "'", "t"] and set(nt["deprel"]) == {"advmod"}
    assert_matches_model(store, run.name, loaded_model, 4)


@pytest.mark.one_backend
def test_truncation_and_skip_are_recorded(store, loaded_model, tmp_path):
    corpus = tmp_path / "long.txt"
    corpus.write_text("short one\n" + " ".join(["word"] * 40) + "\n", encoding="utf-8")
    cut = ingest(
        store, corpus=str(corpus), fmt="text", annotator="whitespace", loaded=loaded_model, max_length=16, name="cut", progress=False
    ).run
    assert (cut.n_stored, cut.n_truncated, cut.truncation) == (2, 1, "truncate")
    assert store.attention("cut", 1).shape[-1] == 16
    skip = ingest(
        store,
        corpus=str(corpus),
        fmt="text",
        annotator="whitespace",
        loaded=loaded_model,
        max_length=16,
        truncation="skip",
        name="skip",
        progress=False,
    ).run
    assert (skip.n_stored, skip.n_skipped) == (1, 1)
    with pytest.raises(FileNotFoundError, match="was skipped"):
        store.attention("skip", 1)


@pytest.mark.one_backend
def test_two_forward_passes_at_once_store_what_one_pass_stores(store, loaded_model, monkeypatch):
    """On a CPU, ingest runs two passes of one torch thread each (passes.forward_passes): same maps,
    bit for bit, in the same storage order as one pass at a time; torch's own setting is kept."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert passes.forward_passes() == (2, 1)
        torch.set_num_threads(3)
        assert passes.forward_passes() == (1, 3)  # no half of three threads
        torch.set_num_threads(2)
        seen = set()
        real_forward = passes.forward_attention

        def noting_forward(loaded, batch, **options):
            seen.add((threading.get_ident(), torch.get_num_threads()))
            return real_forward(loaded, batch, **options)

        monkeypatch.setattr(passes, "forward_attention", noting_forward)
        options = dict(corpus=str(MRPC), fmt="pairs-tsv", annotator="whitespace", loaded=loaded_model, batch_size=2, progress=False)
        ingest(store, name="two", **options)
        assert torch.get_num_threads() == 2
        assert {threads for _, threads in seen} == {1} and len(seen) == 2  # two threads, one torch thread each
        monkeypatch.setattr(passes, "forward_passes", lambda: (1, 1))
        ingest(store, name="one", **options)
    finally:
        torch.set_num_threads(before)
    two, one = store.examples("two"), store.examples("one")
    assert list(two["example"]) == list(one["example"]) and list(two["offset"]) == list(one["offset"])
    for example in range(12):
        np.testing.assert_array_equal(store.attention("two", example), store.attention("one", example))


def test_overlapped_chunk_writes_store_what_waiting_stores(store, loaded_model, monkeypatch):
    """Where cores are left beside the forward passes (passes.storage_overlaps), a batch's chunks are written in
    the background while the rows of the batch before commit: the same maps, offsets and rows as waiting."""
    import os

    import torch

    cores = len(os.sched_getaffinity(0))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(cores)
        assert passes.storage_overlaps() is False  # the passes use every core: storing waits
        torch.set_num_threads(1)
        assert passes.storage_overlaps() is (cores > 1)
    finally:
        torch.set_num_threads(before)
    seen = []
    real_store = passes.store_items

    def noting_store(writer, items, overlap=False):
        seen.append(overlap)
        return real_store(writer, items, overlap)

    monkeypatch.setattr(passes, "store_items", noting_store)
    options = dict(corpus=str(MRPC), fmt="pairs-tsv", annotator="whitespace", loaded=loaded_model, batch_size=2, progress=False)
    options["chunk_cells"] = 4096  # many chunks, so most writes overlap a commit
    for name, overlap in (("overlapped", True), ("waiting", False)):
        monkeypatch.setattr(passes, "storage_overlaps", lambda overlap=overlap: overlap)
        ingest(store, name=name, **options)
        assert seen and set(seen) == {overlap}
        seen.clear()
    overlapped, waiting = store.examples("overlapped"), store.examples("waiting")
    assert list(overlapped["example"]) == list(waiting["example"]) and list(overlapped["offset"]) == list(waiting["offset"])
    assert store.token_table("overlapped").equals(store.token_table("waiting"))
    for example in range(12):
        np.testing.assert_array_equal(store.attention("overlapped", example), store.attention("waiting", example))
    assert not [t for t in threading.enumerate() if t.name.startswith("attnstore-chunks")]


def test_interrupted_run_resumes_without_duplicates_or_loss(store, loaded_model, monkeypatch):
    real_forward = passes.forward_attention
    calls = {"n": 0}

    def flaky_forward(loaded, batch, **options):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real_forward(loaded, batch, **options)

    monkeypatch.setattr(passes, "forward_attention", flaky_forward)
    with pytest.raises(KeyboardInterrupt):
        ingest(
            store,
            corpus=str(MRPC),
            fmt="pairs-tsv",
            annotator="whitespace",
            loaded=loaded_model,
            batch_size=2,
            chunk_cells=4096,
            name="resumed",
            progress=False,
        )
    partial = store.run_info("resumed")
    assert partial.status == "interrupted" and 0 < partial.n_stored < 12
    monkeypatch.setattr(passes, "forward_attention", real_forward)
    done = ingest(
        store,
        corpus=str(MRPC),
        fmt="pairs-tsv",
        annotator="whitespace",
        loaded=loaded_model,
        batch_size=2,
        chunk_cells=4096,
        name="resumed",
        progress=False,
    )
    assert done.n_new == 12 - partial.n_stored
    examples = store.examples("resumed")
    assert sorted(examples["example"]) == list(range(12))
    for example in range(12):
        assert_matches_model(store, "resumed", loaded_model, example)
    # the value norms of the resumed run are those of an uninterrupted one (the same batches), and check finds nothing
    from attnstore.store.check import check_run

    ingest(
        store,
        corpus=str(MRPC),
        fmt="pairs-tsv",
        annotator="whitespace",
        loaded=loaded_model,
        batch_size=2,
        chunk_cells=4096,
        name="clean",
        progress=False,
    )
    clean = dict(store.iter_value_norms("clean"))
    for example, norms in store.iter_value_norms("resumed"):
        assert np.array_equal(norms, clean[example]), example
    assert not check_run(store, "resumed").problems


def test_kill_9_mid_run_then_resume(tmp_path, loaded_model):
    corpus = tmp_path / "corpus.txt"
    lines = [line.split("\t")[3] for line in MRPC.read_text(encoding="utf-8-sig").splitlines()[1:]]
    corpus.write_text("\n".join(lines * 20) + "\n", encoding="utf-8")  # 240 examples
    home = tmp_path / "store"
    cli = [sys.executable, "-m", "attnstore.api.cli"]
    env = {**os.environ, "ATTNSTORE_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    subprocess.run(cli + ["db", "upgrade"], check=True, env=env, capture_output=True)
    args = cli + [
        "ingest",
        "--corpus",
        str(corpus),
        "--format",
        "text",
        "--annotate",
        "whitespace",
        "--batch-size",
        "4",
        "--chunk-cells",
        "16384",
        "--name",
        "k",
        "--no-progress",
    ]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    db = home / "meta.sqlite"
    deadline = time.time() + 120
    stored = 0
    while time.time() < deadline and proc.poll() is None:
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
                stored = conn.execute("SELECT count(*) FROM sequences").fetchone()[0]
        except sqlite3.Error:
            stored = 0
        if stored > 0:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    with sqlite3.connect(db) as conn:
        before = conn.execute("SELECT count(*) FROM sequences").fetchone()[0]
    assert 0 < before < 240
    from click.testing import CliRunner

    from attnstore.api.cli import main

    # the same command resumes it; in this process, which has torch and the model's code imported (a fresh one spends
    # ~6 s on that): what is tested is the resume of a run whose writer was killed, and that writer was a real process
    resumed = CliRunner().invoke(main, args[len(cli) :], env={"ATTNSTORE_HOME": str(home)})
    assert resumed.exit_code == 0, resumed.output[-2000:]
    from attnstore import open_store

    store = open_store(home=str(home))
    info = store.run_info("k")
    examples = store.examples("k")
    assert info.status == "complete" and info.n_stored == 240
    assert sorted(examples["example"]) == list(range(240)) and examples["example_id"].is_unique
    for example in (0, before - 1, before, 239):
        assert_matches_model(store, "k", loaded_model, example)
