"""Streaming capture: each layer's attention taken inside the model's own attention call, one block of query rows
at a time, never as a layer's whole (batch, head, L, L) float32 tensor.

transformers (4.48+) calls a layer's attention through a registry of implementations (`AttentionInterface`). Ingest
registers its own, "attnstore": the model's SDPA kernel computes the layer's output, and this thread's sink takes
the weights. A dense sink recomputes them per block of QUERY_BLOCK rows by calling the model's *own* eager attention
(`eager_attention_forward` of its modeling module) on the block, keys past the block's last row never computed in a
causal model, so logit soft-capping, sliding windows and GQA come out as the model computes them, and writes each
block into the batch's maps in the storage dtype. A Q/K sink keeps the post-RoPE queries and keys and each row's
log-sum-exp instead (store/qk.py rebuilds the maps from them); on the CPU it takes the layer's output and its
log-sum-exps from torch's flash kernel in one call, and where the stored values are rounded (float16) or the row
statistics are kept, one compiled pass over each block of logits rebuilt from the stored values (ingest/_rows.c) takes
the log-sum-exps of those values and the statistics. At load (`prepare`) the captured maps are checked against the
model's eager ones, and the Q/K formula exp(q.k scale + mask - lse) against its eager weights.

The mask is SDPA's (transformers' sdpa_mask, registered under the same name): None where the model skips it (causal,
no padding), else booleans; the eager functions get it as an additive block (`additive_block`). Encoders keep
ingest/capture.py's path: their maps there are bit-identical to the eager model's (docs/DECODERS.md).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import IngestError
from .row_stats import LOWEST_LOG_WEIGHT

IMPLEMENTATION = "attnstore"
# Rows per block: a causal block's weights are QUERY_BLOCK x (its last row + 1) per head, float32 while computed.
QUERY_BLOCK = 512
# A Q/K rebuild must reproduce the model's own eager weights from float32 Q/K to this (max |difference| per weight).
QK_TOLERANCE = 1e-4

_state = threading.local()  # .sink: the sink of the pass this thread runs (None: outside a capturing pass)
_register_lock = threading.Lock()


def register() -> None:
    """Register the "attnstore" attention implementation and its mask (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    with _register_lock:
        AttentionInterface.register(IMPLEMENTATION, capture_attention)
        AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def eager_function(module):
    """The eager attention function of `module`'s modeling file (what `attn_implementation="eager"` calls)."""
    function = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if function is None:
        raise IngestError(
            f"{type(module).__name__} has no eager_attention_forward in {type(module).__module__}: its attention cannot be "
            f"captured block by block; ingest it with attn_implementation='eager' (the whole-pass path)"
        )
    return function


def capture_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The registered attention: SDPA's output, and the weights to this thread's sink (if a capturing pass runs)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    sink = getattr(_state, "sink", None)
    if sink is not None:
        output = sink.layer(module, query, key, value, attention_mask, scaling, kwargs)
        if output is not None:  # the sink ran the fast kernel itself (QKSink on the CPU: the output and its log-sum-exps)
            return output, None
    if _needs_eager_output(module):
        n = query.shape[2]
        mask = additive_block(attention_mask, 0, n, key.shape[2], query.dtype, query.device, causal=True)
        output, _ = eager_function(module)(module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs)
    else:
        output, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    return output, None


def _needs_eager_output(module) -> bool:
    """Whether SDPA would compute another output than the model: logit soft-capping (Gemma 2) or learned sink logits
    (gpt-oss), which only the model's eager attention applies."""
    config = getattr(module, "config", None)
    return getattr(config, "attn_logit_softcapping", None) is not None or getattr(module, "sinks", None) is not None


def _sink_logits(module, device):
    """A layer's learned sink logits (gpt-oss: one more logit per head that no token holds) as float32 (1, head, 1),
    or None."""
    import torch

    sinks = getattr(module, "sinks", None)
    return None if sinks is None else sinks.detach().to(device, torch.float32).reshape(1, -1, 1)


def _blocks(n_rows: int, size: int | None = None):
    size = size or QUERY_BLOCK
    for r0 in range(0, n_rows, size):
        yield r0, min(n_rows, r0 + size)


def additive_block(attention_mask, r0: int, r1: int, n_keys: int, dtype, device, causal: bool):
    """Rows r0..r1 and the first n_keys keys of the layer's mask as the eager functions add it: 0 where a key is seen,
    the dtype's minimum where not. The mask is SDPA's (transformers' sdpa_mask): None where the model skips it (causal
    attention, no padding: here the causal rule), or booleans (True: seen)."""
    import torch

    if attention_mask is not None and attention_mask.ndim == 4:
        block = attention_mask[:, :, r0:r1, :n_keys]
        if block.dtype != torch.bool:
            return block
        return torch.zeros((), dtype=dtype, device=device).masked_fill(~block, torch.finfo(dtype).min)
    if not causal:
        return None
    i = torch.arange(r0, r1, device=device)[:, None]
    j = torch.arange(n_keys, device=device)[None, :]
    return torch.zeros((r1 - r0, n_keys), dtype=dtype, device=device).masked_fill(j > i, torch.finfo(dtype).min)[None, None]


def _seen(attention_mask, b: int, r0: int, r1: int, n_keys: int):
    """Which keys rows r0..r1 of example b see, as booleans (None: the causal rule, the mask was skipped)."""
    import torch

    if attention_mask is None or attention_mask.ndim != 4:
        return None
    block = attention_mask[b, 0, r0:r1, :n_keys]
    return block if block.dtype == torch.bool else block == 0


@dataclass
class DenseSink:
    """A batch's maps, (batch, layer, head, T, T) in the storage dtype on the CPU, filled block by block."""

    n_layers: int
    causal: bool
    dtype: Any  # torch dtype of the stored maps
    stop: bool = False  # end the pass once the last layer's weights are taken (nothing after them is computed)
    rows: Any = None  # ingest/row_stats.RowStats: each block's rows reduced as they pass (a causal model's), or None
    maps: Any = None
    _next: int = 0

    def layer(self, module, query, key, value, attention_mask, scaling, kwargs) -> None:
        import torch

        batch, heads, n, _ = query.shape
        if self.maps is None:
            self.maps = torch.zeros((batch, self.n_layers, heads, n, n), dtype=self.dtype)
        index, self._next = self._next, self._next + 1
        eager = eager_function(module)
        options = {k: v for k, v in kwargs.items() if k not in ("output_attentions", "is_causal")}
        for r0, r1 in _blocks(n):
            keys = r1 if self.causal else n
            mask = additive_block(attention_mask, r0, r1, keys, query.dtype, query.device, self.causal)
            _, weights = eager(
                module, query[:, :, r0:r1], key[:, :, :keys], value[:, :, :keys], mask, scaling=scaling, dropout=0.0, **options
            )
            self.maps[:, index, :, r0:r1, :keys].copy_(weights)
            if self.rows is not None:
                self.rows.block(index, r0, weights)
        if self.stop and self._next == self.n_layers:
            raise _Stop

    def result(self):
        """The maps, (batch, layer, head, T, T) in the sink's dtype."""
        if self._next != self.n_layers:
            raise IngestError(f"caught {self._next} layers' attention in a pass, expected {self.n_layers}")
        return self.maps


class _Stop(Exception):
    """Raised by a dense sink that took the last layer: the rest of the pass is not computed."""


@dataclass
class QKSink:
    """A batch's post-RoPE queries (batch, T, layer, head, d) and keys (batch, T, layer, kv head, d) in the stored
    dtype, and each row's float32 log-sum-exp (batch, T, layer, head) of its logits q.k scale + mask, computed from the
    stored (rounded) Q/K so rebuilt rows sum to 1. `verify`: check each layer's first block against the model's eager
    weights (from unrounded Q/K) and refuse a model whose weights are not that softmax."""

    n_layers: int
    dtype: Any  # torch dtype of the stored Q/K
    windows: list  # per layer, the sliding window a rebuild applies (None: every earlier key), checked against the mask
    lengths: list  # per example of the batch, its real tokens (the mask is checked within them)
    verify: bool = False
    rows: Any = None  # ingest/row_stats.RowStats: each block's rows, rebuilt from the stored Q/K, reduced; or None
    _logits: Any = None  # a rebuilt block's logits (and `_rebuild`'s weights), float32, reused
    q: Any = None
    k: Any = None
    lse: Any = None
    scales: list = field(default_factory=list)
    _next: int = 0

    def layer(self, module, query, key, value, attention_mask, scaling, kwargs):
        """Keep the layer's Q/K and log-sum-exps; on the CPU, return the layer's output too (torch's flash kernel gives
        both at the cost of SDPA alone: benchmarks/decoder_capture.py), else None (the caller computes it)."""
        import torch

        batch, heads, n, dim = query.shape
        kv_heads = key.shape[1]
        if self.q is None:
            self.q = torch.empty((batch, n, self.n_layers, heads, dim), dtype=self.dtype)
            self.k = torch.empty((batch, n, self.n_layers, kv_heads, dim), dtype=self.dtype)
            self.lse = torch.empty((batch, n, self.n_layers, heads), dtype=torch.float32)
        index, self._next = self._next, self._next + 1
        scale = float(scaling if scaling is not None else dim**-0.5)
        self.scales.append(scale)
        self.q[:, :, index].copy_(query.transpose(1, 2))
        self.k[:, :, index].copy_(key.transpose(1, 2))
        self._check_mask(attention_mask, index, n)
        if self.verify:
            self._verify(module, query, key, value, attention_mask, scale, kwargs, min(n, QUERY_BLOCK))
        group = heads // kv_heads
        sink = _sink_logits(module, query.device)  # the stored log-sum-exps include it: rows sum to < 1 as the model's
        if query.device.type == "cpu" and not self.verify:
            # Rounded Q/K (float16) need log-sum-exps of their own, so that rebuilt rows sum to 1: the compiled pass over
            # the stored values takes them (as fast as a second flash call here, and in the same pass as the row
            # statistics where those are kept: benchmarks/decoder_capture.py).
            rounded = self.dtype != torch.float32 or query.dtype != torch.float32
            output = self._flash(query, key, value, attention_mask, scale, group, index, sink)
            if self.rows is not None or rounded:
                self._reduce_on_cpu(index, scale, group, sink, own_lse=rounded)
            return output
        self._rebuild(index, attention_mask, scale, group, query.device, sink)
        return None

    def _rebuild(self, index: int, attention_mask, scale: float, group: int, device, sink=None) -> None:
        """Off the CPU (and in the load-time verify pass): the layer's rows rebuilt on `device` from the stored Q/K a
        block at a time, as store/qk.py rebuilds them, their log-sum-exps taken from them and `sink` and stored, and
        the rows handed to the row statistics (if kept) with their logs (the entropy's)."""
        import torch

        q = self.q[:, :, index].transpose(1, 2).to(device, torch.float32)  # the stored values, as a rebuild reads them
        k = self.k[:, :, index].transpose(1, 2).to(device, torch.float32)
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
        lse = self.lse[:, :, index].transpose(1, 2)  # (batch, head, token) on the host, a view: written through
        batch, heads, n, _ = q.shape
        # Quarter blocks: the log weights, the weights and the statistics' scratch are 3 x 38 MiB at 8,192 tokens.
        rows = min(n, max(1, QUERY_BLOCK // 4))
        size = batch * heads * rows * n
        if self._logits is None or self._logits.numel() < 2 * size or self._logits.device != q.device:
            self._logits = torch.empty(2 * size, device=q.device)  # reused: fresh pages cost a fault each
        for r0, r1 in _blocks(n, rows):
            cells = batch * heads * (r1 - r0) * r1
            logs = self._logits[:cells].view(batch, heads, r1 - r0, r1)
            weights = self._logits[size : size + cells].view(batch, heads, r1 - r0, r1)
            torch.matmul(q[:, :, r0:r1], k[:, :, :r1].transpose(2, 3), out=logs).mul_(scale)
            logs.add_(additive_block(attention_mask, r0, r1, r1, torch.float32, q.device, causal=True))
            peak = logs.amax(-1, keepdim=True)
            torch.sub(logs, peak, out=weights).clamp_(min=LOWEST_LOG_WEIGHT).exp_()
            block_lse = peak[..., 0] + weights.sum(-1).log_()
            if sink is not None:
                block_lse = torch.logaddexp(block_lse, sink)
            lse[:, :, r0:r1] = block_lse
            if self.rows is not None:
                logs.sub_(block_lse[..., None]).clamp_(min=LOWEST_LOG_WEIGHT)
                self.rows.block(index, r0, torch.exp(logs, out=weights), log_weights=logs)

    def _reduce_on_cpu(self, index: int, scale: float, group: int, sink=None, own_lse: bool = False) -> None:
        """`_rebuild`'s work on the CPU: each block's logits from one matmul of the stored (scaled) queries and keys, then
        every row reduced by ingest/_rows.c in one pass while it is in the cache (the log-sum-exp if `own_lse`, the row
        statistics if kept), instead of a dozen torch passes over the block (benchmarks/decoder_capture.py)."""
        import torch

        from .row_stats import reduce_logits

        q = self.q[:, :, index].transpose(1, 2).to(torch.float32) * scale  # scaled before the matmul, as store/qk.py does
        k = self.k[:, :, index].transpose(1, 2).to(torch.float32)
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
        lse = self.lse[:, :, index].transpose(1, 2)  # (batch, head, token), a view: written through
        batch, heads, n, _ = q.shape
        rows = min(n, max(1, QUERY_BLOCK // 4))  # as `_rebuild`'s blocks: 9 heads x 128 rows x 2,048 keys are 9 MiB
        size = batch * heads * rows * n
        if self._logits is None or self._logits.numel() < size or self._logits.device.type != "cpu":
            self._logits = torch.empty(size)  # reused: fresh pages cost a fault each
        window = self.windows[index]
        sinks = None if sink is None else sink.reshape(-1).cpu()
        for r0, r1 in _blocks(n, rows):
            logits = self._logits[: batch * heads * (r1 - r0) * r1].view(batch, heads, r1 - r0, r1)
            torch.matmul(q[:, :, r0:r1], k[:, :, :r1].transpose(2, 3), out=logits)
            block_lse = lse[:, :, r0:r1].contiguous().numpy()
            if self.rows is not None:
                self.rows.from_logits(index, r0, logits, block_lse, not own_lse, window, sinks)
            else:
                reduce_logits(logits, self.lengths, r0, window, sinks, block_lse, not own_lse)
            if own_lse:
                lse[:, :, r0:r1] = torch.from_numpy(block_lse)

    def _flash(self, query, key, value, attention_mask, scale: float, group: int, index: int, sink=None):
        """The layer's output and log-sum-exps (stored) from torch's CPU flash kernel. `sink`: learned sink logits (1,
        head, 1), added to the log-sum-exps; the output, flash's softmax over the tokens alone, is scaled by the tokens'
        share exp(lse - (lse with the sink)), as the model's eager attention computes it."""
        import torch

        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        n = query.shape[2]
        causal = attention_mask is None or attention_mask.ndim != 4
        mask = None if causal else additive_block(attention_mask, 0, n, n, query.dtype, query.device, causal=True)
        k, v = (key, value) if group == 1 else (key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1))
        output, lse = flash(query, k, v, 0.0, causal, attn_mask=mask, scale=scale)[:2]
        if sink is not None:
            with_sink = torch.logaddexp(lse, sink)
            output = output * torch.exp(lse - with_sink).unsqueeze(-1).to(output.dtype)
            lse = with_sink
        self.lse[:, :, index].copy_(lse.transpose(1, 2))
        return output.transpose(1, 2).contiguous()

    def _check_mask(self, attention_mask, layer: int, n: int) -> None:
        """The model's mask, within each example's real tokens, against the rule a rebuild applies (causal, and the
        layer's sliding window): a model masking otherwise (chunked attention, a prefix) is refused."""
        import torch

        window = self.windows[layer]
        for b, length in enumerate(self.lengths):
            seen = _seen(attention_mask, b, 0, length, length)
            if seen is None:
                if window is None or length <= window:
                    continue
                seen = torch.ones((length, length), dtype=torch.bool).tril()  # skipped: the model attends causally
            i = torch.arange(length, device=seen.device)[:, None]
            j = torch.arange(length, device=seen.device)[None, :]
            rule = (j <= i) if window is None else (j <= i) & (i - j < window)
            if not torch.equal(seen, rule):
                raise IngestError(
                    f"layer {layer}: the model masks attention otherwise than causally"
                    f"{f' within a window of {window}' if window else ''} (chunked or prefix attention), so its maps cannot be "
                    f"rebuilt from stored Q/K; ingest it with --tier dense"
                )

    def _verify(self, module, query, key, value, attention_mask, scale, kwargs, r1) -> None:
        """The model's own eager weights on the first block against exp(q.k scale + mask - lse), all in float32."""
        import torch

        options = {k: v for k, v in kwargs.items() if k not in ("output_attentions", "is_causal")}
        mask = additive_block(attention_mask, 0, r1, r1, query.dtype, query.device, causal=True)
        _, weights = eager_function(module)(
            module, query[:, :, :r1], key[:, :, :r1], value[:, :, :r1], mask, scaling=scale, dropout=0.0, **options
        )
        group = query.shape[1] // key.shape[1]
        k = key[:, :, :r1].to(torch.float32).repeat_interleave(group, dim=1) if group > 1 else key[:, :, :r1].to(torch.float32)
        logits = torch.matmul(query[:, :, :r1].to(torch.float32), k.transpose(2, 3)) * scale + mask.to(torch.float32)
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        sink = _sink_logits(module, lse.device)
        if sink is not None:  # the share of the row the sink takes is left out of the tokens'
            lse = torch.logaddexp(lse, sink.unsqueeze(-1))
        rebuilt = torch.exp(logits - lse)
        err = (rebuilt - weights.to(torch.float32)).abs().max().item()
        if not err <= QK_TOLERANCE:
            raise IngestError(
                f"layer {len(self.scales) - 1} of {type(module).__name__}: its attention is not softmax(q.k * scale + mask) "
                f"(max difference {err:.1e} from its eager weights: soft-capping, sink logits or another rule), so its "
                f"maps cannot be rebuilt from stored Q/K; ingest it with --tier dense"
            )

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._next != self.n_layers:
            raise IngestError(f"caught {self._next} layers' queries and keys in a pass, expected {self.n_layers}")
        return self.q.numpy(), self.k.numpy(), self.lse.numpy()


def run_with(sink, run):
    """`run()` (a forward pass of a model loaded with the "attnstore" implementation) with `sink` taking this thread's
    layers; returns run's output. Safe to call from several threads at once (the sink is this thread's)."""
    _state.sink = sink
    try:
        return run()
    except _Stop:
        return None
    finally:
        _state.sink = None


def layer_windows(config, n_layers: int) -> list:
    """Per layer, its sliding window (None: full causal attention), as transformers' masks apply it: key j is seen
    by query i when j <= i and i - j < window."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        return [window if t == "sliding_attention" else None for t in types[:n_layers]]
    return [window] * n_layers


@dataclass(frozen=True)
class Support:
    """What streaming capture can do for a loaded model (found at load by `prepare`)."""

    streaming: bool  # the model's attention goes through the "attnstore" implementation, and its maps match eager's
    qk: dict | None  # n_kv_heads, head_dim, scales and windows per layer, where the Q/K tier can rebuild its maps
    refusal: str | None  # why not (streaming, or the Q/K tier)


STREAMING_TOLERANCE = 1e-4  # the probe's maps through the capture against the eager model's (float32)


def prepare(model, related: list, run_probe, eager_maps: tuple) -> Support:
    """Switch `model` (and the models in `related` sharing its layers: its causal-LM model) to the "attnstore"
    implementation when its attention goes through transformers' attention interface, and check on the probe
    (`run_probe()` runs it) that the captured maps are the eager model's `eager_maps`; else leave it as it was."""
    import torch

    if not getattr(model, "_can_set_attn_implementation", lambda: False)():
        return Support(False, None, "its attention does not go through transformers' attention interface")
    register()
    before = model.config._attn_implementation
    models = [model, *[m for m in related if m is not None]]

    def switch(name: str) -> None:
        for m in models:
            m.set_attn_implementation(name)

    switch(IMPLEMENTATION)
    n_layers = len(eager_maps)
    try:
        with torch.inference_mode():
            sink = DenseSink(n_layers, causal=True, dtype=torch.float32)
            run_with(sink, run_probe)
            maps = sink.result()
            err = max((maps[:, layer] - b).abs().max().item() for layer, b in enumerate(eager_maps))
    except Exception as exc:  # any model whose layers this capture does not fit keeps the eager path
        err, why = float("inf"), f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    else:
        why = f"its captured maps differ from eager ones by {err:.1e}"
    if not err <= STREAMING_TOLERANCE:
        switch(before)
        return Support(False, None, f"streaming capture does not fit it ({why})")
    # Rules the probe's few, small logits may not show: refused by name.
    softcap = getattr(model.config, "attn_logit_softcapping", None)
    if softcap is not None:
        return Support(
            True, None, f"it soft-caps its attention logits (attn_logit_softcapping={softcap}), which a Q/K rebuild does not apply"
        )
    if getattr(model.config, "attention_chunk_size", None):
        return Support(True, None, "it attends in chunks, which a Q/K rebuild does not apply")
    n = eager_maps[0].shape[-1]
    windows = layer_windows(model.config, n_layers)
    try:
        with torch.inference_mode():
            qk_sink = QKSink(n_layers, torch.float32, windows, [n] * eager_maps[0].shape[0], verify=True)
            run_with(qk_sink, run_probe)
            q, k, _ = qk_sink.result()
    except IngestError as exc:
        return Support(True, None, str(exc))
    entry = {"n_kv_heads": int(k.shape[3]), "head_dim": int(q.shape[4]), "scales": qk_sink.scales, "windows": windows}
    return Support(True, entry, None)
