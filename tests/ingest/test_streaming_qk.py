"""Streaming capture and the Q/K tier (issue: decoder capture, items 2-5) on tiny random decoders: the maps taken block
by block inside the model's attention call are the eager model's; a run in the Q/K tier rebuilds them from its stored
queries, keys and log-sum-exps (store/qk.py) to float32 rounding, by blocks of rows too, answers queries as the dense
run does, describes itself to plain zarr, is checked by `attnstore check`, and bad input is refused in one line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")

from attnstore.tests.ingest.test_decoders import store_args  # noqa: E402

pytestmark = pytest.mark.model  # tiny random models through torch (~1 min in all): out of `make test-fast`, whose
# edit loop has the store side in tests/store/test_qk_tier.py

LONG = (
    "The cat sat on the mat and the dog barked at the cat, and it ran away from the dog into the garden.\n"
    "Don't stop me now, the cat sat on the mat while the dog ran.\n"
    "A dog barked.\n"
)
SHORT = "A dog.\nThe cat sat.\nA cat ran.\n"


def eager_maps(path: str, token_ids: list[int]) -> np.ndarray:
    """(layer, head, L, L) of the checkpoint run eagerly on one unpadded example."""
    model = T.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([token_ids]), output_attentions=True)
    return torch.stack(out.attentions, 1)[0].numpy()


def ingest_cli(tmp_path: Path, model: str, name: str, corpus: str, *extra: str, fmt: str = "text"):
    from click.testing import CliRunner

    from attnstore.api.cli import main

    path = tmp_path / f"{name}.{fmt}"
    path.write_text(corpus, encoding="utf-8")
    args = ["ingest", "--corpus", str(path), "--format", fmt, "--annotate", "whitespace", "--no-progress", "--dtype", "float32"]
    return CliRunner().invoke(main, [*args, "--model", model, "--name", name, *extra, *store_args(tmp_path)])


def open_tmp_store(tmp_path: Path):
    from attnstore.store import open_store

    return open_store(db=f"sqlite:///{tmp_path / 'meta.sqlite'}", root=str(tmp_path / "attention.zarr"))


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_streaming_capture_is_the_eager_models_maps_block_by_block(arch, tiny, monkeypatch):
    """Blocks of 3 query rows (causal keys up to each block's last row), a padded batch, gemma3's window of 4 on layer 0."""
    from attnstore.ingest import streaming
    from attnstore.ingest.align import Encoded
    from attnstore.ingest.model import load_model
    from attnstore.ingest.passes import forward_attention

    monkeypatch.setattr(streaming, "QUERY_BLOCK", 3)
    path = tiny(arch)
    loaded = load_model(path)
    assert loaded.capture == "streaming" and loaded.attention_sources is None
    texts = ["the cat sat on the mat and the dog barked at the cat", "a dog ran"]
    ids = [loaded.tokenizer(t)["input_ids"] for t in texts]
    batch = [
        Encoded(example_id=k, position=k, input_ids=i, token_type_ids=None, tokens=[], truncated=False, full_length=len(i))
        for k, i in enumerate(ids)
    ]
    maps, lengths = forward_attention(loaded, batch)
    assert maps.shape[:2] == (2, 2) and lengths == [len(i) for i in ids]
    for k, i in enumerate(ids):
        n = len(i)
        np.testing.assert_allclose(maps[k, :, :, :n, :n].numpy(), eager_maps(path, i), atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen2"])
def test_a_qk_run_rebuilds_the_dense_runs_maps(arch, tiny, tmp_path):
    import zarr

    from attnstore.queries import run_query
    from attnstore.store import qk
    from attnstore.store.check import check_run

    path = tiny(arch)
    for name, tier in (("dense", "dense"), ("qk", "qk")):
        result = ingest_cli(tmp_path, path, name, LONG, "--tier", tier, "--qk-dtype", "float32", "--device", "cpu")
        assert result.exit_code == 0, result.output
    store = open_tmp_store(tmp_path)
    try:
        info = store.run_info("qk")
        assert (info.tier, store.run_info("dense").tier) == ("qk", "dense")
        assert info.manifest["capture"]["path"] == "streaming" and info.manifest["tier"] == "qk"
        entry = info.qk
        assert (entry["dtype"], entry["n_kv_heads"], len(entry["scale"])) == ("float32", 2, 2)
        assert entry["window"] == ([4, None] if arch == "gemma3" else [None, None])
        for example in range(3):
            dense = store.attention("dense", example)
            rebuilt = store.attention("qk", example)
            assert rebuilt.shape == dense.shape and rebuilt.dtype == np.float32
            np.testing.assert_allclose(rebuilt, dense, atol=1e-5)
            ids = store.tokens("qk", example)["token_id"].tolist()
            np.testing.assert_allclose(rebuilt, eager_maps(path, ids), atol=1e-5)
            block = store.attention("qk", example, layer=1, head=[0, 3], rows=range(2, 5))
            # the same cells to float32 rounding, not bit for bit: OpenBLAS picks its matmul kernel by the matrices' shape
            # and the CPU (3 rows against all of them differed by 4.5e-8 on an AMD EPYC)
            np.testing.assert_allclose(block, rebuilt[1:2, [0, 3], 2:5], rtol=0, atol=1e-6)
        streamed = dict(store.iter_attention("qk"))
        assert sorted(streamed) == [0, 1, 2] and all(np.array_equal(streamed[e], store.attention("qk", e)) for e in streamed)
        for query in ("entropy", "special_tokens"):
            a, b = run_query(store, query, run="dense"), run_query(store, query, run="qk")
            np.testing.assert_allclose(a.select_dtypes("number").to_numpy(float), b.select_dtypes("number").to_numpy(float), atol=1e-4)
        assert check_run(store, "qk").problems == []

        # The arrays describe themselves: one head rebuilt with plain zarr from the attributes' formula.
        group = zarr.open_group(str(tmp_path / "attention.zarr"), path="runs/qk", mode="r")
        q, k, lse = (group[name] for name in (qk.QUERY, qk.KEY, qk.LSE))
        assert "exp(qk_query" in q.attrs["formula"] and q.metadata.dimension_names == ("token", "layer", "head", "dim")
        at = int(np.flatnonzero(group["example"][:] == 0)[0])  # example 0's place in storage order
        t0, n = int(group["token_start"][at]), int(group["length"][at])
        layer, head = 0, 3
        t = slice(t0, t0 + n)
        logits = q[t, layer, head] @ k[t, layer, head // 2].T * q.attrs["scale"][layer] - lse[t, layer, head][:, None]
        i, j = np.indices((n, n))
        window = q.attrs["window"][layer]
        seen = (j <= i) & ((i - j < window) if window else True)
        np.testing.assert_allclose(np.where(seen, np.exp(np.where(seen, logits, 0)), 0), store.attention("qk", 0)[layer, head], atol=1e-6)
    finally:
        store.close()


def test_qk_tier_bytes_and_float16_error(tiny, tmp_path):
    """float16 Q/K (the default): half the bytes of float32, rows still sum to 1 (the log-sum-exps are taken from the
    rounded values), within 1e-2 of the eager maps on this random model."""
    path = tiny("llama")
    result = ingest_cli(tmp_path, path, "q16", LONG, "--tier", "qk")
    assert result.exit_code == 0, result.output
    store = open_tmp_store(tmp_path)
    try:
        assert store.run_info("q16").qk["dtype"] == "float16"
        for example in range(3):
            maps = store.attention("q16", example)
            np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
            ids = store.tokens("q16", example)["token_id"].tolist()
            assert np.abs(maps - eager_maps(path, ids)).max() < 1e-2
    finally:
        store.close()


def test_default_tier_follows_the_corpus_lengths(tiny, tmp_path):
    """Tiny llama (4 heads, 2 key/value heads of 8, float16 Q/K): the tier is smaller above (6 * 8 * 2 + 16) / 4 = 28 tokens."""
    from attnstore.ingest.model import load_model
    from attnstore.ingest.tiers import qk_crossover

    path = tiny("llama")
    assert qk_crossover(load_model(path), "float16") == 28
    for name, corpus, tier in (("long", LONG * 2, "qk"), ("short", SHORT, "dense")):
        result = ingest_cli(tmp_path, path, name, corpus)
        assert result.exit_code == 0, result.output
        store = open_tmp_store(tmp_path)
        try:
            assert store.run_info(name).tier == tier
        finally:
            store.close()


def test_bad_tier_and_device_are_refused_in_one_line(tiny, tmp_path):
    result = ingest_cli(tmp_path, tiny("gemma2"), "g2", LONG, "--tier", "qk")
    assert result.exit_code != 0
    last = result.output.strip().splitlines()[-1]  # after the lines saying the new store was created
    assert "soft-caps its attention logits" in last and last.endswith("use --tier dense") and "Traceback" not in result.output
    result = ingest_cli(tmp_path, tiny("llama"), "gpu", SHORT, "--device", "cuda:7")
    assert result.exit_code != 0 and "not available on this machine" in result.output and "--device auto or cpu" in result.output
    result = ingest_cli(tmp_path, tiny("llama"), "tpu", SHORT, "--device", "tpu")
    assert result.exit_code != 0 and "use auto, cpu, cuda, cuda:N or mps" in result.output
    assert not (tmp_path / "meta.sqlite").exists()  # nothing half-written: the store these commands created is gone


def check_bundle(store, run: str, tmp_path: Path) -> None:
    """A bundle carries a Q/K run: the imported run rebuilds the same maps and checks clean."""
    from attnstore.store import migrate, open_store
    from attnstore.store.bundle import export_runs, import_bundle
    from attnstore.store.check import check_run

    export_runs(store, [run], str(tmp_path / "b.zip"))
    url = f"sqlite:///{tmp_path / 'dst.sqlite'}"
    migrate.upgrade(url)
    dst = open_store(db=url, root=str(tmp_path / "dst.zarr"))
    try:
        import_bundle(dst, str(tmp_path / "b.zip"))
        assert dst.run_info(run).tier == "qk"
        for example in range(3):
            np.testing.assert_array_equal(dst.attention(run, example), store.attention(run, example))
        assert check_run(dst, run).problems == []
    finally:
        dst.close()


def test_the_writer_refuses_maps_on_a_qk_run_a_bundle_carries_it_and_check_finds_damage(tiny, tmp_path):
    from attnstore.store.check import check_run
    from attnstore.store.errors import InvalidArgumentError

    assert ingest_cli(tmp_path, tiny("llama"), "qk", LONG, "--tier", "qk").exit_code == 0
    store = open_tmp_store(tmp_path)
    try:
        info = store.run_info("qk")
        writer = store.writer.run_writer(info.id)
        try:
            with pytest.raises(InvalidArgumentError, match="is in the qk tier"):
                writer.add(99, np.zeros((2, 4, 1, 1), np.float32), [{"token_id": 1}])
        finally:
            writer.close()
        check_bundle(store, "qk", tmp_path)
        chunk = tmp_path / "attention.zarr" / "runs" / "qk" / "qk_key" / "c" / "0" / "1" / "0" / "0"
        assert chunk.is_file()
        chunk.write_bytes(b"damaged")
        problems = check_run(store, "qk").problems
        assert problems and "qk_key" in problems[0]["problem"]
    finally:
        store.close()


def test_a_jsonl_corpus_keeps_each_document_whole_and_bad_lines_are_named(tiny, tmp_path):
    import json

    from attnstore.ingest.corpus import read_jsonl
    from attnstore.ingest.errors import CorpusError

    docs = [{"id": "d1", "text": LONG.replace("\n", " ")}, {"id": "d2", "text": "A dog barked.\nThen it slept."}]
    corpus = "\n".join(json.dumps(d) for d in docs) + "\n"
    result = ingest_cli(tmp_path, tiny("llama"), "docs", corpus, "--tier", "qk", fmt="jsonl")
    assert result.exit_code == 0, result.output
    store = open_tmp_store(tmp_path)
    try:
        examples = store.examples("docs")
        assert examples["doc_id"].tolist() == ["d1", "d2"] and examples["text_a"].tolist()[1] == "A dog barked.\nThen it slept."
        assert len(store.tokens("docs", 0)) > 40 and store.run_info("docs").tier == "qk"
    finally:
        store.close()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text"}\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bad.jsonl:2: no string field 'text'; give each line a 'text' text"):
        list(read_jsonl(bad))
    bad.write_text("{not json\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bad.jsonl:1: not a JSON object"):
        list(read_jsonl(bad))


def test_reads_and_ingests_past_their_memory_limits_are_refused_in_one_line(tiny, tmp_path, monkeypatch):
    assert ingest_cli(tmp_path, tiny("llama"), "qk", LONG, "--tier", "qk").exit_code == 0
    store = open_tmp_store(tmp_path)
    try:
        n = len(store.tokens("qk", 0))
        monkeypatch.setenv("ATTNSTORE_REBUILD_MB", str(2 * 4 * n * n * 4 / 2**20 - 1e-6))  # one byte short of example 0
        with pytest.raises(Exception, match=r"rebuilding 2 layer\(s\) x 4 head\(s\) of an example of \d+ tokens needs .* read fewer"):
            store.attention("qk", 0)
        assert store.attention("qk", 0, layer=1).shape == (1, 4, n, n)  # half of it is within the limit
    finally:
        store.close()
    monkeypatch.setenv("ATTNSTORE_DENSE_MB", "0.001")
    result = ingest_cli(tmp_path, tiny("llama"), "dense", LONG, "--tier", "dense")
    assert result.exit_code != 0 and "its dense maps need" in result.output and "--tier qk" in result.output


def test_an_interrupted_qk_run_resumes_to_the_clean_runs_arrays(tiny, tmp_path, monkeypatch):
    """Cut off in a forward pass, then after a batch's Q/K was written but before its rows committed: the resumed run's
    maps equal a clean run's bit for bit (batches of one example: the same arithmetic), and check finds nothing."""
    from attnstore.ingest import passes
    from attnstore.ingest.runner import ingest
    from attnstore.store import migrate
    from attnstore.store.check import check_run
    from attnstore.store.writer import RunWriter

    path = tiny("llama")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(LONG + SHORT, encoding="utf-8")
    migrate.upgrade(f"sqlite:///{tmp_path / 'meta.sqlite'}")
    store = open_tmp_store(tmp_path)
    options = dict(corpus=str(corpus), fmt="text", annotator="whitespace", model=path, batch_size=1, tier="qk", progress=False)
    real_forward, real_write = passes.forward_with_loss, RunWriter._write_qk
    calls = {"forward": 0, "write": 0}

    def flaky_forward(loaded, batch, *args):
        calls["forward"] += 1
        if calls["forward"] == 3:
            raise KeyboardInterrupt
        return real_forward(loaded, batch, *args)

    def write_then_crash(self, parts):
        real_write(self, parts)
        if parts:
            calls["write"] += 1
            if calls["write"] == 2:
                raise KeyboardInterrupt  # queries and keys on disk, the rows of their examples not committed

    try:
        ingest(store, **options, name="clean")
        monkeypatch.setattr(passes, "forward_with_loss", flaky_forward)
        with pytest.raises(KeyboardInterrupt):
            ingest(store, **options, name="resumed")
        monkeypatch.setattr(passes, "forward_with_loss", real_forward)
        monkeypatch.setattr(RunWriter, "_write_qk", write_then_crash)
        with pytest.raises(KeyboardInterrupt):
            ingest(store, **options, name="resumed")
        assert 0 < store.run_info("resumed").n_stored < 6
        monkeypatch.setattr(RunWriter, "_write_qk", real_write)
        done = ingest(store, **options, name="resumed")
        assert done.run.status == "complete" and done.run.n_stored == 6
        for example in range(6):
            np.testing.assert_array_equal(store.attention("resumed", example), store.attention("clean", example))
        assert check_run(store, "resumed").problems == []
    finally:
        store.close()
