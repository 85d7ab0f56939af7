"""`attnstore report head-match`: cross-model head matching of two runs as a table and two figures.

Thin: the numbers come from the registered queries `head_match` and `head_match_matrix` (queries/head_match.py);
this module lays them out: `head_match.csv` / `.md`, the distance matrix with the one-to-one assignment marked
(`head_match_matrix.png`/`.svg`), and the layer correspondence (`head_match_layers.png`/`.svg`: for each layer of A,
the relative depth of its matches in B). Layers and heads are 0-based, and every axis says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..queries import run_query
from ..store.plot import new_figure
from .report import _save, _table

if TYPE_CHECKING:
    from ..store import Store


def draw_matrix(matrix: pd.DataFrame, match: pd.DataFrame, a, b, metric: str):
    """(heads of A) x (heads of B) distances, heads numbered layer-major, the assignment's cells marked."""
    grid = matrix.pivot(index=["layer", "head"], columns=["other_layer", "other_head"], values="distance").to_numpy()
    fig = new_figure(figsize=(min(max(6.5, 3 + 0.06 * grid.shape[1]), 14), min(max(5.5, 2.5 + 0.06 * grid.shape[0]), 10)))
    ax = fig.add_subplot()
    image = ax.imshow(grid, cmap="viridis_r", aspect="auto", interpolation="nearest")
    matched = match.dropna(subset=["match_layer"])
    rows = matched["layer"].to_numpy(int) * a.n_heads + matched["head"].to_numpy(int)
    cols = matched["match_layer"].to_numpy(int) * b.n_heads + matched["match_head"].to_numpy(int)
    ax.scatter(cols, rows, s=8, facecolors="none", edgecolors="red", linewidths=0.7, label="one-to-one match")
    for boundary in range(1, a.n_layers):
        ax.axhline(boundary * a.n_heads - 0.5, color="white", linewidth=0.4)
    for boundary in range(1, b.n_layers):
        ax.axvline(boundary * b.n_heads - 0.5, color="white", linewidth=0.4)
    ax.set_yticks([k * a.n_heads + (a.n_heads - 1) / 2 for k in range(a.n_layers)], [str(k) for k in range(a.n_layers)])
    ax.set_xticks([k * b.n_heads + (b.n_heads - 1) / 2 for k in range(b.n_layers)], [str(k) for k in range(b.n_layers)])
    ax.set_ylabel(f"{a.model}: layer (0-based), {a.n_heads} heads each")
    ax.set_xlabel(f"{b.model}: layer (0-based), {b.n_heads} heads each")
    ax.set_title(f"head distance ({metric}) on {a.dataset}:{a.split}", fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    fig.colorbar(image, ax=ax, label=f"distance ({metric})", location="bottom", shrink=0.6)
    return fig


def layer_depths(match: pd.DataFrame, a, b) -> pd.DataFrame:
    """Per layer of A: the relative depth (layer / (layers - 1)) of its heads' matches in B: mean, min, max, matched."""
    matched = match.dropna(subset=["match_layer"]).assign(depth=lambda f: f["match_layer"].astype(float) / max(b.n_layers - 1, 1))
    rows = []
    for layer in range(a.n_layers):
        depths = matched.loc[matched["layer"] == layer, "depth"]
        rows.append(
            dict(
                layer=layer,
                relative_depth=layer / max(a.n_layers - 1, 1),
                match_depth_mean=float(depths.mean()) if len(depths) else np.nan,
                match_depth_min=float(depths.min()) if len(depths) else np.nan,
                match_depth_max=float(depths.max()) if len(depths) else np.nan,
                matched=int(len(depths)),
            )
        )
    return pd.DataFrame(rows)


def draw_layers(depths: pd.DataFrame, match: pd.DataFrame, a, b):
    fig = new_figure(figsize=(5.5, 4))
    ax = fig.add_subplot()
    matched = match.dropna(subset=["match_layer"])
    jitter = np.random.default_rng(0).uniform(-0.15, 0.15, len(matched))
    ax.scatter(
        matched["layer"] + jitter, matched["match_layer"].astype(float) / max(b.n_layers - 1, 1), s=10, alpha=0.6, label="a head's match"
    )
    ax.plot(depths["layer"], depths["match_depth_mean"], color="black", marker="o", label="mean over the layer's heads")
    ax.plot(depths["layer"], depths["relative_depth"], color="grey", linestyle="--", label="same relative depth")
    ax.set_xlabel(f"{a.model}: layer (0-based)")
    ax.set_ylabel(f"{b.model}: matched layer / {b.n_layers - 1}")
    ax.set_xticks(range(a.n_layers))
    ax.set_ylim(-0.05, 1.05)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    ax.set_title(f"where {a.model}'s heads match in {b.model}", fontsize=9)
    return fig


def head_match_report(store: Store, run, other, out: str, metric: str = "js", specials: str = "keep") -> Path:
    """Write head_match.md (+ CSVs) and the two figures for runs `run` (A) and `other` (B) into `out`."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    a, b = store.run_info(run), store.run_info(other)
    match = run_query(store, "head_match", run=a.name, other=b.name, metric=metric, specials=specials)
    matrix = run_query(store, "head_match_matrix", run=a.name, other=b.name, metric=metric, specials=specials)
    matrix.to_csv(folder / "head_match_matrix.csv", index=False)
    depths = layer_depths(match, a, b)
    figures = _save(draw_matrix(matrix, match, a, b, metric), folder, "head_match_matrix")
    figures += _save(draw_layers(depths, match, a, b), folder, "head_match_layers")
    n = len(match)
    significant = int((match["p_value"] < 0.01 / max(n, 1)).sum())
    lines = [
        f"# Head matching: {a.model} ({a.name}) against {b.model} ({b.name})",
        "",
        f"Examples: {int(match['n_examples'].iloc[0])} of {a.dataset}:{a.split}; distance `{metric}`, special units `{specials}` "
        "(docs/QUERIES.md, `head_match`). Layers and heads are 0-based.",
        "",
        f"{significant} of {n} one-to-one matches beat the null at p < 0.01/{n} (Bonferroni over the {n} heads of A).",
        "",
        "## Layer correspondence",
        "",
        _table(depths, folder, "head_match_layers"),
        "",
        "![layers](head_match_layers.png)",
        "",
        "## Distance matrix with the assignment",
        "",
        "![matrix](head_match_matrix.png)",
        "",
        "## Every head of A",
        "",
        _table(match, folder, "head_match"),
        "",
    ]
    path = folder / "README.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
