"""C2 (Clark et al. 2019, Sec 3.2, Fig 2): attention to special tokens and punctuation per head."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import check_average, per_head_frame, safe_divide
from .registry import register
from .request import MAP_SOURCES
from .summary import CLARK, CLARK_UNITS, summary_totals

if TYPE_CHECKING:
    from ..store import Store


@register("special_tokens", sources=MAP_SOURCES)
def special_tokens(store: Store, *, run, punct: str = ".,", average: str = "example") -> pd.DataFrame:
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
    """
    check_average(average)
    info = store.run_info(run)
    # the Clark summary's totals (queries/summary.py): kept per range for the whole run, else from each example's sums
    t = summary_totals(store, info, CLARK, punct=punct)
    frame = _from_totals(info, t, average == "example")
    absent = [what for what, unit in (("[CLS]-like", "cls"), ("separator", "sep")) if not int(t[f"n_{unit}"])]
    if absent and int(t["n_tokens"]):  # a decoder's tokenizer adds neither: zeros by construction, not a measurement
        columns = " and ".join(c for c, what in (("to_cls", "[CLS]-like"), ("to_sep, sep_from_sep", "separator")) if what in absent)
        frame.attrs["note"] = (
            f"the run's tokens include no {' and no '.join(absent)} token (its tokenizer adds none), so {columns} "
            "are 0 or empty by construction: they measure nothing here"
        )
    return frame


def _from_totals(info, t: dict[str, np.ndarray], per_example: bool) -> pd.DataFrame:
    """The means from the Clark totals: per example, the sum of each example's mean over the examples that have such
    query tokens divided by their number; pooled, the sum over the run's query tokens divided by theirs."""
    prefix, count = ("mean_", "examples_") if per_example else ("", "n_")

    def mean(name: str) -> np.ndarray:
        return safe_divide(t[f"{prefix}{name}"], int(t[f"{count}{CLARK_UNITS[name]}"]))

    return per_head_frame(
        info,
        **{f"to_{k}": mean(f"received_{k}") for k in ("cls", "sep", "punct", "other")},
        sep_from_sep=mean("sep_from_sep"),
        sep_from_other=mean("sep_from_other"),
    )
