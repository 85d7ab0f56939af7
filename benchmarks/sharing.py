"""Benchmark: share a run. Export and import time and size of its bundle, and one example's read latency
from an S3 array root vs a local folder.

    python benchmarks/sharing.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--reads 50]
    python benchmarks/sharing.py --db URL --root PATH --run NAME      # a run of an existing store

Without --db the corpus is ingested first with the default model (all-MiniLM-L6-v2) into a temporary
store. A moto S3 server is started on 127.0.0.1 (a separate process) for the s3:// figures; the
bundle is imported into a store whose array root is s3://bench/attention.zarr to measure reads
from it. Figures:

  export -> zip / folder / s3      seconds and bytes of `attnstore export` to each kind of target
  import zip -> local / s3 root    seconds of `attnstore import` into a fresh SQLite store whose array
                                   root is a local folder / the S3 server
  read p50 local / s3              `store.attention(run, example)` over --reads random examples
                                   (the same ones for both stores), after one warm-up read
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEFAULT_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue" / "MRPC" / "dev.tsv"
BUCKET = "bench"


def start_s3() -> tuple[subprocess.Popen, str]:
    """A moto S3 server in its own process (so it does not share this process's interpreter lock)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        server.kill()
        raise SystemExit("the moto S3 server did not start (pip install 'moto[server]')")
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1", FSSPEC_S3_ENDPOINT_URL=url)
    import boto3

    boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    return server, url


def size_of(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def fresh_store(folder: Path, root: str | None = None):
    from attnstore.store import migrate, open_store

    folder.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{folder / 'meta.sqlite'}"
    migrate.upgrade(url)
    return open_store(db=url, root=root or str(folder / "attention.zarr"))


def latencies(store, run: str, examples: list[int]) -> list[float]:
    store.attention(run, examples[0])  # warm-up: opens the array (and checks a remote root once)
    out = []
    for example in examples:
        t = time.perf_counter()
        store.attention(run, example)
        out.append((time.perf_counter() - t) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="Corpus to ingest first (pairs-tsv) when no --db is given.")
    parser.add_argument("--format", default="pairs-tsv")
    parser.add_argument("--db", default=None, help="An existing store's database URL (with --root and --run).")
    parser.add_argument("--root", default=None, help="Its array root.")
    parser.add_argument("--run", default=None, help="The run to share (default: the store's first complete run).")
    parser.add_argument("--reads", type=int, default=50, help="Reads per store for the latency figures.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="Keep the work folder (stores and bundles) instead of deleting it.")
    args = parser.parse_args()

    server, endpoint = start_s3()
    work: Path | None = None
    try:
        from attnstore.store import open_store
        from attnstore.store.bundle import export_runs, import_bundle

        work = Path(tempfile.mkdtemp(prefix="attnstore-sharing-"))
        ingest_note = ""
        if args.db:
            source = open_store(db=args.db, root=args.root)
            runs = source.runs()
            run = args.run or runs[runs["status"] == "complete"]["run"].iloc[0]
        else:
            from attnstore.ingest import ingest

            source = fresh_store(work / "source")
            t = time.perf_counter()
            result = ingest(source, corpus=args.corpus, fmt=args.format, progress=False)
            run = result.run.name
            ingest_note = f", ingested here in {time.perf_counter() - t:.1f}s"
        info = source.run_info(run)
        frame = source.examples(run)
        cells = int((info.n_layers * info.n_heads * frame["length"] ** 2).sum())
        print(
            f"run {run!r}: {info.n_stored} examples, {cells:,} attention cells, {info.model} "
            f"({info.n_layers}x{info.n_heads}), {info.dtype}{ingest_note}"
        )
        print(f"source store: {source.locations.describe()}; S3: moto server at {endpoint}")

        rows: list[tuple[str, float, str]] = []
        targets = {"zip": str(work / "run.zip"), "folder": str(work / "run-bundle"), "s3": f"s3://{BUCKET}/bundles/run"}
        for kind, target in targets.items():
            report = export_runs(source, [run], target)
            size = size_of(Path(target)) if kind != "s3" else report.n_bytes
            rows.append((f"export -> {kind}", report.seconds, f"{size / 1e6:.1f} MB, {report.n_files} files"))

        local = fresh_store(work / "local")
        done = import_bundle(local, targets["zip"])
        rows.append(("import zip -> local store", done.seconds, f"{done.n_rows:,} rows, {done.n_bytes / 1e6:.1f} MB of files"))
        folder = fresh_store(work / "from-folder")
        done = import_bundle(folder, targets["folder"])
        rows.append(("import folder -> local store", done.seconds, f"{done.n_rows:,} rows"))
        remote = fresh_store(work / "remote", root=f"s3://{BUCKET}/attention.zarr")
        done = import_bundle(remote, targets["zip"])
        rows.append(("import zip -> store on S3", done.seconds, f"array root {remote.locations.array_root}"))
        again = import_bundle(local, targets["zip"])
        rows.append(("import again (no-op)", again.seconds, f"already imported: {', '.join(again.already)}"))

        positions = [int(p) for p in frame.loc[~frame["skipped"], "example"]]
        for store in (local, remote):  # the same maps everywhere
            assert (store.attention(run, positions[0]) == source.attention(run, positions[0])).all()
        chosen = random.Random(args.seed).choices(positions, k=args.reads)
        reads = {name: latencies(store, run, chosen) for name, store in (("local folder", local), ("S3 (moto)", remote))}

        print()
        print(f"{'figure':38s} {'measured':>10s}   detail")
        for label, seconds, detail in rows:
            print(f"{label:38s} {seconds:9.2f}s   {detail}")
        for name, values in reads.items():
            p90 = sorted(values)[int(0.9 * (len(values) - 1))]
            print(f"{'read one example, p50, ' + name:38s} {statistics.median(values):8.1f}ms   p90 {p90:.1f} ms over {len(values)} reads")
        ratio = statistics.median(reads["S3 (moto)"]) / statistics.median(reads["local folder"])
        print(f"{'p50 read latency, S3 / local':38s} {ratio:9.1f}x")
    finally:
        server.terminate()
        server.wait(timeout=10)
        if args.keep:
            print(f"work folder left at {work}", file=sys.stderr)
        elif work is not None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
