"""Per-row statistics of every head's attention, reduced while each block of rows passes the capture.

A causal LM's streaming capture (ingest/streaming.py) forms each layer's weights QUERY_BLOCK rows at a time: the dense
tier to store them, the Q/K tier only for this. `RowStats.block` reduces each block, in float32, to the fields of
store/row_stats.py: the attention on the first positions, the row's entropy and sum, its mass by log2 distance, its
top keys, the attention on the key where the row's token last occurred and on the one after it, and (summed over the
blocks) each key's column. The decoder queries (attention_sink, previous_token_heads, streaming_heads,
entropy_by_position, heavy_hitters, retrieval_heads, induction_heads, duplicate_token_heads) then answer a run from
these without reading a map.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..store import row_stats as fmt
from .errors import IngestError

SUBNORMAL = 2e-38  # just above float32's smallest normal number (1.18e-38)
# The smallest logit minus log-sum-exp a Q/K rebuild exponentiates: exp(-87) = 1.6e-38 is still normal (then
# counted as 0, under SUBNORMAL); exp of anything lower gives subnormal results, 8x slower to compute.
LOWEST_LOG_WEIGHT = -87.0
# Distances whose cumulative mass is taken: mass on d < 2^b for b = 0 .. DISTANCE_BINS - 2 (the last bin is the rest).
_LIMITS = tuple(1 << b for b in range(fmt.DISTANCE_BINS - 1))


@dataclass
class RowStats:
    """One pass's row statistics, (batch, token, layer, head, field) float32 and (batch, token, layer, head, k) top
    keys, filled layer by layer and block by block; `lengths`: each example's real tokens (right-padded batch)."""

    lengths: list[int]
    n_layers: int
    token_ids: list | None = None  # each example's token ids: the `duplicate` and `induction` fields (None: all 0)
    stats: Any = None  # (batch, layer, head, token, field) float16, as stored: each block's rows written in place
    top: Any = None  # (batch, layer, head, token, k) int32
    column: Any = None  # (batch, layer, head, key) float64: the attention each key gets from the example's real rows
    _padded: Any = field(default=None, repr=False)  # (batch, 1, row, 1) float32, 0 on padding rows; None: no padding
    _scratch: Any = field(default=None, repr=False)  # float32, reused by every block as (batch, head, rows, keys)
    _earlier: Any = field(default=None, repr=False)  # (batch, token) int64: the latest earlier position of its id, -1

    def block(self, layer: int, r0: int, weights, log_weights=None) -> None:
        """Rows r0 .. r0 + r of layer `layer`: `weights` (batch, head, r, keys) of a causal layer, each row's keys past
        it 0 (the mask's), keys from 0; `log_weights`: their logs where the caller has them (a Q/K rebuild: finite, the
        entropy then takes no log). Each reduction is one vectorised torch op over the block (`xlogy` and float64
        sums were 11-17x slower than the log and float32 sums used: docs/PERFORMANCE.md, 2026-11-29 (night))."""
        import torch

        # Weights under SUBNORMAL count as 0: float32 subnormals (a softmax's far tail holds many) take the CPU's slow
        # path in every later multiply. In place: both callers are done with the block.
        w = torch.nn.functional.threshold_(weights.to(torch.float32), SUBNORMAL, 0.0)  # type: ignore[attr-defined]
        batch, heads, r, keys = w.shape
        device = w.device
        n = max(self.lengths)
        if self.stats is None:
            self._allocate(batch, heads)
            if min(self.lengths) < n:
                real = torch.arange(n)[None, :] < torch.tensor(self.lengths)[:, None]
                self._padded = real.to(device, torch.float32)[:, None, :, None]
            if self.token_ids is not None:
                self._earlier = torch.from_numpy(fmt.earlier_occurrences(self.token_ids, n)).to(device)
        if self._scratch is None or self._scratch.numel() < w.numel():
            self._scratch = torch.empty(batch * heads * r * n, dtype=torch.float32, device=device)  # fresh pages are slow to touch
        scratch = self._scratch[: w.numel()].view(w.shape)
        out = torch.zeros((batch, heads, r, len(fmt.FIELDS)), device=device)  # float32 while computed
        first = min(fmt.POSITIONS, keys)
        out[..., fmt.FIRST.start : fmt.FIRST.start + first] = w[..., :first]
        if log_weights is None:
            logs = torch.add(w, torch.finfo(torch.float32).tiny, out=scratch).log_()  # 0 log 0 = 0: masked keys add 0
        else:
            logs = log_weights  # finite where w is 0 (under SUBNORMAL): those add 0
        out[..., fmt.FIELD["entropy"]] = -torch.einsum("bhrk,bhrk->bhr", w, logs)
        rows = torch.arange(r0, r0 + r, device=device)
        cumulative = torch.cumsum(w, -1, out=scratch)
        at_row = cumulative.gather(-1, rows.clamp(max=keys - 1).view(1, 1, r, 1).expand(batch, heads, r, 1))
        back = rows[:, None] - torch.tensor(_LIMITS, device=device)[None, :]  # (r, limit): the last key at distance >= limit
        before = cumulative.gather(-1, back.clamp(min=0).expand(batch, heads, r, len(_LIMITS)))
        within = at_row - torch.where(back >= 0, before, torch.zeros((), device=device))  # the mass on d < limit
        bins = out[..., fmt.DISTANCE]
        bins[..., 0] = within[..., 0]
        bins[..., 1:-1] = within[..., 1:] - within[..., :-1]
        bins[..., -1] = at_row[..., 0] - within[..., -1]  # exact 0 where the row reaches no such distance
        out[..., fmt.FIELD["learned_sink"]] = 1 - at_row[..., 0]  # a causal row's cumulative sum at itself: its sum
        k = min(fmt.TOP_K, keys)
        values, indices = torch.topk(w, k, dim=-1)
        indices, by_key = indices.sort(-1)  # equal weights: the earlier key first, as numpy's argmax picks
        values = values.gather(-1, by_key)
        values, by_value = values.sort(dim=-1, descending=True, stable=True)
        indices = indices.gather(-1, by_value)
        out[..., fmt.TOP_VALUES.start : fmt.TOP_VALUES.start + k] = values
        if self._earlier is not None:  # the key holding the row's token id last time, and the one after it
            earlier = self._earlier[:, r0 : r0 + r]
            seen = (earlier >= 0).to(torch.float32)[:, None, :]
            at = earlier.clamp(min=0)[:, None, :, None].expand(batch, heads, r, 1)
            out[..., fmt.FIELD["duplicate"]] = w.gather(-1, at)[..., 0] * seen
            out[..., fmt.FIELD["induction"]] = w.gather(-1, (at + 1).clamp(max=keys - 1))[..., 0] * seen  # <= the row
        out.clamp_(min=0)  # every field is a mass or an entropy: float32 differences of sums may dip below 0 by ~1e-7
        self.stats[:, layer, :, r0 : r0 + r] = out.to("cpu", torch.float16)  # an accelerator's too: a few numbers per row
        self.top[:, layer, :, r0 : r0 + r, :k] = torch.where(values > 0, indices, -1).to(torch.int32).cpu()
        weighted = w if self._padded is None else w * self._padded[:, :, r0 : r0 + r]  # padding rows give no column mass
        self.column[:, layer, :, :keys] += weighted.sum(-2).cpu()

    def from_logits(self, layer: int, r0: int, logits, lse, given: bool, window: int | None, sinks) -> None:
        """Rows r0 .. r0 + r of layer `layer` as `block` takes them, from their logits instead of their weights, on the
        CPU in one pass per row (ingest/_rows.c, `reduce_logits`): `logits` (batch, head, r, keys) float32 of q.k scale,
        masked here by the causal rule, the example's length and the layer's `window`; `lse` (batch, head, r) float32,
        written (`given` False) or read."""
        import torch

        batch, heads, r, keys = logits.shape
        n = max(self.lengths)
        if self.stats is None:
            self._allocate(batch, heads)
        if self._earlier is None:  # all -1 without token ids: no `duplicate` or `induction`
            ids = self.token_ids
            self._earlier = torch.from_numpy(fmt.earlier_occurrences(ids if ids is not None else [[]] * batch, n))
        out = np.empty((batch, heads, r, len(fmt.FIELDS)), dtype=np.float32)
        top = np.empty((batch, heads, r, fmt.TOP_K), dtype=np.int32)
        column = np.zeros((batch, heads, keys), dtype=np.float64)
        earlier = self._earlier.cpu().numpy()
        reduce_logits(logits, self.lengths, r0, window, sinks, lse, given, (out, top, column, earlier))
        self.stats[:, layer, :, r0 : r0 + r] = torch.from_numpy(out).to(torch.float16)
        self.top[:, layer, :, r0 : r0 + r] = torch.from_numpy(top)
        self.column[:, layer, :, :keys] += torch.from_numpy(column)

    def _allocate(self, batch: int, heads: int) -> None:
        """The pass's results on the host, as stored: filled block by block."""
        import torch

        n = max(self.lengths)
        self.stats = torch.zeros((batch, self.n_layers, heads, n, len(fmt.FIELDS)), dtype=torch.float16)
        self.top = torch.full((batch, self.n_layers, heads, n, fmt.TOP_K), -1, dtype=torch.int32)
        self.column = torch.zeros((batch, self.n_layers, heads, n), dtype=torch.float64)

    def example(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Example b's (stats float16 (token, layer, head, field), top keys int32 (token, layer, head, k))."""
        import torch

        n = self.lengths[b]
        with torch.inference_mode():  # the buffers were made in the pass's inference mode
            stats = self.stats[b, :, :, :n]
            seen_by = torch.arange(n, 0, -1, dtype=torch.float64)  # rows at or after key k: n - k
            column = (self.column[b, :, :, :n] / seen_by).to(torch.float32)
            high = column.to(torch.float16)
            high = torch.where(high.to(torch.float32) > column, torch.nextafter(high, torch.zeros_like(high)), high)
            stats[..., fmt.FIELD["column"]] = high  # rounded down, so that the rest is >= 0
            stats[..., fmt.FIELD["column_rest"]] = (column - high.to(torch.float32)).to(torch.float16)
            return stats.permute(2, 0, 1, 3).contiguous().numpy(), self.top[b, :, :, :n].permute(2, 0, 1, 3).contiguous().numpy()

    def results(self) -> list[tuple[np.ndarray, np.ndarray]]:
        if self.stats is None:
            raise RuntimeError("no attention block reached the row statistics")
        return [self.example(b) for b in range(len(self.lengths))]


KERNEL_VERSION = 1  # ingest/_rows.c's, raised with its arguments or results
REBUILD = "rebuild attnstore: pip install -e . (needs a C compiler and Python's headers)"


def _compiled():
    """ingest/_rows.c's module, checked against the version this file calls; else IngestError in one line."""
    try:
        from . import _rows
    except ImportError as exc:
        raise IngestError(f"attnstore's compiled row reduce ingest/_rows.c is not built: {REBUILD}") from exc
    built = getattr(_rows, "KERNEL_VERSION", None)
    if built != KERNEL_VERSION:
        raise IngestError(
            f"attnstore's compiled row reduce ingest/_rows.c is a stale build (version {built}, want {KERNEL_VERSION}): {REBUILD}"
        )
    return _rows


_OFFSETS = np.array(
    [
        fmt.FIELD["first_0"],
        fmt.POSITIONS,
        fmt.FIELD["entropy"],
        fmt.FIELD["learned_sink"],
        fmt.FIELD["distance_0"],
        fmt.DISTANCE_BINS,
        fmt.FIELD["top_0"],
        fmt.TOP_K,
        fmt.FIELD["duplicate"],
        fmt.FIELD["induction"],
        len(fmt.FIELDS),
    ],
    dtype=np.int32,
)  # ingest/_rows.c's F_* order


def reduce_logits(logits, lengths: list[int], r0: int, window: int | None, sinks, lse, given: bool, stats=None) -> None:
    """One block of a causal layer's rows reduced from its logits by ingest/_rows.c, on the CPU: `logits` (batch, head,
    r, keys) float32 torch tensor of q.k scale for rows r0 .. r0 + r (keys past a row, the example's length or the
    layer's `window` are masked there); `sinks` (head,) learned sink logits or None; `lse` (batch, head, r) float32
    numpy, each row's log-sum-exp, written (`given` False) or read; `stats`: None, or (fields (batch, head, r,
    len(FIELDS)) float32, top (batch, head, r, TOP_K) int32, column (batch, head, keys) float64 added to, earlier
    (batch, n) int64) to fill as `RowStats.block` does."""
    _rows = _compiled()
    batch, heads, r, keys = logits.shape
    values = logits.detach().contiguous().numpy()
    sink_values = np.zeros(0, np.float32) if sinks is None else np.ascontiguousarray(sinks, dtype=np.float32).reshape(heads)
    args = [values, batch, heads, r, keys, np.asarray(lengths, dtype=np.int64), r0, window or 0, sink_values, lse, given]
    if stats is not None:
        out, top, column, earlier = stats
        args += [out, top, column, np.ascontiguousarray(earlier, dtype=np.int64), _OFFSETS, earlier.shape[1]]
    _rows.block(*args)


def from_maps(maps: np.ndarray, token_ids=None) -> tuple[np.ndarray, np.ndarray]:
    """One example's row statistics from its (layer, head, L, L) causal maps and its token ids (what ingest computes
    from the rows as they pass): for tests and for checking a stored run against its maps."""
    import torch

    layers = maps.shape[0]
    collector = RowStats([maps.shape[-1]], layers, None if token_ids is None else [list(token_ids)])
    for layer in range(layers):
        collector.block(layer, 0, torch.from_numpy(np.ascontiguousarray(maps[layer], dtype=np.float32))[None])
    return collector.example(0)
