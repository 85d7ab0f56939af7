"""Benchmark: decoder capture and the Q/K tier on SmolLM2-135M-Instruct, printing the targets as ratios measured in one run.

    python benchmarks/decoder_capture.py [--length 2048] [--long 8192] [--data-dir ../shared/data] [--threads 2]

The text is real: GUM dev documents (../shared/data/gum_ontogum/dev) joined and cut to the length. Figures:
  rebuild error           maps rebuilt from stored float32 (and float16) Q/K vs eager output_attentions   (<= 1e-5 f32)
  ingest CPU / SDPA       CPU seconds of ingest --tier qk (one document; the model loaded once, in this process;
                          the median of 3 runs, over the median of 3 bare passes)
                          over a bare SDPA forward pass of the same input (<= 1.5); with per-token loss
                          kept (the default), also over the same pass on to the logits, which that ingest runs;
                          and ingest --no-token-loss, with and without row statistics, over the bare pass
  Q/K bytes / dense       the Q/K arrays on disk over the raw float16 maps (H L^2 2 bytes per layer), and
                          over the dense tier's arrays on disk at --length                              (<= 5 %, 1.5 %)
  block rebuild           one 512 x 512 block of one head from the store, median of 50                   (< 10 ms)
  query / SDPA            `entropy` over the Q/K run, CPU seconds over the bare SDPA pass                 (<= 1.5)
  row statistics          each tier's ingest with them (the default) over --no-row-stats; their bytes on disk
                          per row and head (<= 100) and over the Q/K arrays; the five queries that answer from
                          them, first call (nothing kept yet) from them against weights="maps" (the maps rebuilt)
  peak RSS at --long      `attnstore ingest --tier qk` of one --long-token document, child maxrss       (<= 3 GiB)
  crossover               tokens above which the Q/K tier's bytes on disk are below the dense tier's
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np


def gum_text(data_dir: Path, tokenizer, n_tokens: int) -> str:
    """GUM dev documents' sentences, in file order, until the text has at least n_tokens tokens (then cut to them)."""
    from attnstore.ingest.corpus import read_conllu

    parts: list[str] = []
    for path in sorted((data_dir / "gum_ontogum" / "dev").glob("*.conllu")):
        parts += [" ".join(w["form"] for w in s.words) for s in read_conllu(path)]
        ids = tokenizer(" ".join(parts))["input_ids"]
        if len(ids) >= n_tokens:
            return tokenizer.decode(ids[:n_tokens])
    raise SystemExit(f"GUM dev holds fewer than {n_tokens} tokens")


REPEATS = 3  # the bare passes and the Q/K ingests: each figure the median of 3 (one run's CPU seconds vary by 10-15 % here)


def median_cpu(run, times: int = REPEATS) -> tuple[float, list[float]]:
    """The median CPU seconds of `times` calls of run(), and each call's."""
    spent = []
    for _ in range(times):
        t0 = cpu()
        run()
        spent.append(cpu() - t0)
    return statistics.median(spent), spent


def ingest_median(store, doc: Path, name: str, times: int, **options) -> float:
    """The median CPU seconds of `times` ingests of `doc` into runs `name`, `name`-again-1, ..."""
    from attnstore.ingest import ingest

    names = iter([name, *(f"{name}-again-{k}" for k in range(1, times))])
    return median_cpu(lambda: ingest(store, corpus=str(doc), name=next(names), **options), times)[0]


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child_cpu_and_rss() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime, r.ru_maxrss / 2**20  # GiB (ru_maxrss is KiB on Linux)


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_cli(args: list[str]) -> tuple[float, float]:
    """CPU seconds and peak RSS (GiB) of one `attnstore` command in a child process (each call: a fresh child)."""
    before, _ = child_cpu_and_rss()
    code = (
        "import sys; from attnstore.api.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
        # VmHWM: this process's peak RSS since its exec (ru_maxrss keeps a forked parent's, Linux)
        "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]\n"
        "print('RSS', hwm, file=sys.stderr); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"attnstore {' '.join(args[:3])} failed:\n{done.stderr[-2000:]}")
    rss = next(int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("RSS")) / 2**20
    after, _ = child_cpu_and_rss()
    return after - before, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--long", type=int, default=8192, help="the long document's tokens (0: skip it)")
    parser.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch
    import transformers as T

    from attnstore.ingest import streaming
    from attnstore.ingest.model import load_model
    from attnstore.store import open_store, qk

    torch.set_num_threads(args.threads)
    loaded = load_model("SmolLM2-135M-Instruct")
    assert loaded.capture == "streaming" and loaded.qk is not None, (loaded.capture, loaded.qk_refusal)
    L, H, layers = args.length, loaded.n_heads, loaded.n_layers
    text = gum_text(Path(args.data_dir), loaded.tokenizer, L)
    ids = torch.tensor([loaded.tokenizer(text)["input_ids"][:L]])
    L = ids.shape[1]
    kv = loaded.qk["n_kv_heads"]
    print(f"SmolLM2-135M-Instruct ({layers} layers x {H} heads, {kv} KV heads), {L} tokens of GUM dev, {args.threads} threads")

    sdpa_lm = T.AutoModelForCausalLM.from_pretrained(loaded.source, attn_implementation="sdpa").eval()
    sdpa = sdpa_lm.get_decoder()
    with torch.inference_mode():
        sdpa(input_ids=ids[:, :64])
        bare, bare_all = median_cpu(partial(sdpa, input_ids=ids))
        # the same pass on to the logits, as an ingest that keeps per-token loss runs it (the LM head: 576 x 49,152)
        bare_lm, _ = median_cpu(partial(sdpa_lm, input_ids=ids))
    del sdpa_lm
    each = ", ".join(f"{s:.2f}" for s in bare_all)
    print(f"bare SDPA forward: {bare:.2f} CPU s, the median of {each} (on to the logits: {bare_lm:.2f} CPU s)")

    # Rebuild error: Q/K captured in one pass, maps rebuilt per layer, against eager output_attentions.
    eager = T.AutoModelForCausalLM.from_pretrained(loaded.source, attn_implementation="eager").eval().get_decoder()
    with torch.inference_mode():
        reference = eager(input_ids=ids, output_attentions=True).attentions
    del eager
    entry_of = {}
    for dtype in ("float32", "float16"):
        sink = streaming.QKSink(layers, getattr(torch, dtype), loaded.qk["windows"], [L])
        with torch.inference_mode():
            t0 = cpu()
            streaming.run_with(sink, lambda: loaded.model(input_ids=ids))
            capture_s = cpu() - t0
        q, k, lse = sink.result()
        entry = qk.qk_entry(
            dtype=dtype,
            n_kv_heads=loaded.qk["n_kv_heads"],
            head_dim=loaded.qk["head_dim"],
            scales=sink.scales,
            windows=loaded.qk["windows"],
        )
        entry_of[dtype] = entry
        err = max(
            float(np.abs(qk.rebuild(q[0], k[0], lse[0], entry, [layer], list(range(H)))[0] - reference[layer][0].numpy()).max())
            for layer in range(layers)
        )
        print(f"Q/K {dtype}: capture pass {capture_s:.2f} CPU s = {capture_s / bare:.2f}x SDPA; rebuilt maps vs eager: max |d| = {err:.1e}")
    del reference

    bytes_raw_dense = layers * H * L * L * 2
    print(f"Q/K float16 raw bytes / raw float16 maps at {L}: {qk.stored_bytes(L, layers, H, entry_of['float16']) / bytes_raw_dense:.2%}")

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        from attnstore.store.migrate import upgrade

        db = f"sqlite:///{tmp_path / 'meta.sqlite'}"
        upgrade(db)
        store_args = ["--db", db, "--root", str(tmp_path / "arrays")]
        doc = tmp_path / "doc.jsonl"
        doc.write_text(json.dumps({"id": "gum-dev", "text": text}) + "\n", encoding="utf-8")

        store = open_store(db=db, root=str(tmp_path / "arrays"))
        for tier in ("qk", "dense"):  # in this process, the model loaded: its load is not counted
            spent_of = {}
            for name, row_stats in ((tier, True), (f"{tier}-no-rows", False)):
                options = dict(fmt="jsonl", annotator="whitespace", tier=tier, loaded=loaded, progress=False, row_stats=row_stats)
                # the Q/K tier's ingests are run REPEATS times (the median); the dense tier's once (about a minute each)
                spent = ingest_median(store, doc, name, REPEATS if tier == "qk" else 1, **options)
                spent_of[row_stats] = spent
                flag = "" if row_stats else " --no-row-stats"
                what = f"ingest --tier {tier}{flag} of one {L}-token document (value norms and token loss kept)"
                print(f"{what}: {spent:.2f} CPU s = {spent / bare:.2f}x SDPA, {spent / bare_lm:.2f}x SDPA on to the logits")
            print(f"  row statistics cost the {tier} ingest {spent_of[True] / spent_of[False]:.2f}x its time without them")
        for name, row_stats in (("qk-no-loss", True), ("qk-capture", False)):  # the capture alone: no extra of the pass
            options = dict(fmt="jsonl", annotator="whitespace", tier="qk", token_loss=False, row_stats=row_stats)
            spent = ingest_median(store, doc, name, REPEATS, loaded=loaded, progress=False, **options)
            flag = "" if row_stats else " --no-row-stats"
            what = f"ingest --tier qk --no-token-loss{flag} of the same document (value norms kept)"
            print(f"{what}: {spent:.2f} CPU s = {spent / bare:.2f}x SDPA")
        store.close()
        qk_disk = sum(du(tmp_path / "arrays" / "runs" / "qk" / name) for name in (qk.QUERY, qk.KEY, qk.LSE))
        from attnstore.store import row_stats

        rows_disk = sum(du(tmp_path / "arrays" / "runs" / "qk" / name) for name in (row_stats.STATS, row_stats.TOP))
        print(
            f"row statistics on disk at {L}: {rows_disk / 2**20:.1f} MiB = {rows_disk / (L * layers * H):.0f} bytes per row and "
            f"head ({row_stats.BYTES_PER_ROW_HEAD} raw), {rows_disk / qk_disk:.2f}x the Q/K arrays"
        )
        dense_disk = du(tmp_path / "arrays" / "runs" / "dense" / "cells")
        print(
            f"on disk at {L}: Q/K {qk_disk / 2**20:.1f} MiB = {qk_disk / bytes_raw_dense:.2%} of the raw float16 maps, "
            f"{qk_disk / dense_disk:.2%} of the dense tier's {dense_disk / 2**20:.1f} MiB"
        )
        store = open_store(db=db, root=str(tmp_path / "arrays"))
        for first in (0, L - 512):  # 512 x 512 (rows 0-511 see keys 0-511), then the last rows: 512 x L
            times = []
            for i in range(50):
                layer, head = i % layers, (i * 7) % H
                t0 = time.perf_counter()
                block = store.attention("qk", 0, layer=layer, head=head, rows=range(first, first + 512))
                times.append(time.perf_counter() - t0)
            assert block.shape == (1, 1, 512, L)
            span = f"512 x {first + 512}"
            print(f"rows {first}-{first + 511} of one head ({span} keys) from the store: median {statistics.median(times) * 1e3:.1f} ms")
        from attnstore.queries import run_query

        t0 = cpu()
        run_query(store, "entropy", run="qk")
        query_s = cpu() - t0
        print(f"entropy over the Q/K run: {query_s:.2f} CPU s = {query_s / bare:.2f}x the bare SDPA pass")
        t0 = cpu()
        run_query(store, "entropy", run="dense")
        dense_query_s = cpu() - t0
        print(f"entropy over the dense run: {dense_query_s:.2f} CPU s = {dense_query_s / bare:.2f}x the bare SDPA pass")
        for query in ("attention_sink", "previous_token_heads", "streaming_heads", "entropy_by_position", "heavy_hitters"):
            seconds, frames = {}, {}
            for weights in ("attention", "maps"):  # a first call each: the two keep separate summaries
                t0, w0 = cpu(), time.perf_counter()
                frames[weights] = run_query(store, query, run="qk", weights=weights).select_dtypes("number")
                seconds[weights] = (cpu() - t0, time.perf_counter() - w0)
            err = float(np.nanmax(np.abs(frames["attention"].to_numpy(float) - frames["maps"].to_numpy(float))))
            (rc, rw), (mc, _) = seconds["attention"], seconds["maps"]
            print(
                f"{query} over the Q/K run: from row statistics {rc:.2f} CPU s ({rw:.2f} s wall), from the rebuilt maps "
                f"{mc:.2f} CPU s ({mc / bare:.2f}x SDPA): {mc / max(rc, 1e-9):.0f}x; max |difference| {err:.1e}"
            )
        store.close()
        if not args.long:
            return

        long_text = gum_text(Path(args.data_dir), loaded.tokenizer, args.long)
        long_doc = tmp_path / "long.jsonl"
        long_doc.write_text(json.dumps({"id": "gum-dev-long", "text": long_text}) + "\n", encoding="utf-8")
        long_args = ["ingest", "--corpus", str(long_doc), "--format", "jsonl", "--annotate", "whitespace", "--no-progress"]
        long_s, long_rss = run_cli([*long_args, "--model", "SmolLM2-135M-Instruct", "--name", "long", "--tier", "qk", *store_args])
        long_disk = sum(du(tmp_path / "arrays" / "runs" / "long" / name) for name in (qk.QUERY, qk.KEY, qk.LSE))
        n_long = args.long
        print(
            f"ingest --tier qk of one {n_long}-token document (value norms and token loss kept): {long_s:.1f} CPU s, "
            f"peak RSS {long_rss:.2f} GiB; Q/K on disk {long_disk / 2**20:.1f} MiB = "
            f"{long_disk / (layers * H * n_long * n_long * 2):.2%} of the raw float16 maps"
        )


if __name__ == "__main__":
    main()
