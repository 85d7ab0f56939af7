"""Benchmark: whole-run `relative_position`, `special_tokens` and `entropy` (and with --kinds, the queries of the other
kinds with range reductions: `head_roles`, `rollout`, `feature_attention`, `cls_feature_attention`, `token_to_token`,
`norm_attention`, `head_distances`, `pattern_proportions` and `pattern_heads` over the whole run; on a treebank run
`dependency`, `dependency_summary`, `head_trees` and `head_trees_summary`; on a coreference run `coreference` and
`coreference_summary`) on kept range reductions against the per-example path, from a real run to millions of examples
(issue 29: < 1 s at 8 M examples, peak memory flat).

    python benchmarks/range_summaries.py --source /work/stores/range/data --run MRPC-dev \\
        --factors 1 16 256 4096 20000 65536 --per-example-up-to 20000 --home /work/stores/range/bench \\
        [--kinds clark kovaleva_features kovaleva_relations norm_classes head_js] [--plot docs/img/range_summaries]
        (docs/PERFORMANCE.md, 2026-11-26 "range reductions: whole-run Clark queries at 8 M examples")

The source is a real store with a real run (e.g. `ATTNSTORE_HOME=... attnstore ingest --dataset glue/MRPC:dev
--name MRPC-dev`); each kind's summary (per example) and range reductions are built there first, from the real maps.
For each factor F a store of N = F x (the run's examples) is made SYNTHETICALLY from it:

  SQL      a copy of the source's SQLite file, with (F - 1) x n more examples registered in the run's dataset and as
           the run's stored sequences (rows of `examples` and `sequences`, empty texts, each copy's length that of the
           real example it repeats, offsets past the real cells) and `runs.n_stored` = N: what a query's snapshot,
           committed count and stamp read. No token rows are added (the queries read kept summaries, not tokens).
  maps     the real run's array group hard-linked (its 408 real examples' cells and index; the copies have none:
           nothing here reads maps).
  summary  `summary/<kind>/`: the real run's per-example fields of the kind repeated under the new example ids (the copy
           k of storage slot s is example k * n + s), in chunks of 4,096 examples as the framework writes them; since
           the rows repeat with period n, chunk j holds what chunk j mod (n / gcd(n, 4096)) holds, and is a hard link
           to it: the per-example path reads and decodes every one of the N examples' rows, from few distinct files
           (so mostly from the page cache: a store of real, distinct examples would read more from disk).
           A ragged kind (`word_argmax`, `mention_argmax`, `head_trees`: rows per word or edge) cannot be linked
           chunk by chunk: its rows are written whole at the sizes where the per-example path is timed
           (--per-example-up-to), else only the first range's and the example column (all the range path reads; the
           per-example path is not timed there).
  ranges   `summary/<kind>/ranges/`: each range's reduction, computed by the kind's own `totals` from those rows (on
           the run's relations, for `word_argmax`).

Each (size, path) runs in a child process of its own (`run_query` of the three queries, whole run, best of
--repeats; peak RSS: the child's VmHWM, its own since exec): "per-example" runs them inside queries.engine.per_example_totals(),
"range" leaves it on. The table gives the largest relative difference between the two paths' frames.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
# The kinds that declare range reductions and the whole-run queries that add them.
KIND_QUERIES = {
    "clark": ("relative_position", "special_tokens", "entropy"),
    "head_roles": ("head_roles",),
    "rollout": ("rollout",),
    "kovaleva_features": ("feature_attention", "cls_feature_attention"),
    "kovaleva_relations": ("token_to_token",),
    "norm_classes": ("norm_attention",),
    "head_js": ("head_distances",),
    "word_argmax": ("dependency", "dependency_summary"),  # a treebank run (e.g. --dataset ud/en_ewt:dev)
    "head_trees": ("head_trees", "head_trees_summary"),  # a treebank run
    "mention_argmax": ("coreference", "coreference_summary"),  # a coreference run (--dataset gum/ontogum:dev)
    "pattern_scores": ("pattern_proportions", "pattern_heads"),  # over the whole run, not their default sample of 1,000
}  # attribution_tau (attention_attribution) has ranges too, but needs a fine-tuned classifier's run and its saliency
QUERIES = KIND_QUERIES["clark"]  # set from --kinds in main()
QUERY_PARAMS = {"pattern_proportions": {"max_examples": None}, "pattern_heads": {"max_examples": None}}

CHILD = r"""
import contextlib, json, sys, time
from attnstore.api.cli import bound_heap_growth
bound_heap_growth()
from attnstore.queries import engine as summary, run_query
from attnstore.store import open_store
home, run, path, repeats, out, params = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], json.loads(sys.argv[6])
paths = summary.per_example_totals() if path != "range" else contextlib.nullcontext()
paths.__enter__()  # the per-example path for every query below
store = open_store(home=home, read_only=True)
times, frames = {}, {}
for name in sys.argv[7:]:
    best = []
    for _ in range(repeats):
        t = time.perf_counter()
        frame = run_query(store, name, run=run, **params.get(name, {}))
        best.append(time.perf_counter() - t)
    times[name] = best
    frames[name] = frame.select_dtypes("number").drop(columns=["layer", "head"], errors="ignore").to_numpy(float).tolist()
# this process's own peak RSS (VmHWM: of its address space since exec; ru_maxrss from wait4 would include the
# parent's at the fork)
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) / 1024
json.dump({"times": times, "frames": frames, "peak_mib": peak}, open(out, "w"))
"""


def child(args: list[str], env: dict) -> float:
    """Run a command to completion: its wall seconds."""
    with tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.run(args, env=env, stderr=err, text=True, check=False)
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"failed: {' '.join(args[:4])}\n{err.read()[-3000:]}")
    return wall


def measure(home: Path, run: str, path: str, repeats: int, env: dict) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    wall = child([sys.executable, "-c", CHILD, str(home), run, path, str(repeats), out, json.dumps(QUERY_PARAMS), *QUERIES], env)
    result = json.loads(Path(out).read_text())
    os.unlink(out)
    return dict(times={k: min(v) for k, v in result["times"].items()}, frames=result["frames"], rss=result["peak_mib"], wall=wall)


def prepare_source(source: Path, run: str, kinds: list[str]):
    """Each kind's summary of the source run (storage order, whole) and its range reductions, built from the real maps."""
    from attnstore.queries import load_all, run_query
    from attnstore.queries.engine import KINDS, kept_ranges, summary
    from attnstore.store import open_store

    load_all()
    store = open_store(home=str(source))
    info = store.run_info(run)
    rows, labels = {}, {}
    for name in kinds:
        run_query(store, KIND_QUERIES[name][0], run=run)  # keeps the summary and its ranges if they are not
        kept = kept_ranges(store, info, KINDS[name])
        assert kept is not None, name
        rows[name], labels[name] = summary(store, info, KINDS[name]), kept.labels
    order = rows[kinds[0]]["example"]
    assert all(np.array_equal(r["example"], order) for r in rows.values())
    lengths = store.examples(run, texts=False).set_index("example").loc[order, ["length", "offset"]]
    store.close()
    return info, rows, labels, lengths["length"].to_numpy(np.int64), lengths["offset"].to_numpy(np.int64)


def build(
    source: Path, home: Path, info, rows: dict[str, dict], labels: dict, lengths: np.ndarray, offsets: np.ndarray, factor: int, full: bool
) -> float:
    """The synthetic store of `factor` copies of the source run (see the module docstring); returns seconds. `full`:
    the per-example path is timed on it (ragged kinds' rows are then written whole)."""
    t0 = time.perf_counter()
    n = len(lengths)
    total = n * factor
    if home.exists():
        shutil.rmtree(home)
    (home / "attention.zarr").mkdir(parents=True)
    shutil.copy(source / "meta.sqlite", home / "meta.sqlite")
    src_root, dst_root = source / "attention.zarr", home / "attention.zarr"
    for path in src_root.rglob("*"):  # the real run's arrays and the root's metadata, hard-linked; no summary
        rel = path.relative_to(src_root)
        if "summary" in rel.parts or path.is_dir():
            continue
        (dst_root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.link(path, dst_root / rel)

    # SQL: the copies' examples and sequences
    db = sqlite3.connect(home / "meta.sqlite")
    dataset_id, cells_end = db.execute(
        "SELECT r.dataset_id, max(s.offset + ? * s.length * s.length) FROM runs r JOIN sequences s ON s.run_id = r.id WHERE r.id = ?",
        (info.n_layers * info.n_heads, info.id),
    ).fetchone()
    if factor > 1:
        db.execute("CREATE TEMP TABLE slot (s INTEGER PRIMARY KEY, length INTEGER, offset INTEGER)")
        db.executemany("INSERT INTO slot VALUES (?, ?, ?)", zip(range(n), lengths.tolist(), offsets.tolist()))
        first_id = db.execute("SELECT coalesce(max(id), 0) + 1 FROM examples").fetchone()[0]
        db.execute(
            "WITH RECURSIVE k(x) AS (SELECT ? UNION ALL SELECT x + 1 FROM k WHERE x < ?) "
            "INSERT INTO examples (id, dataset_id, position, text_a) SELECT ? + x - ?, ?, x, '' FROM k",
            (n, total - 1, first_id, n, dataset_id),
        )
        db.execute(
            "INSERT INTO sequences (run_id, example_id, length, offset, truncated, skipped) "
            "SELECT ?, e.id, slot.length, (e.position / ?) * ? + slot.offset, 0, 0 FROM examples e JOIN slot ON slot.s = e.position % ? "
            "WHERE e.dataset_id = ? AND e.position >= ?",
            (info.id, n, cells_end, n, dataset_id, n),
        )
        db.execute("UPDATE runs SET n_stored = ? WHERE id = ?", (total, info.id))
        db.commit()
    db.close()
    for name, kind_rows in rows.items():
        write_kind(dst_root, info, name, kind_rows, labels[name], total, full)
    return time.perf_counter() - t0


def write_kind(dst_root: Path, info, name: str, rows: dict, labels: list[str] | None, total: int, full: bool) -> None:
    """The kind's per-example summary of `total` examples (the real rows repeated) and its range reductions."""
    from attnstore.queries.engine import KINDS, SUMMARY_RANGE, ranges
    from attnstore.store import arrays, summaries

    kind = KINDS[name]
    n = len(rows["example"])
    group = arrays.group_path_of(info.array_path)

    # the per-example summary: rows repeated with period n; chunks beyond the first distinct ones hard-linked
    def tiled(start: int, stop: int) -> dict:
        idx = np.arange(start, stop) % n
        part = {"example": synthetic_examples(rows["example"], n, start, stop)}
        for key, values in rows.items():
            if key in kind.ragged:  # each example's rows, in order, and their offsets from 0
                offsets = rows[f"{key}_start"]
                first, sizes = offsets[idx], offsets[idx + 1] - offsets[idx]
                ends = np.cumsum(sizes)
                part[key] = values[np.repeat(first - (ends - sizes), sizes) + np.arange(int(ends[-1]) if len(ends) else 0)]
                part[f"{key}_start"] = np.r_[0, ends].astype(np.int64)
            elif key != "example" and not (key.endswith("_start") and key[: -len("_start")] in kind.ragged):
                part[key] = values[idx]
        return part

    period = n // math.gcd(n, SUMMARY_RANGE)  # chunks (and ranges) repeat with this period
    # A ragged kind's chunks hold words, not examples, so they cannot be linked: its rows are written whole where the
    # per-example path is timed, else only the first range's, with the example column (all the range path reads).
    real_rows = min(total, period * SUMMARY_RANGE) if not kind.ragged else total if full else min(total, SUMMARY_RANGE)
    writer = summaries.SummaryWriter(str(dst_root), info.array_path, name)
    for start in range(0, real_rows, SUMMARY_RANGE):
        writer.append(tiled(start, min(start + SUMMARY_RANGE, real_rows)))
    node = dst_root / group / "summary" / name
    for key, array in writer.arrays.items():
        if kind.ragged and key != "example":
            continue
        array.resize((total, *array.shape[1:]))
        if key == "example" or real_rows >= total:  # every row written: nothing to link
            continue
        # a field's chunks hold a power of two of rows up to 4,096 (fewer where a row is large), so real_rows (a
        # multiple of n and of 4,096) is a whole number of them, and chunk j repeats chunk j mod that number
        rows_per_chunk = summaries.summary_file_rows(array)  # a shard's rows where the field is sharded
        assert real_rows % rows_per_chunk == 0, (key, rows_per_chunk)
        distinct_chunks = real_rows // rows_per_chunk
        chunk_dir = node / key / "c"
        for j in range(distinct_chunks, -(-total // rows_per_chunk)):
            source_chunk = chunk_dir / str(j % distinct_chunks)  # c/<j> (1-D arrays) or c/<j>/0/0
            files = [source_chunk] if source_chunk.is_file() else [p for p in source_chunk.rglob("*") if p.is_file()]
            for path in files:
                target = chunk_dir / str(j) / path.relative_to(source_chunk)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(path, target)
    example = writer.arrays["example"]
    for start in range(real_rows, total, 1 << 20):
        stop = min(start + (1 << 20), total)
        example[start:stop] = synthetic_examples(rows["example"], n, start, stop)

    # the ranges: each the kind's totals of its rows (period distinct full ranges, and the last, partial one)
    assert kind.totals is not None
    totals = kind.totals if labels is None else functools.partial(kind.totals, labels=labels)
    bounds = ranges(np.arange(total))
    distinct = {j: totals(tiled(int(b[0]), int(b[-1]) + 1)) for j, b in enumerate(bounds[:period])}
    last = len(bounds) - 1
    if len(bounds[last]) != SUMMARY_RANGE or last < period:
        distinct[last] = totals(tiled(int(bounds[last][0]), int(bounds[last][-1]) + 1))
    which = [j if j == last and j in distinct else j % period for j in range(len(bounds))]
    ranges_writer = summaries.SummaryRangesWriter(str(dst_root), info.array_path, name, labels)
    for start in range(0, len(bounds), 4096):
        block = which[start : start + 4096]
        ranges_writer.extend(
            np.array([len(bounds[j]) for j in range(start, start + len(block))], np.int64),
            {key: np.stack([distinct[j][key] for j in block]) for key in distinct[0]},
        )
    stamp = kind.stamp(total)
    ranges_writer.finish(stamp)
    writer.finish(stamp)


def synthetic_examples(real: np.ndarray, n: int, start: int, stop: int) -> np.ndarray:
    """Storage slots start..stop-1 -> example positions: the real run's first, then copy k's slot s is k * n + s."""
    slots = np.arange(start, stop, dtype=np.int64)
    return np.where(slots < n, real[np.minimum(slots, n - 1)], slots)


def relative_difference(a: list, b: list) -> float:
    """The largest |a - b| / |b| over the values where b is a nonzero number (0 where a and b are equal)."""
    x, y = np.array(a, float), np.array(b, float)
    mask = np.isfinite(y) & (y != 0)
    return float((np.abs(x - y)[mask] / np.abs(y[mask])).max(initial=0.0))


def disk_bytes(home: Path, info) -> int:
    """Bytes on disk of what the synthetic store adds: its SQLite file and its summary (each hard-linked file once; the
    real run's cells, hard-linked from the source, are not counted)."""
    from attnstore.store import arrays

    seen, size = set(), (home / "meta.sqlite").stat().st_blocks * 512
    for f in (home / "attention.zarr" / str(arrays.group_path_of(info.array_path)) / "summary").rglob("*"):
        if f.is_file():
            st = f.stat()
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                size += st.st_blocks * 512
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True, help="home of a store with the real run (meta.sqlite, attention.zarr)")
    parser.add_argument("--run", required=True)
    parser.add_argument("--factors", type=int, nargs="+", default=[1, 16, 256, 4096, 20000])
    parser.add_argument("--kinds", nargs="+", default=["clark"], choices=sorted(KIND_QUERIES), help="kinds (and their queries) timed")
    parser.add_argument("--home", required=True, help="folder for the synthetic stores (each replaced by the next size's)")
    parser.add_argument("--repeats", type=int, default=3, help="calls of each query per child; the best is reported")
    parser.add_argument("--per-example-repeats", type=int, default=1)
    parser.add_argument("--per-example-up-to", type=int, default=None, help="largest factor timed on the per-example path too")
    parser.add_argument("--keep", action="store_true", help="keep every size's store (default: only the last)")
    parser.add_argument("--max-free-gb", type=float, default=30.0, help="stop before a size whose store would pass this")
    parser.add_argument("--json", default=None, help="write the rows here too")
    parser.add_argument("--plot", default="", help="writes PLOT.png and PLOT.svg")
    args = parser.parse_args()
    source, base = Path(args.source), Path(args.home)
    base.mkdir(parents=True, exist_ok=True)
    env = {**os.environ}
    env.pop("ATTNSTORE_HOME", None)
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    global QUERIES
    QUERIES = tuple(q for kind in args.kinds for q in KIND_QUERIES[kind])
    info, rows, labels, lengths, offsets = prepare_source(source, args.run, args.kinds)
    n = len(lengths)
    out, stopped = [], None
    previous: Path | None = None
    for factor in sorted(args.factors):
        total = n * factor
        home = base / f"x{factor}"
        free = shutil.disk_usage(base).free
        estimate = total * 400 + 200e6  # SQL rows and indexes, the example ids, hard links
        if estimate > min(free - 10e9, args.max_free_gb * 1e9):
            stopped = f"{factor}x ({total:,} examples): about {estimate / 1e9:.0f} GB needed, {free / 1e9:.0f} GB free"
            break
        full = args.per_example_up_to is None or factor <= args.per_example_up_to
        build_s = build(source, home, info, rows, labels, lengths, offsets, factor, full)
        ranged = measure(home, args.run, "range", args.repeats, env)
        if full:
            per_example = measure(home, args.run, "per-example", args.per_example_repeats, env)
            diff = max(relative_difference(ranged["frames"][q], per_example["frames"][q]) for q in QUERIES)
        else:  # not timed (minutes per query): NaN in the table
            per_example = dict(times={q: math.nan for q in QUERIES}, rss=math.nan)
            diff = math.nan
        row = dict(
            factor=factor, examples=total, build_s=build_s, disk=disk_bytes(home, info), load=os.getloadavg()[0],
            range={q: ranged["times"][q] for q in QUERIES}, per_example={q: per_example["times"][q] for q in QUERIES},
            range_rss=ranged["rss"], per_example_rss=per_example["rss"], max_rel_diff=diff,
        )  # fmt: skip
        out.append(row)
        print(
            f"  {factor}x ({total:,}): built in {build_s:.0f}s; range "
            + ", ".join(f"{q} {row['range'][q]:.3f}s" for q in QUERIES)
            + "; per-example "
            + ", ".join(f"{q} {row['per_example'][q]:.2f}s" for q in QUERIES)
            + f"; rss {ranged['rss']:.0f} / {per_example['rss']:.0f} MiB; max rel diff {diff:.1e}",
            file=sys.stderr,
            flush=True,
        )
        if previous is not None and not args.keep:
            shutil.rmtree(previous, ignore_errors=True)
        previous = home
    print(f"source run {args.run!r} ({n} real examples, {info.n_layers} x {info.n_heads} heads); {os.cpu_count()} CPUs")
    print(f"load average (1/5/15 min): start {load_start}, end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    header = "  ".join(f"{q[:12]:>12s}" for q in QUERIES)
    print(
        f"{'factor':>6s} {'examples':>10s} {'disk MB':>8s}  range s: {header}  per-example s: {header}  "
        f"{'MiB range':>9s} {'MiB p-e':>8s} {'rel diff':>8s} {'load':>5s}"
    )
    for r in out:
        print(
            f"{r['factor']:>6d} {r['examples']:>10,d} {r['disk'] / 1e6:8.0f}  {'':9s}"
            + "  ".join(f"{r['range'][q]:12.3f}" for q in QUERIES)
            + f"  {'':15s}"
            + "  ".join(f"{r['per_example'][q]:12.2f}" for q in QUERIES)
            + f"  {r['range_rss']:9.0f} {r['per_example_rss']:8.0f} {r['max_rel_diff']:8.1e} {r['load']:5.2f}"
        )
    print("  seconds: best of the repeats of run_query over the whole run in a fresh read-only process; MiB: that process's peak RSS")
    if stopped:
        print(f"  stopped at {stopped}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(rows=out, stopped=stopped, load_start=load_start), indent=1))
    if args.plot and out:
        plot(Path(args.plot), out)


def plot(stem: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["examples"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    for q, color in zip(QUERIES, ("C0", "C1", "C2", "C3", "C4")):
        left.plot(sizes, [r["per_example"][q] for r in rows], "o--", color=color, label=f"{q}: per-example path")
        left.plot(sizes, [r["range"][q] for r in rows], "s-", color=color, label=f"{q}: kept ranges")
    left.axhline(1.0, color="gray", linewidth=1, linestyle=":", label="1 s")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("examples (a real run repeated; synthetic beyond 1x)")
    left.set_ylabel("whole-run query time (s)")
    left.legend(fontsize=7.5)
    left.grid(True, alpha=0.3)
    right.plot(sizes, [r["per_example_rss"] for r in rows], "o--", color="C3", label="per-example path")
    right.plot(sizes, [r["range_rss"] for r in rows], "s-", color="C4", label="kept ranges")
    right.set_xscale("log")
    right.set_ylim(0, np.nanmax([[r["per_example_rss"], r["range_rss"]] for r in rows]) * 1.2)
    right.set_xlabel("examples")
    right.set_ylabel("peak RSS of the query process (MiB)")
    right.legend()
    right.grid(True, alpha=0.3)
    fig.tight_layout()
    stem.parent.mkdir(parents=True, exist_ok=True)
    for ext in ("png", "svg"):
        fig.savefig(stem.with_suffix(f".{ext}"), dpi=120)
    print(f"plot written to {stem}.png and {stem}.svg", file=sys.stderr)


if __name__ == "__main__":
    main()
