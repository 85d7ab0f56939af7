"""`attnstore report llm`: a decoder's attention sinks, head types, induction curve and massive activations.

Thin: every number comes from a registered query (attention_sink, previous_token_heads, streaming_heads, heavy_hitters,
massive_activations on a run of real text; induction_heads, duplicate_token_heads on a run of the generated
repeated-token dataset); this module lays them out as tables (`.csv` beside `llm.md`) and PNG/SVG figures naming the
model and the data. Layers and heads are 0-based.

Head types (`head_types.csv`, `head_types.png`), each head the first type whose rule it meets:
induction (induction score > INDUCTION on the repeated run), duplicate (duplicate score > DUPLICATE), previous token
(previous-token attention > PREVIOUS on real text), sink (attention on the first token > SINK over the rows that see
it), streaming (DuoAttention's mass rule: first 4 + last 64 keys keep > 0.9), else other (retrieval-like in
DuoAttention's split).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..queries import run_query
from ..store.plot import new_figure
from .report import _caption, _save, _table, left_out

if TYPE_CHECKING:
    from ..store import Store

INDUCTION, DUPLICATE, PREVIOUS, SINK = 0.4, 0.4, 0.5, 0.5
TYPES = ["induction", "duplicate", "previous token", "sink", "streaming", "other"]
COLOURS = ["tab:red", "tab:orange", "tab:green", "tab:blue", "lightsteelblue", "whitesmoke"]


def head_types(sinks: pd.DataFrame, previous: pd.DataFrame, streaming: pd.DataFrame, induction, duplicate) -> pd.DataFrame:
    """Per head: the scores the rules read and the type (module docstring); the repeated run's scores NaN without one."""
    frame = sinks[["layer", "head", "position_0"]].merge(previous[["layer", "head", "previous"]], on=["layer", "head"])
    frame = frame.merge(streaming[["layer", "head", "kept"]], on=["layer", "head"])
    frame["induction"] = induction["induction"].to_numpy() if induction is not None else np.nan
    frame["duplicate"] = duplicate["duplicate"].to_numpy() if duplicate is not None else np.nan
    rules = [
        frame["induction"] > INDUCTION,
        frame["duplicate"] > DUPLICATE,
        frame["previous"] > PREVIOUS,
        frame["position_0"] > SINK,
        frame["kept"] > 0.9,
    ]
    frame["type"] = np.select(rules, TYPES[:-1], default="other")
    return frame


def draw_types(types: pd.DataFrame, n_layers: int, n_heads: int, title: str):
    from matplotlib.colors import ListedColormap

    grid = types["type"].map({t: i for i, t in enumerate(TYPES)}).to_numpy().reshape(n_layers, n_heads)
    fig = new_figure(figsize=(4 + 0.3 * n_heads, 1.5 + 0.22 * n_layers))
    ax = fig.add_subplot()
    ax.imshow(grid, cmap=ListedColormap(COLOURS), vmin=-0.5, vmax=len(TYPES) - 0.5, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    ax.set_xlabel("head (0-based)")
    ax.set_ylabel("layer (0-based)")
    from matplotlib.patches import Patch

    counts = types["type"].value_counts()
    handles = [Patch(facecolor=c, edgecolor="grey", label=f"{t} ({int(counts.get(t, 0))})") for t, c in zip(TYPES, COLOURS, strict=True)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    ax.set_title("\n".join(textwrap.wrap(title, 55)), fontsize=8)
    return fig


def draw_sinks_and_activations(sinks: pd.DataFrame, massive: pd.DataFrame | None, title: str):
    """Per layer: the mean (and max) over heads of the attention on the first token, and beside it on a log axis the
    largest hidden-state magnitude over the median (massive activations)."""
    per_layer = sinks.groupby("layer")["position_0"].agg(["mean", "max"])
    fig = new_figure(figsize=(7, 3.8))
    ax = fig.add_subplot()
    ax.plot(per_layer.index, per_layer["mean"], marker="o", color="tab:blue", label="attention on the first token, mean over heads")
    ax.plot(per_layer.index, per_layer["max"], marker=".", linestyle=":", color="tab:blue", label="... max over heads")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("layer (0-based)")
    ax.set_ylabel("attention on the first token")
    handles, labels = ax.get_legend_handles_labels()
    if massive is not None:
        twin = ax.twinx()
        twin.plot(massive["layer"], massive["ratio"], marker="s", color="tab:red", label="largest |hidden| / median (right, log)")
        twin.set_yscale("log")
        twin.set_ylabel("largest |hidden-state entry| / median")
        more = twin.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.0, -0.2), fontsize=7, frameon=False, ncol=1)
    ax.set_title("\n".join(textwrap.wrap(title, 75)), fontsize=8)
    return fig


def induction_curve(induction: pd.DataFrame, duplicate: pd.DataFrame) -> pd.DataFrame:
    """Per T: the best head's induction and duplicate scores, the heads above the thresholds, the in-context loss gain."""
    gains = induction.attrs.get("loss_gain", {})
    rows = []
    for t in sorted(induction.attrs.get("examples_per_length", {})):
        scores, dup = induction[f"induction_T{t}"], duplicate[f"duplicate_T{t}"]
        best = int(scores.to_numpy().argmax())
        rows.append(
            dict(
                T=t,
                examples=induction.attrs["examples_per_length"][t],
                best_induction=float(scores.max()),
                best_head=f"L{int(induction['layer'].iloc[best])}H{int(induction['head'].iloc[best])}",
                induction_heads=int((scores > INDUCTION).sum()),
                best_duplicate=float(dup.max()),
                duplicate_heads=int((dup > DUPLICATE).sum()),
                loss_gain_nats=float(gains.get(t, np.nan)),
            )
        )
    return pd.DataFrame(rows)


def draw_curve(curve: pd.DataFrame, induction: pd.DataFrame, title: str):
    fig = new_figure(figsize=(6.5, 3.8))
    ax = fig.add_subplot()
    top = induction.nlargest(5, "induction")
    for _, head in top.iterrows():
        values = [head[f"induction_T{t}"] for t in curve["T"]]
        ax.plot(curve["T"], values, marker="o", label=f"L{int(head['layer'])}H{int(head['head'])}")
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(curve["T"], [str(t) for t in curve["T"]])
    ax.set_xlabel("T (random tokens in each copy)")
    ax.set_ylabel("induction score (attention on i - T + 1)")
    ax.set_ylim(0, 1.02)
    ax.legend(title="the 5 best heads", loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    ax.set_title("\n".join(textwrap.wrap(title, 65)), fontsize=8)
    return fig


def llm_report(store: Store, run, out: str, repeated_run=None, needle_run=None) -> Path:
    """Write llm.md, its tables and figures for `run` (real text; a causal LM), `repeated_run` (the generated
    repeated-token dataset, for induction and duplicate heads) and `needle_run` (needle-in-a-haystack prompts ingested
    with their generation, for retrieval heads) into `out`."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    info = store.run_info(run)
    caption = _caption(store, run)
    sinks = run_query(store, "attention_sink", run=run)
    previous = run_query(store, "previous_token_heads", run=run)
    streaming = run_query(store, "streaming_heads", run=run)
    hitters = run_query(store, "heavy_hitters", run=run)
    massive = run_query(store, "massive_activations", run=run) if info.has_hidden_peaks else None
    induction = duplicate = None
    if repeated_run is not None:
        induction = run_query(store, "induction_heads", run=repeated_run)
        duplicate = run_query(store, "duplicate_token_heads", run=repeated_run)
    types = head_types(sinks, previous, streaming, induction, duplicate)
    lines = [f"# Decoder attention: {info.model}", "", f"Real text: {caption}.", ""]
    if repeated_run is not None:
        lines += [f"Repeated random tokens: {_caption(store, repeated_run)}.", ""]

    lines += ["## Attention sinks and massive activations", ""]
    per_layer = sinks.groupby("layer")[["position_0", "position_1", "importance"]].mean().reset_index()
    if massive is not None:
        peaks = massive[["layer", "peak", "position", "token", "dim", "median", "ratio", "first_token_share"]]
        per_layer = per_layer.merge(peaks, on="layer")
    lines += [
        f"Gu et al.'s Sink_1^eps (window {sinks.attrs['window']}, eps {sinks.attrs['epsilon']}): "
        f"{sinks.attrs['sink_percentage']:.1f} % of (example, layer, head) over {sinks.attrs['windowed_examples']} examples "
        f"({sinks.attrs['short_examples']} shorter than the window left out).",
        "",
        _table(per_layer, folder, "sinks_by_layer"),
        "",
    ]
    figures = _save(draw_sinks_and_activations(sinks, massive, f"{caption}: sinks by layer, massive activations"), folder, "sinks")
    if massive is None:
        how = "the run keeps no hidden-state peaks: ingest a causal LM with its per-token loss"
        lines.append(left_out("llm", "massive activations", how))

    lines += ["", "## Head types", "", _rules_text(), ""]
    counts = types["type"].value_counts().reindex(TYPES, fill_value=0).rename_axis("type").reset_index(name="heads")
    lines += [_table(counts, folder, "head_type_counts"), ""]
    types.to_csv(folder / "head_types.csv", index=False)
    figures += _save(draw_types(types, info.n_layers, info.n_heads, f"{info.model}: head types"), folder, "head_types")

    lines += ["", "## Induction and duplicate-token heads", ""]
    if induction is not None and duplicate is not None:
        curve = induction_curve(induction, duplicate)
        lines += [_table(curve, folder, "induction_curve"), ""]
        best = induction.nlargest(10, "induction")
        lines += [_table(best, folder, "induction_heads"), ""]
        figures += _save(draw_curve(curve, induction, f"{_caption(store, repeated_run)}: induction score by T"), folder, "induction_curve")
    else:
        lines.append(
            left_out("llm", "induction and duplicate-token heads", "give --repeated-run (a run of generated/repeated_tokens:T20,50,200)")
        )

    lines += ["", "## Heavy hitters (H2O)", "", _table(hitters.nlargest(10, "mass_top10"), folder, "heavy_hitters"), ""]
    lines += ["", "## Retrieval heads (Wu et al. 2024)", ""]
    if needle_run is not None:
        retrieval = run_query(store, "retrieval_heads", run=needle_run)
        lines += [
            f"{_caption(store, needle_run)}: the answer recalled the needle (ROUGE-1 recall > 0.5) in "
            f"{retrieval.attrs['retrieved']} of {retrieval.attrs['examples']} examples; "
            f"{int(retrieval['retrieval_head'].sum())} heads score over {retrieval.attrs['threshold']}.",
            "",
            _table(retrieval.nlargest(10, "retrieval"), folder, "retrieval_heads"),
            "",
        ]
        if induction is not None:
            both = retrieval.merge(induction[["layer", "head", "induction"]], on=["layer", "head"])
            corr = float(both["retrieval"].corr(both["induction"], method="spearman"))
            lines += [f"Spearman correlation of the heads' retrieval and induction scores: {corr:.2f}.", ""]
    else:
        how = "give --needle-run (a run of generated/needle:L1000,2000 ingested with --generate 50)"
        lines.append(left_out("llm", "retrieval heads (Wu et al. 2024)", how))
    lines += ["", "Figures: " + ", ".join(figures), ""]
    path = folder / "llm.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _rules_text() -> str:
    return (
        f"Each head is the first type whose rule it meets: induction (score > {INDUCTION} on the repeated run), duplicate "
        f"(> {DUPLICATE}), previous token (attention on i - 1 > {PREVIOUS} on real text), sink (attention on the first "
        f"token > {SINK} over the rows that see it), streaming (first 4 + last 64 keys keep > 0.9 of each row), else other."
    )
