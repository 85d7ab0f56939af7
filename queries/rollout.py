"""Attention rollout and attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers"; the Primer,
Sec. 5.1): how much of the input each token's representation mixes in, through all layers.

Rollout, as the authors' `compute_joint_attention` (samiraabnar/attention_flow, attention_graph_util.py): per layer the
head-averaged map with the residual connection added and rows renormalised, Ã = (A + I) / rowsum = 0.5 A + 0.5 I; the
rollout of layer l is Ã_l · Ã_(l-1) · ... · Ã_0 (layers 0-based, the product taken from the first layer up). Row i of
layer l is how much token i's representation after layer l draws on each input token.

- `rollout`: per layer, the rolled-out attention *from* the source token -- the first special token ([CLS]-like), or
  the last token for a causal model, whose first token sees only itself -- to each token class: [CLS]-like,
  separators, punctuation (`punct`, as `special_tokens`), everything else; per example, then the mean over examples.
  Each example's (layer, class) shares are the `rollout` summary kind, kept with the run.
- `rollout_map`: one example's whole rollout (every layer, query and key token), long format.
- `attention_flow`: one example's attention flow: the maximum flow from the source token at the last layer to each
  input token through the layered graph whose edges carry Ã's weights (the authors' `get_adjmat` and
  `compute_node_flow`), normalised to sum to 1. One maximum flow per input token: scipy's Dinic (capacities as
  integers, 2**30 per unit weight: the flows agree with networkx's exact Edmonds-Karp to ~1e-10, 400x faster, 0.37 s
  against 149 s for 6 layers of 48 tokens), networkx where scipy is not installed; an example longer than
  `max_tokens` (64) is refused in one line that says so.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.float16 import as_float32
from .common import CAUSAL_NOTE, is_causal, token_flags
from .engine import MAP_SOURCES, SummaryKind, register, register_kind, summary_totals
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

CLASSES = ("cls", "sep", "punct", "other")
DEFAULT_PUNCT = ".,"
MAX_FLOW_TOKENS = 64


# float32 cells cast at a time into a buffer each reduce thread keeps (8 MiB; one layer of a longer example is cast
# whole): a fresh array per example above 1 MiB is a fresh mmap under the CLI's heap (store/heap.py), and its page
# faults cost more than the cast.
CAST_CELLS = 1 << 21
_CAST = threading.local()


def _cast_buffer(n: int) -> np.ndarray:
    buf = getattr(_CAST, "buf", None)
    if buf is None or buf.size < n:
        buf = _CAST.buf = np.empty(max(n, CAST_CELLS), np.float32)
    return buf[:n]


def residual_maps(maps: np.ndarray) -> np.ndarray:
    """(layer, head, L, L) maps -> (layer, L, L): averaged over heads, the identity added, rows renormalised (float64).
    float16 maps are cast to float32 by table (store/float16.py) a few layers at a time and averaged in float64: the
    same sums in the same order as numpy's mean of a float64 copy, bit for bit, without that copy. (Compiled from
    a37eb6c until docs/PERFORMANCE.md, 2026-11-29 "two compiled reduces back to numpy": the C loop took the reduce
    1.1-1.4x faster and the first whole-run query no faster.)"""
    n_layers, length = maps.shape[0], maps.shape[-1]
    if maps.dtype != np.float16:
        mean = np.asarray(maps, dtype=np.float64).mean(axis=1)
    else:
        mean = np.empty((n_layers, length, length))
        per_part = max(1, CAST_CELLS // max(1, int(np.prod(maps.shape[1:]))))
        for first in range(0, n_layers, per_part):
            part = maps[first : first + per_part]
            cast = as_float32(part, _cast_buffer(part.size).reshape(part.shape))
            cast.mean(axis=1, dtype=np.float64, out=mean[first : first + per_part])
    mixed = mean + np.eye(length)[None]
    return mixed / mixed.sum(-1, keepdims=True)


def rollout(maps: np.ndarray) -> np.ndarray:
    """(layer, head, L, L) maps -> (layer, L, L) rollout: layer l is Ã_l ... Ã_0."""
    aug = residual_maps(maps)
    out = np.empty_like(aug)
    out[0] = aug[0]
    for layer in range(1, len(aug)):
        out[layer] = aug[layer] @ out[layer - 1]
    return out


def source_token(flags, length: int, causal: bool) -> int:
    """The token whose rollout row is reported: the first [CLS]-like token (the last token for a causal model); -1
    where a bidirectional model's input has no [CLS]-like token."""
    if causal:
        return length - 1
    cls = np.flatnonzero(flags.cls)
    return int(cls[0]) if len(cls) else -1


def _prepare(store: Store, info: RunInfo, examples=None, punct: str = DEFAULT_PUNCT):
    return token_flags(store, info, punct, examples), is_causal(store, info)


def _reduce(context, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    flags, causal = context
    f = flags[example]
    length = maps.shape[-1]
    source = source_token(f, length, causal)
    shares = np.zeros((maps.shape[0], len(CLASSES)))
    if source >= 0:
        row = rollout(maps)[:, source, :]  # (layer, key)
        other = ~(f.cls | f.sep | f.punct)
        for k, mask in enumerate((f.cls, f.sep, f.punct, other)):
            shares[:, k] = row[:, mask].sum(-1)
    return {"shares": shares, "has_source": np.asarray(source >= 0)}


# shares: (layer, class in CLASSES order): the source token's rollout mass on each class; has_source false: no source
def _totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A range's reduction: the shares of its examples with a source token, added one example at a time in storage
    order (as the query did), and how many there are."""
    used = part["has_source"].astype(bool)
    shares = part["shares"][used]
    total = np.add.accumulate(shares, axis=0)[-1] if len(shares) else np.zeros(part["shares"].shape[1:])
    return {"shares": total, "n_examples": np.asarray(int(used.sum()), dtype=np.int64)}


ROLLOUT = register_kind(SummaryKind("rollout", 1, _prepare, _reduce, defaults={"punct": DEFAULT_PUNCT}, totals=_totals, threads=True))


@register("rollout", per_head=False, sources=MAP_SOURCES)
def rollout_query(store: Store, *, run, punct: str = DEFAULT_PUNCT) -> pd.DataFrame:
    """Attention rollout (Abnar & Zuidema 2020) per layer: from the first special token to [CLS], [SEP], punctuation, the rest.

    Per layer l, the rollout Ã_l ... Ã_0 of the head-averaged maps with the residual added
    (Ã = 0.5 A + 0.5 I); the row of the source token -- the first [CLS]-like token, or the
    last token of a causal model -- summed over each token class.
    Columns: layer, to_cls, to_sep, to_punct, to_other (the four sum to 1), n_examples
    (examples with a source token). Per example, then the mean over examples. `punct`: the
    characters that count as punctuation, as in special_tokens.
    """
    info = store.run_info(run)
    # the whole run adds its kept range reductions (O(ranges)); a subset adds each part's
    totals = summary_totals(store, info, ROLLOUT, punct=punct)
    total, n = totals["shares"], int(totals["n_examples"])
    mean = total / n if n else np.full_like(total, np.nan)
    frame = pd.DataFrame({"layer": np.arange(info.n_layers), **{f"to_{c}": mean[:, k] for k, c in enumerate(CLASSES)}, "n_examples": n})
    if is_causal(store, info):
        frame.attrs["note"] = f"{CAUSAL_NOTE}: the rollout is read from the last token"
    return frame


def _one_example(store: Store, run, example: int) -> tuple[RunInfo, np.ndarray, pd.DataFrame]:
    info = store.run_info(run)
    return info, store.attention(info.id, example), store.tokens(info.id, example)


@register("rollout_map", per_head=False)
def rollout_map(store: Store, *, run, example: int = 0, layer: int | None = None) -> pd.DataFrame:
    """One example's attention rollout (Abnar & Zuidema 2020): every layer's Ã_l ... Ã_0, long format.

    Columns: layer, query, key (token positions), query_token, key_token, rollout (rows sum
    to 1). `layer`: one layer only (default every layer).
    """
    info, maps, tokens = _one_example(store, run, example)
    rolled = rollout(maps)
    layers = range(info.n_layers) if layer is None else [int(layer)]
    names = tokens["token"].tolist()
    length = len(names)
    q, k = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    parts = [
        pd.DataFrame(
            {
                "layer": lay,
                "query": q.ravel(),
                "key": k.ravel(),
                "query_token": np.asarray(names, dtype=object)[q.ravel()],
                "key_token": np.asarray(names, dtype=object)[k.ravel()],
                "rollout": rolled[lay].ravel(),
            }
        )
        for lay in layers
    ]
    return pd.concat(parts, ignore_index=True)


FLOW_SCALE = 1 << 30  # integer capacity of a unit weight for scipy's maximum_flow (int32 capacities; a flow is <= 1)


def flow_from(aug: np.ndarray, source: int) -> np.ndarray:
    """Attention flow to each input token from token `source` at the last layer, through the layered graph whose edge
    (layer i, token a) -> (layer i - 1, token b) has capacity aug[i - 1][a, b] (the authors' get_adjmat), normalised to
    sum to 1 (their compute_node_flow): one maximum flow per input token (scipy's Dinic on integer capacities, else
    networkx's Edmonds-Karp)."""
    try:
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import maximum_flow
    except ImportError:
        return _flow_networkx(aug, source)
    layers, length, _ = aug.shape
    rows, cols, caps = [], [], []
    for i in range(1, layers + 1):
        a, b = np.nonzero(aug[i - 1] > 0)
        rows.append(i * length + a)
        cols.append((i - 1) * length + b)
        caps.append(np.rint(aug[i - 1][a, b] * FLOW_SCALE))
    n = (layers + 1) * length
    graph = csr_matrix((np.concatenate(caps).astype(np.int32), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))
    values = np.array(
        [maximum_flow(graph, layers * length + source, b, method="dinic").flow_value for b in range(length)], dtype=np.float64
    )
    return values / values.sum() if values.sum() > 0 else values


def _flow_networkx(aug: np.ndarray, source: int) -> np.ndarray:
    """`flow_from` with networkx's exact Edmonds-Karp on float capacities (slow: seconds per token at 48 tokens)."""
    try:
        import networkx as nx
        from networkx.algorithms.flow import edmonds_karp
    except ImportError:
        raise InvalidArgumentError("attention_flow needs scipy or networkx: pip install 'attnstore[ingest]' (scipy)") from None
    layers, length, _ = aug.shape
    graph = nx.DiGraph()
    for i in range(1, layers + 1):
        for a in range(length):
            for b in range(length):
                if aug[i - 1][a, b] > 0:
                    graph.add_edge((i, a), (i - 1, b), capacity=float(aug[i - 1][a, b]))
    values = np.array([nx.maximum_flow_value(graph, (layers, source), (0, b), flow_func=edmonds_karp) for b in range(length)])
    return values / values.sum() if values.sum() > 0 else values


@register("attention_flow", per_head=False)
def attention_flow(store: Store, *, run, example: int = 0, max_tokens: int = MAX_FLOW_TOKENS) -> pd.DataFrame:
    """One example's attention flow (Abnar & Zuidema 2020): max-flow from the first special token at the last layer to each input token.

    The graph's edges carry the head-averaged maps with the residual added (Ã = 0.5 A + 0.5 I)
    between consecutive layers; the flow to each input token is normalised to sum to 1.
    Columns: key (token position), token, flow, rollout (the same token's rollout share,
    for comparison). The source is the last token for a causal model. An example longer
    than max_tokens tokens (64) is refused: one max-flow per token.
    """
    info, maps, tokens = _one_example(store, run, example)
    length = maps.shape[-1]
    if length > max_tokens:
        raise InvalidArgumentError(
            f"example {example} of run {info.name!r} has {length} tokens, more than max_tokens={max_tokens}: attention flow solves one "
            f"max-flow per token over {info.n_layers + 1} x {length} nodes; raise --param max_tokens={length} to wait for it"
        )
    flags = token_flags(store, info, examples=[example])[example]
    source = source_token(flags, length, is_causal(store, info))
    if source < 0:
        raise InvalidArgumentError(f"example {example} of run {info.name!r} has no [CLS]-like token to take the flow from")
    flow = flow_from(residual_maps(maps), source)
    return pd.DataFrame({"key": np.arange(length), "token": tokens["token"].tolist(), "flow": flow, "rollout": rollout(maps)[-1, source]})
