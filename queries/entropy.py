"""C4 (Clark et al. 2019, Sec 3.3, Fig 4): entropy of each head's attention distributions."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .common import iter_maps, per_head_frame, safe_divide, token_flags
from .registry import register


def row_entropy(maps: np.ndarray) -> np.ndarray:
    """Entropy in nats of every attention row: (..., query, key) -> (..., query); 0 log 0 = 0."""
    logs = np.log(maps, out=np.zeros_like(maps), where=maps > 0)
    return -(maps * logs).sum(-1)


@register("entropy")
def entropy(store, *, run, examples=None) -> pd.DataFrame:
    """Mean entropy (nats) of each head's attention, over all query tokens and from the first special token only.

    Columns: layer, head;
    entropy: mean over all query tokens of the run of -sum_j a_ij log a_ij;
    entropy_from_cls: the same over [CLS]-like query tokens only (tokenizer's cls/bos id);
    uniform_entropy: mean log(L) over the same query tokens, what uniform attention would give;
    uniform_entropy_from_cls: log(L) averaged over the [CLS]-like queries.
    """
    info = store.run_info(run)
    flags = token_flags(store, info)
    shape = (info.n_layers, info.n_heads)
    total, from_cls = np.zeros(shape), np.zeros(shape)
    n_queries = n_cls = 0
    uniform = uniform_cls = 0.0
    for example, maps in iter_maps(store, info, examples):
        f = flags[example]
        h = row_entropy(maps.astype(np.float32, copy=False))  # (layer, head, query)
        length = maps.shape[-1]
        total += h.sum(-1)
        from_cls += h[..., f.cls].sum(-1)
        n_queries += length
        n_cls += int(f.cls.sum())
        uniform += length * np.log(length)
        uniform_cls += int(f.cls.sum()) * np.log(length)
    frame = per_head_frame(info, entropy=safe_divide(total, n_queries), entropy_from_cls=safe_divide(from_cls, n_cls))
    frame["uniform_entropy"] = safe_divide(uniform, n_queries)
    frame["uniform_entropy_from_cls"] = safe_divide(uniform_cls, n_cls)
    return frame
