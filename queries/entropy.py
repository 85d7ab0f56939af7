"""C4 (Clark et al. 2019, Sec 3.3, Fig 4): entropy of each head's attention distributions."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import CAUSAL_NOTE, check_average, is_causal, per_head_frame, safe_divide
from .registry import register
from .request import MAP_SOURCES
from .summary import CLARK, row_entropy, summary_totals

if TYPE_CHECKING:
    from ..store import Store


__all__ = ["entropy", "row_entropy"]  # row_entropy: every row's entropy, the summands the Clark sums add (queries/summary.py)


@register("entropy", sources=MAP_SOURCES)
def entropy(store: Store, *, run, average: str = "example") -> pd.DataFrame:
    """Mean entropy (nats) of each head's attention, over all query tokens and from the first special token only.

    Columns: layer, head;
    entropy: mean over query tokens of -sum_j a_ij log a_ij;
    entropy_from_cls: the same over [CLS]-like query tokens only (tokenizer's cls/bos id);
    uniform_entropy: mean log(L) over the same query tokens, what uniform attention would give;
      for a causal model (models.causal) uniform attention over what each query sees: log(i + 1)
      for the query at position i;
    uniform_entropy_from_cls: log(L) averaged over the [CLS]-like queries.
    average="example" (default, Clark et al.'s code): each mean is taken within an example,
      then over the examples (for the *_from_cls columns, those with a [CLS]-like token);
    average="token": pooled over every query token of the run (long examples weigh more).
    Causal models: the *_from_cls columns are NaN (the first token sees only itself, so its
    entropy is 0 by construction), and frame.attrs["note"] says so.
    """
    check_average(average)
    per_example = average == "example"
    info = store.run_info(run)
    causal = is_causal(store, info)
    # the Clark summary's totals (queries/summary.py): kept per range for the whole run, else from each example's sums
    t = summary_totals(store, info, CLARK)
    # Uniform attention over the keys a query sees: all L (sum over the L queries: L log L), or (causal) the i + 1 up
    # to itself (log L!).
    if per_example:  # each example's means, counted once
        total, from_cls = t["mean_entropy"], t["mean_entropy_from_cls"]
        n_queries, n_cls = int(t["examples"]), int(t["examples_cls"])
        uniform = float(t["lgamma_per_length"] if causal else t["log_length"])
        uniform_cls = float(t["log_length_with_cls"])
    else:
        total, from_cls = t["entropy"], t["entropy_from_cls"]
        n_queries, n_cls = int(t["n_tokens"]), int(t["n_cls"])
        uniform = float(t["lgamma_length"] if causal else t["length_log_length"])
        uniform_cls = float(t["cls_log_length"])
    frame = per_head_frame(info, entropy=safe_divide(total, n_queries), entropy_from_cls=safe_divide(from_cls, n_cls))
    frame["uniform_entropy"] = safe_divide(uniform, n_queries)
    frame["uniform_entropy_from_cls"] = safe_divide(uniform_cls, n_cls)
    if causal:
        frame[["entropy_from_cls", "uniform_entropy_from_cls"]] = np.nan
        frame.attrs["note"] = f"{CAUSAL_NOTE}: uniform_entropy is over each query's visible prefix; *_from_cls are NaN"
    return frame
