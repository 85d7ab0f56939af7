"""`attnstore report kovaleva`: the stored-map figures and tables of Kovaleva et al. 2019.

Thin: every number comes from a registered query (pattern_proportions, frame_heads,
run_similarity, feature_attention, cls_feature_attention, token_to_token); this module lays
them out as CSV/Markdown tables and PNG/SVG figures, each naming the model and the data.
Layers and heads are 0-based, as in the data, and every axis says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..queries import QUERIES, load_all, run_query
from ..store.errors import AttnStoreError
from ..store.plot import new_figure
from .report import _has_tabulate, _save, left_out

if TYPE_CHECKING:
    from ..store import Store

FIG6_FEATURES = ("sep", "cls", "noun", "verb", "pronoun", "subject", "object", "negation")


def _markdown(frame: pd.DataFrame) -> str:
    shown = frame.round(3)
    return shown.to_markdown(index=False) if _has_tabulate() else shown.to_string(index=False)


def _grid(frame: pd.DataFrame, value: str, n_layers: int, n_heads: int) -> np.ndarray:
    grid = np.full((n_layers, n_heads), np.nan)
    grid[frame["layer"].to_numpy(int), frame["head"].to_numpy(int)] = frame[value].to_numpy(float)
    return grid


def _heatmap(ax, grid: np.ndarray, title: str, cmap: str = "viridis", vmin=None, vmax=None):
    image = ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.set_xlabel("head (0-based)")
    ax.set_ylabel("layer (0-based)")
    ax.set_xticks(range(grid.shape[1]))
    ax.set_yticks(range(grid.shape[0]))
    ax.tick_params(labelsize=6)
    ax.set_title(title, fontsize=8)
    return image


def _describe(store: Store, run) -> str:
    info = store.run_info(run)
    return f"{info.model} on {info.dataset}:{info.split} ({info.n_stored} examples)"


def draw_patterns(table: pd.DataFrame, tasks: list[str], model: str, max_examples: int, classifier: str = "rule classifier"):
    """Fig. 2 from `pattern_proportions` rows of each task (a `task` column)."""
    wide = table.pivot_table(index="task", columns="label", values="fraction", aggfunc="sum").fillna(0.0)
    wide = wide.reindex(tasks)
    fig = new_figure(figsize=(1.1 * len(tasks) + 4, 4.2))
    ax = fig.add_subplot()
    bottom = np.zeros(len(wide))
    for label in wide.columns:
        ax.bar(wide.index, wide[label], bottom=bottom, label=label)
        bottom += wide[label].to_numpy()
    ax.set_ylabel("fraction of (example, layer, head) maps")
    ax.set_xlabel("task (dev set)")
    handles, labels = ax.get_legend_handles_labels()  # listed top to bottom, as the classes are stacked
    ax.legend(handles[::-1], labels[::-1], fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left", borderaxespad=0.0)
    fig.suptitle(f"Fig. 2: attention pattern classes ({classifier})\n{model}, ≤ {max_examples} dev examples per task", fontsize=9)
    return fig


def figure_patterns(
    store: Store, runs: dict[str, str], out: Path, max_examples: int, stem: str = "fig2_pattern_classes"
) -> tuple[list[str], pd.DataFrame]:
    frames = []
    for task, run in runs.items():
        frame = run_query(store, "pattern_proportions", run=run, max_examples=max_examples)
        frames.append(frame.assign(task=task))
    table = pd.concat(frames, ignore_index=True)
    fig = draw_patterns(table, list(runs), store.run_info(next(iter(runs.values()))).model, max_examples)
    return _save(fig, out, stem), table


def figure_patterns_cnn(
    store: Store, runs: dict[str, str], out: Path, max_examples: int, model_file: str | Path
) -> tuple[list[str], pd.DataFrame]:
    """Fig. 2 with the CNN of `model_file` (`patterns train-cnn`): stacked shares as predicted, and per class the
    shares corrected by its held-out confusion matrix with 95% bootstrap intervals (as `patterns figure --report`)."""
    from ..queries.pattern_cnn import load_model
    from ..queries.pattern_cnn_store import classify_run
    from ..queries.patterns import CLASSES
    from .pattern_report import figure_uncertainty, uncertainty_table

    _, saved = load_model(model_file)
    frames, wide = [], []
    model = store.run_info(next(iter(runs.values()))).model
    for task, run in runs.items():
        labels = classify_run(store, run, model_file, max_examples=max_examples)
        counts = labels["label"].value_counts().reindex(list(CLASSES), fill_value=0)
        shares = counts.to_numpy(np.float64) / max(int(counts.sum()), 1)
        n_examples = labels["example"].nunique()
        frames.append(pd.DataFrame(dict(label=list(CLASSES), n_maps=counts.to_numpy(), fraction=shares, n_examples=n_examples, task=task)))
        wide.append(dict(task=task, run=store.run_info(run).name, **dict(zip(CLASSES, shares))))
    table = pd.concat(frames, ignore_index=True)
    report = saved.get("report", {})
    members = report.get("members", 1)
    classifier = f"CNN, {members} network(s), trained on {report.get('source', '?')}"
    fig = draw_patterns(table, list(runs), model, max_examples, classifier=classifier)
    names = _save(fig, out, "fig2_pattern_classes")
    matrix = np.asarray(report.get("cnn", {}).get("confusion", []), dtype=np.int64)
    if matrix.shape == (len(CLASSES), len(CLASSES)) and matrix.sum():
        long = uncertainty_table(pd.DataFrame(wide), matrix)
        names += figure_uncertainty(long, out, "cnn", max_examples, int(matrix.sum()), model, stem="fig2_pattern_classes_uncertainty")
    return names, table


def draw_frame_heads(frame: pd.DataFrame, n_layers: int, n_heads: int, description: str):
    """Fig. 3 from a `frame_heads` frame: a layer x head heatmap, the heads above the 99th percentile framed."""
    from matplotlib.patches import Rectangle

    fig = new_figure(figsize=(0.5 * n_heads + 2.5, 0.45 * n_layers + 1.8))
    ax = fig.add_subplot()
    image = _heatmap(ax, _grid(frame, "value", n_layers, n_heads), "red squares: heads above the 99th percentile")
    fig.colorbar(image, ax=ax, label="mean max attention")
    for layer, head in frame.loc[frame["top"].astype(bool), ["layer", "head"]].itertuples(index=False):
        ax.add_patch(Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
    fig.suptitle(
        f"Fig. 3: max attention between LU and core FE tokens, mean over {int(frame['n_sentences'].iloc[0])} sentences\n{description}",
        fontsize=9,
    )
    return fig


def figure_frame_heads(store: Store, run: str, out: Path) -> tuple[list[str], pd.DataFrame]:
    frame = run_query(store, "frame_heads", run=run)
    info = store.run_info(run)
    fig = draw_frame_heads(frame, info.n_layers, info.n_heads, _describe(store, run))
    return _save(fig, out, "fig3_frame_heads"), frame


SIMILARITY_FLOOR = 1e-5  # the least 1 - similarity Fig. 5's log scale shows apart (0.99999)


def similarity_norm(frames: dict[str, pd.DataFrame]):
    """Fig. 5's colour scale: logarithmic in 1 - similarity, from the smallest difference drawn to the largest, shared
    by the tasks' panels. A linear 0-1 scale gave every head at similarity >= 0.99 the same colour; on this scale
    0.99, 0.999 and 0.9999 are a decade apart."""
    from matplotlib.colors import LogNorm

    change = np.concatenate([1 - frame["similarity"].to_numpy(float) for frame in frames.values()])
    change = change[np.isfinite(change)]
    low = max(float(change.min()) if change.size else SIMILARITY_FLOOR, SIMILARITY_FLOOR)
    high = max(float(change.max()) if change.size else 1.0, low * 10)
    return LogNorm(vmin=low, vmax=high)


def draw_similarity(frames: dict[str, pd.DataFrame], n_layers: int, n_heads: int, tuned_models: dict[str, str]):
    """Fig. 5 from one `run_similarity` frame per task; `tuned_models`: task -> the fine-tuned model's name. Coloured
    by 1 - similarity on a log scale (`similarity_norm`), the colour bar labelled in similarity."""
    from matplotlib.ticker import FuncFormatter

    norm = similarity_norm(frames)
    fig = new_figure(figsize=(4.4 * len(frames) + 1.6, 4.0))
    axes = fig.subplots(1, len(frames), squeeze=False)
    for ax, (task, frame) in zip(axes[0], frames.items()):
        title = f"{task}: pre-trained vs\n{tuned_models[task]}"
        change = np.maximum(1 - _grid(frame, "similarity", n_layers, n_heads), norm.vmin)
        image = _heatmap(ax, change, title, cmap="magma_r")
        image.set_norm(norm)
    bar = fig.colorbar(image, ax=list(axes[0]), label="cosine similarity of maps\n(log scale of 1 - similarity)", shrink=0.9)
    decades = [10.0**k for k in range(int(np.floor(np.log10(norm.vmin))), 1) if norm.vmin <= 10.0**k <= norm.vmax]
    bar.set_ticks([*decades, norm.vmax] if not decades or norm.vmax / decades[-1] > 1.5 else decades)
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{1 - v:.6g}" if v < 0.01 else f"{1 - v:.2f}"))
    bar.ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    bar.ax.invert_yaxis()  # similarity 1 at the top, as before
    fig.suptitle("Fig. 5: per-head cosine similarity between pre-trained and fine-tuned attention (dev examples)", fontsize=9)
    return fig


def figure_similarity(store: Store, pairs: dict[str, tuple[str, str]], out: Path, max_examples: int) -> tuple[list[str], pd.DataFrame]:
    frames = {}
    for task, (pre, tuned) in pairs.items():
        frame = run_query(store, "run_similarity", run=pre, other=tuned, max_examples=max_examples)
        frames[task] = frame.assign(task=task, run=pre, other=tuned)
    info = store.run_info(next(iter(pairs.values()))[0])
    fig = draw_similarity(frames, info.n_layers, info.n_heads, {task: store.run_info(tuned).model for task, (_, tuned) in pairs.items()})
    return _save(fig, out, "fig5_similarity"), pd.concat(frames.values(), ignore_index=True)


def feature_blocks(n_features: int, n_tasks: int) -> int:
    """How many features Fig. 6 puts side by side in one row (each a block of one panel per task): the count that
    dividing the features evenly brings the figure closest to square (one task's eight features: 4 rows of 2, not
    the 8 x 1 strip of 795 x 3197 px)."""
    options = [k for k in range(1, n_features + 1) if n_features % k == 0] or [1]
    return min(options, key=lambda k: abs(np.log((3.6 * n_tasks * k + 1.6 * k) / (2.6 * -(-n_features // k)))))


def draw_features(frames: dict[str, pd.DataFrame], n_layers: int, n_heads: int, models: dict[str, str], title: str):
    """Fig. 6 from one `feature_attention` frame per task: per feature a block of one panel per task with one colour
    scale (shared by the tasks, so a block's panels compare), the blocks laid out `feature_blocks` to a row."""
    features = [f for f in FIG6_FEATURES if any(f in set(fr["feature"]) for fr in frames.values())]
    blocks = feature_blocks(len(features), len(frames))
    rows = -(-len(features) // blocks)
    fig = new_figure(figsize=((3.6 * len(frames) + 1.6) * blocks, 2.6 * rows + 0.4))
    axes = fig.subplots(rows, len(frames) * blocks, squeeze=False)
    for k, feature in enumerate(features):
        row, first = k // blocks, (k % blocks) * len(frames)
        top = max(float(fr.loc[fr["feature"] == feature, "value"].max()) for fr in frames.values() if (fr["feature"] == feature).any())
        for col, (task, frame) in enumerate(frames.items()):
            part = frame[frame["feature"] == feature]
            label = f"{task}: to {feature}" + (f"\n{models[task]}" if k < blocks and len(set(models.values())) > 1 else "")
            image = _heatmap(
                axes[row][first + col],
                _grid(part, "value", n_layers, n_heads),
                label,
                cmap="Reds",
                vmin=0,
                vmax=top if top == top and top > 0 else None,
            )
        fig.colorbar(image, ax=axes[row][first : first + len(frames)].tolist(), label=f"to {feature}")
    model = next(iter(models.values()))
    same_model = len(set(models.values())) == 1
    fig.suptitle(f"{title}\n{model}" if same_model else f"{title}\n(each column's model named at its top)", fontsize=9)
    return fig


def figure_features(store: Store, runs: dict[str, str], out: Path, stem: str, title: str) -> tuple[list[str], pd.DataFrame]:
    frames = {task: run_query(store, "feature_attention", run=run) for task, run in runs.items()}
    info = store.run_info(next(iter(runs.values())))
    models = {task: store.run_info(run).model for task, run in runs.items()}
    fig = draw_features(frames, info.n_layers, info.n_heads, models, title)
    return _save(fig, out, stem), pd.concat([f.assign(task=t) for t, f in frames.items()], ignore_index=True)


def draw_cls(table: pd.DataFrame, tasks: list[str], model: str):
    """Fig. 7 from `cls_feature_attention` rows of each task (a `task` column)."""
    means = table.groupby(["task", "feature"], sort=False)["mean_over_heads"].first().unstack("feature").reindex(tasks)
    fig = new_figure(figsize=(1.2 * len(tasks) + 5, 4.2))
    ax = fig.add_subplot()
    width = 0.8 / max(len(means.columns), 1)
    for k, feature in enumerate(means.columns):
        ax.bar(np.arange(len(means)) + k * width, means[feature], width, label=feature)
    ax.set_xticks(np.arange(len(means)) + 0.4 - width / 2, means.index)
    ax.set_xlabel("task (dev set)")
    ax.set_ylabel("attention from [CLS]-like token\n(mean over heads)")
    layer = int(table["layer"].iloc[0])
    fig.suptitle(f"Fig. 7: last layer (layer {layer}, 0-based) attention from [CLS] to feature tokens\n{model}", fontsize=9)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left", borderaxespad=0.0)
    return fig


def figure_cls(store: Store, runs: dict[str, str], out: Path) -> tuple[list[str], pd.DataFrame]:
    frames = [run_query(store, "cls_feature_attention", run=run).assign(task=task) for task, run in runs.items()]
    table = pd.concat(frames, ignore_index=True)
    fig = draw_cls(table, list(runs), store.run_info(next(iter(runs.values()))).model)
    return _save(fig, out, "fig7_cls_attention"), table


def kovaleva_report(
    store: Store,
    out: str,
    runs: dict[str, str],
    finetuned: dict[str, str] | None = None,
    frame_run: str | None = None,
    max_examples: int = 1000,
    pattern_model: str | Path | None = None,
) -> Path:
    """Write the figures and tables for `runs` (task -> pre-trained dev run), `finetuned` (task -> a run of the
    fine-tuned model on the same examples) and `frame_run` (a FrameNet exemplar run); return the Markdown index.
    With `pattern_model` (weights from `patterns train-cnn`) Fig. 2 is drawn with that CNN, the rules' beside it."""
    load_all()
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    finetuned = finetuned or {}
    lines = [
        "# Kovaleva et al. 2019 on stored maps",
        "",
        "Runs: " + ", ".join(f"{t} = `{r}` ({_describe(store, r)})" for t, r in runs.items()),
        "",
    ]

    def section(title: str, build, table_name: str, note: str = "") -> None:
        try:
            names, table = build()
        except AttnStoreError as exc:
            lines.extend([f"## {title}", "", f"Not produced: {exc}", ""])
            return
        table.to_csv(folder / f"{table_name}.csv", index=False)
        lines.extend(
            [
                f"## {title}",
                "",
                *[f"![{n}]({n})" for n in names if n.endswith(".png")],
                "",
                f"Data: [{table_name}.csv]({table_name}.csv). {note}".rstrip(),
                "",
            ]
        )

    if pattern_model is not None:
        section(
            "Fig. 2: attention pattern classes per task (CNN)",
            lambda: figure_patterns_cnn(store, runs, folder, max_examples, pattern_model),
            "fig2_pattern_classes",
            f"Classifier: the CNN of `{Path(pattern_model).name}`; the uncertainty figure corrects each share by its held-out "
            "confusion matrix (whiskers: 95% bootstrap interval, dots: as predicted).",
        )
    if "pattern_proportions" in QUERIES:
        stem = "fig2_pattern_classes_rules" if pattern_model is not None else "fig2_pattern_classes"
        section(
            "Fig. 2: attention pattern classes per task (rules)",
            lambda: figure_patterns(store, runs, folder, max_examples, stem),
            stem,
            ""
            if pattern_model is not None
            else "Classifier: the length-normalised rules; pass --pattern-model FILE.pt "
            "(`attnstore patterns train-cnn`) to draw it with the CNN, which scores higher on labels it was not trained on.",
        )
    if frame_run:
        section(
            "Fig. 3: heads specific to frame-semantic relations",
            lambda: figure_frame_heads(store, frame_run, folder),
            "fig3_frame_heads",
            "Red squares: heads above the 99th percentile.",
        )
    else:
        how = "--frame-run RUN (a run over framenet/1.5:exemplars) adds it"
        lines.extend(["## Fig. 3: heads specific to frame-semantic relations", "", left_out("kovaleva", "Fig. 3 (frame heads)", how), ""])
    pairs = {t: (runs[t], r) for t, r in finetuned.items() if t in runs}
    unpaired = sorted(set(finetuned) - set(runs))
    if unpaired:
        how = f"give --run {unpaired[0]}=RUN (its pre-trained run) beside --finetuned-run {unpaired[0]}=..."
        lines.extend([left_out("kovaleva", f"the fine-tuned run(s) of {', '.join(unpaired)}, which have no pre-trained run", how), ""])
    if not pairs:
        how = "--finetuned-run TASK=RUN (a fine-tuned model's run over the same examples) adds them"
        lines.extend(["## Fig. 5 and Fig. 6 (fine-tuned)", "", left_out("kovaleva", "Fig. 5 and the fine-tuned Fig. 6", how), ""])
    if pairs:
        section(
            "Fig. 5: change of attention after fine-tuning",
            lambda: figure_similarity(store, pairs, folder, max_examples),
            "fig5_similarity",
        )
        tuned_runs = {t: r for t, r in finetuned.items() if t in runs}
        section(
            "Fig. 6 (fine-tuned): attention to linguistic features",
            lambda: figure_features(
                store, tuned_runs, folder, "fig6_features_finetuned", "Fig. 6: normalised attention to feature tokens after fine-tuning"
            ),
            "fig6_features_finetuned",
        )
    section(
        "Fig. 6: attention to linguistic features and special tokens",
        lambda: figure_features(store, runs, folder, "fig6_features", "Fig. 6: normalised attention to feature tokens (pre-trained)"),
        "fig6_features",
    )
    section(
        "Fig. 7: attention from [CLS] in the last layer",
        lambda: figure_cls(store, runs, folder),
        "fig7_cls_attention",
        "Per head, the largest weight from [CLS] among the feature's tokens (pool=max, the paper's Sec. 4.4 rule), averaged "
        "over the examples with the feature; each bar is the mean over the layer's heads.",
    )
    section(
        "Token-to-token attention (Sec. 4.5)",
        lambda: ([], pd.concat([run_query(store, "token_to_token", run=r).assign(task=t) for t, r in runs.items()], ignore_index=True)),
        "token_to_token",
        "Per head: verb→subject, subject→verb, noun→pronoun, pronoun→noun; per example the largest token-to-token weight over "
        "the linked pairs (statistic=token_max, the authors' notebook), averaged over the examples with a pair.",
    )
    path = folder / "README.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
