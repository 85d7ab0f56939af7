"""Benchmark: what the opt-in lossy codec (`--codec u8`) saves and what it changes, on a real run.

    python benchmarks/lossy.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--home DIR]

Ingests the corpus twice with the real model (lossless float16, then `--codec u8`) into one
store (a temp folder unless --home), prints bytes per cell of each, then runs every registered
query with its defaults on both runs and prints, per query, the largest absolute change of any
numeric output column and, for per-head queries, whether the best head (largest value) of any
column changes. Queries that do not apply to the corpus (no frames, no mentions, no labels)
are listed as such.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import pandas as pd
from tabulate import tabulate

from attnstore.ingest import ingest
from attnstore.ingest.model import load_model
from attnstore.queries import QUERIES, load_all, run_query
from attnstore.store import arrays, migrate, open_store
from attnstore.store.errors import AttnStoreError

DEFAULT_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue" / "MRPC" / "dev.tsv"
EXTRA_PARAMS = {"word_maps": {"example": 0, "layer": 0, "head": 0}}


def compare(a: pd.DataFrame, b: pd.DataFrame, per_head: bool) -> dict:
    """The largest change of a numeric column (absolute, and relative to the column's largest value), text
    values that changed (e.g. pattern labels), and best-head changes, between two results of one query."""
    numeric = [c for c in a.columns if pd.api.types.is_float_dtype(a[c])]
    keys = [c for c in a.columns if c not in numeric]
    texts: list[str] = []
    if keys and not a.set_index(keys).sort_index().index.equals(b.set_index(keys).sort_index().index):
        texts = [c for c in keys if not pd.api.types.is_integer_dtype(a[c])]  # labels that differ between runs
        keys = [c for c in keys if c not in texts]
    if keys:
        a, b = a.set_index(keys).sort_index(), b.set_index(keys).sort_index()
    out = dict(column="", max_abs_change=0.0, relative=0.0, text_changed="", best_head_changes="no")
    for c in numeric:
        d = float(np.nanmax(np.abs(a[c].to_numpy(float) - b[c].to_numpy(float)), initial=0.0))
        if d >= out["max_abs_change"]:
            scale = float(np.nanmax(np.abs(b[c].to_numpy(float)), initial=0.0)) or 1.0
            out.update(column=c, max_abs_change=d, relative=d / scale)
    if texts:
        changed = int((a[texts].astype(str).to_numpy() != b[texts].astype(str).to_numpy()).any(axis=1).sum())
        out["text_changed"] = f"{', '.join(texts)}: {changed} of {len(a)} rows"
    if per_head and {"layer", "head"} <= set(keys):
        moved = [
            f"{c}: L{a[c].idxmax()[0]}-H{a[c].idxmax()[1]} -> L{b[c].idxmax()[0]}-H{b[c].idxmax()[1]}"
            for c in numeric
            if a[c].notna().any() and b[c].notna().any() and a[c].idxmax() != b[c].idxmax()
        ]
        out["best_head_changes"] = "; ".join(moved) if moved else "no"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--format", default="pairs-tsv")
    parser.add_argument("--home", default=None, help="store folder (default: a new temp folder)")
    args = parser.parse_args()
    home = Path(args.home or tempfile.mkdtemp(prefix="attnstore-lossy-"))
    home.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{home / 'meta.sqlite'}"
    migrate.upgrade(db)
    store = open_store(db=db, root=str(home / "attention.zarr"))
    loaded = load_model()
    runs = {}
    for codec in ("lossless", "u8"):
        name = f"lossy-bench-{codec}"
        start = time.perf_counter()
        runs[codec] = ingest(
            store, corpus=args.corpus, fmt=args.format, loaded=loaded, name=name, codec=dict(arrays.CODECS[codec]), progress=False
        ).run
        print(f"ingest {codec}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    rows = []
    for codec, info in runs.items():
        seqs = store.examples(info.name)
        n_cells = int((info.n_layers * info.n_heads * seqs["length"] ** 2).sum())
        stored = sum(f.stat().st_size for f in (home / "attention.zarr" / info.array_path / "c").rglob("*") if f.is_file())
        rows.append(dict(codec=codec, cells=n_cells, bytes=stored, bytes_per_cell=round(stored / n_cells, 3)))
    print(tabulate(rows, headers="keys", tablefmt="github"))
    print()
    diff = np.float32(0)
    for e in store.examples(runs["u8"].name)["example"][:50]:
        a = store.attention(runs["u8"].name, int(e)).astype(np.float32)
        b = store.attention(runs["lossless"].name, int(e)).astype(np.float32)
        diff = max(diff, np.abs(a - b).max())
    # round(f16(255 v)) is off by at most 0.5 + 0.0625 steps, and decoding to float16 adds < 2**-12: 0.0025 in all
    print(f"largest change of one stored value over 50 examples: {diff:.5f} (bound 0.5625/255 + 2**-12 = {0.5625 / 255 + 2**-12:.5f})\n")
    load_all()
    table = []
    for name, spec in sorted(QUERIES.items()):
        params = EXTRA_PARAMS.get(name, {})
        if name == "run_similarity":  # each run against the lossless one: 1.0 for itself, how far below for u8
            params = {"other": runs["lossless"].name}
        try:
            a = run_query(store, name, run=runs["u8"].name, **params)
            b = run_query(store, name, run=runs["lossless"].name, **params)
        except (AttnStoreError, TypeError, ValueError) as exc:
            table.append(dict(query=name, column=f"not applicable: {str(exc)[:60]}"))
            continue
        row = compare(b, a, spec.per_head)  # lossless first: "relative" is to the lossless values
        row.update(max_abs_change=f"{row['max_abs_change']:.2e}", relative=f"{row['relative']:.1%}")
        table.append(dict(query=name, **row))
    print(tabulate(table, headers="keys", tablefmt="github"))
    store.close()


if __name__ == "__main__":
    main()
