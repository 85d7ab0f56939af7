"""Norm-based analysis of attention (Kobayashi et al. 2020, "Attention is not only a weight", Sec. 4; the Primer, Sec. 5.1).

A head's output for query i is sum_j a_ij f_h(x_j): the attention weight a_ij says how much of token j's transformed
vector f_h(x_j) is taken, its norm ||f_h(x_j)|| how large that vector is. Kobayashi et al. found BERT's large weights on
[CLS], [SEP] and punctuation paired with small norms, so the norm-weighted contribution ||a_ij f_h(x_j)|| =
a_ij ||f_h(x_j)|| of those tokens is small. Per head and token class this query gives the three numbers of their
re-examination (reference code gorokoba560/norm-analysis-of-transformer, emnlp2020/exp1_bert/re-examine.py, read): the
weight, the norm and the norm-weighted contribution, plus the contribution's share of the row's total (what every
per-head query reads with weights="norm").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .clark import DEFAULT_PUNCT
from .common import per_head_frame, safe_divide, token_flags
from .engine import ATTENTION_ONLY, SummaryKind, iter_maps_with_norms, register, register_kind, summary_totals

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

CLASSES = ("cls", "sep", "punct", "other")


def _prepare(store: Store, info: RunInfo, examples=None, punct: str = DEFAULT_PUNCT):
    store.require_value_norms(info.id)
    return token_flags(store, info, punct, examples)


def _read(store: Store, info: RunInfo, examples, context) -> Iterator[tuple[int, tuple[np.ndarray, np.ndarray]]]:
    """(example, (maps, value norms)): both in storage order."""
    for example, maps, norms in iter_maps_with_norms(store, info, examples):
        yield example, (maps, norms)


def _reduce(flags, example: int, pair: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    """Per (layer, head) and class, summed over the example's L query rows: the weight on the class's keys, the
    norm-weighted contribution of its keys and that contribution's share of each row; per class the sum of its keys'
    norms and their count."""
    maps, norms = pair
    f = flags[example]
    a = maps.astype(np.float64)
    weighted = a * norms.astype(np.float64)[:, :, None, :]  # ||a_ij f_h(x_j)||
    total = weighted.sum(-1, keepdims=True)
    share = np.divide(weighted, total, out=np.zeros_like(weighted), where=total > 0)
    masks = {"cls": f.cls, "sep": f.sep, "punct": f.punct, "other": ~(f.cls | f.sep | f.punct)}
    out = {"length": np.asarray(maps.shape[-1], np.int64)}
    for name, mask in masks.items():
        out[f"weight_{name}"] = a[..., mask].sum((-2, -1))
        out[f"contribution_{name}"] = weighted[..., mask].sum((-2, -1))
        out[f"share_{name}"] = share[..., mask].sum((-2, -1))
        out[f"norm_{name}"] = norms[..., mask].astype(np.float64).sum(-1)
        out[f"n_{name}"] = np.asarray(mask.sum(), np.int64)
    return out


def _totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A range's reduction, what `norm_attention` adds: per class, the weight, contribution and share averaged over
    each example's query tokens and summed over the examples; the mean norm of the class's keys summed over the examples
    that have one (`norm_<c>`) and their count (`with_<c>`); and the examples (`examples`)."""
    length = part["length"].astype(np.float64)[:, None, None]
    out = {"examples": np.asarray(len(part["length"]), np.int64)}
    for c in CLASSES:
        for kind in ("weight", "contribution", "share"):
            out[f"{kind}_{c}"] = (part[f"{kind}_{c}"] / length).sum(0)
        has = part[f"n_{c}"] > 0
        out[f"norm_{c}"] = (part[f"norm_{c}"][has] / part[f"n_{c}"][has][:, None, None]).sum(0)
        out[f"with_{c}"] = np.asarray(has.sum(), np.int64)
    return out


NORM_CLASSES = register_kind(
    SummaryKind("norm_classes", 1, _prepare, _reduce, read=_read, defaults={"punct": DEFAULT_PUNCT}, totals=_totals),
)


@register("norm_attention", sources=ATTENTION_ONLY)
def norm_attention(store: Store, *, run, punct: str = DEFAULT_PUNCT) -> pd.DataFrame:
    """Kobayashi et al. 2020: per head, weight, value norm and norm-weighted contribution of [CLS], [SEP], punctuation, other.

    Columns: layer, head, then for each class c of cls ([CLS]-like: the first special token),
    sep (separators), punct (non-special tokens whose text is one of `punct`), other:
    weight_c: attention mass a query gives the class's keys, sum_{j in c} a_ij, averaged over
      the example's query tokens, then over the examples (the paper's alpha);
    norm_c: mean ||f_h(x_j)|| over the class's tokens in an example, then over the examples that
      have such a token (the paper's ||f(x)||);
    contribution_c: sum_{j in c} ||a_ij f_h(x_j)|| averaged over query tokens, then examples
      (the paper's ||alpha f(x)||, in the units of the model's hidden vectors);
    share_c: contribution_c's share of the row's total sum_j ||a_ij f_h(x_j)||, averaged the same
      way: `special_tokens` with weights="norm" (the four shares sum to 1).
    Needs a run ingested with value norms (the default since attnstore kept them).
    """
    info = store.run_info(run)
    # the whole run adds its kept range reductions (O(ranges)); a subset adds each part's
    sums = summary_totals(store, info, NORM_CLASSES, punct=punct)
    n_examples = int(sums["examples"])
    with_class = {c: int(sums[f"with_{c}"]) for c in CLASSES}
    columns = {}
    for c in CLASSES:
        columns[f"weight_{c}"] = safe_divide(sums[f"weight_{c}"], n_examples)
        columns[f"norm_{c}"] = safe_divide(sums[f"norm_{c}"], with_class[c])
        columns[f"contribution_{c}"] = safe_divide(sums[f"contribution_{c}"], n_examples)
        columns[f"share_{c}"] = safe_divide(sums[f"share_{c}"], n_examples)
    frame = per_head_frame(info, **columns)
    frame.attrs["examples_with_class"] = {"all": n_examples, **with_class}
    return frame
