"""How small a log-domain code of a run's maps compresses (issue 29's lossy target), before building one.

A log-domain code keeps relative precision for small probabilities: q = round(-s log2 a) in one byte (0..254; 255 for
a < floor, decoded as 0), decoded as 2^(-q/s), so every value >= floor is within 2^(1/(2s)) - 1 of itself. The script
reads the first --cells cells of a stored run, codes them for several steps s and floors, and prints bytes per cell
after blosc-zstd (level 1 as the store uses, and level 9) with the largest relative error and what the floor drops;
for comparison, float16 with its mantissa rounded to k bits (another relative-precision code that plain zarr reads).
With --contexts, also what an entropy coder with a context model could reach (the bound such a coder, e.g. rANS,
approaches, before the cost of its model): the empirical entropy of the codes in bits per cell, alone and given the
code before it in its row, and given that and the code above it (same key, the query before). With --accuracy, also
tiered codes (coarse steps for small values, fine ones for large, 1 - a above 0.5) with what each moves of the
measures the queries build on (per-head entropies, attention to [CLS], rows' argmax) against the issue's 1 % bar.

    python benchmarks/log_codes.py --root attnstore-data/attention.zarr --run MRPC-dev-all-MiniLM-L6-v2
"""

from __future__ import annotations

import argparse

import numpy as np
import zarr
from numcodecs import Blosc


def log_code(a: np.ndarray, step: float, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """(codes, decoded values) of the one-byte log code."""
    with np.errstate(divide="ignore"):
        q = np.where(a < floor, 255, np.clip(np.rint(-np.log2(a) * step), 0, 254)).astype(np.uint8)
    return q, np.where(q == 255, 0.0, 2.0 ** (-q.astype(np.float64) / step))


def mantissa_rounded(a16: np.ndarray, keep: int) -> np.ndarray:
    """float16 with its 10-bit mantissa rounded (half to even) to `keep` bits."""
    u = a16.view(np.uint16).astype(np.uint32)
    drop = 10 - keep
    u = (u + (1 << (drop - 1)) - 1 + ((u >> drop) & 1)) >> drop << drop
    return u.astype(np.uint16).view(np.float16)


def conditional_entropy(codes: np.ndarray, *contexts: np.ndarray) -> float:
    """H(codes | contexts) in bits per code, from the counts of (context, code) and of context."""
    key = np.zeros(len(codes), dtype=np.int64)
    for c in contexts:
        key = key * 256 + c
    joint = np.unique(key * 256 + codes, return_counts=True)[1]
    given = np.unique(key, return_counts=True)[1] if contexts else np.array([len(codes)])
    n = len(codes)
    return float(-(joint * np.log2(joint / n)).sum() / n + (given * np.log2(given / n)).sum() / n)


def context_table(g, cells: np.ndarray, floors_steps: list[tuple[int, float]]) -> None:
    """Bits per cell of each code alone, given the code on its left, and given the left and the one above."""
    lengths, offsets = np.asarray(g["length"][:]), np.asarray(g["offset"][:])
    maps_per_example = (offsets[1] - offsets[0]) // (int(lengths[0]) ** 2)  # layers x heads
    left = np.full(len(cells), -1, dtype=np.int64)  # index of the cell before in the row, -1 at a row's start
    above = np.full(len(cells), -1, dtype=np.int64)  # index of the cell one row up in the same map, -1 in row 0
    for length, offset in zip(lengths.tolist(), offsets.tolist()):
        if offset >= len(cells):
            break
        idx = np.arange(offset, min(offset + maps_per_example * length * length, len(cells)))
        within = (idx - offset) % (length * length)
        col, row = within % length, within // length
        left[idx[col > 0]] = idx[col > 0] - 1
        above[idx[row > 0]] = idx[row > 0] - length
    print(f"\n{'code':34s} {'bits/cell: alone':>16s} {'| left':>8s} {'| left, above':>13s} {'as B/cell':>10s}")
    for step, floor_exp in floors_steps:
        q, _ = log_code(cells, step, 2.0**-floor_exp)
        q = q.astype(np.int64)
        start = 256  # a context value for "none" (row start / first row)
        lq = np.where(left >= 0, q[np.maximum(left, 0)], start)
        aq = np.where(above >= 0, q[np.maximum(above, 0)], start)
        h0, h1, h2 = conditional_entropy(q), conditional_entropy(q, lq), conditional_entropy(q, lq, aq)
        print(f"log, step 1/{step} octave, floor 2^-{floor_exp:<4d} {h0:16.2f} {h1:8.2f} {h2:13.2f} {h2 / 8:10.3f}")


def tiered_code(floor_exp: int, coarse_until: int, coarse: int, fine: int, top: int, top_floor_exp: int):
    """Bin edges and decoded values of a one-byte code with more steps where the queries need them: a bin [0, 2^-floor)
    decoded as 0.3 x its edge; `coarse` steps per octave up to 2^-coarse_until and `fine` steps up to 0.5; above 0.5,
    1 - a coded in `top` steps per octave down to 2^-top_floor (so a row's peak keeps relative precision in what the
    other cells share). Each bin decodes to the mean of a log-uniform value inside it (zero mean error per bin)."""
    low = 2.0 ** (-floor_exp + np.arange((floor_exp - coarse_until) * coarse) / coarse)
    mid = 2.0 ** (-coarse_until + np.arange((coarse_until - 1) * fine + 1) / fine)
    high = 1 - 2.0 ** (-1 - np.arange(1, (top_floor_exp - 1) * top + 1) / top)
    edges = np.concatenate([low, mid, high])
    assert len(edges) < 256, f"{len(edges) + 1} codes do not fit a byte"
    lo, hi = np.concatenate([[0.0], edges]), np.concatenate([edges, [1.0]])
    mirrored = lo >= 0.5  # bins of 1 - a
    a, b = np.where(mirrored, 1 - hi, lo), np.where(mirrored, 1 - lo, hi)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(a > 0, (b - a) / np.log(b / a), 0.3 * b)
    return edges, np.where(mirrored, 1 - mean, mean)


def accuracy_table(group, cells: np.ndarray, blosc) -> None:
    """Per tiered code: bytes per cell and how far it moves what the queries compute from the maps. Stand-ins, per
    (layer, head) over the cells read: the mean row entropy (Clark et al.'s entropy query), the [CLS] row's entropy
    (entropy_from_cls), the mean attention to [CLS], and the share of rows whose argmax stays (what dependency,
    coreference and head_trees count). "within" is the issue's bar: 1 % relative or 1e-3 absolute."""
    lengths, offsets = np.asarray(group["length"][:]), np.asarray(group["offset"][:])
    heads = (offsets[1] - offsets[0]) // (int(lengths[0]) ** 2)
    maps = [
        (offset, length) for length, offset in zip(lengths.tolist(), offsets.tolist()) if offset + heads * length * length <= len(cells)
    ]

    def measures(values: np.ndarray):
        entropy, cls_entropy, to_cls, rows, argmax = np.zeros(heads), np.zeros(heads), np.zeros(heads), 0, []
        for offset, length in maps:
            m = values[offset : offset + heads * length * length].reshape(heads, length, length).astype(np.float64)
            with np.errstate(divide="ignore", invalid="ignore"):
                e = -np.where(m > 0, m * np.log(np.where(m > 0, m, 1.0)), 0.0).sum(axis=2)
            entropy += e.sum(axis=1)
            cls_entropy += e[:, 0]
            to_cls += m[:, :, 0].sum(axis=1)
            rows += length
            argmax.append(m.argmax(axis=2))
        return entropy / rows, cls_entropy / len(maps), to_cls / rows, argmax

    def worst(a: np.ndarray, b: np.ndarray) -> str:
        over = np.abs(a - b) / np.maximum(np.abs(b) * 0.01, 1e-3)  # > 1: outside the bar
        return f"{np.abs(a - b).max():.4f} ({over.max():.1f}x)"

    ref = measures(cells)
    print(f"\n{len(maps)} examples; largest change per head, and as a multiple of the bar (1 % or 1e-3):")
    print(
        f"{'tiered code (floor, coarse until, steps/octave coarse, fine, 1-a; 1-a floor)':78s} {'B/cell':>6s} "
        f"{'entropy':>15s} {'CLS entropy':>15s} {'to CLS':>15s} {'argmax kept':>11s}"
    )
    for spec in [
        (16, 6, 1, 4, 4, 12),
        (16, 5, 1, 8, 8, 12),
        (16, 6, 1, 2, 4, 10),
        (20, 4, 2, 4, 8, 14),
        (20, 8, 2, 8, 8, 14),
        (20, 8, 4, 8, 8, 14),
        (20, 6, 4, 16, 8, 14),
    ]:
        edges, decode = tiered_code(*spec)
        q = np.searchsorted(edges, cells, side="right").astype(np.uint8)
        size = sum(len(blosc.encode(q[i : i + (1 << 20)])) for i in range(0, len(q), 1 << 20)) / len(q)
        got = measures(decode[q].astype(np.float16))
        kept = min(float(np.mean(np.concatenate([(a == b)[h].ravel() for a, b in zip(ref[3], got[3])]))) for h in range(heads))
        label = f"floor 2^-{spec[0]}, 1/{spec[2]} oct to 2^-{spec[1]}, 1/{spec[3]} to 0.5, 1-a 1/{spec[4]} to 2^-{spec[5]}"
        print(
            f"{label:78s} {size:6.3f} {worst(got[0], ref[0]):>15s} {worst(got[1], ref[1]):>15s} {worst(got[2], ref[2]):>15s} {kept:11.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--run", required=True, help="The run's group name under runs/ (its slug).")
    parser.add_argument("--cells", type=int, default=20_000_000)
    parser.add_argument("--contexts", action="store_true", help="Also the entropy bound of a context-modelling coder.")
    parser.add_argument("--no-table", action="store_true", help="Skip the size table of the one-byte codes above.")
    parser.add_argument("--accuracy", action="store_true", help="Also tiered codes (finer steps for large values) and what they change.")
    args = parser.parse_args()
    group = zarr.open_group(args.root, path=f"runs/{args.run}", mode="r")
    cells16 = np.asarray(group["cells"][: args.cells]).astype(np.float16)
    cells = cells16.astype(np.float64)
    fast, strong = (Blosc(cname="zstd", clevel=level, shuffle=Blosc.NOSHUFFLE, blocksize=1 << 18) for level in (1, 9))
    shuffled = Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE, blocksize=1 << 18)
    lossless = len(shuffled.encode(cells16)) / len(cells)
    print(f"{len(cells):,} cells of run {args.run!r}; lossless float16 (the store's codec): {lossless:.3f} B/cell")
    print(f"{'code':34s} {'B/cell zstd1':>12s} {'zstd9':>7s} {'max rel err':>11s} {'largest dropped':>15s} {'dropped':>8s}")
    for step in () if args.no_table else (2, 3, 4, 6, 8):
        for floor_exp in (12, 16, 20):
            floor = 2.0**-floor_exp
            q, decoded = log_code(cells, step, floor)
            kept = cells >= floor
            rel = np.abs(decoded - cells)[kept] / cells[kept]
            dropped = cells[~kept].max() if (~kept).any() else 0.0
            sizes = len(fast.encode(q)) / len(q), len(strong.encode(q)) / len(q)
            print(
                f"log, step 1/{step} octave, floor 2^-{floor_exp:<4d} {sizes[0]:12.3f} {sizes[1]:7.3f} "
                f"{rel.max():11.3f} {dropped:15.2e} {1 - kept.mean():8.3f}"
            )
    for keep in () if args.no_table else (0, 1, 2, 3, 4):
        r = mantissa_rounded(cells16, keep)
        big = cells >= 2.0**-14  # normal float16 numbers
        rel = np.abs(r.astype(np.float64) - cells)[big] / cells[big]
        print(f"float16, mantissa kept {keep} bits          {len(shuffled.encode(r)) / len(r):12.3f} {'':>7s} {rel.max():11.3f}")
    if args.contexts:
        context_table(group, cells, [(2, 12), (3, 16), (4, 16), (8, 16)])
    if args.accuracy:
        accuracy_table(group, cells, fast)


if __name__ == "__main__":
    main()
