"""Benchmark: ingest and query cost as the corpus grows (should be linear), and peak memory (should stay flat).

    python benchmarks/scaling.py [--dataset glue/SST-2:train] [--sizes 500 2000 8000]
                                 [--queries relative_position special_tokens entropy dependency]
                                 [--plot docs/img/scaling]

For each size N (the first N examples of the dataset, `--limit N`), in a fresh store of its own:

  ingest  `attnstore ingest --dataset ... --limit N --no-progress` in a child process: its wall time,
          the time it reports for the run itself ("stored N examples in X s": tokenization, forward
          pass, float16 conversion, compression, Zarr + SQL writes) and the rest (interpreter start,
          imports, model load, spaCy load and annotation of the N examples), and its peak RSS;
  query   each query of `--queries` through `attnstore.queries.run_query` over the whole run, each in
          a child process of its own (with the CLI's fixed mmap threshold, `bound_heap_growth`), on the
          store opened read-only: every query then streams and decodes every stored map (on a writable
          store, `relative_position`, `special_tokens` and `entropy` read per-example sums that the first
          of them builds and keeps beside the run, and `dependency` kept word-level predictions,
          queries/engine/); the best of `--query-repeats` calls in that process, and its peak RSS;
  kept    on the writable store: one child whose first `relative_position` and `dependency` build and
          keep those summaries (one streaming pass each), then one child running the queries that read
          them (best of the repeats).

Peak RSS is the child's own ru_maxrss (os.wait4), so each figure belongs to one command at one size.
Prints a table of times (and per 1,000 examples), a table of peak memory, the growth exponent of each
time between the smallest and largest size (1.0 = linear), and writes a log-log plot of the times with
the ideal linear line through each series' smallest-size point, and the peak RSS, to PLOT.png and
PLOT.svg.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data"
# served from per-example summaries kept with the run (queries/engine/): the first three from `clark`, dependency
# from `word_argmax`; the build child's first relative_position (and dependency) builds them
SUMMARY_QUERIES = ("relative_position", "special_tokens", "entropy", "dependency")

QUERY_CHILD = r"""
import json, sys, time, warnings
from attnstore.api.cli import bound_heap_growth
bound_heap_growth()
from attnstore.queries import run_query
from attnstore.store import open_store
home, run, read_only, repeats = sys.argv[1], sys.argv[2], sys.argv[3] == "ro", int(sys.argv[4])
store = open_store(home=home, read_only=read_only)
out = {}
for name in sys.argv[5:]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        frame = run_query(store, name, run=run)
        times.append(time.perf_counter() - t)
    out[name] = times
print(json.dumps(out))
"""


def child(args: list[str], env: dict) -> dict:
    """Run a command to completion; its wall time, CPU time, peak RSS (MiB, its own) and output."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(args)}\n{stderr[-3000:]}")
    return dict(wall=wall, cpu=usage.ru_utime + usage.ru_stime, rss=usage.ru_maxrss / 1024, stdout=stdout, stderr=stderr)


def query_child(home: Path, run: str, mode: str, repeats: int, names: list[str], env: dict) -> tuple[dict, float]:
    """Run queries `names` in a fresh process on the store read-only ("ro") or writable ("rw"): ({name: [seconds]}, peak MiB)."""
    q = child([sys.executable, "-c", QUERY_CHILD, str(home), run, mode, str(repeats), *names], env)
    return json.loads(q["stdout"].strip().splitlines()[-1]), q["rss"]


def exponent(sizes: list[int], values: list[float]) -> float:
    return math.log(values[-1] / values[0]) / math.log(sizes[-1] / sizes[0])


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="glue/SST-2:train")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA))
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 2000, 8000])
    parser.add_argument("--queries", nargs="+", default=["relative_position", "special_tokens", "entropy", "dependency"])
    parser.add_argument("--query-repeats", type=int, default=2, help="calls of each query in its process; the best is reported")
    parser.add_argument("--annotate", default="spacy", choices=["spacy", "whitespace"])
    parser.add_argument("--plot", default=str(REPO / "docs" / "img" / "scaling"), help="writes PLOT.png and PLOT.svg ('' for none)")
    parser.add_argument("--home", default=None, help="folder for the stores, kept (default: a temporary folder, removed at the end)")
    args = parser.parse_args()
    sizes = sorted(args.sizes)
    base = Path(args.home or tempfile.mkdtemp(prefix="attnstore-scaling-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("ATTNSTORE_HOME", None)
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.perf_counter()

    rows = []
    for n in sizes:
        home = base / f"n{n}"
        run = f"scaling-{n}"
        ingest = child(
            [sys.executable, "-m", "attnstore.api.cli", "ingest", "--dataset", args.dataset, "--data-dir", args.data_dir,
             "--limit", str(n), "--annotate", args.annotate, "--name", run, "--home", str(home), "--no-progress"],
            env,
        )  # fmt: skip
        match = re.search(r"stored (\d+) examples in ([\d.]+)s", ingest["stdout"])
        if not match:
            raise SystemExit(f"unexpected ingest output: {ingest['stdout']!r}")
        run_s = float(match.group(2))
        from attnstore.store import open_store

        store = open_store(home=str(home))
        info = store.run_info(run)
        frame = store.examples(run)
        stored = frame[~frame["skipped"]]
        cells = int((info.n_layers * info.n_heads * stored["length"].astype("int64") ** 2).sum())
        disk = sum(f.stat().st_size for f in (home / "attention.zarr").rglob("*") if f.is_file())
        store.engine.dispose()

        stream, stream_rss = {}, {}
        for name in args.queries:
            times, stream_rss[name] = query_child(home, run, "ro", args.query_repeats, [name], env)
            stream[name] = min(times[name])
        builders = ["relative_position", *(["dependency"] if "dependency" in args.queries else [])]
        built, build_rss = query_child(home, run, "rw", 1, builders, env)
        kept_names = [q for q in args.queries if q in SUMMARY_QUERIES]
        kept, kept_rss = query_child(home, run, "rw", args.query_repeats, kept_names, env) if kept_names else ({}, float("nan"))
        rows.append(
            dict(n=n, stored=int(match.group(1)), cells=cells, disk=disk, mean_len=float(stored["length"].mean()),
                 wall=ingest["wall"], run=run_s, other=ingest["wall"] - run_s, rss=ingest["rss"],
                 stream=stream, stream_rss=stream_rss, build=sum(t[0] for t in built.values()), build_rss=build_rss,
                 kept={k: min(v) for k, v in kept.items()}, kept_rss=kept_rss)
        )  # fmt: skip
        print(
            f"  done {n}: ingest {ingest['wall']:.1f}s (run {run_s:.1f}s), streaming queries "
            + ", ".join(f"{k} {v:.2f}s" for k, v in stream.items())
            + f", summaries built in {rows[-1]['build']:.2f}s",
            file=sys.stderr,
        )
    elapsed = time.perf_counter() - started

    import torch

    print(
        f"{args.dataset}, first N examples, annotate={args.annotate}; model all-MiniLM-L6-v2 (6 x 12 heads), float16 lossless; "
        f"{os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads)"
    )
    print(f"load average (1/5/15 min): start {load_start}, end {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {elapsed:.0f}s in all")
    print()
    qnames = args.queries
    kept_names = [q for q in qnames if q in SUMMARY_QUERIES]
    print(
        f"{'examples':>8s} {'M cells':>8s} {'mean L':>6s} {'MB disk':>7s} {'ingest s':>8s} {'run s':>6s} {'other s':>7s} "
        f"{'ingest s/1k':>11s} {'run s/1k':>8s} {'peak MiB':>8s}"
    )
    for r in rows:
        k = r["n"] / 1000
        print(
            f"{r['n']:8d} {r['cells'] / 1e6:8.1f} {r['mean_len']:6.1f} {r['disk'] / 1e6:7.1f} {r['wall']:8.1f} {r['run']:6.1f} "
            f"{r['other']:7.1f} {r['wall'] / k:11.1f} {r['run'] / k:8.2f} {r['rss']:8.0f}"
        )
    print(
        "  ingest s: wall time of the CLI process; run s: what it reports for the run (tokenize, forward, store); other s: the rest\n"
        "  (interpreter start, imports, model load, spaCy load + annotation); peak MiB: the ingest process's peak RSS"
    )
    a, b = fit_line([r["n"] / 1000 for r in rows], [r["other"] for r in rows])
    print(f"  other s ~ {a:.1f}s fixed + {b:.2f}s per 1,000 examples (least squares over the sizes)")
    print()
    print(
        f"{'examples':>8s} {'M cells':>8s} "
        + " ".join(f"{q[:17]:>17s}" for q in qnames)
        + f" {'build summ.':>11s} "
        + " ".join(f"{'kept: ' + q[:11]:>17s}" for q in kept_names)
    )
    for r in rows:
        print(
            f"{r['n']:8d} {r['cells'] / 1e6:8.1f} "
            + " ".join(f"{r['stream'][q]:17.2f}" for q in qnames)
            + f" {r['build']:11.2f} "
            + " ".join(f"{r['kept'][q]:17.3f}" for q in kept_names)
        )
    print(
        f"  seconds; queries: best of {args.query_repeats} calls of run_query over the whole run in one process, store opened "
        "read-only,\n  so every query streams and decodes every map; build summ.: the first relative_position (and dependency) on the "
        "writable\n  store (one streaming pass each that computes and keeps a per-example summary, clark and word_argmax); kept: the\n  "
        "queries that then read those summaries instead of the maps"
    )
    series = {"ingest (wall)": [r["wall"] for r in rows], "ingest run": [r["run"] for r in rows]}
    for q in qnames:
        series[q] = [r["stream"][q] for r in rows]
    series["build summaries"] = [r["build"] for r in rows]
    kept_series = {f"kept: {q}": [r["kept"][q] for r in rows] for q in kept_names}
    if len(rows) > 1:
        cell_ratio = rows[-1]["cells"] / rows[0]["cells"]
        print(
            f"  growth exponent {sizes[0]} -> {sizes[-1]} examples (time ~ N^e; cells grew {cell_ratio:.1f}x "
            f"for {sizes[-1] / sizes[0]:.0f}x examples): "
            + ", ".join(f"{k} {exponent(sizes, v):.2f}" for k, v in {**series, **kept_series}.items())
        )
        last = rows[-1]
        print(
            f"  per 100 M cells at {last['n']} examples: "
            + ", ".join(f"{k} {v[-1] / last['cells'] * 1e8:.2f}s" for k, v in series.items() if k not in ("ingest (wall)",))
        )
    print()
    print(f"{'peak RSS MiB':>24s} " + " ".join(f"{r['n']:>8d}" for r in rows) + f" {'last/first':>10s}")
    mem = {"ingest": [r["rss"] for r in rows]}
    for q in qnames:
        mem[f"query {q}"] = [r["stream_rss"][q] for r in rows]
    mem["build summaries"] = [r["build_rss"] for r in rows]
    if kept_names:
        mem["queries on kept summ."] = [r["kept_rss"] for r in rows]
    for label, values in mem.items():
        print(f"{label:>24s} " + " ".join(f"{v:8.0f}" for v in values) + f" {values[-1] / values[0]:10.2f}")
    if args.home:
        print(f"stores left under {base}", file=sys.stderr)
    else:
        shutil.rmtree(base, ignore_errors=True)

    if args.plot:
        plot(Path(args.plot), sizes, series, mem, args.dataset)


def plot(stem: Path, sizes: list[int], series: dict, mem: dict, dataset: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # one colour per command in both panels
    names = [*series, *(k for k in mem if k not in ("ingest", *(f"query {q}" for q in series)))]
    color = {k: cycle[i % len(cycle)] for i, k in enumerate(names)}
    color["ingest"] = color["ingest (wall)"]
    color.update({f"query {q}": color[q] for q in series})
    for label, values in series.items():
        left.plot(sizes, values, "o-", color=color[label], label=label)
        left.plot(sizes, [values[0] * n / sizes[0] for n in sizes], ":", color=color[label], linewidth=1)
    left.plot([], [], ":", color="gray", label="ideal linear (from the smallest size)")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xticks(sizes, [f"{n:,}" for n in sizes])
    left.minorticks_off()
    left.set_xlabel(f"examples ({dataset}, first N)")
    left.set_ylabel("time (s)")
    left.set_title("ingest and query time (queries streaming every map)")
    left.grid(True, which="major", alpha=0.3)
    left.legend(fontsize=7.5, loc="upper left")
    for label, values in mem.items():
        right.plot(sizes, values, "o-", color=color[label], label=label)
    right.set_xscale("log")
    right.set_xticks(sizes, [f"{n:,}" for n in sizes])
    right.minorticks_off()
    right.set_ylim(0, max(max(v) for v in mem.values()) * 1.15)
    right.set_xlabel(f"examples ({dataset}, first N)")
    right.set_ylabel("peak RSS of the process (MiB)")
    right.set_title("peak memory")
    right.grid(True, alpha=0.3)
    right.legend(fontsize=7.5, loc="center", bbox_to_anchor=(0.55, 0.55))
    fig.tight_layout()
    stem.parent.mkdir(parents=True, exist_ok=True)
    for ext in ("png", "svg"):
        fig.savefig(stem.with_suffix(f".{ext}"), dpi=120)
    print(f"plot written to {stem}.png and {stem}.svg", file=sys.stderr)


if __name__ == "__main__":
    main()
