"""`attnstore report head-match`: cross-model head matching of two runs as a table and two figures.

Thin: the numbers come from the registered queries `head_match` and `head_match_matrix` (queries/head_match.py);
this module lays them out: `head_match.csv` / `.md`, the distance matrix with the one-to-one assignment marked
(`head_match_matrix.png`/`.svg`), and the layer correspondence (`head_match_layers.png`/`.svg`: for each layer of A,
the relative depth of its matches in B). Layers and heads are 0-based, and every axis says so. The headline is the
positional null (queries/head_match.py), which a randomly initialised model fails; the sentence null, which it
passes, is given beside it, and a paragraph says what the numbers can and cannot claim.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import click
import numpy as np
import pandas as pd

from ..queries import run_query
from ..store.plot import new_figure
from .report import _save, _table

if TYPE_CHECKING:
    from ..store import Store


CAVEAT = [
    "## What these numbers can and cannot claim",
    "",
    "- A one-to-one match always exists: the Hungarian method pairs every head of A with some head of B (while B has "
    "heads left), whether or not the models share anything. The distance, `rank`, `margin` and `row_z` say how close "
    "and how exceptional the chosen head is; they are chosen on the same examples they are measured on.",
    "- **Beating the positional null** says that the matched head of B agrees with the head of A, example by example, "
    "beyond what the head's own use of position and of the start and separator tokens explains (the template is "
    "fitted to the head of A on each example, which favours the null). Measured on 400 UD EWT dev sentences "
    "(docs/QUERIES.md): all-MiniLM-L6-v2 against a randomly initialised model of its architecture, 0 of 72; two "
    "random initialisations against each other, 0 of 72; all-MiniLM-L6-v2 against all-mpnet-base-v2, 8 of 72.",
    "- It does not say that the two heads compute the same function, that B has no other head as close (read `rank` "
    "and `margin`), or that the match holds on other data: the test treats the examples as independent draws and "
    "says nothing beyond them.",
    "- **Failing it** does not say that the head has no counterpart: a head whose maps its template reproduces (a "
    "previous-word head, a head resting on [CLS]) can be matched by any head with the same profile, and the maps "
    "cannot tell those apart (`head_profile_match` compares the profiles themselves).",
    "- **The sentence null** only says that both heads' maps depend on the sentence: on real model pairs most of all "
    "head pairs pass it, and a randomly initialised model passes it for most matches (51 of 72 on the sentences "
    "above).",
]


def draw_matrix(matrix: pd.DataFrame, match: pd.DataFrame, a, b, metric: str):
    """(heads of A) x (heads of B) distances, heads numbered layer-major, the assignment's cells marked."""
    grid = matrix.pivot(index=["layer", "head"], columns=["other_layer", "other_head"], values="distance").to_numpy()
    fig = new_figure(figsize=(min(max(6.5, 3 + 0.06 * grid.shape[1]), 14), min(max(5.5, 2.5 + 0.06 * grid.shape[0]), 10)))
    ax = fig.add_subplot()
    image = ax.imshow(grid, cmap="viridis_r", aspect="auto", interpolation="nearest")
    matched = match.dropna(subset=["match_layer"])
    rows = matched["layer"].to_numpy(int) * a.n_heads + matched["head"].to_numpy(int)
    cols = matched["match_layer"].to_numpy(int) * b.n_heads + matched["match_head"].to_numpy(int)
    passed = (matched["position_p"] < 0.01 / max(len(match), 1)).to_numpy()
    ax.scatter(cols[~passed], rows[~passed], s=8, facecolors="none", edgecolors="red", linewidths=0.7, label="one-to-one match")
    ax.scatter(cols[passed], rows[passed], s=10, color="red", label="match beating the\npositional null")
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
    """Per head of A its match's relative depth in B, the layer means and the diagonal. The axis labels name the runs'
    roles (A, B) only, short enough for the axes; the title names the models, wrapped."""
    fig = new_figure(figsize=(6, 4.4))
    ax = fig.add_subplot()
    matched = match.dropna(subset=["match_layer"])
    jitter = np.random.default_rng(0).uniform(-0.15, 0.15, len(matched))
    ax.scatter(
        matched["layer"] + jitter, matched["match_layer"].astype(float) / max(b.n_layers - 1, 1), s=10, alpha=0.6, label="a head's match"
    )
    ax.plot(depths["layer"], depths["match_depth_mean"], color="black", marker="o", label="mean over the layer's heads")
    ax.plot(depths["layer"], depths["relative_depth"], color="grey", linestyle="--", label="same relative depth")
    ax.set_xlabel("A: layer (0-based)")
    ax.set_ylabel(f"B: matched layer / {b.n_layers - 1} (relative depth)")
    ax.set_xticks(range(a.n_layers))
    ax.set_ylim(-0.05, 1.05)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    title = f"where the heads of A = {a.model} match in B = {b.model}"
    ax.set_title("\n".join(textwrap.wrap(title, 60, break_on_hyphens=False)), fontsize=9)
    return fig


def head_match_report(store: Store, run, other, out: str, metric: str = "js", specials: str = "keep") -> Path:
    """Write head_match.md (+ CSVs) and the two figures for runs `run` (A) and `other` (B) into `out`."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    a, b = store.run_info(run), store.run_info(other)
    click.echo(
        f"report head-match: comparing {b.name!r} with each example of {a.name!r} ({a.n_stored} stored); the first time, "
        "this builds the pair's summary (about 0.1 s per sentence, 1 s per MRPC pair on 2 cores), later calls read it",
        err=True,
    )
    match = run_query(store, "head_match", run=a.name, other=b.name, metric=metric, specials=specials)
    matrix = run_query(store, "head_match_matrix", run=a.name, other=b.name, metric=metric, specials=specials)
    matrix.to_csv(folder / "head_match_matrix.csv", index=False)
    depths = layer_depths(match, a, b)
    figures = _save(draw_matrix(matrix, match, a, b, metric), folder, "head_match_matrix")
    figures += _save(draw_layers(depths, match, a, b), folder, "head_match_layers")
    n = len(match)
    matched = int(match["match_layer"].notna().sum())
    positional = int((match["position_p"] < 0.01 / max(n, 1)).sum())
    sentence = int((match["p_value"] < 0.01 / max(n, 1)).sum())
    lines = [
        f"# Head matching: {a.model} ({a.name}) against {b.model} ({b.name})",
        "",
        f"Examples: {int(match['n_examples'].iloc[0])} of {a.dataset}:{a.split}; distance `{metric}`, special units `{specials}` "
        "(docs/QUERIES.md, `head_match`). Layers and heads are 0-based.",
        "",
        f"**{positional} of {n} heads of A have a one-to-one match that beats the positional null** at p < 0.01/{n} "
        f"(Bonferroni over the {n} heads of A; {matched} matched): on these examples the matched head of B reproduces "
        "the head's maps better than the head's own positional template does (attention spread evenly over the tokens, "
        "reweighted by how much the head attends to the start and separator units, the previous, same and next word and "
        "the other words; `position_null`, `position_z`, `position_p`).",
        "",
        f"The sentence null (the same heads on two unrelated sentences of similar length; `null_mean`, `z`, `p_value`): "
        f"{sentence} of {n}. It is a floor, not evidence: a randomly initialised model passes it too.",
        "",
        *CAVEAT,
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
