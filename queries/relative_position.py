"""C1 (Clark et al. 2019, Sec 3.1): attention to the previous, same and next token per head."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import CAUSAL_NOTE, check_average, is_causal, per_head_frame, safe_divide
from .registry import register
from .request import MAP_SOURCES
from .summary import CLARK, summary_totals

if TYPE_CHECKING:
    from ..store import Store


@register("relative_position", sources=MAP_SOURCES)
def relative_position(store: Store, *, run, average: str = "example") -> pd.DataFrame:
    """Mean attention per head from each token to the previous, the same and the next token.

    Columns: layer, head, to_previous, to_self, to_next.
    average="example" (default, Clark et al.'s code): per example, the sum of a[i, i-1]
      (a[i, i], a[i, i+1]) over its L query tokens divided by L, then the mean over examples;
      the first (last) token has no previous (next) token and counts as 0.
    average="token" (pooled): to_previous = mean of a[i, i-1] over every query token of the
      run that has a previous token (i >= 1), to_next likewise (i <= L-2), to_self over all
      query tokens; long examples weigh more.
    All tokens count, special tokens included (as in the paper).
    Causal models (models.causal): to_next is NaN, since no token can attend to the next one
    (it would be 0 by construction); frame.attrs["note"] says so.
    """
    check_average(average)
    info = store.run_info(run)
    causal = is_causal(store, info)
    # the Clark summary's totals (queries/summary.py): kept per range for the whole run, else from each example's sums
    t = summary_totals(store, info, CLARK)
    names = ("to_previous", "to_self", "to_next")
    if average == "example":  # each example's mean over its L query tokens, then the mean over examples
        frame = per_head_frame(info, **{name: safe_divide(t[f"mean_{name}"], int(t["examples"])) for name in names})
    else:  # pooled: to_previous over the tokens that have a previous token (i >= 1), to_next likewise
        n_pairs = int(t["n_tokens"]) - int(t["examples"])
        frame = per_head_frame(
            info,
            to_previous=safe_divide(t["to_previous"], n_pairs),
            to_self=safe_divide(t["to_self"], int(t["n_tokens"])),
            to_next=safe_divide(t["to_next"], n_pairs),
        )
    if causal:
        frame["to_next"] = np.nan
        frame.attrs["note"] = f"{CAUSAL_NOTE}: to_next is NaN"
    return frame
