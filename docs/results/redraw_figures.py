"""Redraw the report figures in docs/results with the current drawing code, from the results saved beside them.

The numbers do not change, only the pictures (layout, 0-based layer axes, legends beside the data):

- Kovaleva et al. Figs. 2, 3, 5, 6, 7 (kovaleva/, kovaleva-finetuned/) and Figs. 8, 9 (ablation/, finetuning/)
  are drawn from the CSV files each report wrote next to its figures, with the draw functions the reports use.
  The fine-tuned models and the runs behind them are not needed (they took hours of CPU to make).
- The Primer report's head confidence and pruning curve (primer/), the MRPC pruning curve (pruning/) and the layer
  correspondence of the fine-tuned head matching (head_match_finetuned/*/) are drawn from their CSV files too; the
  pruning curves' majority-class lines read the GLUE dev labels from the data folder (ATTNSTORE_DATA or
  ../shared/data from the working directory).
- Clark et al. Figs. 2, 4, 6 need per-head values the report did not all save (entropy per head, MDS
  coordinates), so they are recomputed from a store holding run ud/en_ewt-dev-all-MiniLM-L6-v2
  (`attnstore ingest --dataset ud/en_ewt:dev`, under a minute) with the convention that report was made with
  (`average="token"`; see the note in docs/results/README.md), after checking that the recomputed values
  reproduce the saved special_tokens.csv and entropy_by_layer.csv. Without --clark-home they are left alone.

    python docs/results/redraw_figures.py [--clark-home FOLDER_OF_THE_STORE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from attnstore.api.ablation_report import draw_pruning, save_ablation_figures
from attnstore.api.head_match_report import draw_layers
from attnstore.api.kovaleva_report import draw_cls, draw_features, draw_frame_heads, draw_patterns, draw_similarity
from attnstore.api.primer_report import draw_confidence
from attnstore.api.report import _save, figure_entropy, figure_mds, figure_special_tokens

HERE = Path(__file__).parent / "all-MiniLM-L6-v2"
MODEL = "all-MiniLM-L6-v2"
N_LAYERS, N_HEADS = 6, 12
MAX_EXAMPLES = 1000  # `attnstore report kovaleva`'s default, used for every Kovaleva report here
# The fine-tuned models whose runs the Kovaleva reports compared (docs/results/README.md, the commands).
FINETUNED = {
    "MRPC": f"{MODEL}-MRPC-pretrained-seed0",
    "RTE": f"{MODEL}-RTE-pretrained-seed0",
    "STS-B": f"{MODEL}-STS-B-pretrained-seed0",
    "SST-2": f"{MODEL}-SST-2-pretrained-seed0-n8000",
}
FRAMES = f"{MODEL} on framenet/1.5:exemplars (22436 examples)"  # the frame run of kovaleva/ (its Fig. 3 caption)
CLARK_RUN = "ud/en_ewt-dev-all-MiniLM-L6-v2"


def _by_task(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {task: table[table["task"] == task] for task in table["task"].unique()}


def redraw_kovaleva(folder: Path) -> list[str]:
    written = []
    csv = lambda stem: pd.read_csv(folder / f"{stem}.csv")  # noqa: E731
    # where the rules' figure has a file of its own, fig2_pattern_classes is the CNN's, drawn with its uncertainty by
    # the report's CNN functions (kovaleva/README.md), which a CSV alone cannot redraw: left alone
    if (folder / "fig2_pattern_classes.csv").exists() and not (folder / "fig2_pattern_classes_rules.csv").exists():
        table = csv("fig2_pattern_classes")
        written += _save(draw_patterns(table, list(table["task"].unique()), MODEL, MAX_EXAMPLES), folder, "fig2_pattern_classes")
    if (folder / "fig3_frame_heads.csv").exists():
        written += _save(draw_frame_heads(csv("fig3_frame_heads"), N_LAYERS, N_HEADS, FRAMES), folder, "fig3_frame_heads")
    if (folder / "fig5_similarity.csv").exists():
        frames = _by_task(csv("fig5_similarity"))
        written += _save(draw_similarity(frames, N_LAYERS, N_HEADS, {t: FINETUNED[t] for t in frames}), folder, "fig5_similarity")
    for stem, title, models in (
        ("fig6_features", "Fig. 6: normalised attention to feature tokens (pre-trained)", lambda task: MODEL),
        ("fig6_features_finetuned", "Fig. 6: normalised attention to feature tokens after fine-tuning", lambda task: FINETUNED[task]),
    ):
        if (folder / f"{stem}.csv").exists():
            frames = _by_task(csv(stem))
            written += _save(draw_features(frames, N_LAYERS, N_HEADS, {t: models(t) for t in frames}, title), folder, stem)
    if (folder / "fig7_cls_attention.csv").exists():
        table = csv("fig7_cls_attention")
        written += _save(draw_cls(table, list(table["task"].unique()), MODEL), folder, "fig7_cls_attention")
    return written


def redraw_ablation(folder: Path, mode: str) -> list[str]:
    headline = pd.read_csv(folder / f"ablation_{mode}.csv")
    headline["disabled_heads"] = headline["disabled_heads"].map(json.loads)
    written = []
    for _, group in headline.groupby(["model", "task"], sort=False):
        written += save_ablation_figures(group, N_LAYERS, N_HEADS, folder, mode)
    return written


def redraw_primer(folder: Path) -> list[str]:
    """head_roles.png from head_roles.csv (the caption of the run the report read) and pruning_zero.png."""
    roles = pd.read_csv(folder / "head_roles.csv")
    caption = f"{MODEL} on glue/MRPC:dev (408 examples, run MRPC-dev)"  # the report's --run (docs/results/README.md)
    written = _save(draw_confidence(roles, N_LAYERS, N_HEADS, caption), folder, "head_roles")
    steps = pd.read_csv(folder / "pruning_zero.csv").melt(id_vars="n_pruned", var_name="metric", value_name="score").dropna()
    return written + _save(draw_pruning(steps, f"{MODEL}-SST-2-pretrained-seed0-n4000", "SST-2", "zero"), folder, "pruning_zero")


def redraw_pruning(folder: Path) -> list[str]:
    """prune_MRPC_zero.png, as `attnstore prune --figure` drew it (PNG only), from prune_MRPC_zero.csv."""
    steps = pd.read_csv(folder / "prune_MRPC_zero.csv")
    fig = draw_pruning(steps, f"{MODEL}-MRPC-pretrained-seed0", "MRPC", "zero")
    fig.savefig(folder / "prune_MRPC_zero.png", dpi=150, bbox_inches="tight")
    return ["prune_MRPC_zero.png"]


def redraw_head_match_layers(folder: Path) -> list[str]:
    """Each task's head_match_layers from its head_match.csv and head_match_layers.csv: A the pre-trained model, B the
    fine-tuned one (named in the task's README.md title)."""
    written = []
    for task in ("MRPC", "RTE", "SST-2"):
        title = (folder / task / "README.md").read_text(encoding="utf-8").splitlines()[0]
        tuned = title.split(" against ")[1].split(" (")[0]
        a = SimpleNamespace(model=MODEL, n_layers=N_LAYERS, n_heads=N_HEADS)
        b = SimpleNamespace(model=tuned, n_layers=N_LAYERS, n_heads=N_HEADS)
        match = pd.read_csv(folder / task / "head_match.csv")
        match["match_layer"] = match["match_layer"].astype("Int64")
        depths = pd.read_csv(folder / task / "head_match_layers.csv")
        written += _save(draw_layers(depths, match, a, b), folder / task, "head_match_layers")
    return written


def redraw_clark(home: str) -> list[str]:
    import attnstore

    store = attnstore.open_store(home=home, read_only=True)
    saved = pd.read_csv(HERE / "special_tokens.csv")
    out = HERE
    names, special = figure_special_tokens(store, CLARK_RUN, out, average="token")
    np.testing.assert_allclose(special[saved.columns].to_numpy(), saved.to_numpy(), atol=1e-5)  # the data of the tables
    names4, entropy = figure_entropy(store, CLARK_RUN, out, average="token")
    by_layer = entropy.groupby("layer")[["entropy", "entropy_from_cls", "uniform_entropy"]].mean().reset_index()
    saved4 = pd.read_csv(HERE / "entropy_by_layer.csv")
    np.testing.assert_allclose(by_layer[saved4.columns].to_numpy(), saved4.to_numpy(), atol=1e-5)
    examples = store.examples(CLARK_RUN)["example"].iloc[:500].tolist()  # the report's --mds-examples default
    names6, _ = figure_mds(store, CLARK_RUN, out, examples, average="token")
    return names + names4 + names6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clark-home", help="store folder holding run " + CLARK_RUN + " (redraws Clark Figs. 2, 4, 6)")
    args = parser.parse_args()
    written = redraw_kovaleva(HERE / "kovaleva") + redraw_kovaleva(HERE / "kovaleva-finetuned")
    written += redraw_ablation(HERE / "ablation", "uniform")
    written += redraw_ablation(HERE / "finetuning", "uniform") + redraw_ablation(HERE / "finetuning", "mean")
    written += redraw_primer(HERE / "primer") + redraw_pruning(HERE / "pruning")
    written += redraw_head_match_layers(HERE / "head_match_finetuned")
    if args.clark_home:
        written += redraw_clark(args.clark_home)
    print(f"redrew {len(written)} files")


if __name__ == "__main__":
    main()
