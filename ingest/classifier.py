"""Sequence classifiers over the store's models: raw-text encoding, length-bucketed batches,
prediction, and the head-disabling hook on attention probabilities (Kovaleva et al. K7).

Head disabling is the project's own forward hook on each layer's attention-probability dropout
module (identity at evaluation time): the probabilities it returns for a disabled head are
replaced by uniform 1/L over the real (non-padding) keys, or by zeros. Hugging Face's
`head_mask` zeroes heads instead (and is gone in transformers v5). The hook also changes
`output_attentions`, which is how tests check it exactly.

Mean ablation works one step later, on the self-attention module's output: a disabled head's
output vector (its attention-weighted values) at every real token is replaced by that head's
mean output over all real tokens of a reference set (the evaluated split, one unablated pass
first), the usual "mean ablation" of circuit analyses. Its attention probabilities are left
as they are, since they no longer reach the output.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .align import pad_inputs
from .errors import IngestError, InvalidArgumentError
from .glue import LabelledPair

MODES = ("uniform", "zero", "mean")


@dataclass(frozen=True)
class Encoded:
    input_ids: list[int]
    token_type_ids: list[int] | None
    label: float | int

    @property
    def length(self) -> int:
        return len(self.input_ids)


def encode(tokenizer, pairs: Sequence[LabelledPair], max_length: int) -> list[Encoded]:
    """The tokenizer's own encoding of the raw texts (pairs as two segments), truncated to `max_length`."""
    a = [p.text_a for p in pairs]
    b = [p.text_b for p in pairs] if pairs and pairs[0].text_b is not None else None
    enc = tokenizer(a, b, truncation=True, max_length=max_length)
    types = enc.get("token_type_ids")
    return [Encoded(ids, types[i] if types is not None else None, p.label) for i, (ids, p) in enumerate(zip(enc["input_ids"], pairs))]


def length_batches(
    items: Sequence[Encoded], batch_size: int, rng: np.random.Generator | None = None, window: int = 50
) -> Iterator[list[int]]:
    """Indices in batches of similar length (dynamic padding wastes little).

    Training (`rng` given): shuffle, sort within windows of `window` batches, shuffle the
    batch order. Evaluation: sorted by length, deterministic.
    """
    order = np.arange(len(items)) if rng is None else rng.permutation(len(items))
    lengths = np.array([items[i].length for i in order])
    span = batch_size * window if rng is not None else len(order)
    batches = []
    for start in range(0, len(order), max(span, 1)):
        chunk = order[start : start + span]
        chunk = chunk[np.argsort(lengths[start : start + span], kind="stable")]
        batches += [chunk[i : i + batch_size].tolist() for i in range(0, len(chunk), batch_size)]
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    yield from batches


def collate(items: Sequence[Encoded], pad_id: int, regression: bool):
    """Padded tensors for one batch: inputs dict and labels."""
    import torch

    inputs = pad_inputs(items, pad_id)
    labels = torch.tensor([e.label for e in items], dtype=torch.float32 if regression else torch.long)
    return inputs, labels


def accepted(model, inputs: dict) -> dict:
    """`inputs` without what the model's forward pass does not take (DistilBERT, MPNet: no token_type_ids)."""
    import inspect

    names = inspect.signature(model.forward).parameters
    return {k: v for k, v in inputs.items() if k in names}


def predict(model, items: Sequence[Encoded], pad_id: int, regression: bool, batch_size: int = 64, progress=None) -> np.ndarray:
    """Predicted class (argmax) or score of every item, in item order; eval mode, inference mode."""
    import torch

    model.eval()
    out = np.zeros(len(items), dtype=np.float64 if regression else np.int64)
    with torch.inference_mode():
        for batch in length_batches(items, batch_size):
            inputs, _ = collate([items[i] for i in batch], pad_id, regression)
            logits = model(**accepted(model, inputs)).logits
            out[batch] = (logits[:, 0] if regression else logits.argmax(-1)).numpy()
            if progress is not None:
                progress.update(len(batch))
    return out


# ---------------------------------------------------------------- head disabling


def self_attentions(model) -> list:
    """Each layer's self-attention module, in layer order.

    BERT-family self-attention (BERT, RoBERTa, XLM-R, ELECTRA, MPNet, DistilBERT) applies an
    `nn.Dropout` module named `dropout` to the probabilities in eager mode and returns the
    heads' outputs concatenated on the last axis; other designs are refused by `HeadDisabler`
    after a probe forward pass.
    """
    import torch.nn as nn

    return [
        m
        for _, m in model.named_modules()
        if type(m).__name__.endswith("SelfAttention") and isinstance(getattr(m, "dropout", None), nn.Dropout)
    ]


def attention_dropouts(model) -> list:
    """Each layer's dropout module applied to the attention probabilities, in layer order."""
    return [m.dropout for m in self_attentions(model)]


def parse_heads(spec: str, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """'0:1,2:5' -> [(0, 1), (2, 5)]: 0-based layer:head pairs, checked against the model's shape."""
    heads = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        try:
            layer, head = (int(x) for x in part.split(":"))
        except ValueError:
            raise InvalidArgumentError(f"--heads {spec!r}: write each head as LAYER:HEAD (0-based), e.g. 0:1,2:5") from None
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise InvalidArgumentError(
                f"--heads {spec!r}: {part} is outside the model's {n_layers} layers x {n_heads} heads "
                f"(0-based: 0..{n_layers - 1}:0..{n_heads - 1})"
            )
        heads.append((layer, head))
    if not heads:
        raise InvalidArgumentError("--heads: give each, layers, or LAYER:HEAD pairs like 0:1,2:5")
    return sorted(set(heads))


def config_name(heads: Sequence[tuple[int, int]], n_heads: int) -> str:
    """Canonical name of a disabled set: "none", "layer:L" (all heads of one layer) or "heads:L:H,...""."""
    heads = sorted(set(heads))
    if not heads:
        return "none"
    layers = {layer for layer, _ in heads}
    if len(layers) == 1 and len(heads) == n_heads:
        return f"layer:{layers.pop()}"
    return "heads:" + ",".join(f"{layer}:{head}" for layer, head in heads)


class HeadDisabler:
    """Forward hooks that replace chosen heads' attention probabilities (uniform, zero) or outputs (mean);
    `disabled(heads, mode)` scopes them. Mean ablation needs `fit_means` (or `means`) first."""

    def __init__(self, model, n_layers: int, n_heads: int):
        self.model = model
        self.n_layers, self.n_heads = n_layers, n_heads
        attentions = self_attentions(model)
        if len(attentions) != n_layers:
            raise IngestError(
                f"cannot disable heads of {type(model).__name__}: found {len(attentions)} attention-probability "
                f"dropout modules for {n_layers} layers (supported: BERT-family eager self-attention)"
            )
        self.modules = [m.dropout for m in attentions]
        self.heads: dict[int, list[int]] = {}
        self.mode = "uniform"
        self.key_mask = None
        self.calls = 0
        self.means: list | None = None  # per layer: (n_heads, head_size) mean output over a reference set's real tokens
        self._sums: list | None = None  # while fitting: [sum of outputs, number of real tokens] per layer
        self._handles = [m.register_forward_hook(self._hook(layer)) for layer, m in enumerate(self.modules)]
        self._handles += [m.register_forward_hook(self._output_hook(layer)) for layer, m in enumerate(attentions)]
        self._handles.append(model.register_forward_pre_hook(self._capture_mask, with_kwargs=True))

    def _capture_mask(self, _module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if mask is None and len(args) > 1:
            mask = args[1]
        self.key_mask = mask

    def _hook(self, layer: int):
        def hook(_module, _inputs, probs):
            self.calls += 1
            heads = self.heads.get(layer)
            if not heads:
                return None
            if probs.dim() != 4 or probs.shape[1] != self.n_heads:
                raise IngestError(
                    f"layer {layer}: attention probabilities of shape {tuple(probs.shape)} are not "
                    f"(batch, {self.n_heads} heads, query, key); cannot disable heads of this model"
                )
            if self.mode == "mean":
                return None  # replaced at the module's output instead
            probs = probs.clone()
            if self.mode == "zero":
                probs[:, heads] = 0
            else:
                if self.key_mask is None:
                    real = probs.new_ones(probs.shape[0], probs.shape[-1])
                else:
                    real = self.key_mask.to(probs.dtype)
                uniform = real / real.sum(-1, keepdim=True)  # 1/L over each example's real tokens
                probs[:, heads] = uniform[:, None, None, :].expand(-1, len(heads), probs.shape[2], -1)
            return probs

        return hook

    def _real_tokens(self, like):
        """(batch, tokens) 1.0 at real tokens, 0.0 at padding."""
        if self.key_mask is None:
            return like.new_ones(like.shape[0], like.shape[1])
        return self.key_mask.to(like.dtype)

    def _per_head(self, layer: int, context):
        if context.dim() != 3 or context.shape[-1] % self.n_heads:
            raise IngestError(
                f"layer {layer}: self-attention output of shape {tuple(context.shape)} is not "
                f"(batch, tokens, {self.n_heads} heads x head size); cannot mean-ablate heads of this model"
            )
        return context.view(*context.shape[:2], self.n_heads, context.shape[-1] // self.n_heads)

    def _output_hook(self, layer: int):
        def hook(_module, _inputs, output):
            context = output[0] if isinstance(output, tuple) else output
            if self._sums is not None:
                real = self._real_tokens(context)
                per_head = self._per_head(layer, context).double()
                self._sums[layer][0] = self._sums[layer][0] + (per_head * real.double()[:, :, None, None]).sum((0, 1))
                self._sums[layer][1] += float(real.sum())
                return None
            heads = self.heads.get(layer)
            if not heads or self.mode != "mean":
                return None
            assert self.means is not None
            context = context.clone()
            per_head = self._per_head(layer, context)
            real = self._real_tokens(context).bool()
            mean = self.means[layer][heads].to(context.dtype)  # (len(heads), head_size)
            for i, head in enumerate(heads):
                per_head[:, :, head][real] = mean[i]
            return (context, *output[1:]) if isinstance(output, tuple) else context

        return hook

    @contextmanager
    def fitting_means(self):
        """Forward passes inside this scope (no heads disabled) set `means`: each head's mean output over real tokens."""
        import torch

        self._sums = [[torch.zeros((), dtype=torch.float64), 0.0] for _ in range(self.n_layers)]
        try:
            yield self
            if any(count == 0 for _, count in self._sums):
                raise IngestError("no real tokens were seen while fitting mean head outputs")
            self.means = [(total / count).float() for total, count in self._sums]
        finally:
            self._sums = None

    @contextmanager
    def disabled(self, heads: Sequence[tuple[int, int]], mode: str = "uniform"):
        if mode not in MODES:
            raise InvalidArgumentError(f"--mode must be one of {MODES}, not {mode!r}")
        if mode == "mean" and heads and self.means is None:
            raise InvalidArgumentError("mean ablation needs each head's mean output first (HeadDisabler.fitting_means)")
        by_layer: dict[int, list[int]] = {}
        for layer, head in heads:
            by_layer.setdefault(layer, []).append(head)
        self.heads, self.mode = by_layer, mode
        try:
            yield self
        finally:
            self.heads = {}

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
