"""Head importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?"; the Primer, Sec. 7).

Each head's output is multiplied by a gate xi_h = 1 (a forward hook on the layer's self-attention, whose heads'
outputs are concatenated on the last axis: the BERT family, as `HeadDisabler` checks); the importance of head h is
the expected absolute gradient of the loss with respect to its gate, I_h = E_x |dL(x)/dxi_h|, taken example by
example on the task's dev set as the paper defines it (the transformers bertology example sums the gradient over a
batch before the absolute value and divides by tokens; per example is the definition), then normalised by layer with
the l2 norm, as the paper does for pruning ("normalizing the importance scores by layer ... was necessary"). The
raw expectation is kept beside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .classifier import accepted, collate, self_attentions
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .evaluate import Evaluator


def head_importance(ev: Evaluator, max_examples: int | None = None, progress: bool = False) -> pd.DataFrame:
    """Per head: layer, head, importance (normalised by layer, l2), importance_raw (E|dL/dxi_h|), n_examples."""
    import torch
    from tqdm.auto import tqdm

    model = ev.classifier
    model.eval()  # no dropout: the gradient of the model as it predicts
    modules = self_attentions(model)
    if len(modules) != ev.n_layers:
        raise InvalidArgumentError(
            f"cannot gate the heads of {ev.model_name!r}: found {len(modules)} self-attention modules for {ev.n_layers} layers "
            "(eager BERT-family self-attention is supported)"
        )
    if max_examples is not None and max_examples < 1:
        raise InvalidArgumentError(f"max_examples must be at least 1, not {max_examples}")
    gates = torch.ones(ev.n_layers, ev.n_heads, requires_grad=True)

    def gate(layer: int):
        def hook(_module, _args, output):
            context = output[0] if isinstance(output, tuple) else output
            b, length, hidden = context.shape
            gated = (context.view(b, length, ev.n_heads, hidden // ev.n_heads) * gates[layer].view(1, 1, -1, 1)).view(b, length, hidden)
            return (gated, *output[1:]) if isinstance(output, tuple) else gated

        return hook

    items = ev.items[:max_examples] if max_examples else ev.items
    total = torch.zeros(ev.n_layers, ev.n_heads, dtype=torch.float64)
    handles = [m.register_forward_hook(gate(layer)) for layer, m in enumerate(modules)]
    try:
        for item in tqdm(items, desc=f"{ev.task.name}: head importance", unit="ex", disable=not progress, leave=False):
            inputs, labels = collate([item], ev.pad_id, ev.task.is_regression)
            loss = model(**accepted(model, inputs), labels=labels).loss
            (grad,) = torch.autograd.grad(loss, gates)
            total += grad.abs().double()
    finally:
        for h in handles:
            h.remove()
    raw = (total / len(items)).numpy()
    norms = np.linalg.norm(raw, axis=1, keepdims=True)
    normalised = np.divide(raw, norms, out=np.zeros_like(raw), where=norms > 0)
    layer, head = np.meshgrid(np.arange(ev.n_layers), np.arange(ev.n_heads), indexing="ij")
    return pd.DataFrame(
        {
            "layer": layer.ravel(),
            "head": head.ravel(),
            "importance": normalised.ravel(),
            "importance_raw": raw.ravel(),
            "n_examples": len(items),
        }
    )
