"""Pictures of one example's attention for notebooks: `Store.plot(run, example, layer=None, head=None)`.

Token x token heatmaps (one head, a layer's heads, or every head as a grid), drawn with
matplotlib (the optional `report` extra). Special tokens ([CLS], [SEP], <s>, ...) are marked in
bold red on both axes; layers and heads are 0-based, as in the data, and the axes say which is
the query (row, attends) and which the key (column, attended to). `attnstore view` saves the
same figures to PNG/SVG (api/view.py).

Library code never touches pyplot or the backend (`matplotlib.use`): every figure here and in the
reports (api/report.py, api/kovaleva_report.py, api/ablation_report.py) is a `matplotlib.figure.Figure`
made by `new_figure`, with constrained layout, saved with `fig.savefig`. Switching the backend in a
notebook closes its figures and blanks every later one; a Figure made without pyplot is not held
by pyplot either (no figure manager, freed with its last reference). In Jupyter/IPython it shows
inline as a PNG when it is a cell's value, whether or not pyplot was ever imported (`_repr_png_`). In a
script, save it (`fig.savefig("maps.png")`), or hand it to pyplot to show it in a window:
`import matplotlib.pyplot as plt; plt.figure(fig); plt.show()`.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from .errors import InvalidArgumentError

try:
    from matplotlib.figure import Figure as _Figure
except ImportError:  # the `report` extra is optional; new_figure() says what to install
    _Figure = object  # type: ignore[misc,assignment]

if TYPE_CHECKING:
    from .reader import StoreReader

FIGURE_SUFFIXES = (".png", ".svg")
MAX_FIGURE_INCHES = 16.0
MAX_GRID_HEADS = 400  # a grid of more heads than this would be unreadable (and slow); pick a layer instead


class NotebookFigure(_Figure):
    """A matplotlib Figure that IPython/Jupyter shows as a PNG when it is a cell's value, with or without pyplot."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", bbox_inches="tight")
        return buffer.getvalue()


def new_figure(**kwargs: Any) -> Any:
    """A new Figure (constrained layout unless `layout` is given), made without pyplot and without changing the
    backend; save it with `fig.savefig(path)`. Raises InvalidArgumentError without matplotlib."""
    if _Figure is object:
        raise InvalidArgumentError("pictures need matplotlib: pip install 'attnstore[report]'")
    kwargs.setdefault("layout", "constrained")
    return NotebookFigure(**kwargs)


def _label_axes(ax, tokens: list[str], special: list[bool], show_labels: bool, inches: float) -> None:
    n = len(tokens)
    if not show_labels:
        ax.set_xticks([])
        ax.set_yticks([])
        return
    size = max(3.0, min(8.0, 0.9 * 72 * inches / max(n, 1)))  # points: the labels of a panel `inches` wide never collide
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
    given), or every head as a layers x heads grid (neither given). Rows are queries, columns keys; one colour
    bar (0 to 1) serves every panel. Made without pyplot: the backend in use is left alone."""
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
    return plot_maps(maps, tokens, special, layers, heads, title)


def plot_maps(maps: Any, tokens: list[str], special: list[bool], layers: list[int], heads: list[int], title: str):
    """`plot_attention`'s Figure from the maps themselves: `maps` (len(layers), len(heads), L, L) of the 0-based
    `layers` and `heads` named in the panels, over `tokens` (`special` in red); also what `attnstore view --text`
    draws for a typed sentence (ingest/scratch.py)."""
    if len(layers) == 1 and len(heads) == 1:
        side = min(MAX_FIGURE_INCHES, max(3.5, 0.22 * len(tokens) + 1.5))  # long examples: small labels, bounded picture
        fig = new_figure(figsize=(side + 1.0, side + 0.4))
        ax = fig.add_subplot()
        image = ax.imshow(maps[0, 0], cmap="viridis", vmin=0.0, vmax=1.0)
        _label_axes(ax, tokens, special, True, side - 1.5)
        ax.set_xlabel("key (attended to)")
        ax.set_ylabel("query (attending)")
        ax.set_title(f"layer {layers[0]}, head {heads[0]} (0-based)", fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8, label="attention")
        fig.suptitle(title, fontsize=8)
        return fig
    if len(layers) * len(heads) > MAX_GRID_HEADS:
        raise InvalidArgumentError(f"{len(layers) * len(heads)} heads are too many for one picture; give --layer")
    columns = min(len(heads), 6) if len(layers) == 1 else len(heads)
    rows = -(-len(heads) // columns) if len(layers) == 1 else len(layers)
    show_labels = len(tokens) <= 24 and rows * columns <= 12
    cell = 2.6 if show_labels else 1.2
    fig = new_figure(figsize=(cell * columns + 1.2, cell * rows + 0.8))
    axes = fig.subplots(rows, columns, squeeze=False)
    used = []
    for i, layer_index in enumerate(layers):
        for j, head_index in enumerate(heads):
            k = j if len(layers) == 1 else i * columns + j
            ax = axes.flat[k]
            image = ax.imshow(maps[i, j], cmap="viridis", vmin=0.0, vmax=1.0)
            _label_axes(ax, tokens, special, show_labels, cell - 0.6)
            ax.set_title(f"L{layer_index}-H{head_index}", fontsize=7)
            used.append(ax)
    for ax in axes.flat[len(used) :]:
        ax.remove()  # a layer's last row may be short
    fig.colorbar(image, ax=used, shrink=0.8 if rows > 1 else 1.0, label="attention")
    what = f"layer {layers[0]}, every head" if len(layers) == 1 else "every layer (rows) and head (columns)"
    fig.suptitle(f"{what}, 0-based: panel L<layer>-H<head>; rows: query, columns: key\n{title}", fontsize=8)
    return fig
