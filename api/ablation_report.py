"""`attnstore report table1` and `attnstore report ablation`: Kovaleva et al. Table 1, Fig. 8, Fig. 9.

Every number is a row of `ablation_results` (config "none" = a model's plain dev score);
this module lays them out as CSV/Markdown tables and PNG/SVG figures naming model and data.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..ingest.glue import TASKS
from ..store.errors import NotFoundError
from ..store.plot import new_figure
from .report import _has_tabulate, _legend_beside, _save

if TYPE_CHECKING:
    from ..store import Store

COLUMNS = {"pretrained": "no fine-tuning", "random": "fine-tuned from random init", "finetuned": "fine-tuned from pre-trained"}
NO_FINETUNING = (
    "no fine-tuning = the pre-trained encoder with a sequence-classification head initialised with a fixed seed "
    "(0) and never trained, evaluated on the dev set (the paper's 'pre-trained' column); scores near chance "
    "are expected."
)


def _markdown(frame: pd.DataFrame) -> str:
    return frame.to_markdown(index=False) if _has_tabulate() else frame.to_string(index=False)


def _cell(values: pd.Series) -> str:
    if values.empty:
        return "–"
    if len(values) == 1:
        return f"{values.iloc[0]:.1f}"
    return f"{values.mean():.1f} ± {values.std(ddof=1):.1f} (n={len(values)})"


def table1(store: Store) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(long rows: task, column, model, metric, score; the paper-shaped table: task x initialisation)."""
    rows = store.ablation_results()
    rows = rows[rows["config"] == "none"]
    if rows.empty:
        raise NotFoundError("no evaluations stored yet; run `attnstore evaluate --model M --task T` first")
    rows = rows.assign(column=rows["init"].map(COLUMNS))
    settings = _settings(store)
    rows = rows.assign(setting=rows["model"].map(settings).fillna(""))
    # The table compares initialisations at one setting per task (the paper's, lr 2e-5, batch 32, 3 epochs, where
    # it was run; else the most common one); seeds are averaged, other settings are listed apart, never pooled.
    main_setting = {}
    for task, group in rows.groupby("task"):
        tuned = group.loc[group["setting"] != "", "setting"]
        main_setting[task] = PAPER_SETTING if (tuned == PAPER_SETTING).any() or tuned.empty else tuned.mode().iloc[0]
    main = (rows["setting"] == "") | (rows["setting"] == rows["task"].map(main_setting))
    others = rows[~main]
    rows = rows[main]
    shaped = []
    for task, group in rows.groupby("task", sort=False):
        metrics = TASKS[task].metrics if task in TASKS else tuple(group["metric"].unique())
        line = {"task": task, "metric": "/".join(metrics)}
        for init, column in COLUMNS.items():
            cells = [_cell(group[(group["init"] == init) & (group["metric"] == m)]["score"]) for m in metrics]
            line[column] = " / ".join(cells)
        line["dev examples"] = int(group["n_examples"].iloc[0])
        shaped.append(line)
    long = pd.concat([rows.assign(in_table=True), others.assign(in_table=False)])
    long = long[["task", "column", "model", "setting", "in_table", "metric", "score", "n_examples"]]
    return long.reset_index(drop=True), pd.DataFrame(shaped)


SETTING_KEYS = ("lr", "batch_size", "epochs", "train_limit", "max_length", "warmup", "weight_decay")
PAPER_SETTING = "lr=2e-05 batch_size=32 epochs=3"


def _settings(store: Store) -> dict[str, str]:
    """Fine-tuned model name -> its training setting without the seed ("lr=2e-05 batch_size=32 epochs=3", plus
    train_limit etc. where they differ from the defaults); base models -> ""."""
    defaults = dict(train_limit=None, max_length=128, warmup=0.1, weight_decay=0.01)
    out = {}
    for name, training in zip(store.models()["name"], store.models()["training"]):
        hparams = (training or {}).get("hparams") or {}
        if not hparams:
            out[name] = ""
            continue
        parts = [f"{k}={hparams.get(k)}" for k in ("lr", "batch_size", "epochs")]
        parts += [f"{k}={hparams.get(k)}" for k, v in defaults.items() if hparams.get(k, v) != v and k != "train_limit"]
        out[name] = " ".join(parts)
    return out


def table1_report(store: Store, out: str) -> Path:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    long, shaped = table1(store)
    long.to_csv(folder / "table1_scores.csv", index=False)
    shaped.to_csv(folder / "table1.csv", index=False)
    text = [
        "# Table 1 (Kovaleva et al. 2019): GLUE dev scores by initialisation",
        "",
        _markdown(shaped),
        "",
        f"Scores in percent; mean ± sample sd over seeds where several were run, each task at one fine-tuning "
        f"setting (the paper's, {PAPER_SETTING}, where it was run; a train-set sample where `-nN` ends the model "
        f"name; every model's setting is in table1_scores.csv). {NO_FINETUNING}",
        "",
    ]
    others = long[~long["in_table"]]
    if not others.empty:
        text += [
            "Other settings (not in the table above):",
            "",
            _markdown(others[["task", "column", "model", "setting", "metric", "score"]].round(1)),
            "",
        ]
    path = folder / "table1.md"
    path.write_text("\n".join(text), encoding="utf-8")
    return path


def _single_heads(frame: pd.DataFrame, n_layers: int, n_heads: int) -> np.ndarray:
    grid = np.full((n_layers, n_heads), np.nan)
    for heads, score in zip(frame["disabled_heads"], frame["score"]):
        if len(heads) == 1:
            layer, head = heads[0]
            grid[layer, head] = score
    return grid


def ablation_tables(store: Store, mode: str = "uniform") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per model, task, configuration: score, baseline, delta; per head: tasks it helps / hurts, mean delta)."""
    rows = store.ablation_results()
    rows = rows[(rows["mode"] == mode) & (rows["config"] != "none")]
    if rows.empty:
        raise NotFoundError(f"no {mode} ablations stored yet; run `attnstore ablate --model M --task T` first")
    headline = rows[rows.apply(lambda r: r["metric"] == TASKS[r["task"]].metrics[0], axis=1)]
    singles = headline[headline["config"].str.startswith("heads:") & (headline["disabled_heads"].map(len) == 1)]
    per_task = (
        singles.assign(layer=singles["disabled_heads"].map(lambda h: h[0][0]), head=singles["disabled_heads"].map(lambda h: h[0][1]))
        .groupby(["task", "layer", "head"], as_index=False)["delta"]
        .mean()
    )
    verdict = (
        per_task.groupby(["layer", "head"])
        .agg(
            tasks=("task", "nunique"),
            helps=("delta", lambda d: int((d > 0).sum())),
            hurts=("delta", lambda d: int((d < 0).sum())),
            mean_delta=("delta", "mean"),
        )
        .reset_index()
    )
    return headline.reset_index(drop=True), verdict


def _single_heads_line(group: pd.DataFrame) -> str:
    single = group["config"].str.startswith("heads:")
    if not single.any():
        return "No single-head configurations stored (`attnstore ablate --heads each` adds them)."
    return f"Single heads that improve the score: {int(((group['delta'] > 0) & single).sum())} of {int(single.sum())}."


def save_ablation_figures(group: pd.DataFrame, n_layers: int, n_heads: int, folder: Path, mode: str) -> list[str]:
    """Fig. 8 (single heads disabled) and Fig. 9 (whole layers) of one model on one task, from its headline rows
    (config, disabled_heads, score, baseline_score, as in ablation_<mode>.csv); returns the files written."""
    model, task = str(group["model"].iloc[0]), str(group["task"].iloc[0])
    metric = TASKS[task].metrics[0]
    baseline = float(group["baseline_score"].iloc[0])
    stem = f"{task}_{model}".replace("/", "_") + ("" if mode == "uniform" else f"_{mode}")  # modes share a folder
    names: list[str] = []
    grid = _single_heads(group, n_layers, n_heads)
    if not np.isnan(grid).all():
        fig = new_figure(figsize=(0.5 * n_heads + 2.5, 0.45 * n_layers + 1.8))
        ax = fig.add_subplot()
        span = np.nanmax(np.abs(grid - baseline)) or 1.0
        image = ax.imshow(grid, cmap="RdBu", vmin=baseline - span, vmax=baseline + span)
        ax.set_xlabel("head (0-based)")
        ax.set_ylabel("layer (0-based)")
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
        fig.colorbar(image, ax=ax, label=f"{metric} with the head disabled\n(baseline {baseline:.1f}: white)")
        fig.suptitle(f"Fig. 8: {task} dev, {model}\none head disabled ({mode}); blue = better than baseline", fontsize=9)
        names += _save(fig, folder, f"fig8_{stem}")
    layers = group[group["config"].str.startswith("layer:")]
    if not layers.empty:
        order = layers.assign(layer=layers["config"].str.split(":").str[1].astype(int)).sort_values("layer")
        fig = new_figure(figsize=(6.5, 3.2))
        ax = fig.add_subplot()
        ax.plot(order["layer"], order["score"], marker="o", label="layer disabled")
        ax.axhline(baseline, color="grey", linestyle="--", label=f"baseline {baseline:.1f}")
        ax.set_xlabel("disabled layer (0-based)")
        ax.set_ylabel(f"{task} dev {metric}")
        ax.set_xticks(order["layer"])
        fig.suptitle(f"Fig. 9: {task}, {model} ({mode})", fontsize=9)
        _legend_beside(ax, fontsize=8)
        names += _save(fig, folder, f"fig9_{stem}")
    return names


def _noise_caveat(verdict: pd.DataFrame, noises: list[float]) -> list[str]:
    """One paragraph setting the single-head changes against the baselines' standard errors: a head 'helps' by a change
    smaller than the noise of one dev-set score as often as not."""
    if verdict.empty or not noises:
        return []
    gain = float(verdict["mean_delta"].max())
    low, high = min(noises), max(noises)
    within = "within" if gain <= high else "above some of"
    spread = f"{low:.1f}" if round(low, 1) == round(high, 1) else f"{low:.1f}-{high:.1f}"
    return [
        f"**Noise.** The largest mean gain from disabling one head is {gain:+.1f} points, against binomial standard "
        f"errors of {spread} points for the accuracy baselines above: {within} the noise of a single dev-set score. "
        "Read `helps` and `hurts` as counts of small, mostly insignificant changes, not as heads that matter.",
        "",
    ]


def ablation_report(store: Store, out: str, mode: str = "uniform") -> Path:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    headline, verdict = ablation_tables(store, mode)
    headline.drop(columns=["created_at"]).to_csv(folder / f"ablation_{mode}.csv", index=False)
    verdict.to_csv(folder / f"heads_help_or_hurt_{mode}.csv", index=False)
    models = store.models().set_index("name")
    lines = [f"# Disabling heads ({mode}; Kovaleva et al. Fig. 8-9)", ""]
    noises: list[float] = []
    for (model, task), group in headline.groupby(["model", "task"], sort=False):
        n_layers, n_heads = int(models.loc[model, "n_layers"]), int(models.loc[model, "n_heads"])
        metric = TASKS[task].metrics[0]
        baseline = float(group["baseline_score"].iloc[0])
        n = int(group["n_examples"].iloc[0])
        noise = 100 * np.sqrt((baseline / 100) * (1 - baseline / 100) / n) if metric == "accuracy" else float("nan")
        if noise == noise:
            noises.append(noise)
        save_ablation_figures(group, n_layers, n_heads, folder, mode)
        best = group.loc[group["score"].idxmax()]
        worst = group.loc[group["score"].idxmin()]
        lines += [
            f"## {task}: {model}",
            "",
            f"Baseline {metric} {baseline:.1f} on {n} dev examples"
            + (f" (binomial standard error {noise:.1f} points)" if noise == noise else "")
            + ".",
            f"Best configuration: {best['config']} ({best['score']:.1f}, {best['delta']:+.1f}); "
            f"worst: {worst['config']} ({worst['score']:.1f}, {worst['delta']:+.1f}).",
            _single_heads_line(group),
            "",
        ]
    lines += [
        "## Heads that help or hurt across tasks",
        "",
        "Per head: on how many tasks disabling it alone raised (`helps`) or lowered (`hurts`) the headline metric, "
        "and the mean change in points (averaged over seeds within a task first).",
        "",
        *_noise_caveat(verdict, noises),
        _markdown(verdict.sort_values("mean_delta", ascending=False).round(2)),
        "",
    ]
    path = folder / f"ablation_{mode}.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def majority_scores(task: str, n_examples: int | None = None, data_dir: str | None = None) -> dict[str, float] | None:
    """The dev scores, per metric of `task`, of always answering the dev set's most common label (a tie: the first in
    class order): the majority-class baseline a pruned model falls to. `n_examples` below the dev set's size takes
    the seeded sample the evaluator reads for its `dev_limit` (ingest/evaluate.py). None for a regression task (STS-B) or where the dev
    data cannot be read (the data folder: --data-dir > ATTNSTORE_DATA > ../shared/data)."""
    from ..ingest.glue import compute_metrics, get_task, read_split
    from ..store.errors import AttnStoreError

    try:
        spec = get_task(task)
        if spec.is_regression:
            return None
        pairs = read_split(spec, spec.dev, data_dir, n_examples)
    except (AttnStoreError, OSError):
        return None
    labels = np.array([int(p.label) for p in pairs])
    if not len(labels):
        return None
    majority = np.bincount(labels).argmax()
    return compute_metrics(spec, np.full(len(labels), majority), labels)


def draw_pruning(frame: pd.DataFrame, model: str, task: str, mode: str, majority: dict[str, float] | None = None):
    """The pruning curve of `attnstore prune`: each metric's dev score against the number of heads pruned, with the
    majority-class baseline of each metric as a dashed line of its colour (`majority`: metric -> score; default
    `majority_scores` of the task's dev data, which the title says is missing where it cannot be read). A `procedure`
    column (how the importance was estimated) draws one curve per procedure and metric, told apart by marker and style."""
    from ..store.plot import new_figure

    if majority is None:
        n = int(frame["n_examples"].max()) if "n_examples" in frame and frame["n_examples"].notna().any() else None
        majority = majority_scores(task, n)
    n_heads = max(int(frame["n_pruned"].max()), 1)
    several = "procedure" in frame.columns
    fig = new_figure(figsize=(6.5, 5.2) if several else (5.5, 3.8))
    ax = fig.add_subplot()
    sweeps = frame.groupby("procedure", sort=False) if several else [(None, frame)]
    colours: dict[str, str] = {}
    for k, (procedure, part) in enumerate(sweeps):
        for metric, rows in part.sort_values("n_pruned").groupby("metric", sort=False):
            label = metric if procedure is None else f"{metric}: {procedure}"
            style = dict(marker="osD^v"[k % 5], linestyle=("-", "-.", ":")[k % 3])
            (line,) = ax.plot(rows["n_pruned"], rows["score"], label=label, **style)
            colours.setdefault(str(metric), line.get_color())
    for metric, colour in colours.items():
        if majority and metric in majority:
            value = majority[metric]
            ax.axhline(value, color=colour, linestyle="--", linewidth=1, label=f"{metric}: majority class ({value:.1f})")
    ax.set_xlabel("heads pruned (least important first)")
    ax.set_ylabel("dev score")
    missing = "" if majority else f"; no majority-class line: {_why_no_majority(task)}"
    ax.set_title(f"{model} on {task}: pruning by importance\n(mask: {mode}; {n_heads} pruned at most{missing})", fontsize=8)
    if several:  # long labels: below the axes, so the plot keeps the figure's width
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.14), fontsize=7, frameon=False)
    else:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    return fig


def _why_no_majority(task: str) -> str:
    from ..ingest.glue import TASKS

    spec = TASKS.get(task.upper(), TASKS.get(task))
    if spec is None:
        return f"{task} is not a GLUE task"
    return "a regression task" if spec.is_regression else "its dev data was not found (--data-dir, ATTNSTORE_DATA)"
