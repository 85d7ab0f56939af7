"""Per-token loss of causal LMs (issue: decoder LLMs, item 6): a tiny random decoder saved as its *ForCausalLM
checkpoint goes through the real `attnstore ingest`, and the run's token_loss array holds, per token, the next-token loss
-log p(token[i+1] | tokens[..i]) in nats from the pass that made the maps: equal to a direct cross entropy over the
checkpoint's logits, NaN at each example's last token. Encoders and --no-token-loss keep none, and reading it is refused
in one line; an interrupted ingest resumes with the loss rows aligned to the tokens."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")

from attnstore.tests.ingest.test_decoders import CORPUS, cli_ingest, store_args  # noqa: E402

LONGER = CORPUS + "Colorless green ideas sleep furiously.\nThe dog ran.\n"


def open_at(tmp_path):
    from attnstore.store import open_store

    return open_store(db=f"sqlite:///{tmp_path / 'meta.sqlite'}", root=str(tmp_path / "attention.zarr"))


def direct_loss(path: str, ids: list[int], segments: list[int] | None) -> np.ndarray:
    """The checkpoint's logits over the example's ids alone (token_type_ids where ingest gives them: the tiny GPT-2's
    tokenizer makes them), cross entropy against the next ids."""
    model = T.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    extra = {} if segments is None else {"token_type_ids": torch.tensor([segments])}
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids]), **extra).logits[0].float()
        loss = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="none")
    return np.append(loss.numpy(), np.float32("nan")).astype(np.float32)


def check_loss(store, run: str, path: str, examples) -> None:
    given = store.run_info(run).manifest["model"]["inputs"]
    for example in examples:
        tokens = store.tokens(run, example)
        ids = [int(i) for i in tokens["token_id"]]
        segments = [int(s) for s in tokens["segment"]] if "token_type_ids" in given else None
        stored = store.token_loss(run, example)
        assert stored.dtype == np.float32 and stored.shape == (len(ids),)
        assert np.isnan(stored[-1]) and np.isfinite(stored[:-1]).all()
        np.testing.assert_allclose(stored, direct_loss(path, ids, segments), rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
def test_causal_lm_keeps_token_loss_equal_to_its_cross_entropy(arch, tiny, tmp_path, monkeypatch):
    import zarr

    from attnstore.ingest import passes
    from attnstore.store import arrays
    from attnstore.store.check import check_run

    monkeypatch.setattr(passes, "LOSS_CHUNK", 3)  # the LM head over chunks of 3 tokens: their seams are checked too

    path = tiny(arch)
    result = cli_ingest(tmp_path, path, arch)
    assert result.exit_code == 0, result.output
    assert "per-token loss" not in result.output
    store = open_at(tmp_path)
    try:
        assert store.has_token_loss(arch)
        entry = store.run_info(arch).manifest["token_loss"]
        assert entry["unit"] == "nats" and entry["array"] == "token_loss" and entry["dtype"] == "float32"
        check_loss(store, arch, path, range(3))
        assert sorted(e for e, _ in store.iter_token_loss(arch)) == [0, 1, 2]
        np.testing.assert_array_equal(store.run(arch).token_loss(1), store.token_loss(arch, 1))
        # What a plain zarr reader sees: the array and what it holds.
        group = zarr.open_group(str(tmp_path / "attention.zarr"), path=arrays.run_group_path(arch), mode="r")
        array = group[arrays.TOKEN_LOSS]
        assert array.dtype == np.float32 and array.attrs["unit"] == "nats" and array.shape[0] == len(store.token_table(arch))
        assert not check_run(store, arch).problems
        if arch == "llama":
            check_bundle_and_damage(store, arch, tmp_path)
    finally:
        store.close()


def check_bundle_and_damage(store, run: str, tmp_path) -> None:
    """A bundle carries the run's token_loss (the run's group byte for byte); `attnstore check` reports it cut short."""
    import zarr

    from attnstore.store import migrate, open_store
    from attnstore.store.bundle import export_runs, import_bundle
    from attnstore.store.check import check_run

    export_runs(store, [run], str(tmp_path / "b.zip"))
    url = f"sqlite:///{tmp_path / 'dst.sqlite'}"
    migrate.upgrade(url)
    dst = open_store(db=url, root=str(tmp_path / "dst.zarr"))
    try:
        import_bundle(dst, str(tmp_path / "b.zip"))
        assert dst.has_token_loss(run)
        for example in range(3):
            np.testing.assert_array_equal(dst.token_loss(run, example), store.token_loss(run, example))
        assert not check_run(dst, run).problems
        array = zarr.open_array(str(tmp_path / "dst.zarr"), path=f"runs/{run}/token_loss", mode="r+")
        array.resize((array.shape[0] - 1,))
        problems = check_run(dst, run).problems
        assert any("token_loss holds" in str(p) and "per-token loss" in str(p) for p in problems), problems
    finally:
        dst.close()


def test_no_token_loss_flag_and_encoders_keep_none(tiny, tmp_path):
    from click.testing import CliRunner

    from attnstore.api.cli import main
    from attnstore.store.errors import InvalidArgumentError
    from attnstore.tests.ingest.test_architectures import build as build_encoder

    result = cli_ingest(tmp_path, tiny("gpt2"), "gpt2")  # a first run, so the store exists
    assert result.exit_code == 0, result.output
    corpus = tmp_path / "corpus.txt"
    args = ["ingest", "--corpus", str(corpus), "--format", "text", "--annotate", "whitespace", "--no-progress"]
    skipped = CliRunner().invoke(main, [*args, "--model", tiny("gpt2"), "--name", "without", "--no-token-loss", *store_args(tmp_path)])
    assert skipped.exit_code == 0, skipped.output
    (tmp_path / "bert").mkdir()
    encoder = build_encoder("bert", tmp_path / "bert")
    bert = CliRunner().invoke(main, [*args, "--model", encoder, "--name", "bert", *store_args(tmp_path)])
    assert bert.exit_code == 0, bert.output
    assert "per-token loss" not in bert.output  # an encoder: nothing to say
    store = open_at(tmp_path)
    try:
        for run in ("without", "bert"):
            assert not store.has_token_loss(run) and "token_loss" not in store.run_info(run).manifest
            with pytest.raises(InvalidArgumentError) as refused:
                store.token_loss(run, 0)
            message = str(refused.value)
            assert "\n" not in message and f"run {run!r} has no per-token loss" in message and "ingest a causal LM" in message
    finally:
        store.close()


def test_a_causal_checkpoint_without_its_lm_head_keeps_no_loss(tmp_path):
    from attnstore.tests.ingest.test_decoders import byte_level_tokenizer

    torch.manual_seed(0)
    tok = byte_level_tokenizer(bos=False)
    folder = tmp_path / "gpt2-base"
    T.GPT2Model(T.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=64)).save_pretrained(folder)
    tok.save_pretrained(folder)
    result = cli_ingest(tmp_path, str(folder), "base")
    assert result.exit_code == 0, result.output
    assert "no per-token loss (its checkpoint has no causal-LM head)" in result.output
    store = open_at(tmp_path)
    try:
        assert not store.has_token_loss("base") and store.run_info("base").manifest["model"]["causal"]
    finally:
        store.close()


def test_interrupted_ingest_resumes_with_loss_rows_aligned(tiny, tmp_path, monkeypatch):
    """Cut off twice: once in a forward pass, once after a batch's loss was written but before its rows committed (the
    loss on disk, no rows). The resumed runs' loss is that of the tokens they stored, example by example."""
    from attnstore.ingest import passes
    from attnstore.ingest.runner import ingest
    from attnstore.store.writer import RunWriter

    path = tiny("llama")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(LONGER, encoding="utf-8")
    from attnstore.store import migrate

    migrate.upgrade(f"sqlite:///{tmp_path / 'meta.sqlite'}")
    store = open_at(tmp_path)
    options = dict(corpus=str(corpus), fmt="text", annotator="whitespace", model=path, batch_size=1, chunk_cells=256)
    options.update(dtype="float32", name="resumed", progress=False)
    real_forward, real_write = passes.forward_with_loss, RunWriter._write_loss
    calls = {"forward": 0, "write": 0}

    def flaky_forward(loaded, batch, *args):
        calls["forward"] += 1
        if calls["forward"] == 3:
            raise KeyboardInterrupt
        return real_forward(loaded, batch, *args)

    def write_then_crash(self, losses):
        real_write(self, losses)
        if losses:
            calls["write"] += 1
            if calls["write"] == 2:
                raise KeyboardInterrupt  # the loss is on disk, the rows of its examples are not committed

    try:
        monkeypatch.setattr(passes, "forward_with_loss", flaky_forward)
        with pytest.raises(KeyboardInterrupt):
            ingest(store, **options)
        first = store.run_info("resumed")
        assert first.status == "interrupted" and 0 < first.n_stored < 5
        monkeypatch.setattr(passes, "forward_with_loss", real_forward)
        monkeypatch.setattr(RunWriter, "_write_loss", write_then_crash)
        with pytest.raises(KeyboardInterrupt):
            ingest(store, **options)
        second = store.run_info("resumed")
        assert second.status == "interrupted" and first.n_stored <= second.n_stored < 5
        monkeypatch.setattr(RunWriter, "_write_loss", real_write)
        done = ingest(store, **options)
        assert done.run.status == "complete" and done.run.n_stored == 5
        check_loss(store, "resumed", path, range(5))
        from attnstore.store.check import check_run

        assert not check_run(store, "resumed").problems
    finally:
        store.close()
