"""The map sources a query over one run's maps reads: the attention maps as stored, or (Kobayashi et al. 2020) the
maps weighted by the value norms. Which one a call reads is its request's `source` (engine/request.py); the readers
here take it wherever their caller names none, so no query forwards it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from ...store import row_stats
from ...store.float16 import as_float32
from ..errors import InvalidArgumentError
from .request import REQUESTED, requested_examples

if TYPE_CHECKING:
    from ...store import Store
    from ...store.records import RunInfo
    from .kinds import SummaryKind


def iter_maps(store: Store, info: RunInfo, examples=REQUESTED, by_layer: bool = False) -> Iterator[tuple[int, np.ndarray]]:
    """(example, maps as stored, float16 or float32) over a run (its examples `examples`; within a query call, by
    default the request's), streamed; reduce with dtype=np.float64. `by_layer`: a Q/K run's maps as `qk.LayerMaps`."""
    examples = requested_examples(info.id, examples)
    if by_layer and info.qk is not None:  # only a Q/K run's maps come a layer at a time
        yield from store.iter_attention(info.id, examples, by_layer=True)
    else:
        yield from store.iter_attention(info.id, examples)


# What a per-head query reads: the attention weights a_ij, or (Kobayashi et al. 2020) the weights times the value norms,
# a_ij ||f_h(x_j)|| = ||a_ij f_h(x_j)||, each row renormalised to sum to 1 (so entropies, argmaxes and shares read as
# for attention; a row whose weighted values are all 0 stays 0).
WEIGHTS = ("attention", "maps", "norm")


def check_weights(weights: str) -> str:
    if weights not in WEIGHTS:
        raise InvalidArgumentError(
            f"weights={weights!r}: use 'attention' (the weights: a causal LM run's row statistics where the query answers "
            f"from them, else the maps), 'maps' (the maps as stored, always) or 'norm' (the maps weighted by each key's "
            f"value norm, Kobayashi et al. 2020; runs ingested with value norms)"
        )
    return weights


def weighted_maps(maps: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """(layer, head, query, key) maps weighted by (layer, head, key) value norms, rows renormalised; float32."""
    w = as_float32(maps) * norms.astype(np.float32, copy=False)[:, :, None, :]  # float16 by table (store/float16.py)
    total = w.sum(-1, keepdims=True)
    return np.divide(w, total, out=np.zeros_like(w), where=total > 0)


def iter_weighted_maps(
    store: Store, info: RunInfo, examples=None, weights: str = "attention", by_layer: bool = False
) -> Iterator[tuple[int, np.ndarray]]:
    """`iter_maps` (`by_layer` as there), or with weights="norm" each example's `weighted_maps` (a run without value
    norms is refused)."""
    if check_weights(weights) in ("attention", "maps"):
        yield from iter_maps(store, info, examples, by_layer)
        return
    for example, maps, norms in iter_maps_with_norms(store, info, examples):
        yield example, weighted_maps(maps, norms)


def reads_rows(info: RunInfo, kind: SummaryKind, params: dict) -> bool:
    """Whether a kind's pass over run `info` reads its per-row statistics (store/row_stats.py) instead of its maps: the
    run keeps them, the kind reduces them (`kind.rows`), its parameters are ones they give (`kind.rows_accept`), the
    run keeps the fields it then reads (one kept before a field existed reads its maps), and the call asks for the
    attention weights (not weights="maps" or "norm")."""
    if kind.rows is None or not info.has_row_stats or params.get("weights", "attention") != "attention":
        return False
    if kind.rows_accept is not None and not kind.rows_accept({k: v for k, v in params.items() if k != "weights"}):
        return False
    wanted = row_stats.field_indices(rows_fields(kind, params))
    return wanted is None or {row_stats.FIELDS[i] for i in wanted} <= set(info.row_stats_fields)


def rows_fields(kind: SummaryKind, params) -> tuple[str, ...] | None:
    """The row-statistics fields a kind's `rows` reduce reads for these parameters (None: all)."""
    return kind.rows_fields(params) if callable(kind.rows_fields) else kind.rows_fields


def iter_maps_with_norms(store: Store, info: RunInfo, examples=REQUESTED) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(example, maps, value norms) in storage order (`examples` as `iter_maps`); a run without value norms is refused
    in one line."""
    store.require_value_norms(info.id)
    examples = requested_examples(info.id, examples)
    for (example, maps), (same, norms) in zip(iter_maps(store, info, examples), store.iter_value_norms(info.id, examples)):
        assert example == same, (example, same)  # both in storage order
        yield example, maps, norms
