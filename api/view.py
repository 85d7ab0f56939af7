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
from ..store.plot import plot_attention, plot_maps

if TYPE_CHECKING:
    from ..ingest.scratch import ScratchMaps
    from ..store import Store

FIGURE_SUFFIXES = (".png", ".svg")
ROLLOUT_COLUMNS = 3  # panels per row of `plot_rollout`
ROLLOUT_MAX_LABELLED = 64  # tokens; a longer example's panels are drawn without token labels
ROLLOUT_MAX_CELL = 5.0  # inches per panel: 3 columns stay within store/plot.py's MAX_FIGURE_INCHES


def save_view(store: Store, run: str, example: int, out: str, layer: int | None = None, head: int | None = None) -> Path:
    """Draw `plot_attention` into `out` (.png or .svg)."""
    path = Path(out)
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise InvalidArgumentError(f"--out {out}: give a file ending in .png or .svg")
    fig = plot_attention(store, run, example, layer=layer, head=head)  # a Figure of its own: no pyplot, backend untouched
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    return path


def plot_scratch(maps: ScratchMaps, layer: int | None = None, head: int | None = None):
    """`plot_attention`'s Figure for a typed sentence (ingest/scratch.py `attention_for_text`): one head, a layer's
    heads, or every head as a layers x heads grid."""
    n_layers, n_heads = maps.attention.shape[:2]
    if head is not None and layer is None:
        raise InvalidArgumentError("--head needs --layer (a head is named by its layer and head, both 0-based)")
    for option, value, size in (("--layer", layer, n_layers), ("--head", head, n_heads)):
        if value is not None and not 0 <= value < size:
            raise InvalidArgumentError(f"{option} {value} is out of range: the model has {size} {option[2:]}s (0..{size - 1})")
    layers = list(range(n_layers)) if layer is None else [layer]
    heads = list(range(n_heads)) if head is None else [head]
    chosen = maps.attention[np.ix_(layers, heads)]
    typed = repr(maps.text) + (f" / {maps.text_b!r}" if maps.text_b else "")
    shown = typed if len(typed) <= 90 else typed[:87] + "..."
    title = f"{maps.model} on typed text {shown}" + (" (truncated)" if maps.truncated else "")
    return plot_maps(chosen, maps.token_texts, maps.special, layers, heads, title)


def save_scratch_view(maps: ScratchMaps, out: str, layer: int | None = None, head: int | None = None) -> Path:
    """Draw `plot_scratch` into `out` (.png or .svg)."""
    path = Path(out)
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise InvalidArgumentError(f"--out {out}: give a file ending in .png or .svg")
    fig = plot_scratch(maps, layer=layer, head=head)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    return path


def plot_rollout(store: Store, run: str, example: int, layer: int | None = None):
    """A Figure of one example's attention rollout (queries/rollout.py): every layer's Ã_l ... Ã_0 as a panel, or one
    layer's; rows are queries, columns input tokens, one colour bar (0 to 1)."""
    from ..queries.rollout import rollout
    from ..store.plot import _label_axes, new_figure

    info = store.run_info(run)
    rolled = rollout(store.attention(run, example))
    if layer is not None and not 0 <= layer < info.n_layers:
        raise InvalidArgumentError(f"--layer {layer} is out of range: the model has {info.n_layers} layers (0..{info.n_layers - 1})")
    layers = list(range(info.n_layers)) if layer is None else [layer]
    frame = store.tokens(run, example)
    tokens, special = frame["token"].astype(str).tolist(), frame["is_special"].astype(bool).tolist()
    columns = min(len(layers), ROLLOUT_COLUMNS)  # a grid, not one long row: 6 layers are 2 rows of 3
    rows = -(-len(layers) // columns)
    show = len(tokens) <= ROLLOUT_MAX_LABELLED
    # a panel wide enough for its token labels at a readable size (store/plot.py `_label_axes` sizes them to fit)
    cell = min(ROLLOUT_MAX_CELL, max(3.0, 0.11 * len(tokens) + 0.6)) if show else 2.2
    fig = new_figure(figsize=(cell * columns + 1.2, cell * rows + 0.9))
    axes = fig.subplots(rows, columns, squeeze=False)
    image = None
    for k, lay in enumerate(layers):
        ax = axes.flat[k]
        image = ax.imshow(rolled[lay], cmap="viridis", vmin=0.0, vmax=1.0)
        _label_axes(ax, tokens, special, show, cell - 0.6)
        ax.set_title(f"rollout to layer {lay} (0-based)", fontsize=8)
    for ax in list(axes.flat)[len(layers) :]:
        ax.set_visible(False)
    axes.flat[0].set_ylabel("token after the layer (query)")
    axes.flat[0].set_xlabel("input token (key)")
    fig.colorbar(image, ax=list(axes.flat), shrink=0.8, label="rolled-out attention")
    fig.suptitle(f"attention rollout (Abnar & Zuidema 2020): {info.model} on {info.dataset}:{info.split}, example {example}", fontsize=8)
    return fig


def save_rollout(store: Store, run: str, example: int, out: str, layer: int | None = None) -> Path:
    """Draw `plot_rollout` into `out` (.png or .svg)."""
    path = Path(out)
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise InvalidArgumentError(f"--out {out}: give a file ending in .png or .svg")
    fig = plot_rollout(store, run, example, layer=layer)
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
