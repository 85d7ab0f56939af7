"""`attnstore report primer`: the analyses "A Primer in BERTology" weighs Clark's and Kovaleva's findings against.

Thin, as the other reports: every number comes from a registered query (norm_attention, rollout, head_roles,
head_trees_summary, attention_attribution) or a stored table (the pruning steps of `attnstore prune` in
ablation_results); this module lays them out as CSV + Markdown tables and PNG/SVG figures, each naming model and
data, in one folder with a README.md. A section whose input is not given (or not stored: a run without value norms,
without saliency) says so in one line instead of failing the report.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..queries import run_query
from ..store.errors import AttnStoreError
from ..store.plot import new_figure
from .ablation_report import draw_pruning, majority_scores
from .report import _caption, _layer_axis, _legend_beside, _save, _table, left_out

if TYPE_CHECKING:
    from ..store import Store

CLASSES = {"cls": "[CLS]-like", "sep": "[SEP]-like", "punct": ". or ,"}
COLOURS = {"cls": "tab:red", "sep": "tab:blue", "punct": "tab:green", "other": "tab:grey"}


def draw_norms(by_layer: pd.DataFrame, n_layers: int, caption: str):
    """Per layer and class: the attention weight (solid) against the norm-weighted share (hatched), as Kobayashi et
    al.'s Fig. 2 compares alpha and ||alpha f(x)||."""
    fig = new_figure(figsize=(9, 4))
    ax = fig.add_subplot()
    width = 0.13
    for k, (c, label) in enumerate(CLASSES.items()):
        x = by_layer.index.to_numpy() + (k - 1) * 2.2 * width
        ax.bar(x - width / 2, by_layer[f"weight_{c}"], width, color=COLOURS[c], label=f"{label}: attention weight")
        ax.bar(
            x + width / 2,
            by_layer[f"share_{c}"],
            width,
            color="white",
            edgecolor=COLOURS[c],
            hatch="///",
            label=f"{label}: norm-weighted share",
        )
    ax.set_ylabel("mean over heads (share of a query's row)")
    _layer_axis(ax, n_layers)
    _legend_beside(ax, fontsize=7)
    ax.set_title("Attention weight vs norm-weighted share ||a f(x)|| (Kobayashi et al. 2020)", fontsize=9)
    fig.suptitle(caption, fontsize=8)
    return fig


def draw_rollout(frame: pd.DataFrame, n_layers: int, caption: str):
    fig = new_figure(figsize=(7, 3.8))
    ax = fig.add_subplot()
    for c, label in {**CLASSES, "other": "other tokens"}.items():
        ax.plot(frame["layer"], frame[f"to_{c}"], marker="o", color=COLOURS[c], label=label)
    ax.set_ylabel("rolled-out attention from the source token")
    _layer_axis(ax, n_layers)
    _legend_beside(ax, fontsize=8)
    ax.set_title("Attention rollout (Abnar & Zuidema 2020)", fontsize=9)
    fig.suptitle(caption, fontsize=8)
    return fig


def draw_confidence(frame: pd.DataFrame, n_layers: int, n_heads: int, caption: str):
    grid = frame.pivot(index="layer", columns="head", values="confidence").to_numpy()
    fig = new_figure(figsize=(7, 3.6))
    ax = fig.add_subplot()
    image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    from matplotlib.patches import Rectangle

    positional = frame[frame["positional"].astype(bool)]
    for layer, head in positional[["layer", "head"]].itertuples(index=False):
        ax.add_patch(Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    ax.set_xlabel("head (0-based)")
    ax.set_ylabel("layer (0-based)")
    # the marker is explained in the title, as Kovaleva's Fig. 3 does: a legend had no place between the map and its bar
    count = f"{len(positional)} positional head{'' if len(positional) == 1 else 's'}"
    ax.set_title(f"Head confidence (Voita et al. 2019)\nframed red: {count} (>= 90 % of rows on one offset)", fontsize=9)
    fig.colorbar(image, ax=ax, label="confidence")
    fig.suptitle(caption, fontsize=8)
    return fig


def draw_trees(frame: pd.DataFrame, random: pd.DataFrame | None, caption: str):
    rows = frame.sort_values("n", ascending=False)
    fig = new_figure(figsize=(max(7, 0.45 * len(rows)), 4))
    ax = fig.add_subplot()
    x = np.arange(len(rows))
    ax.bar(x - 0.3, rows["max_uuas"], 0.2, label="best head, MAX", color="tab:blue")
    ax.bar(x - 0.1, rows["mst_uuas"], 0.2, label="best head, MST", color="tab:orange")
    ax.bar(x + 0.1, rows["chain_uuas"], 0.2, label="adjacent words (chain)", color="tab:grey")
    if random is not None:
        other = random.set_index("relation").reindex(rows["relation"])
        ax.bar(x + 0.3, other["mst_uuas"], 0.2, label="random-init model, best head MST", color="tab:olive")
    ax.set_xticks(x, rows["relation"], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("undirected attachment accuracy")
    ax.set_title("Trees from single heads (Htut et al. 2019)", fontsize=9)
    _legend_beside(ax, fontsize=7)
    fig.suptitle(caption, fontsize=8)
    return fig


def draw_attribution(absolute: pd.DataFrame, signed: pd.DataFrame, n_layers: int, caption: str):
    fig = new_figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2, sharey=True)
    for ax, frame, title in ((axes[0], absolute, "|gradient x input| (the authors')"), (axes[1], signed, "signed gradient x input")):
        by_layer = frame.groupby("layer")[["tau", "tau_norm", "tau_rollout", "tau_random"]].mean()
        best = frame.groupby("layer")["tau"].max()
        ax.plot(by_layer.index, by_layer["tau"], marker="o", label="attention (mean over heads)")
        ax.plot(best.index, best, marker="^", linestyle=":", label="attention (best head)")
        ax.plot(by_layer.index, by_layer["tau_norm"], marker="s", label="norm-weighted")
        ax.plot(by_layer.index, by_layer["tau_rollout"], marker="d", label="rollout")
        ax.plot(by_layer.index, by_layer["tau_random"], color="grey", linestyle="--", label="random row (chance)")
        ax.set_title(title, fontsize=9)
        _layer_axis(ax, n_layers)
    axes[0].set_ylabel("mean Kendall tau with the saliency")
    _legend_beside(axes[1], fontsize=7)
    fig.suptitle(f"Attention vs gradient x input (Jain & Wallace 2019) — {caption}", fontsize=8)
    return fig


def _section(title: str, lines: list[str]) -> list[str]:
    return [f"## {title}", "", *lines, ""]


def primer_report(
    store: Store,
    run: str,
    out: str | Path,
    *,
    tree_run: str | None = None,
    random_tree_run: str | None = None,
    attribution_run: str | None = None,
    seed_run: str | None = None,
    prune: tuple[str, str] | None = None,
) -> Path:
    """Write the report into `out` (created); returns its README.md."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    info = store.run_info(run)
    caption = _caption(store, run)
    lines = [
        "# The Primer's analyses of attention heads",
        "",
        "Written by `attnstore report primer`; definitions, conventions and the reference code read are in docs/QUERIES.md. "
        "Layers and heads are 0-based.",
        "",
    ]

    try:
        norms = run_query(store, "norm_attention", run=run)
    except AttnStoreError as exc:
        lines += _section("Norm-based attention (Kobayashi et al. 2020)", [f"Not drawn: {exc}"])
    else:
        columns = [f"{kind}_{c}" for c in ("cls", "sep", "punct", "other") for kind in ("weight", "norm", "contribution", "share")]
        by_layer = norms.groupby("layer")[columns].mean()
        _save(draw_norms(by_layer, info.n_layers, caption), folder, "norms")
        table = _table(by_layer.reset_index(), folder, "norms_by_layer")
        norms.to_csv(folder / "norms_per_head.csv", index=False)
        lines += _section(
            "Norm-based attention (Kobayashi et al. 2020)",
            [
                f"{caption}. Per layer, means over heads: `weight_c` the attention a query gives class c, `norm_c` the mean "
                "value norm ||f(x)|| of its tokens, `contribution_c` the norm-weighted sum ||a f(x)||, `share_c` that "
                "contribution's share of the row (query `norm_attention`; per head in norms_per_head.csv).",
                "",
                table,
                "",
                "![weights vs norm-weighted shares](norms.png)",
            ],
        )

    rollout = run_query(store, "rollout", run=run)
    _save(draw_rollout(rollout, info.n_layers, caption), folder, "rollout")
    lines += _section(
        "Attention rollout (Abnar & Zuidema 2020)",
        [
            f"{caption}. Query `rollout`: per layer, the rolled-out attention of the source token.",
            "",
            _table(rollout, folder, "rollout"),
            "",
            "![rollout](rollout.png)",
        ],
    )

    roles = run_query(store, "head_roles", run=run)
    _save(draw_confidence(roles, info.n_layers, info.n_heads, caption), folder, "head_roles")
    roles.to_csv(folder / "head_roles.csv", index=False)
    top = roles.sort_values("offset_share", ascending=False).head(5)[
        ["layer", "head", "confidence", "top_offset", "offset_share", "rare_share", "rare_chance"]
    ]
    lines += _section(
        "Head confidence and roles (Voita et al. 2019)",
        [
            f"{caption}. Query `head_roles`; the five heads with the largest share of rows on one relative offset "
            f"({int(roles['positional'].astype(bool).sum())} positional by the 90 % rule); all heads in head_roles.csv.",
            "",
            _table(top, folder, "head_roles_top"),
            "",
            "![confidence](head_roles.png)",
        ],
    )

    if tree_run is not None:
        baseline: list[str] = []
        if random_tree_run is None:
            how = "--random-tree-run RUN (the same corpus through a randomly initialised model) adds it"
            baseline = ["", left_out("primer", "the trees' random-init baseline", how)]
        try:
            trees = run_query(store, "head_trees_summary", run=tree_run)
            random = run_query(store, "head_trees_summary", run=random_tree_run) if random_tree_run is not None else None
        except AttnStoreError as exc:
            lines += _section("Trees from heads (Htut et al. 2019)", [f"Not drawn: {exc}"])
        else:
            _save(draw_trees(trees, random, _caption(store, tree_run)), folder, "trees")
            body = [
                f"{_caption(store, tree_run)}. Query `head_trees_summary`: per relation the best head's MAX and MST "
                "undirected attachment accuracy and the adjacent-word chain.",
                "",
                _table(trees, folder, "trees"),
            ]
            if random is not None:
                body += ["", f"Random-init baseline: {_caption(store, random_tree_run)}.", "", _table(random, folder, "trees_random_init")]
            lines += _section("Trees from heads (Htut et al. 2019)", [*body, *baseline, "", "![trees](trees.png)"])
    else:
        how = "--tree-run RUN (a run over a corpus with gold trees, e.g. `attnstore ingest --dataset ud/en_ewt:dev`) adds it"
        lines += _section("Trees from heads (Htut et al. 2019)", [left_out("primer", "trees from heads (Htut et al. 2019)", how)])

    if attribution_run is not None:
        try:
            absolute = run_query(store, "attention_attribution", run=attribution_run, seed_run=seed_run)  # the default
            signed = run_query(store, "attention_attribution", run=attribution_run, saliency="signed", seed_run=seed_run)
        except AttnStoreError as exc:
            lines += _section("Attention vs attribution (Jain & Wallace 2019)", [f"Not drawn: {exc}"])
        else:
            a_info = store.run_info(attribution_run)
            _save(draw_attribution(absolute, signed, a_info.n_layers, _caption(store, attribution_run)), folder, "attribution")
            absolute.to_csv(folder / "attribution_absolute.csv", index=False)
            signed.to_csv(folder / "attribution_signed.csv", index=False)
            both = (absolute, signed)
            summary = pd.DataFrame(
                {
                    "saliency": ["absolute (default, the authors')", "signed"],
                    "mean_tau": [f["tau"].mean() for f in both],
                    "best_head": [_best(f) for f in both],
                    "best_tau": [f["tau"].max() for f in both],
                    "mean_tau_norm": [f["tau_norm"].mean() for f in both],
                    "mean_tau_random": [f["tau_random"].mean() for f in both],
                    "tau_sd": [f["tau_sd"].mean() for f in both],
                }
            )
            by_layer = pd.DataFrame({"layer": sorted(absolute["layer"].unique())})
            for label, f in (("absolute", absolute), ("signed", signed)):
                grouped = f.groupby("layer")["tau"]
                by_layer[f"{label}_mean_tau"] = grouped.mean().to_numpy()
                by_layer[f"{label}_best_tau"] = grouped.max().to_numpy()
            seed_line: list[str] = []
            if seed_run is not None:  # how far two fine-tunes' saliencies agree: the yardstick for the heads' taus
                summary["tau_seed"] = [f["tau_seed"].iloc[0] for f in both]
            else:
                how = "--seed-run RUN (the same task fine-tuned with another seed, with saliency) adds it"
                seed_line = ["", left_out("primer", "the seed baseline tau_seed", how)]
            lines += _section(
                "Attention vs attribution (Jain & Wallace 2019)",
                [
                    f"{_caption(store, attribution_run)}. Query `attention_attribution`: Kendall tau between each head's "
                    "[CLS] row and the run's gradient x input saliency (`attnstore saliency`), per example, then averaged; "
                    "ranked by its absolute value by default, as the authors did, and signed as the alternative.",
                    "",
                    _table(summary, folder, "attribution_summary"),
                    "",
                    "Per layer, the mean over its heads and the best head:",
                    "",
                    _table(by_layer, folder, "attribution_layers"),
                    *seed_line,
                    "",
                    "![attention vs attribution](attribution.png)",
                ],
            )
    else:
        how = "--attribution-run RUN (a fine-tuned model's run with `attnstore saliency`) adds it"
        lines += _section("Attention vs attribution (Jain & Wallace 2019)", [left_out("primer", "attention vs attribution", how)])

    if prune is not None:
        model, task = prune
        frame = store.ablation_results(model=model, task=task)
        parsed = frame["config"].str.extract(r"^(prune(?:\[[^\]]*\])?:)(\d+)$")
        steps = frame[parsed[0].notna()].assign(sweep=parsed[0], n_pruned=pd.to_numeric(parsed[1]))
        if steps.empty:
            lines += _section(
                "Head importance and pruning (Michel et al. 2019)",
                [f"Not drawn: no pruning steps of {model!r} on {task} are stored (run `attnstore prune`)."],
            )
        else:
            base = frame[frame["config"] == "none"].assign(n_pruned=0)
            for mode, rows in steps.groupby("mode"):
                sweeps = sorted(rows.groupby("sweep", sort=False), key=lambda kv: (kv[0] != "prune:", kv[0]))  # the default first
                curve = pd.concat(
                    [pd.concat([base.assign(mode=mode), part]).assign(procedure=_procedure(sweep, part)) for sweep, part in sweeps]
                )
                _save(draw_pruning(curve, model, task, mode), folder, f"pruning_{mode}")
                shown = curve.pivot_table(index="n_pruned", columns=["procedure", "metric"], values="score", sort=False)
                shown.columns = [f"{metric}, {procedure}" for procedure, metric in shown.columns]
                majority = majority_scores(task, int(frame["n_examples"].max()))
                lines += _section(
                    f"Head importance and pruning (Michel et al. 2019): mask {mode}",
                    [
                        f"{model} on {task} dev (`attnstore prune`): dev score after each step, one column per stored "
                        "procedure, named by where the importance was estimated, on how many examples, and whether once "
                        "(the authors' script's default, on the training data) or again before each step"
                        + (f"; majority class: {', '.join(f'{m} {v:.1f}' for m, v in majority.items())}." if majority else "."),
                        "",
                        _table(shown.reset_index(), folder, f"pruning_{mode}"),
                        "",
                        f"![pruning](pruning_{mode}.png)",
                    ],
                )

    else:
        how = "--prune MODEL:TASK (a model pruned with `attnstore prune`) adds it"
        lines += _section("Head importance and pruning (Michel et al. 2019)", [left_out("primer", "the pruning curve", how)])

    path = folder / "README.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _procedure(sweep: str, rows: pd.DataFrame) -> str:
    """How a pruning sweep estimated its importance, from its rows' procedure columns (its config key where missing)."""
    first = rows.iloc[0]
    split, n, schedule = (first.get(k) for k in ("importance_split", "importance_examples", "importance_schedule"))
    if not isinstance(split, str) or not isinstance(schedule, str):
        return sweep.rstrip(":")
    label = f"importance on {split} ({int(n):,} ex.), {'estimated once' if schedule == 'once' else 're-estimated each step'}"
    other = re.findall(r"fraction=[^,\]]*", sweep)
    return label + (f", {other[0]}" if other else "") + (" (the authors')" if split == "train" and schedule == "once" else "")


def _best(frame: pd.DataFrame) -> str:
    row = frame.loc[frame["tau"].idxmax()]
    return f"L{int(row['layer'])}-H{int(row['head'])}"
