"""Measure candidate Zarr codecs on real stored attention maps: bytes per cell, encode and decode speed.

    python benchmarks/choose_codec.py --run MRPC-dev-all-MiniLM-L6-v2 [--home attnstore-data] [--cells 41943040]

The default codec of attnstore (store/arrays.py, DEFAULT_CODEC) was chosen with this script on the
MRPC dev maps of all-MiniLM-L6-v2: the only lossless float16 candidate under 1.7 bytes/cell.
Chunks are encoded one at a time, as Zarr writes them.
"""

from __future__ import annotations

import argparse
import time

from numcodecs import Blosc

from attnstore import open_store
from attnstore.store import arrays

CANDIDATES = [
    ("zstd", 1, Blosc.SHUFFLE, 1 << 18),
    ("zstd", 1, Blosc.SHUFFLE, 1 << 17),  # smaller blocks: less decoded at an example's edges (2026-11-27: 1.80 B/cell)
    ("zstd", 1, Blosc.SHUFFLE, 1 << 16),
    ("zstd", 1, Blosc.SHUFFLE, 0),
    ("zstd", 3, Blosc.SHUFFLE, 1 << 18),
    ("zstd", 1, Blosc.BITSHUFFLE, 1 << 18),
    ("lz4", 5, Blosc.SHUFFLE, 1 << 18),
    ("lz4", 5, Blosc.BITSHUFFLE, 1 << 16),
    ("blosclz", 5, Blosc.BITSHUFFLE, 1 << 16),
]
SHUFFLES = {Blosc.NOSHUFFLE: "none", Blosc.SHUFFLE: "byte", Blosc.BITSHUFFLE: "bit"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True)
    parser.add_argument("--home", default=None)
    parser.add_argument("--cells", type=int, default=40 << 20)
    parser.add_argument("--chunk-cells", type=int, default=arrays.DEFAULT_CHUNK_CELLS)
    args = parser.parse_args()
    store = open_store(home=args.home)
    info = store.run_info(args.run)
    data = store._array(info)[: args.cells]
    chunk = args.chunk_cells
    print(f"{len(data):,} cells of run {info.name} ({info.dtype}), chunks of {chunk:,} cells")
    print(f"{'codec':34s} {'bytes/cell':>10s} {'encode ns/cell':>15s} {'decode ns/cell':>15s}")
    for cname, level, shuffle, blocksize in CANDIDATES:
        codec = Blosc(cname, level, shuffle, blocksize=blocksize)
        start = time.perf_counter()
        encoded = [codec.encode(data[i : i + chunk]) for i in range(0, len(data), chunk)]
        enc = (time.perf_counter() - start) / len(data) * 1e9
        start = time.perf_counter()
        for blob in encoded:
            codec.decode(blob)
        dec = (time.perf_counter() - start) / len(data) * 1e9
        size = sum(len(b) for b in encoded) / len(data)
        label = f"blosc {cname}-{level} {SHUFFLES[shuffle]}-shuffle bs={blocksize or 'auto'}"
        print(f"{label:34s} {size:10.3f} {enc:15.2f} {dec:15.2f}")


if __name__ == "__main__":
    main()
