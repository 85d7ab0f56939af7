"""What the per-example extras cost beside the maps (issue 27), as ratios measured in one run.

1. Value norms at ingest: the forward passes ingest runs (stopped at the last map), with and without catching the
   value projections and computing ||f_h(x_j)|| (ingest/norms.py), alternated over the same MRPC dev batches.
2. Saliency (`attnstore saliency`): the job's time over a fine-tuned model's run against bare forward passes of the
   same classifier over the same tokens and batch size, alternated (needs --store and --run of such a run).

    python benchmarks/extras_cost.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--rounds 5]
    python benchmarks/extras_cost.py --store DIR --run RUN      # also the saliency job

The ingest figure with writes included is `make bench`'s "ingest with value norms / without".
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def norms_cost(corpus: str, rounds: int) -> None:
    import torch

    from attnstore.ingest import capture, norms
    from attnstore.ingest.model import load_model

    loaded = load_model("all-MiniLM-L6-v2")
    rows = [line.rstrip("\n").split("\t") for line in open(corpus, encoding="utf-8")][1:]
    tok = loaded.tokenizer
    batches = []
    for i in range(0, len(rows), 32):
        part = rows[i : i + 32]
        batches.append(dict(tok([r[3] for r in part], [r[4] for r in part], return_tensors="pt", padding=True, truncation=True)))
    projections = loaded.value_projections

    def passes(with_norms: bool) -> tuple[float, float]:
        started, computing = time.perf_counter(), 0.0
        with torch.inference_mode():
            for batch in batches:
                with norms.collecting(projections if with_norms else None) as values:
                    capture.attention_maps(loaded.model, batch, loaded.attention_sources)
                if with_norms:
                    t = time.perf_counter()
                    norms.value_norms(projections, values, [int(n) for n in batch["attention_mask"].sum(1)])
                    computing += time.perf_counter() - t
        return time.perf_counter() - started, computing

    passes(True), passes(False)  # warm-up
    with_, without, computing = [], [], []
    for _ in range(rounds):
        a, c = passes(True)
        b, _ = passes(False)
        with_.append(a), without.append(b), computing.append(c)
    print(f"forward passes over {len(rows)} pairs, {rounds} rounds alternated:")
    print(f"  with value norms    {' '.join(f'{x:.2f}' for x in with_)} s")
    print(f"  without             {' '.join(f'{x:.2f}' for x in without)} s")
    print(f"  with / without      {statistics.median(a / b for a, b in zip(with_, without)):.3f} (median of the rounds)")
    print(f"  norm computation    {statistics.median(c / b for c, b in zip(computing, without)):.3f} of the passes without")


def saliency_cost(folder: str, run: str, rounds: int) -> None:
    import torch

    from attnstore.ingest.saliency import _classifier, compute_saliency
    from attnstore.store import arrays, open_store

    store = open_store(db=f"sqlite:///{folder}/meta.sqlite", root=f"{folder}/attention.zarr")
    info = store.run_info(run)
    classifier = _classifier(store, info.model)
    table = store.token_table(info.id)
    groups = [table[table["example"] == e] for e in store.storage_order(info.id)]

    def bare() -> float:
        started = time.perf_counter()
        with torch.inference_mode():
            for i in range(0, len(groups), 16):
                part = groups[i : i + 16]
                length = max(len(g) for g in part)
                ids = torch.zeros((len(part), length), dtype=torch.long)
                mask = torch.zeros_like(ids)
                for k, g in enumerate(part):
                    ids[k, : len(g)] = torch.tensor(g["token_id"].to_numpy(np.int64))
                    mask[k, : len(g)] = 1
                classifier(input_ids=ids, attention_mask=mask)
        return time.perf_counter() - started

    def job() -> float:
        arrays.set_run_group_attribute(store.locations.array_root, info.array_path, arrays.SALIENCY, None)  # computed anew
        started = time.perf_counter()
        compute_saliency(store, run, batch_size=16)
        return time.perf_counter() - started

    bare()
    bares, jobs = [], []
    for _ in range(rounds):
        bares.append(bare()), jobs.append(job())
    print(f"saliency of run {run!r} ({len(groups)} examples), {rounds} rounds alternated:")
    print(f"  bare forward {' '.join(f'{x:.2f}' for x in bares)} s; saliency job {' '.join(f'{x:.2f}' for x in jobs)} s")
    print(f"  saliency / bare forward {statistics.median(j / b for j, b in zip(jobs, bares)):.2f} (median of the rounds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="../shared/data/glue/MRPC/dev.tsv")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--store", default=None, help="A store folder (meta.sqlite, attention.zarr) holding --run.")
    parser.add_argument("--run", default=None, help="A fine-tuned classifier's run, for the saliency job.")
    args = parser.parse_args()
    norms_cost(args.corpus, args.rounds)
    if args.store and args.run:
        saliency_cost(args.store, args.run, max(1, args.rounds // 2))


if __name__ == "__main__":
    main()
