"""Massive activations (Sun et al. 2024): per layer, the largest entries of the residual stream and how far they stand
above the median, read from the hidden-state peaks a causal LM's run keeps (ingest/activations.py).

Sun et al. report, per layer, the top activation magnitudes against the median, the token and the dimension that hold
them (the first token or a delimiter, a few fixed dimensions), appearing at an early layer and staying; they tie them to
attention sinks. Join this frame with `attention_sink` on `layer` to see the sink onset beside them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .engine import register
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..store import Store

TOP = 3


@register("massive_activations", per_head=False)
def massive_activations(store: Store, *, run, examples=None) -> pd.DataFrame:
    """Sun et al. 2024: per layer, the largest hidden-state magnitudes of the run, their token and dimension, and the median.

    Columns: layer; peak (the signed entry of largest magnitude over every token of the run's examples, or of
    `examples`), example, position, token, dim (where it is); top2, top3 (the next largest magnitudes, each on another
    token); median (the median over tokens of each token's median magnitude over dimensions); ratio (|peak| / median);
    first_token_share (the share of examples whose own largest magnitude in the layer is on their first token).
    Needs a run that keeps hidden-state peaks (a causal LM ingested with its per-token loss).
    """
    info = store.run_info(run)
    entries, positions, owners, medians, first = [], [], [], [], []
    for example, peaks in store.iter_hidden_peaks(info.id, examples):  # (token, layer, [value, dim, median])
        entries.append(peaks[..., :2])
        positions.append(np.arange(len(peaks)))
        owners.append(np.full(len(peaks), example))
        medians.append(peaks[..., 2])
        first.append(np.abs(peaks[..., 0]).argmax(0) == 0)  # (layer,): the example's own peak on its first token
    if not entries:
        raise InvalidArgumentError(f"examples={examples!r} selects no stored example of run {info.name!r}")
    stacked = np.concatenate(entries)  # (token, layer, 2): signed value, dim
    position, owner = np.concatenate(positions), np.concatenate(owners)
    magnitude = np.abs(stacked[..., 0])
    order = np.argsort(-magnitude, axis=0, kind="stable")[:TOP]  # (TOP, layer): the largest tokens of each layer
    layers = np.arange(info.n_layers)
    best = order[0]
    median = np.median(np.concatenate(medians), axis=0)
    frame = pd.DataFrame(
        {
            "layer": layers,
            "peak": stacked[best, layers, 0],
            "example": owner[best],
            "position": position[best],
            "dim": stacked[best, layers, 1].astype(np.int64),
        }
    )
    for k in range(1, TOP):
        frame[f"top{k + 1}"] = magnitude[order[k], layers] if len(order) > k else np.nan
    frame["median"] = median
    frame["ratio"] = np.abs(frame["peak"]) / median
    frame["first_token_share"] = np.mean(first, axis=0)
    tokens = store.token_table(info.id, sorted(set(owner[best].tolist())))
    text = {(int(e), int(p)): t for e, p, t in tokens[["example", "position", "token"]].itertuples(index=False)}
    frame.insert(4, "token", [text.get((int(e), int(p))) for e, p in zip(frame["example"], frame["position"], strict=True)])
    return frame
