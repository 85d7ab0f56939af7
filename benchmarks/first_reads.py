"""First reads of one example from several stores of the same run, each against exBERT-style HDF5 in a loop of its own.

Two readers at a time, in turns, who goes first alternating (a third reader in the same turns slows HDF5's reads and
flatters the ratio: docs/PERFORMANCE.md, 2026-11-28 "fair first reads in the peer bench"), over distinct random
examples, so every timed read is the
first of its example in the process. The HDF5 file (one group per example, uncompressed, as exBERT writes it) is
written from the first store's maps unless `--hdf5` names one written before. Compare two layouts of one corpus, e.g.
a store ingested before 6063b8b (2026-11-28: examples packed) and one ingested since (each in the fewest blosc blocks):

    python benchmarks/first_reads.py --run MRPC-dev --homes OLD_HOME NEW_HOME [--samples 300] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import first_reads_in_turns, write_exbert_hdf5  # noqa: E402  (a sibling script)

from attnstore.store import open_store  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="the run's name, the same in every store")
    parser.add_argument("--homes", nargs="+", required=True, help="store folders (meta.sqlite, attention.zarr)")
    parser.add_argument(
        "--hdf5",
        default=None,
        help="an HDF5 file of the run written before by this script or peers.py (default: written now)",
    )
    parser.add_argument("--samples", type=int, default=300, help="distinct random examples timed per store")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    hdf5 = Path(args.hdf5) if args.hdf5 else Path(tempfile.mkdtemp(prefix="attnstore-first-reads-")) / "attn.hdf5"
    if not args.hdf5:
        with open_store(home=args.homes[0], read_only=True) as store:
            table = store.token_table(args.run)
            tokens = {int(e): list(group["token"]) for e, group in table.groupby("example", sort=False)}
            write_exbert_hdf5(hdf5, store, args.run, tokens)
    print(f"{'store':40s} {'p50 ms':>8s} {'p90 ms':>8s} {'HDF5 p50':>9s} {'HDF5 p90':>9s} {'ratio p50':>10s} {'ratio p90':>10s}")
    with h5py.File(hdf5, "r") as f:
        for home in args.homes:
            with open_store(home=home, read_only=True) as store:
                positions = [int(e) for e in store.examples(args.run, texts=False)["example"]]
                picks = random.Random(args.seed).sample(positions, min(args.samples + 10, len(positions)))
                for e in picks[:10]:  # warm-up: the run's info, its array, the first chunk files' checks
                    store.attention(args.run, e)
                ours_ms, hdf5_ms = first_reads_in_turns(lambda e, store=store: store.attention(args.run, e), f, picks[10:], check=3)
                ours, peer = np.percentile(ours_ms, [50, 90]), np.percentile(hdf5_ms, [50, 90])
                ratio = ours / peer
                print(f"{home:40s} {ours[0]:8.3f} {ours[1]:8.3f} {peer[0]:9.3f} {peer[1]:9.3f} {ratio[0]:10.2f} {ratio[1]:10.2f}")


if __name__ == "__main__":
    main()
