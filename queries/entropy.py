"""C4 (Clark et al. 2019, Sec 3.3, Fig 4): entropy of each head's attention distributions."""

from __future__ import annotations

from collections.abc import Iterable
from math import lgamma
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import CAUSAL_NOTE, check_average, is_causal, per_head_frame, safe_divide, token_flags
from .registry import register
from .summary import ranged_maps, summaries

if TYPE_CHECKING:
    from ..store import Store


# Hand-written on purpose: scipy (scipy.special.entr) is only in the ingest extra, and queries need numpy alone.
def row_entropy(maps: np.ndarray) -> np.ndarray:
    """Entropy in nats of every attention row: (..., query, key) -> (..., query); 0 log 0 = 0."""
    logs = np.log(maps, out=np.zeros_like(maps), where=maps > 0)
    return -(maps * logs).sum(-1)


@register("entropy")
def entropy(store: Store, *, run, examples=None, average: str = "example") -> pd.DataFrame:
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
    shape = (info.n_layers, info.n_heads)
    total, from_cls = np.zeros(shape), np.zeros(shape)
    n_queries = n_cls = 0
    uniform = uniform_cls = 0.0
    kept = summaries(store, info, examples)  # per-example sums kept with the run, read part by part: no map is decoded
    rows = (
        _kept_rows(kept) if kept is not None else ranged_maps(store, info, examples, lambda part: token_flags(store, info, examples=part))
    )
    for example, maps, context in rows:
        if maps is not None:
            f = context[example]  # this range's token flags
            h = row_entropy(maps.astype(np.float32, copy=False))  # (layer, head, query)
            length, cls = maps.shape[-1], int(f.cls.sum())
            h_sum, h_cls_sum = h.sum(-1, dtype=np.float64), h[..., f.cls].sum(-1, dtype=np.float64)
        else:
            part, i = context
            length, cls = int(part["length"][i]), int(part["n_cls"][i])
            h_sum, h_cls_sum = part["entropy"][i], part["entropy_from_cls"][i]
        # Uniform attention over the keys a query sees: all L, or (causal) the i + 1 up to itself.
        uniform_sum = lgamma(length + 1) if causal else length * np.log(length)  # sum over the L queries
        if per_example:  # this example's means, counted once
            total += h_sum / length
            uniform += uniform_sum / length
            n_queries += 1
            if cls:
                from_cls += h_cls_sum / cls
                uniform_cls += np.log(length)
                n_cls += 1
        else:
            total += h_sum
            from_cls += h_cls_sum
            uniform += uniform_sum
            uniform_cls += cls * np.log(length)
            n_queries += length
            n_cls += cls
    frame = per_head_frame(info, entropy=safe_divide(total, n_queries), entropy_from_cls=safe_divide(from_cls, n_cls))
    frame["uniform_entropy"] = safe_divide(uniform, n_queries)
    frame["uniform_entropy_from_cls"] = safe_divide(uniform_cls, n_cls)
    if causal:
        frame[["entropy_from_cls", "uniform_entropy_from_cls"]] = np.nan
        frame.attrs["note"] = f"{CAUSAL_NOTE}: uniform_entropy is over each query's visible prefix; *_from_cls are NaN"
    return frame


def _kept_rows(parts: Iterable[dict[str, np.ndarray]]):
    """(example, None, (its part, its row there)) per summarised example, standing in for (example, maps, flags) in the
    loop above."""
    return ((int(example), None, (part, i)) for part in parts for i, example in enumerate(part["example"]))
