"""Kovaleva et al. K1 reports: the classifiers scored per labeller, agreement between labellers, and Fig 2 with
per-class uncertainty from a classifier's held-out confusion matrix (`attnstore patterns evaluate`, `patterns
figure --report`). The label sources and their labellers are api/pattern_labels.py's; the metrics
queries/pattern_metrics.py's."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..queries.pattern_cnn import MAP_KEY  # a map, whatever the store and run (torch is imported lazily there)
from ..queries.pattern_metrics import CLASSES, cohen_kappa, evaluate, share_intervals
from ..queries.patterns import labelled_maps, labels_from_scores
from ..store.errors import InvalidArgumentError, NotFoundError
from .pattern_labels import COLOURS, LABELLER_KINDS, labellers

if TYPE_CHECKING:
    from ..store import Store


FOUR = tuple(c for c in CLASSES if c != "block")


def labeller_scores(true: np.ndarray, predicted: np.ndarray) -> dict:
    r = evaluate(true, predicted)
    used = r["support"] > 0
    return dict(
        n=r["n"],
        accuracy=r["accuracy"],
        macro_f1_labelled=float(r["f1"][used].mean()) if used.any() else float("nan"),  # the classes the labeller used
        macro_f1_four=float(np.mean([r["f1"][CLASSES.index(c)] for c in FOUR])),
        **{f"f1_{c}": float(f) for c, f in zip(CLASSES, r["f1"])},
        confusion=r["confusion"].tolist(),
    )


def evaluate_labellers(store: Store, model_file: str | Path | None = None) -> dict:
    """Every labeller's label source (people's `human`, `human:NAME`; a model's `model:NAME`) scored against the
    rules (module thresholds) and, with `model_file`, the CNN, on the maps none of them was trained on: a map in the
    CNN's training part (the split saved with its weights, matched by model, dataset, split, source row, layer and
    head) is left out for both.
    Returns per_labeller (a row per source and classifier), agreement (a row per pair of sources: maps both
    labelled, share agreeing, Cohen's kappa) and the CNN file's training source."""
    sources = labellers(store, kinds=LABELLER_KINDS)
    if sources.empty:
        raise NotFoundError("no labellers' pattern labels in this store; import some (`attnstore patterns import`) or label in the viewer")
    model = saved = None
    trained_on: set[tuple] = set()
    if model_file is not None:
        from ..queries.pattern_cnn import load_model

        model, saved = load_model(model_file)
        split = pd.DataFrame(saved["split"])
        trained_on = set(map(tuple, split[split["part"] == "train"][MAP_KEY].itertuples(index=False)))
    rows, frames = [], {}
    for source, who in zip(sources["source"], sources["labeller"]):
        frame, maps = labelled_maps(store, source)
        keys = list(map(tuple, frame[MAP_KEY].itertuples(index=False)))
        fresh = np.array([k not in trained_on for k in keys], dtype=bool)
        frames[source] = frame.assign(key=keys)
        true = frame["label"].to_numpy(object)
        predictions = {"rules": labels_from_scores(frame)}
        if model is not None and saved is not None:
            from ..queries.pattern_cnn import inputs_for, predict, stack_inputs

            inputs = stack_inputs([inputs_for(saved, a[None], s, g) for a, s, g in maps])
            predictions["cnn"] = np.array(CLASSES, dtype=object)[predict(model, *inputs)[0]]
        for name, predicted in predictions.items():
            if fresh.any():
                rows.append(
                    dict(
                        source=source,
                        labeller=who,
                        classifier=name,
                        n_labels=len(frame),
                        **labeller_scores(true[fresh], predicted[fresh]),
                    )
                )
    agreement = []
    for a, b in itertools.combinations(frames, 2):
        left = frames[a].drop_duplicates("key").set_index("key")["label"]
        right = frames[b].drop_duplicates("key").set_index("key")["label"]
        both = left.index.intersection(right.index)
        if len(both):
            x, y = left.loc[both].to_numpy(object), right.loc[both].to_numpy(object)
            agreement.append(dict(first=a, second=b, n_maps=len(both), agreement=float((x == y).mean()), kappa=cohen_kappa(x, y)))
    return dict(
        per_labeller=pd.DataFrame(rows),
        agreement=pd.DataFrame(agreement, columns=["first", "second", "n_maps", "agreement", "kappa"]),
        cnn_trained_on=None if saved is None else saved.get("report", {}).get("source"),
    )


# ---------------------------------------------------------------- Fig 2 with uncertainty


def held_out_confusion(report_file: str | Path, source: str) -> np.ndarray:
    """The held-out confusion matrix of `source` (cnn or rules) from a `patterns train-cnn` report (.json)."""
    try:
        report = json.loads(Path(report_file).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFoundError(f"no report at {report_file}; `attnstore patterns train-cnn --out FILE.pt` writes FILE.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"{report_file} is not a train-cnn report ({exc})") from None
    if source not in ("cnn", "rules") or source not in report or "confusion" not in report[source]:
        raise InvalidArgumentError(f"{report_file} has no held-out confusion matrix for {source!r} (it has one for cnn and rules)")
    return np.asarray(report[source]["confusion"], dtype=np.int64)


def uncertainty_table(table: pd.DataFrame, matrix: np.ndarray, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Long table (task, run, label, predicted, corrected, low, high) of a proportions_table's shares with their
    95% bootstrap interval from the held-out confusion matrix (queries/pattern_metrics.py share_intervals)."""
    predicted = table[list(CLASSES)].to_numpy(np.float64)
    bands = share_intervals(predicted, matrix, n_boot=n_boot, seed=seed)
    rows = []
    for t, (task, run) in enumerate(zip(table["task"], table["run"])):
        for k, cls in enumerate(CLASSES):
            rows.append(
                dict(
                    task=task,
                    run=run,
                    label=cls,
                    predicted=predicted[t, k],
                    corrected=bands["corrected"][t, k],
                    low=bands["low"][t, k],
                    high=bands["high"][t, k],
                )
            )
    return pd.DataFrame(rows)


def figure_uncertainty(
    long: pd.DataFrame, out: str | Path, source: str, max_examples: int, n_held_out: int, models: str, stem: str
) -> list[str]:
    """Fig 2 with uncertainty: per class, a bar per task at the confusion-corrected share with its 95% bootstrap
    interval, and a dot at the share the classifier predicted (PNG, SVG, CSV); returns the file names."""
    from ..store.plot import new_figure

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = list(dict.fromkeys(long["task"]))
    fig = new_figure(figsize=(10, 4.6))
    ax = fig.subplots()
    width = 0.8 / len(tasks)
    shades = np.linspace(1.0, 0.45, len(tasks))
    for k, cls in enumerate(CLASSES):
        for t, task in enumerate(tasks):
            row = long[(long["label"] == cls) & (long["task"] == task)].iloc[0]
            x = k + (t - (len(tasks) - 1) / 2) * width
            ax.bar(x, row.corrected * 100, width=width * 0.92, color=COLOURS[cls], alpha=float(shades[t]), label=task if k == 0 else None)
            ax.errorbar(
                x,
                row.corrected * 100,
                yerr=[[max(0.0, (row.corrected - row.low) * 100)], [max(0.0, (row.high - row.corrected) * 100)]],
                fmt="none",
                ecolor="0.2",
                elinewidth=0.8,
                capsize=1.5,
            )
            ax.plot(x, row.predicted * 100, marker=".", color="black", markersize=3)
    ax.set_xticks(range(len(CLASSES)), labels=list(CLASSES))
    ax.set(ylabel="% of (example, layer, head) maps", ylim=(0, 100))
    ax.legend(title="task (bars left to right)", fontsize=7, title_fontsize=7, loc="upper right")
    ax.set_title(
        f"Attention pattern classes per task — {models} on GLUE dev (≤ {max_examples} examples per task)\n"
        f"classifier: {source}; bars: shares corrected by its held-out confusion matrix ({n_held_out} maps), "
        "whiskers: 95% bootstrap interval, dots: shares as predicted",
        fontsize=8,
    )
    names = []
    for ext in ("png", "svg"):
        fig.savefig(out / f"{stem}.{ext}", dpi=150, bbox_inches="tight")
        names.append(f"{stem}.{ext}")
    long.to_csv(out / f"{stem}.csv", index=False, float_format="%.4f")
    return [*names, f"{stem}.csv"]
