"""C1 (Clark et al. 2019, Sec 3.1): attention to the previous, same and next token per head."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .common import iter_maps, per_head_frame, safe_divide
from .registry import register


@register("relative_position")
def relative_position(store, *, run, examples=None) -> pd.DataFrame:
    """Mean attention per head from each token to the previous, the same and the next token.

    Columns: layer, head;
    to_previous: mean of a[i, i-1] over query tokens that have a previous token (i >= 1);
    to_self: mean of a[i, i] over all query tokens;
    to_next: mean of a[i, i+1] over query tokens that have a next token (i <= L-2).
    All tokens count, special tokens included (as in the paper).
    """
    info = store.run_info(run)
    shape = (info.n_layers, info.n_heads)
    prev, same, nxt = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    n_tokens = n_pairs = 0
    for _, maps in iter_maps(store, info, examples):
        prev += np.diagonal(maps, offset=-1, axis1=2, axis2=3).sum(-1, dtype=np.float64)
        same += np.diagonal(maps, offset=0, axis1=2, axis2=3).sum(-1, dtype=np.float64)
        nxt += np.diagonal(maps, offset=1, axis1=2, axis2=3).sum(-1, dtype=np.float64)
        n_tokens += maps.shape[-1]
        n_pairs += maps.shape[-1] - 1
    return per_head_frame(info, to_previous=safe_divide(prev, n_pairs), to_self=safe_divide(same, n_tokens),
                          to_next=safe_divide(nxt, n_pairs))
