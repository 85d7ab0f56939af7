"""Any Hugging Face encoder or decoder-only model, or a one-line refusal (issue 13).

Tiny random models of each architecture (hidden 32, 2 layers, 2-4 heads) are built here,
with tokenizers built here too: character-level WordPiece vocabularies, byte-level BPE
and Metaspace ("sentencepiece-like") BPE trained on a few sentences. Nothing is
downloaded. Accepted models go through the real ingest path (raw-text pairs and gold
CoNLL-U words, batches of 2 so inputs are padded); their stored maps must equal an
unpadded eager forward pass of the inputs a user would give (`model(**tokenizer(a, b))`,
less what the forward does not take). Refused models must give one `Error:` line naming
the reason and leave the store as it was.
"""

from __future__ import annotations

import inspect
import string
from math import lgamma
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

pytestmark = pytest.mark.model

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")

SENTENCES = [
    "The cat sat on the mat.",
    "A dog barked at the cat, and it ran away.",
    "Don't stop me now!",
    "Colorless green ideas sleep furiously.",
    "the quick brown fox jumps over the lazy dog 123",
]
WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
POSITIONS = 40  # max_position_embeddings of the RoBERTa-style models: 38 usable positions after padding_idx 1

PAIRS = (
    "sentence1\tsentence2\n"
    "The cat sat.\tA dog ran away, fast.\n"
    "Don't stop me now!\tIt sat.\n"
    "the quick brown fox\tjumps over the lazy dog.\n"
)
CONLLU = "".join(
    f"# text = {' '.join(forms)}\n"
    + "".join(f"{i + 1}\t{f}\t{f}\tX\tX\t_\t{h}\tdep\t_\t_\n" for i, (f, h) in enumerate(zip(forms, heads)))
    + "\n"
    for forms, heads in [
        (["The", "cat", "sat", "."], [2, 3, 0, 3]),
        (["Dogs", "bark", "loudly"], [2, 0, 2]),
        (["A", "dog", "ran", "away", "fast", "."], [2, 3, 0, 3, 3, 3]),
    ]
)


# ---------------------------------------------------------------- tokenizers and models, built offline


def wordpiece(folder: Path, cls, specials=WORDPIECE_SPECIALS):
    """A character-level WordPiece vocabulary: any lowercase ASCII text, one piece per character."""
    chars = string.ascii_lowercase + string.digits
    vocab = [*specials, *chars, *(f"##{c}" for c in chars), *string.punctuation, "the", "cat"]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return cls(vocab_file=str(folder / "vocab.txt"))


def byte_level(folder: Path, cls, specials=ROBERTA_SPECIALS):
    """A byte-level BPE trained on SENTENCES, loaded by `cls` with its defaults (add_prefix_space=False)."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES, vocab_size=300, min_frequency=1, special_tokens=specials, show_progress=False)
    bpe.save_model(str(folder))
    return cls(vocab_file=str(folder / "vocab.json"), merges_file=str(folder / "merges.txt"))


def sentencepiece_like(cls, specials: list[str], single: str, pair: str):
    """A Metaspace BPE (what SentencePiece models convert to) trained on SENTENCES; no sentencepiece package needed."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    bpe = Tokenizer(models.BPE(unk_token=next(t for t in specials if "unk" in t.lower())))
    bpe.normalizer = normalizers.NFKC()
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    bpe.decoder = decoders.Metaspace()
    alphabet = list(string.ascii_letters + string.digits + string.punctuation)
    bpe.train_from_iterator(
        SENTENCES, trainers.BpeTrainer(vocab_size=200, special_tokens=specials, initial_alphabet=alphabet, show_progress=False)
    )
    used = sorted({t.split(":")[0] for t in f"{single} {pair}".split() if not t.startswith("$")})
    bpe.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=[(t, bpe.token_to_id(t)) for t in used])
    return cls(tokenizer_object=bpe)


def build(arch: str, folder: Path, head: str = "") -> str:
    """Save a tiny random `arch` model (its base model, or with `head="mlm"` a masked-LM) and its tokenizer."""
    torch.manual_seed(0)
    roberta_like = dict(max_position_embeddings=POSITIONS, pad_token_id=1, **SMALL)
    if arch == "bert":
        tok = wordpiece(folder, T.BertTokenizerFast)
        model = T.BertModel(T.BertConfig(vocab_size=len(tok), **SMALL))
    elif arch == "distilbert":  # with a BERT tokenizer: it gives token_type_ids, which DistilBERT does not take
        tok = wordpiece(folder, T.BertTokenizerFast)
        config = T.DistilBertConfig(vocab_size=len(tok), dim=32, n_layers=2, n_heads=2, hidden_dim=37)
        model = (T.DistilBertForMaskedLM if head == "mlm" else T.DistilBertModel)(config)
    elif arch == "electra":
        tok = wordpiece(folder, T.ElectraTokenizerFast)
        model = T.ElectraModel(T.ElectraConfig(vocab_size=len(tok), embedding_size=16, **SMALL))
    elif arch == "convbert":
        tok = wordpiece(folder, T.ConvBertTokenizerFast)
        model = T.ConvBertModel(T.ConvBertConfig(vocab_size=len(tok), embedding_size=32, head_ratio=2, **SMALL))
    elif arch == "funnel":
        tok = wordpiece(folder, T.FunnelTokenizerFast, ["<pad>", "<unk>", "<cls>", "<sep>", "<mask>", "<s>", "</s>"])
        model = T.FunnelModel(T.FunnelConfig(vocab_size=len(tok), block_sizes=[1, 1], d_model=32, n_head=2, d_head=16, d_inner=37))
    elif arch == "mpnet":
        tok = wordpiece(folder, T.MPNetTokenizerFast, ROBERTA_SPECIALS)
        model = (T.MPNetForMaskedLM if head == "mlm" else T.MPNetModel)(T.MPNetConfig(vocab_size=len(tok), **roberta_like))
    elif arch == "roberta":
        tok = byte_level(folder, T.RobertaTokenizerFast)
        config = T.RobertaConfig(vocab_size=len(tok), **roberta_like)
        model = (T.RobertaForMaskedLM if head == "mlm" else T.RobertaModel)(config)
    elif arch == "xlm-roberta":
        tok = sentencepiece_like(T.XLMRobertaTokenizerFast, ROBERTA_SPECIALS, "<s> $A </s>", "<s> $A </s> </s> $B </s>")
        model = T.XLMRobertaModel(T.XLMRobertaConfig(vocab_size=len(tok), **roberta_like))
    elif arch == "albert":
        tok = sentencepiece_like(
            T.AlbertTokenizerFast, ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"], "[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1"
        )
        model = T.AlbertModel(T.AlbertConfig(vocab_size=len(tok), embedding_size=16, **SMALL))
    elif arch == "deberta-v2":
        tok = sentencepiece_like(
            T.DebertaV2TokenizerFast, ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"], "[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1"
        )
        model = T.DebertaV2Model(
            T.DebertaV2Config(
                vocab_size=len(tok),
                relative_attention=True,
                position_biased_input=False,
                pos_att_type=["p2c", "c2p"],
                position_buckets=16,
                **SMALL,
            )
        )
    elif arch == "gpt2":  # no pad token, no special tokens added
        tok = byte_level(folder, T.GPT2TokenizerFast, ["<|endoftext|>"])
        model = T.GPT2Model(T.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=64))
    elif arch == "llama":  # no pad token; <s> first
        tok = sentencepiece_like(T.LlamaTokenizerFast, ["<unk>", "<s>", "</s>"], "<s> $A", "<s> $A <s> $B")
        model = T.LlamaModel(
            T.LlamaConfig(
                vocab_size=len(tok),
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=37,
                max_position_embeddings=64,
            )
        )
    elif arch == "t5":
        tok = sentencepiece_like(T.T5TokenizerFast, ["<pad>", "</s>", "<unk>"], "$A </s>", "$A </s> $B </s>")
        model = T.T5Model(T.T5Config(vocab_size=len(tok), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4))
    elif arch == "bart":
        tok = byte_level(folder, T.BartTokenizerFast)
        model = T.BartModel(
            T.BartConfig(
                vocab_size=len(tok),
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=37,
                decoder_ffn_dim=37,
                max_position_embeddings=64,
            )
        )
    else:
        raise ValueError(arch)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny(arch, head="") -> the folder of a saved tiny model, built once per module."""
    cache: dict[tuple[str, str], str] = {}

    def get(arch: str, head: str = "") -> str:
        if (arch, head) not in cache:
            cache[arch, head] = build(arch, tmp_path_factory.mktemp(f"{arch}{head}"), head)
        return cache[arch, head]

    return get


@pytest.fixture
def sqlite_store(tmp_path):
    from attnstore.store import migrate, open_store

    url = f"sqlite:///{tmp_path / 'meta.sqlite'}"
    migrate.upgrade(url)
    s = open_store(db=url, root=str(tmp_path / "attention.zarr"))
    yield s
    s.close()


# ---------------------------------------------------------------- accepted: maps equal an unpadded forward pass

# arch -> (heads, causal, passes token_type_ids)
ACCEPTED = {
    "bert": (4, False, True),
    "distilbert": (2, False, False),
    "electra": (4, False, True),
    "albert": (4, False, True),
    "deberta-v2": (4, False, False),  # type_vocab_size 0: its tokenizer's token_type_ids are unused
    "roberta": (4, False, False),
    "xlm-roberta": (4, False, False),
    "mpnet": (4, False, False),
    "gpt2": (4, True, False),
    "llama": (4, True, False),
}
BYTE_LEVEL = ("roberta", "gpt2")


def eager_model(loaded):
    """The loaded model, or for a decoder whose maps the streaming capture takes (ingest/streaming.py) an eager copy:
    with attnstore's attention implementation a model's own pass returns no maps."""
    if loaded.capture != "streaming":
        return loaded.model
    return T.AutoModelForCausalLM.from_pretrained(loaded.source, attn_implementation="eager").eval().get_decoder()


def reference_maps(loaded, encoding) -> np.ndarray:
    """(layer, head, L, L) of one unpadded eager forward pass of what the tokenizer gave, less what the forward does not take."""
    accepted = inspect.signature(loaded.model.forward).parameters
    inputs = {k: torch.tensor([v]) for k, v in encoding.items() if k in accepted}
    with torch.inference_mode():
        out = eager_model(loaded)(**inputs, output_attentions=True)
    return torch.stack(out.attentions, 1)[0].numpy()


def check_stopped_pass(loaded) -> None:
    """Ingest's pass stops at the last map (ingest/capture.py) and returns exactly the whole pass's maps, padded batch
    included; a decoder's streaming capture (ingest/streaming.py) returns the eager model's maps within 1e-5."""
    from attnstore.ingest import capture, streaming

    if loaded.causal:  # every decoder here goes through transformers' attention interface
        assert loaded.capture == "streaming" and loaded.attention_sources is None
    else:
        assert loaded.attention_sources is not None and loaded.attention_sources.n_maps == loaded.n_layers
    rows = [loaded.tokenizer("the cat sat on the mat .")["input_ids"], loaded.tokenizer("a dog")["input_ids"]]
    width = max(map(len, rows))
    batch = {
        "input_ids": torch.tensor([r + [loaded.pad_id] * (width - len(r)) for r in rows]),
        "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
        "token_type_ids": torch.zeros((2, width), dtype=torch.long),
    }
    inputs = loaded.model_inputs(batch)
    with torch.inference_mode():
        whole = eager_model(loaded)(**inputs, output_attentions=True).attentions
        if loaded.capture == "streaming":
            sink = streaming.DenseSink(loaded.n_layers, True, torch.float32, stop=True)
            streaming.run_with(sink, lambda: loaded.model(**inputs))
            taken = sink.result()
            real = inputs["attention_mask"].bool()
            for layer, eager in enumerate(whole):  # padded rows and keys aside (each path masks them its own way)
                for b in range(2):
                    n = int(real[b].sum())
                    assert (taken[b, layer, :, :n, :n] - eager[b, :, :n, :n]).abs().max() < 1e-5
            return
        stopped = capture.attention_maps(loaded.model, inputs, loaded.attention_sources)
    assert len(stopped) == len(whole) and all(torch.equal(a, b) for a, b in zip(stopped, whole))


def check_run(store, loaded, run: str, encodings: list, causal: bool) -> None:
    for example, encoding in enumerate(encodings):
        toks = store.tokens(run, example)
        assert toks["token_id"].tolist() == list(encoding["input_ids"])
        assert toks.loc[~toks["is_special"], "word"].notna().all()  # every non-special token has its word
        maps = store.attention(run, example).astype(np.float32)
        assert maps.shape == (loaded.n_layers, loaded.n_heads, len(toks), len(toks))
        np.testing.assert_allclose(maps, reference_maps(loaded, encoding), atol=1e-3)
        np.testing.assert_allclose(maps.sum(-1), 1.0, atol=5e-3)
        above = np.triu(np.ones(maps.shape[-2:], dtype=bool), 1)
        assert (maps[..., above] == 0).all() == causal


@pytest.mark.parametrize("arch", ACCEPTED)
def test_accepted_architecture_stores_exact_maps(arch, tiny, sqlite_store, tmp_path):
    from attnstore.ingest import ingest
    from attnstore.ingest.model import load_model

    heads, causal, types = ACCEPTED[arch]
    path = tiny(arch)
    loaded = load_model(path)
    assert (loaded.n_layers, loaded.n_heads, loaded.causal) == (2, heads, causal)
    assert loaded.architecture == type(loaded.model).__name__ and not loaded.architecture.endswith(("ForMaskedLM", "LMHeadModel"))
    assert ("token_type_ids" in loaded.inputs) == types
    assert (loaded.word_tokenizer_options == {"add_prefix_space": True}) == (arch in BYTE_LEVEL)
    check_stopped_pass(loaded)

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(PAIRS, encoding="utf-8")
    text_run = ingest(
        sqlite_store, corpus=str(pairs), fmt="pairs-tsv", annotator="whitespace", loaded=loaded, batch_size=2, name="text", progress=False
    ).run
    assert (text_run.status, text_run.n_stored, text_run.tokenization) == ("complete", 3, "text")
    assert text_run.manifest["model"]["causal"] is causal
    assert text_run.manifest["model"]["architecture"] == loaded.architecture
    rows = [line.split("\t") for line in PAIRS.splitlines()[1:]]
    check_run(sqlite_store, loaded, "text", [loaded.tokenizer(a, b) for a, b in rows], causal)

    conllu = tmp_path / "gold.conllu"
    conllu.write_text(CONLLU, encoding="utf-8")
    word_run = ingest(sqlite_store, corpus=str(conllu), fmt="conllu", loaded=loaded, batch_size=2, name="words", progress=False).run
    assert (word_run.n_stored, word_run.tokenization) == (3, "words")
    assert word_run.manifest["tokenizer"].get("add_prefix_space") == (True if arch in BYTE_LEVEL else None)
    words_tok = T.AutoTokenizer.from_pretrained(path, add_prefix_space=True) if arch in BYTE_LEVEL else loaded.tokenizer
    sentences = [[line.split("\t")[1] for line in block.splitlines() if line[:1].isdigit()] for block in CONLLU.split("\n\n")]
    check_run(sqlite_store, loaded, "words", [words_tok(s, is_split_into_words=True) for s in sentences if s], causal)

    recorded = sqlite_store.sql("SELECT architecture, causal FROM models").to_dict("records")
    assert [(r["architecture"], bool(r["causal"])) for r in recorded] == [(loaded.architecture, causal)]


@pytest.mark.parametrize("arch", ["mpnet", "roberta", "xlm-roberta"])
def test_positions_after_the_padding_index_limit_the_length(arch, tiny, sqlite_store, tmp_path):
    """RoBERTa-style positions start at padding_idx + 1: 40 position embeddings hold 38 tokens. The tokenizers here
    declare no model_max_length (like the real all-mpnet-base-v2 one can), so the table decides."""
    from attnstore.ingest import ingest
    from attnstore.ingest.model import load_model

    loaded = load_model(tiny(arch))
    assert loaded.max_length == POSITIONS - 2
    corpus = tmp_path / "long.txt"
    corpus.write_text(" ".join(["the cat sat on the mat."] * 12) + "\n", encoding="utf-8")
    run = ingest(sqlite_store, corpus=str(corpus), fmt="text", annotator="whitespace", loaded=loaded, progress=False).run
    assert (run.n_stored, run.n_truncated, run.max_length) == (1, 1, POSITIONS - 2)
    toks = sqlite_store.tokens(run.name, 0)
    assert len(toks) == POSITIONS - 2  # exactly the limit
    np.testing.assert_allclose(
        sqlite_store.attention(run.name, 0).astype(np.float32), reference_maps(loaded, {"input_ids": toks["token_id"].tolist()}), atol=1e-3
    )
    with pytest.raises(IndexError):  # one token more does not fit the position table
        loaded.model(input_ids=torch.tensor([toks["token_id"].tolist() + [5]]))


# ---------------------------------------------------------------- refused: one line naming the reason, store unchanged

REFUSED = {
    "t5": "(T5Model) is an encoder-decoder model; attnstore stores self-attention of encoder-only or decoder-only models",
    "bart": "(BartModel) is an encoder-decoder model; attnstore stores self-attention of encoder-only or decoder-only models",
    "funnel": "(FunnelModel) returns attention of shape (2, 2, ",
    "convbert": "(ConvBertModel) returns 2 attention heads per layer where its config declares num_attention_heads=4 (head_ratio=2",
}


def store_args(tmp_path: Path) -> list[str]:
    return ["--db", f"sqlite:///{tmp_path / 'meta.sqlite'}", "--root", str(tmp_path / "attention.zarr")]


def row_counts(tmp_path: Path) -> dict[str, int]:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'meta.sqlite'}")
    with engine.connect() as conn:
        counts = {
            t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one() for t in ("datasets", "examples", "models", "runs", "tokens")
        }
    engine.dispose()
    return counts


@pytest.mark.parametrize("arch", REFUSED)
def test_unsupported_architecture_is_refused_in_one_line(arch, tiny, sqlite_store, tmp_path):
    from click.testing import CliRunner

    from attnstore.api.cli import main

    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat.\n", encoding="utf-8")
    before = row_counts(tmp_path)
    result = CliRunner().invoke(
        main,
        [
            "ingest",
            "--corpus",
            str(corpus),
            "--format",
            "text",
            "--annotate",
            "whitespace",
            "--no-progress",
            "--model",
            tiny(arch),
            *store_args(tmp_path),
        ],
    )
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: model "), result.output
    assert REFUSED[arch] in lines[0], lines[0]
    assert row_counts(tmp_path) == before
    runs = tmp_path / "attention.zarr" / "runs"
    assert not runs.exists() or not any(runs.iterdir())


# ---------------------------------------------------------------- what runs on the stored maps


def test_gradients_pass_only_the_inputs_the_model_takes(tiny, sqlite_store, tmp_path):
    """C3 gradients with masked-LM models that take no token_type_ids (DistilBERT, MPNet) or hold one type only (RoBERTa
    pairs: segment 1 would be out of range)."""
    from attnstore.ingest import ingest
    from attnstore.queries.gradients import gradient_importance

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(PAIRS, encoding="utf-8")
    for arch in ("distilbert", "mpnet", "roberta"):
        run = ingest(
            sqlite_store,
            corpus=str(pairs),
            fmt="pairs-tsv",
            annotator="whitespace",
            model=tiny(arch, "mlm"),
            name=f"mlm-{arch}",
            progress=False,
        ).run
        assert "token_type_ids" not in run.manifest["model"]["inputs"]
        frame = gradient_importance(sqlite_store, run.name, seed=0)
        values = frame[["to_cls", "to_sep", "to_other"]].to_numpy()
        assert len(frame) == run.n_layers * run.n_heads and np.isfinite(values).all() and (values > 0).all(), arch


def test_causal_baselines_and_probe_refusal(tiny, sqlite_store, tmp_path):
    """GPT-2 (causal, no special tokens): entropy's uniform baseline is over each query's visible prefix, to_next and
    the from-[CLS] columns are NaN, and `probe train` names the missing [CLS]-like token in one line."""
    from click.testing import CliRunner

    from attnstore.api.cli import main
    from attnstore.ingest import ingest
    from attnstore.queries import run_query

    conllu = tmp_path / "gold.conllu"
    conllu.write_text(CONLLU, encoding="utf-8")
    run = ingest(sqlite_store, corpus=str(conllu), fmt="conllu", model=tiny("gpt2"), name="gpt2", progress=False).run
    lengths = [len(sqlite_store.tokens("gpt2", e)) for e in range(run.n_stored)]
    entropy = run_query(sqlite_store, "entropy", run="gpt2")
    np.testing.assert_allclose(entropy["uniform_entropy"], np.mean([lgamma(n + 1) / n for n in lengths]))
    pooled = run_query(sqlite_store, "entropy", run="gpt2", average="token")
    np.testing.assert_allclose(pooled["uniform_entropy"], sum(lgamma(n + 1) for n in lengths) / sum(lengths))
    assert entropy["entropy_from_cls"].isna().all() and entropy["uniform_entropy_from_cls"].isna().all()
    assert "causal" in entropy.attrs["note"]
    position = run_query(sqlite_store, "relative_position", run="gpt2")
    assert position["to_next"].isna().all() and position["to_previous"].notna().all()

    # probes refuse to evaluate on their training run: a second run of the same sentences to evaluate on
    ingest(sqlite_store, corpus=str(conllu), fmt="conllu", model=tiny("gpt2"), name="gpt2-eval", progress=False)
    result = CliRunner().invoke(
        main, ["probe", "train", "--run", "gpt2", "--eval-run", "gpt2-eval", "--kind", "attn", *store_args(tmp_path)]
    )
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("Error: run 'gpt2-eval' has no [CLS]-like token"), lines[0]  # the evaluation run is read first
