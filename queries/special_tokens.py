"""C2 (Clark et al. 2019, Sec 3.2, Fig 2): attention to special tokens and punctuation per head."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import check_average, per_head_frame, safe_divide
from .registry import register
from .summary import CLARK, summary_parts

if TYPE_CHECKING:
    from ..store import Store


@register("special_tokens")
def special_tokens(
    store: Store, *, run, punct: str = ".,", examples=None, average: str = "example", weights: str = "attention"
) -> pd.DataFrame:
    """Mean attention per head to [CLS]-like, [SEP]-like and punctuation tokens, and from [SEP] to [SEP].

    Columns: layer, head;
    to_cls, to_sep, to_punct, to_other: attention mass a query token gives each kind of
      key token, averaged over query tokens (the four sum to 1); `to_other` includes other
      special tokens; punctuation = non-special tokens whose text (without subword marker)
      is one of the characters in `punct`;
    sep_from_sep: mean attention a separator token gives to separator tokens;
    sep_from_other: the same for all other query tokens.
    average="example" (default, Clark et al.'s code): each mean is taken within an example
      (over its L query tokens; over its separators for sep_from_sep, its other tokens for
      sep_from_other), then over the examples (those that have such query tokens);
    average="token": pooled over every query token of the run.
    Special tokens are identified by the tokenizer's ids recorded with the model.
    weights="norm": each key's attention weighted by its value norm (Kobayashi et al. 2020), rows renormalised
      (runs ingested with value norms); "attention" (default): the maps as stored.
    """
    check_average(average)
    info = store.run_info(run)
    return _from_summaries(info, summary_parts(store, info, CLARK, examples, punct=punct, weights=weights), average == "example")


def _from_summaries(info, parts: Iterable[dict[str, np.ndarray]], per_example: bool) -> pd.DataFrame:
    """The means from each example's sums (the Clark summary, queries/summary.py), part by part."""
    shape = (info.n_layers, info.n_heads)
    names = (*(f"received_{k}" for k in ("cls", "sep", "punct", "other")), "sep_from_sep", "sep_from_other")
    totals = {name: np.zeros(shape) for name in names}
    of_field = {name: "length" for name in names} | {"sep_from_sep": "n_sep", "sep_from_other": "others"}  # its query tokens
    counts = {"length": 0.0, "n_sep": 0.0, "others": 0.0}
    for part in parts:
        length = part["length"].astype(np.float64)
        per_query = {"length": length, "n_sep": part["n_sep"].astype(np.float64), "others": length - part["n_sep"]}
        for name in totals:
            values, n = part[name], per_query[of_field[name]]
            used = n > 0
            # per example: each example's mean, over the examples that have such query tokens
            totals[name] += (values[used] / n[used][:, None, None]).sum(0) if per_example else values.sum(0)
        for key, n in per_query.items():
            counts[key] += float((n > 0).sum()) if per_example else float(n.sum())
    return per_head_frame(
        info,
        **{f"to_{k}": safe_divide(totals[f"received_{k}"], counts["length"]) for k in ("cls", "sep", "punct", "other")},
        sep_from_sep=safe_divide(totals["sep_from_sep"], counts["n_sep"]),
        sep_from_other=safe_divide(totals["sep_from_other"], counts["others"]),
    )
