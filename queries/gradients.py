"""C3 (Clark et al. 2019, Fig. 3): gradient-based importance of attention to special tokens.

For a run whose model has a masked-LM head: mask a random 15 % of each example's
non-special tokens, compute the MLM loss, and average |∂loss/∂α| over the attention
weights α that point *to* [SEP]-like tokens, to punctuation, to [CLS]-like tokens and to
other tokens, per head. An analysis of a stored run, but it needs the model again (torch
and transformers, imported inside the functions), so it is not a registered query:
`attnstore gradients` runs it and saves the results to `head_metrics` as `gradient.to_*`.
A model without a masked-LM head (such as the default all-MiniLM-L6-v2, a
sentence-embedding model) is refused with a clear error (InvalidArgumentError).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import model_source, per_head_frame, safe_divide, token_flags
from .errors import InvalidArgumentError, NotFoundError

if TYPE_CHECKING:
    from ..store import Store

HEAD_KEYS = ("cls.predictions", "lm_head", "predictions.", "generator_lm_head", "vocab_projector")


def load_mlm(source: str):
    from transformers import AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    # transformers' own warning for a head it had to make up ("Some weights ... were not initialized ... You should
    # probably TRAIN this model") would come before the one line below that says what to do
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = AutoModelForMaskedLM.from_pretrained(source, attn_implementation="eager", output_loading_info=True)
    except (OSError, ValueError) as exc:
        raise NotFoundError(f"cannot load a masked-LM model from {source}: {str(exc).splitlines()[0][:200]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = [k for k in info.get("missing_keys", []) if any(h in k for h in HEAD_KEYS)]
    if missing:
        raise InvalidArgumentError(
            f"the model at {source} has no masked-LM head (missing {missing[0]}, ...); gradient importance "
            "(Clark et al. Fig. 3) needs one, e.g. a run of bert-base-uncased"
        )
    return model.eval()


def takes_token_types(model, info) -> bool:
    """Whether to give the masked-LM model the stored segments as token_type_ids: only where its forward takes
    them, its type-embedding table holds segment 1 (not RoBERTa's single type), and the run gave them too
    (`manifest.model.inputs`, recorded since the probe at load; older runs: decided from the model alone)."""
    import inspect

    recorded = (info.manifest or {}).get("model", {}).get("inputs")
    type_vocab = getattr(model.config, "type_vocab_size", None)
    return (
        "token_type_ids" in inspect.signature(model.forward).parameters
        and (recorded is None or "token_type_ids" in recorded)
        and not (isinstance(type_vocab, int) and type_vocab < 2)
    )


def gradient_importance(
    store: Store,
    run,
    *,
    max_examples: int = 200,
    mask_rate: float = 0.15,
    seed: int = 0,
    punct: str = ".,",
    model_dir: str | None = None,
) -> pd.DataFrame:
    """Per head: mean |∂MLM loss/∂α| of attention to [CLS]-like, [SEP]-like, punctuation and other tokens."""
    import torch

    info = store.run_info(run)
    model = load_mlm(model_source(store, info, model_dir))
    mask_id = (info.special_tokens.get("mask") or {}).get("id")
    if mask_id is None:
        raise InvalidArgumentError(f"the tokenizer of run {info.name!r} has no mask token")
    chosen = np.sort(store.storage_order(info.id))[:max_examples]  # the first ones
    flags = token_flags(store, info, punct, chosen)  # of those examples only, not of the whole run
    use_types = takes_token_types(model, info)
    tokens = {int(k): g for k, g in store.token_table(info.id, chosen).groupby("example")}
    rng = np.random.default_rng(seed)
    kinds = ("cls", "sep", "punct", "other")
    total = np.zeros((len(kinds), info.n_layers, info.n_heads))
    count = np.zeros(len(kinds))
    for example in sorted(tokens):
        t, f = tokens[example], flags[example]
        ids = torch.tensor([t["token_id"].tolist()])
        candidates = np.flatnonzero(~f.special)
        if len(candidates) == 0:
            continue
        chosen = rng.choice(candidates, size=max(1, int(round(mask_rate * len(candidates)))), replace=False)
        labels = torch.full_like(ids, -100)
        labels[0, chosen] = ids[0, chosen]
        ids[0, chosen] = mask_id
        inputs = {"input_ids": ids}
        if use_types:
            inputs["token_type_ids"] = torch.tensor([t["segment"].tolist()])
        out = model(**inputs, labels=labels, output_attentions=True)
        for a in out.attentions:
            a.retain_grad()
        out.loss.backward()
        grads = torch.stack([a.grad[0] for a in out.attentions]).abs().numpy()  # (layer, head, query, key)
        other = ~(f.cls | f.sep | f.punct)
        for k, mask in enumerate((f.cls, f.sep, f.punct, other)):
            total[k] += grads[..., mask].sum(axis=(-1, -2))
            count[k] += mask.sum() * grads.shape[-2]
        model.zero_grad(set_to_none=True)
    if not count.any():
        raise InvalidArgumentError(f"run {info.name!r} has no tokens to mask")
    return per_head_frame(info, **{f"to_{k}": safe_divide(total[i], count[i]) for i, k in enumerate(kinds)})
