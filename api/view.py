"""Pictures of one example's attention: token x token heatmaps (one head, a layer's heads, or every head).

Thin: maps come from `Store.attention`, tokens from `Store.tokens`; this module only draws.
Special tokens ([CLS], [SEP], <s>, ...) are marked in bold red on both axes; layers and heads
are 0-based, as in the data, and the axes say which is the query (row, attends) and which the
key (column, attended to). Also writes bertviz's `head_view` / `model_view` input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..store.errors import InvalidArgumentError
from ..store.plot import plot_attention

if TYPE_CHECKING:
    from ..store import Store

FIGURE_SUFFIXES = (".png", ".svg")


def save_view(store: Store, run: str, example: int, out: str, layer: int | None = None, head: int | None = None) -> Path:
    """Draw `plot_attention` into `out` (.png or .svg)."""
    path = Path(out)
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise InvalidArgumentError(f"--out {out}: give a file ending in .png or .svg")
    fig = plot_attention(store, run, example, layer=layer, head=head)  # a Figure of its own: no pyplot, backend untouched
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    return path


def bertviz_input(store: Store, run: str, example: int) -> dict:
    """What bertviz's `head_view(attention, tokens, sentence_b_start)` and `model_view` take, as plain lists:
    `attention` is one (1, heads, L, L) list per layer; load it with `torch.tensor(...)` per layer."""
    maps = store.attention(run, example).astype(np.float32)
    tokens_frame = store.tokens(run, example)
    second = tokens_frame.index[tokens_frame["segment"] == 1]
    return dict(
        attention=[maps[layer][None].tolist() for layer in range(maps.shape[0])],
        tokens=tokens_frame["token"].astype(str).tolist(),
        sentence_b_start=int(second[0]) if len(second) else None,
    )


def save_bertviz(store: Store, run: str, example: int, out: str) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(bertviz_input(store, run, example)), encoding="utf-8")
    return path
