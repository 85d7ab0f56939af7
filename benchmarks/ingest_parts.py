"""Benchmark: where ingest's time goes beyond the forward pass (MRPC dev by default).

    python benchmarks/ingest_parts.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--rounds 2]

Each round, in one process with the model loaded and the dataset registered (whitespace words, so
annotation is not in the figures): a bare forward pass over the batches `ingest` forms, a whole
`ingest` into a fresh run, a bare forward pass, an `ingest` whose run writer stores nothing
(`RunWriter.add` and `commit` replaced by no-ops: tokenization, planning, forward pass, float16
conversion and row-sum check only), and a last bare forward pass. Each ingest is compared with the
mean of the two bare passes around it. The difference between the two ratios is what storing costs
the forward pass (on a machine whose cores torch already uses, the storage thread's CPU); what the
second ratio lacks from 1 is the rest of ingest's own work.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from attnstore.ingest import file_source, ingest, register_dataset
from attnstore.ingest.align import encode_batch
from attnstore.ingest.batches import plan_batches
from attnstore.ingest.model import load_model
from attnstore.ingest.passes import forward_attention
from attnstore.store import migrate, open_store
from attnstore.store import writer as run_writer

DEFAULT_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue" / "MRPC" / "dev.tsv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--format", default="pairs-tsv")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="attnstore-ingest-parts-"))
    db = f"sqlite:///{home / 'meta.sqlite'}"
    migrate.upgrade(db)
    store = open_store(db=db, root=str(home / "attention.zarr"))
    loaded = load_model()
    dataset_id, _ = register_dataset(store, file_source(args.corpus, args.format), annotator="whitespace", progress=False)
    examples = list(store.writer.dataset_examples(dataset_id))
    encoded = encode_batch(loaded.tokenizer, examples, loaded.max_length, "truncate", tokenization="text")
    batches = list(plan_batches(encoded, 32))
    forward_attention(loaded, batches[0])  # warm-up

    def bare() -> float:
        t = time.perf_counter()
        for batch in batches:
            forward_attention(loaded, batch)
        return time.perf_counter() - t

    def run(name: str, store_nothing: bool) -> float:
        kept = run_writer.RunWriter.add, run_writer.RunWriter.commit
        if store_nothing:
            run_writer.RunWriter.add = lambda self, *a, **k: None  # type: ignore[method-assign]
            run_writer.RunWriter.commit = lambda self, *a, **k: 0  # type: ignore[method-assign]
        try:
            t = time.perf_counter()
            ingest(store, corpus=args.corpus, fmt=args.format, annotator="whitespace", loaded=loaded, name=name, progress=False)
            return time.perf_counter() - t
        finally:
            run_writer.RunWriter.add, run_writer.RunWriter.commit = kept  # type: ignore[method-assign]

    print(f"{args.corpus}: {len(encoded)} examples, {len(batches)} batches; load average {os.getloadavg()[0]:.2f}")
    print(f"{'round':>5} {'bare s (3 passes)':>20} {'ingest s':>9} {'ratio':>6} {'storing nothing s':>18} {'ratio':>6}")
    for k in range(args.rounds):
        b1 = bare()
        whole = run(f"whole-{k}", store_nothing=False)
        b2 = bare()
        nothing = run(f"nothing-{k}", store_nothing=True)
        b3 = bare()
        print(
            f"{k + 1:>5} {f'{b1:.2f}/{b2:.2f}/{b3:.2f}':>20} {whole:9.2f} {(b1 + b2) / 2 / whole:6.3f} "
            f"{nothing:18.2f} {(b2 + b3) / 2 / nothing:6.3f}"
        )
    print(f"load average at the end {os.getloadavg()[0]:.2f}; store left at {home}")


if __name__ == "__main__":
    main()
