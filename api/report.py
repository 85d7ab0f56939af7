"""`attnstore report clark`: the tables and figures of Clark et al. 2019 for stored runs.

Thin: every number comes from a registered query; this module only lays the results
out as Markdown/CSV tables and PNG/SVG figures, each naming the model and the data.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..queries import run_query
from ..queries.dependency import PAPER_RELATIONS
from ..store.plot import new_figure

if TYPE_CHECKING:
    from ..store import Store

CATEGORY_COLOURS = {"to_cls": "tab:red", "to_sep": "tab:blue", "to_punct": "tab:green"}
CATEGORY_LABELS = {"to_cls": "[CLS]-like", "to_sep": "[SEP]-like", "to_punct": ". or ,"}


def left_out(report: str, section: str, how: str) -> str:
    """A part of a report left out because the option that adds it was not given: one line on stderr naming the part
    and the option, and the same line returned for the report's text (a section never disappears without a word)."""
    import click

    line = f"Left out: {section}; {how}."
    click.echo(f"report {report}: {line}", err=True)
    return line


def _caption(store: Store, run) -> str:
    info = store.run_info(run)
    return f"{info.model} on {info.dataset}:{info.split} ({info.n_stored} examples, run {info.name})"


def _save(fig, out: Path, stem: str) -> list[str]:
    names = []
    for ext in ("png", "svg"):
        fig.savefig(out / f"{stem}.{ext}", dpi=150, bbox_inches="tight")
        names.append(f"{stem}.{ext}")
    return names


def _table(frame: pd.DataFrame, out: Path, stem: str) -> str:
    frame.to_csv(out / f"{stem}.csv", index=False)
    shown = frame.round(3)
    return shown.to_markdown(index=False) if _has_tabulate() else shown.to_string(index=False)


def _mention_counts(frame: pd.DataFrame) -> str:
    counts = frame.attrs.get("n_mentions", {})
    return ", ".join(f"{n} {kind}" for kind, n in counts.items())


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


def _per_layer_scatter(ax, frame: pd.DataFrame, column: str, colour: str, label: str, offset: float = 0.0):
    jitter = np.random.default_rng(0).uniform(-0.12, 0.12, len(frame))
    ax.scatter(frame["layer"] + offset + jitter, frame[column], s=14, alpha=0.75, color=colour, label=label)


def _layer_axis(ax, n_layers: int) -> None:
    """Layers on x, 0-based as in the data and every table (the paper's figures count from 1)."""
    ax.set_xticks(range(n_layers))
    ax.set_xlim(-0.6, n_layers - 0.4)
    ax.set_xlabel("layer (0-based)")


def _legend_beside(ax, **kwargs) -> None:
    """The legend to the right of the axes, never over the data (constrained layout makes room for it)."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kwargs)


def draw_special_tokens(df: pd.DataFrame, n_layers: int, caption: str):
    """Fig. 2 from a `special_tokens` frame (one point per head)."""
    fig = new_figure(figsize=(13, 4.2))
    left, right = fig.subplots(1, 2)
    for i, (column, colour) in enumerate(CATEGORY_COLOURS.items()):
        _per_layer_scatter(left, df, column, colour, CATEGORY_LABELS[column], offset=(i - 1) * 0.25)
    left.set(ylabel="avg. attention", title="Attention to special tokens and punctuation")
    _legend_beside(left, fontsize=8)
    _per_layer_scatter(right, df, "sep_from_sep", "tab:blue", "from [SEP]-like\nto [SEP]-like", -0.15)
    _per_layer_scatter(right, df, "sep_from_other", "tab:orange", "from other tokens\nto [SEP]-like", 0.15)
    right.set(ylabel="avg. attention", title="Attention to [SEP]-like tokens")
    _legend_beside(right, fontsize=8)
    for ax in (left, right):
        _layer_axis(ax, n_layers)
    fig.suptitle(f"Fig. 2 — {caption}; one point per head", fontsize=9)
    return fig


def figure_special_tokens(store: Store, run, out: Path, average: str = "example") -> tuple[list[str], pd.DataFrame]:
    df = run_query(store, "special_tokens", run=run, average=average)
    fig = draw_special_tokens(df, store.run_info(run).n_layers, _caption(store, run))
    return _save(fig, out, "fig2_special_tokens"), df


def draw_entropy(df: pd.DataFrame, n_layers: int, caption: str):
    """Fig. 4 from an `entropy` frame (one point per head, and uniform attention's entropy)."""
    fig = new_figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    _per_layer_scatter(ax, df, "entropy", "tab:purple", "head (all tokens)", -0.15)
    _per_layer_scatter(ax, df, "entropy_from_cls", "tab:red", "head (from [CLS]-like)", 0.15)
    ax.axhline(df["uniform_entropy"].iloc[0], color="grey", linestyle="--", label="uniform attention")
    ax.set(ylabel="avg. attention entropy (nats)", title="Entropy of attention distributions")
    _layer_axis(ax, n_layers)
    _legend_beside(ax, fontsize=8)
    fig.suptitle(f"Fig. 4 — {caption}", fontsize=9)
    return fig


def figure_entropy(store: Store, run, out: Path, average: str = "example") -> tuple[list[str], pd.DataFrame]:
    df = run_query(store, "entropy", run=run, average=average)
    fig = draw_entropy(df, store.run_info(run).n_layers, _caption(store, run))
    return _save(fig, out, "fig4_entropy"), df


def figure_gradients(store: Store, run, grads: pd.DataFrame, out: Path) -> list[str]:
    by_layer = grads.groupby(["metric", "layer"])["value"].mean().unstack(0)
    fig = new_figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    for metric, label in (
        ("gradient.to_sep", "[SEP]-like"),
        ("gradient.to_punct", ". or ,"),
        ("gradient.to_other", "other"),
        ("gradient.to_cls", "[CLS]-like"),
    ):
        if metric in by_layer:
            ax.plot(by_layer.index, by_layer[metric], marker="o", label=label)
    ax.set(ylabel="avg. |gradient| of attention", title="Gradient-based importance of attention")
    _layer_axis(ax, store.run_info(run).n_layers)
    _legend_beside(ax, fontsize=8)
    fig.suptitle(f"Fig. 3 — {_caption(store, run)}", fontsize=9)
    return _save(fig, out, "fig3_gradients")


OFF_SCALE_IQR = 3.0  # MDS points further than this many interquartile ranges beyond the quartiles are drawn at the edge


def _view_limits(values: np.ndarray) -> tuple[float, float, float, float]:
    """(lo, hi, view_lo, view_hi): the range that holds every value within OFF_SCALE_IQR interquartile ranges of the
    quartiles, and the axis limits around it (padded). One far head (a previous-token head in MDS) no longer squeezes
    the other 71 into a corner."""
    q1, q3 = np.percentile(values, [25, 75])
    spread = (q3 - q1) or (values.max() - values.min()) or 1.0
    lo, hi = max(values.min(), q1 - OFF_SCALE_IQR * spread), min(values.max(), q3 + OFF_SCALE_IQR * spread)
    pad = 0.08 * ((hi - lo) or 1.0)
    return lo, hi, lo - pad, hi + pad


def draw_mds(df: pd.DataFrame, behaviour: pd.DataFrame, n_layers: int, caption: str, n_examples):
    """Fig. 6 from `head_clusters` (x, y per head) and `special_tokens` (colours by behaviour). The legend lists the
    behaviours present only; a head far off the others (beyond OFF_SCALE_IQR interquartile ranges) is drawn at the
    edge as a diamond named L<layer>-H<head>, so the rest keep the picture."""
    from matplotlib import colormaps

    x, y = df["x"].to_numpy(float), df["y"].to_numpy(float)
    (x_lo, x_hi, x_min, x_max), (y_lo, y_hi, y_min, y_max) = _view_limits(x), _view_limits(y)
    off = (x < x_lo) | (x > x_hi) | (y < y_lo) | (y > y_hi)
    shown_x = np.clip(x, x_lo - 0.5 * (x_lo - x_min), x_hi + 0.5 * (x_max - x_hi))
    shown_y = np.clip(y, y_lo - 0.5 * (y_lo - y_min), y_hi + 0.5 * (y_max - y_hi))
    fig = new_figure(figsize=(13, 5))
    left, right = fig.subplots(1, 2)
    layers = colormaps["viridis"].resampled(n_layers)  # one colour per layer
    points = left.scatter(shown_x, shown_y, c=df["layer"], cmap=layers, vmin=-0.5, vmax=n_layers - 0.5, s=22)
    fig.colorbar(points, ax=left, label="layer (0-based)", ticks=range(n_layers))
    left.set(title="Heads coloured by layer", xticks=[], yticks=[])
    kind = np.where(
        behaviour["to_cls"] > 0.5,
        "[CLS]-like",
        np.where(behaviour["to_sep"] > 0.5, "[SEP]-like", np.where(behaviour["to_punct"] > 0.5, ". or ,", "other")),
    )
    for label, colour in (("[CLS]-like", "tab:red"), ("[SEP]-like", "tab:blue"), (". or ,", "tab:green"), ("other", "lightgrey")):
        mask = kind == label
        if mask.any():  # the legend names the behaviours the heads show, none that no head has
            right.scatter(shown_x[mask], shown_y[mask], s=22, color=colour, label=f"> 50 % to {label}" if label != "other" else label)
    for ax in (left, right):
        ax.set(xlim=(x_min, x_max), ylim=(y_min, y_max))
        if off.any():
            ax.scatter(shown_x[off], shown_y[off], s=60, marker="D", facecolors="none", edgecolors="black", linewidths=1.0)
            for i in np.flatnonzero(off):
                name = f"L{int(df['layer'].iloc[i])}-H{int(df['head'].iloc[i])}"
                ax.annotate(
                    f"{name}\n(off scale)", (shown_x[i], shown_y[i]), fontsize=7, xytext=(-6, 6), textcoords="offset points", ha="right"
                )
    if off.any():
        right.scatter([], [], s=60, marker="D", facecolors="none", edgecolors="black", label="off the scale, drawn at the edge")
    right.set(title="Heads coloured by behaviour", xticks=[], yticks=[])
    _legend_beside(right, fontsize=8)
    fig.suptitle(f"Fig. 6 — MDS of summed JS distances between heads ({n_examples} examples)\n{caption}", fontsize=9)
    return fig


def figure_mds(store: Store, run, out: Path, examples, average: str = "example") -> tuple[list[str], pd.DataFrame]:
    df = run_query(store, "head_clusters", run=run, examples=examples)
    behaviour = run_query(store, "special_tokens", run=run, examples=examples, average=average)
    n = "all" if examples is None else len(examples)
    fig = draw_mds(df, behaviour, store.run_info(run).n_layers, _caption(store, run), n)
    return _save(fig, out, "fig6_mds"), df


def clark_report(store: Store, run, out: str, coref_run=None, mds_examples: int = 500, min_count: int = 100) -> Path:
    """Write the report for `run` (a treebank run, e.g. ud/en_ewt:dev) and optionally `coref_run` (gum/ontogum)."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    caption = _caption(store, run)
    lines = ["# Clark et al. 2019, reproduced with attnstore", "", f"Attention statistics, Table 1, Figs. 2, 4, 6: {caption}."]
    if coref_run is not None:
        lines.append(f"Table 2: {_caption(store, coref_run)}.")
    lines += [
        "",
        "Layers and heads are 0-based, as in the data, in tables (`layer-head`) and on figure axes alike "
        "(the paper's figures count layers from 1).",
        "Attention statistics (Figs. 2 and 4, relative position) are averaged within each sentence (example), then "
        "over sentences, as in the authors' code (queries' default `average=example`).",
        "",
    ]

    fig2, special = figure_special_tokens(store, run, out_dir)
    special.to_csv(out_dir / "special_tokens.csv", index=False)
    lines += [
        "## Attention to special tokens and punctuation (Sec. 3.2, Fig. 2)",
        "",
        f"![Fig. 2]({fig2[0]})",
        "",
        "Mean over the heads of each layer (per head: special_tokens.csv):",
        "",
        _table(special.drop(columns="head").groupby("layer").mean().reset_index(), out_dir, "special_tokens_by_layer"),
        "",
    ]
    fig4, entropy = figure_entropy(store, run, out_dir)
    lines += [
        "## Attention entropy (Sec. 3.3, Fig. 4)",
        "",
        f"![Fig. 4]({fig4[0]})",
        "",
        _table(
            entropy.groupby("layer")[["entropy", "entropy_from_cls", "uniform_entropy"]].mean().reset_index(), out_dir, "entropy_by_layer"
        ),
        "",
    ]
    relpos = run_query(store, "relative_position", run=run)
    strong = relpos[(relpos["to_previous"] > 0.5) | (relpos["to_next"] > 0.5)]
    lines += [
        "## Relative position (Sec. 3.1): heads with more than half their attention on the previous or next token",
        "",
        "Per sentence, the attention to the previous (next) token summed over its L tokens and divided by L, as in the "
        "authors' code (the first token has no previous token: a perfect previous-token head scores (L-1)/L).",
        "",
        _table(strong, out_dir, "relative_position_strong"),
        "",
    ]
    summary = run_query(store, "dependency_summary", run=run, min_count=min_count)
    paper_relations = {u for us in PAPER_RELATIONS.values() for u in us}
    paper_first = summary.assign(order=summary["relation"].map(lambda r: 0 if r in paper_relations else 1))
    table1 = paper_first.sort_values(["order", "relation", "direction"]).drop(columns="order")
    lines += [
        "## Table 1 — dependency relations (Sec. 4.2)",
        "",
        "Best head per relation over both directions, as in the paper: `dep2head` = the dependent attends most to its "
        "head; `head2dep` = the word that attends most to the dependent is its head (the transposed map, as in the "
        "authors' code). A word whose row (column) has no unique non-zero maximum among the other words makes no "
        "prediction (counted wrong). `all` counts every word, root words included (attention never predicts ROOT). "
        "A possessor followed by 's is judged by the 's (the paper's poss rule). Baseline: the best fixed offset "
        "(-3..3) from the dependent, clamped to the sentence (before it: ROOT; past it: the last word). Relations "
        f"with at least {min_count} edges.",
        "",
        _table(table1, out_dir, "table1_dependency"),
        "",
    ]
    if coref_run is not None:
        coref = run_query(store, "coreference_summary", run=coref_run)
        lines += [
            "## Table 2 — coreference antecedent selection (Sec. 4.3)",
            "",
            f"Accuracy over the mentions that have an antecedent in their window: {_mention_counts(coref)}.",
            "",
            _table(coref, out_dir, "table2_coreference"),
            "",
        ]
    else:
        how = "--coref-run RUN (a run over gum/ontogum:dev windows, `attnstore ingest --dataset gum/ontogum:dev`) adds it"
        lines += ["## Table 2 — coreference antecedent selection (Sec. 4.3)", "", left_out("clark", "Table 2 (coreference)", how), ""]
    probes = store.probe_results()
    probes = probes[probes["eval_run"] == store.run_info(run).name]
    lines += ["## Table 3 — attention probes (Sec. 5)", ""]
    if len(probes):
        latest = probes.groupby("kind").tail(1)[["kind", "run", "n_train", "uas", "train_uas", "epochs"]]
        lines += [
            f"UAS on {len(store.word_table(run))} words of the held-out run (latest result per probe):",
            "",
            _table(latest, out_dir, "table3_probes"),
            "",
        ]
    else:
        lines += [
            "Not computed yet: `attnstore probe train --run TRAIN_RUN --eval-run "
            + store.run_info(run).name
            + " --kind attn` (and attn+words, right-branching, distance+words) stores the results shown here.",
            "",
        ]
    examples = None
    n = store.run_info(run).n_stored
    if mds_examples and n > mds_examples:
        examples = store.examples(run)["example"].iloc[:mds_examples].tolist()
    fig6, _ = figure_mds(store, run, out_dir, examples)
    lines += ["## Clustering of heads (Sec. 6, Fig. 6)", "", f"![Fig. 6]({fig6[0]})", ""]
    lines += ["## Gradient-based importance (Fig. 3)", ""]
    grads = store.head_metrics(run)
    grads = grads[grads["metric"].str.startswith("gradient.")]
    if len(grads):
        fig3 = figure_gradients(store, run, grads, out_dir)
        lines += [f"![Fig. 3]({fig3[0]})", ""]
    else:
        lines += [
            f"Not computed: `attnstore gradients --run {store.run_info(run).name}` stores it, for a model with a "
            f"masked-LM head; {store.run_info(run).model} has none if that command refuses it.",
            "",
        ]
    (out_dir / "README.md").write_text("\n".join(lines), encoding="utf-8")
    return out_dir / "README.md"
