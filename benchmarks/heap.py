"""Benchmark: glibc's heap settings and the forward pass (store/heap.py).

    python benchmarks/heap.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--pairs 160] [--rounds 2]

Each setting runs in a fresh process (heap settings are per process): load the default model with
torch on one thread, then time the eager forward passes (`output_attentions`, plus the float16 copy
ingest makes) over the first `--pairs` pairs of the corpus in batches of 32, and report wall time,
CPU time, system CPU time and minor page faults of those passes. Settings, interleaved over rounds:

  default    glibc's dynamic mmap threshold (load_model's own setting left out)
  dask       MALLOC_TRIM_THRESHOLD_=65536 in the environment, as Dask's nanny gives its workers
  reading    heap.for_reading(): mmap threshold 1 MiB (query commands)
  forward    heap.for_forward(): 32 MiB mmap threshold, 128 MiB trim threshold (what load_model sets)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

DEFAULT_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue" / "MRPC" / "dev.tsv"
SETTINGS = ("default", "dask", "reading", "forward")


def measure(setting: str, corpus: str, pairs: int) -> dict:
    """In this (child) process: the forward passes' costs under `setting`."""
    import resource
    import time

    import torch

    from attnstore.ingest.model import load_model
    from attnstore.store import heap

    torch.set_num_threads(1)
    if setting != "forward":
        heap.for_forward = lambda: None  # type: ignore[assignment]  # load_model's setting, left out here
    if setting == "reading":
        heap.for_reading()
    loaded = load_model()
    rows = [line.split("\t") for line in Path(corpus).read_text().splitlines()[1 : pairs + 1]]
    enc = loaded.tokenizer([r[3] for r in rows], [r[4] for r in rows], padding=True, truncation=True, return_tensors="pt")
    batches = [{k: v[i : i + 32] for k, v in enc.items()} for i in range(0, len(rows), 32)]
    with torch.inference_mode():
        loaded.model(**batches[0], output_attentions=True)  # warm-up
        before, cpu, wall = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
        for batch in batches:
            out = loaded.model(**batch, output_attentions=True)
            torch.stack(out.attentions).to(torch.float16).numpy().copy()
        after = resource.getrusage(resource.RUSAGE_SELF)
    return dict(
        wall=time.perf_counter() - wall,
        cpu=time.process_time() - cpu,
        sys=after.ru_stime - before.ru_stime,
        faults=after.ru_minflt - before.ru_minflt,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--pairs", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.corpus, args.pairs)))
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    print(f"{args.pairs} pairs of {args.corpus} in batches of 32, torch on 1 thread; load average {os.getloadavg()[0]:.2f}")
    print(f"{'round':>5} {'setting':8} {'wall s':>7} {'cpu s':>6} {'sys s':>6} {'page faults':>12}")
    for k in range(args.rounds):
        for setting in SETTINGS:
            child_env = {**env, "MALLOC_TRIM_THRESHOLD_": "65536"} if setting == "dask" else env
            out = subprocess.run(
                [sys.executable, __file__, "--child", setting, "--corpus", args.corpus, "--pairs", str(args.pairs)],
                env=child_env,
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{k + 1:>5} {setting:8} {r['wall']:7.2f} {r['cpu']:6.2f} {r['sys']:6.2f} {r['faults']:12,d}")


if __name__ == "__main__":
    main()
