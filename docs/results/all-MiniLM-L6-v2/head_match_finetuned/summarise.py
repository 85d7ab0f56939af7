"""Summarise head_match of a pre-trained run against its fine-tuned run (issue 28), per task folder.

Reads, in each TASK folder beside this file: head_match.csv and head_match_matrix.csv (`attnstore report head-match
--run PRE --other FT`), head_match_ft_to_pre.csv (`attnstore query head_match --run FT --param other=PRE`),
run_similarity.csv (`attnstore query run_similarity --run PRE --param
other=FT`) and special_tokens_pre_ft.csv (`attnstore query special_tokens` on both runs, stacked with a `run` column).
Writes per_layer.csv and moved_heads.csv into each folder and prints them as markdown.
Usage: python summarise.py [TASK ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from scipy.stats import spearmanr

HERE = Path(__file__).resolve().parent
KEY = ["layer", "head"]


def own_and_other(matrix: pd.DataFrame) -> pd.DataFrame:
    """Per head of A: distance to the same (layer, head) of B, and to the nearest other head of B."""
    same = (matrix["layer"] == matrix["other_layer"]) & (matrix["head"] == matrix["other_head"])
    own = matrix[same].set_index(KEY)[["distance", "null_mean"]].rename(columns={"distance": "self_distance", "null_mean": "self_null"})
    other = matrix[~same].groupby(KEY)["distance"].min().rename("nearest_other_distance")
    return own.join(other).reset_index()


def is_self(frame: pd.DataFrame, prefix: str) -> pd.Series:
    return (frame[f"{prefix}_layer"] == frame["layer"]) & (frame[f"{prefix}_head"] == frame["head"])


def summarise(task: str) -> None:
    folder = HERE / task
    match = pd.read_csv(folder / "head_match.csv")
    back = pd.read_csv(folder / "head_match_ft_to_pre.csv")
    sim = pd.read_csv(folder / "run_similarity.csv")[KEY + ["similarity"]]
    special = pd.read_csv(folder / "special_tokens_pre_ft.csv")
    cls = (
        special.pivot_table(index=KEY, columns="run", values="to_cls")
        .rename(columns={"pre": "to_cls_pre", "ft": "to_cls_ft"})
        .reset_index()
    )
    n = len(match)
    m = match.merge(own_and_other(pd.read_csv(folder / "head_match_matrix.csv")), on=KEY).merge(sim, on=KEY).merge(cls, on=KEY)
    m["self_match"], m["self_best"] = is_self(m, "match"), is_self(m, "best")
    back["self_match"], back["self_best"] = is_self(back, "match"), is_self(back, "best")
    m["sig_01"] = m["p_value"] < 0.01 / n
    per_layer = m.groupby("layer").agg(
        self_match=("self_match", "sum"),
        self_nearest=("self_best", "sum"),
        self_distance=("self_distance", "mean"),
        nearest_other_distance=("nearest_other_distance", "mean"),
        self_null=("self_null", "mean"),
        row_z=("row_z", "mean"),
        similarity=("similarity", "mean"),
        to_cls_pre=("to_cls_pre", "mean"),
        to_cls_ft=("to_cls_ft", "mean"),
        bonferroni_01=("sig_01", "sum"),
    )
    per_layer.insert(2, "self_match_reverse", back.groupby("layer")["self_match"].sum())
    per_layer.insert(3, "self_nearest_reverse", back.groupby("layer")["self_best"].sum())
    per_layer = per_layer.reset_index()
    counts = ["self_match", "self_nearest", "self_match_reverse", "self_nearest_reverse", "bonferroni_01"]
    total = {c: (per_layer[c].sum() if c in counts else m[c if c in m else c].mean()) for c in per_layer.columns if c != "layer"}
    total.update(
        self_distance=m["self_distance"].mean(), nearest_other_distance=m["nearest_other_distance"].mean(), self_null=m["self_null"].mean()
    )
    per_layer = pd.concat([per_layer, pd.DataFrame([{"layer": "all", **total}])], ignore_index=True)
    per_layer.to_csv(folder / "per_layer.csv", index=False)
    best_cls = cls.rename(columns={"layer": "best_layer", "head": "best_head", "to_cls_ft": "best_to_cls_ft"})[
        ["best_layer", "best_head", "best_to_cls_ft"]
    ]
    moved = m.loc[
        ~m["self_best"],
        KEY + ["self_distance", "best_layer", "best_head", "best_distance", "rank", "row_z", "similarity", "to_cls_pre", "to_cls_ft"],
    ].merge(best_cls, on=["best_layer", "best_head"])
    moved.to_csv(folder / "moved_heads.csv", index=False)
    rho, p = spearmanr(m["self_distance"], 1 - m["similarity"])
    rho_cls, p_cls = spearmanr(m["self_distance"], m["to_cls_pre"] - m["to_cls_ft"])
    print(f"## {task}: {int(m['n_examples'].iloc[0])} examples\n")
    print(per_layer.to_markdown(index=False, floatfmt=".4g"))
    print(
        f"\nSpearman over {n} heads: self_distance vs 1 - cosine similarity {rho:.3f} (p={p:.2g}); "
        f"vs drop in to_cls {rho_cls:.3f} (p={p_cls:.2g})"
    )
    print(
        f"max self distance {m['self_distance'].max():.4g} at {m.loc[m['self_distance'].idxmax(), KEY].tolist()}; "
        f"heads with self_distance < self_null: {(m['self_distance'] < m['self_null']).sum()}; "
        f"heads with self_distance < nearest_other_distance: {(m['self_distance'] < m['nearest_other_distance']).sum()}"
    )
    print(
        f"rank of own position: max {m['rank'].max()}, heads with rank > 1: {(m['rank'] > 1).sum()}; row_z min {m['row_z'].min():.3g} "
        f"median {m['row_z'].median():.3g}; median margin {m['margin'].median():.4g}; min z {m['z'].min():.3g}"
    )
    print(f"\nnearest head not itself: {len(moved)}\n")
    if len(moved):
        print(moved.to_markdown(index=False, floatfmt=".3g"))
    rb = back.loc[~back["self_best"], KEY + ["best_layer", "best_head", "best_distance", "distance"]]
    print(f"\nreverse (ft -> pre): non-self one-to-one {int((~back['self_match']).sum())}, non-self nearest {len(rb)}")
    if len(rb):
        print(rb.to_markdown(index=False, floatfmt=".3g"))
    print()


if __name__ == "__main__":
    for task in sys.argv[1:] or sorted(p.name for p in HERE.iterdir() if (p / "head_match.csv").exists()):
        summarise(task)
