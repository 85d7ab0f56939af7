"""Pictures of one example's attention for notebooks: `Store.plot(run, example, layer=None, head=None)`.

Token x token heatmaps (one head, a layer's heads, or every head as a grid), drawn with
matplotlib (the optional `report` extra). Special tokens ([CLS], [SEP], <s>, ...) are marked in
bold red on both axes; layers and heads are 0-based, as in the data, and the axes say which is
the query (row, attends) and which the key (column, attended to). `attnstore view` saves the
same figures to PNG/SVG (api/view.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .reader import StoreReader

FIGURE_SUFFIXES = (".png", ".svg")
MAX_FIGURE_INCHES = 16.0
MAX_GRID_HEADS = 400  # a grid of more heads than this would be unreadable (and slow); pick a layer instead


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise InvalidArgumentError("pictures need matplotlib: pip install 'attnstore[report]'") from None
    matplotlib.use("Agg", force=False)  # no display needed; a notebook's inline backend still shows the figure
    import matplotlib.pyplot as plt

    return plt


def _label_axes(ax, tokens: list[str], special: list[bool], show_labels: bool) -> None:
    n = len(tokens)
    if not show_labels:
        ax.set_xticks([])
        ax.set_yticks([])
        return
    size = max(3.0, min(8.0, 400 / max(n, 1)))
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xticklabels(tokens, rotation=90, fontsize=size)
    ax.set_yticklabels(tokens, fontsize=size)
    for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
        for label, is_special in zip(labels, special):
            if is_special:
                label.set_color("tab:red")
                label.set_fontweight("bold")


def plot_attention(store: StoreReader, run: str, example: int, layer: int | None = None, head: int | None = None):
    """A matplotlib Figure of one example's maps: one head (layer and head given), one layer's heads (layer
    given), or every head as a layers x heads grid (neither given). Rows are queries, columns keys."""
    plt = _pyplot()

    if head is not None and layer is None:
        raise InvalidArgumentError("--head needs --layer (a head is named by its layer and head, both 0-based)")
    info = store.run_info(run)
    maps = store.attention(run, example, layer=layer, head=head)  # (layers, heads, query, key), checked ranges
    tokens_frame = store.tokens(run, example)
    tokens = tokens_frame["token"].astype(str).tolist()
    special = tokens_frame["is_special"].astype(bool).tolist()
    layers = list(range(info.n_layers)) if layer is None else [layer]
    heads = list(range(info.n_heads)) if head is None else [head]
    title = f"{info.model} on {info.dataset}:{info.split}, run {info.name!r}, example {example}"
    if len(layers) == 1 and len(heads) == 1:
        side = min(MAX_FIGURE_INCHES, max(3.5, 0.22 * len(tokens) + 1.5))  # long examples: small labels, bounded picture
        fig, ax = plt.subplots(figsize=(side + 0.5, side))
        image = ax.imshow(maps[0, 0], cmap="viridis", vmin=0.0, vmax=1.0)
        _label_axes(ax, tokens, special, True)
        ax.set_xlabel("key (attended to)")
        ax.set_ylabel("query (attending)")
        ax.set_title(f"layer {layers[0]}, head {heads[0]} (0-based)\n{title}", fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention")
        return fig
    if len(layers) * len(heads) > MAX_GRID_HEADS:
        raise InvalidArgumentError(f"{len(layers) * len(heads)} heads are too many for one picture; give --layer")
    columns = min(len(heads), 6) if len(layers) == 1 else len(heads)
    rows = -(-len(heads) // columns) if len(layers) == 1 else len(layers)
    show_labels = len(tokens) <= 24 and rows * columns <= 12
    cell = 2.6 if show_labels else 1.2
    fig, axes = plt.subplots(rows, columns, figsize=(cell * columns + 1, cell * rows + 1), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for i, layer_index in enumerate(layers):
        for j, head_index in enumerate(heads):
            k = j if len(layers) == 1 else i * columns + j
            ax = axes.flat[k]
            ax.set_visible(True)
            ax.imshow(maps[i, j], cmap="viridis", vmin=0.0, vmax=1.0)
            _label_axes(ax, tokens, special, show_labels)
            ax.set_title(f"L{layer_index}-H{head_index}", fontsize=7)
    what = f"layer {layers[0]}, every head" if len(layers) == 1 else "every layer (rows) and head (columns)"
    fig.suptitle(f"{what}, 0-based; rows: query, columns: key\n{title}", fontsize=8)
    fig.tight_layout()
    return fig
