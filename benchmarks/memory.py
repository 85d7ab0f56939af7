"""Peak memory of `attnstore ingest` and `attnstore query` as the corpus grows (should stay flat).

    python benchmarks/memory.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--sizes 100 200 408]
                                [--queries special_tokens entropy ... | --queries all]

`--queries all` measures every registered query that needs nothing but the run.

Each command runs in its own process; its peak RSS is read from the OS (ru_maxrss of the child).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue" / "MRPC" / "dev.tsv"


def peak_mib(args: list[str], env: dict) -> float:
    """Run a command in a fresh child (via a tiny wrapper) and return its peak RSS in MiB (NaN if it fails,
    e.g. a coreference query on a corpus without mentions)."""
    code = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
    return int(out.stdout.strip()) / 1024 if out.returncode == 0 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--format", default="pairs-tsv")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 200, 408])
    parser.add_argument("--queries", nargs="+", default=["special_tokens"])
    args = parser.parse_args()
    queries = run_only_queries() if args.queries == ["all"] else args.queries
    cli = [sys.executable, "-m", "attnstore.api.cli"]
    home = tempfile.mkdtemp(prefix="attnstore-mem-")
    env = {**os.environ, "ATTNSTORE_HOME": home, "HF_HUB_OFFLINE": "1"}
    subprocess.run(cli + ["db", "upgrade"], env=env, check=True, stdout=subprocess.DEVNULL)
    table: dict[str, list[float]] = {"ingest": []}
    for n in args.sizes:
        run = f"mem-{n}"
        table["ingest"].append(
            peak_mib(
                cli
                + [
                    "ingest",
                    "--corpus",
                    args.corpus,
                    "--format",
                    args.format,
                    "--limit",
                    str(n),
                    "--annotate",
                    "whitespace",
                    "--name",
                    run,
                    "--no-progress",
                ],
                env,
            )
        )
        for name in queries:
            table.setdefault(f"query {name}", []).append(peak_mib(cli + ["query", name, "--run", run], env))
    print(f"peak RSS (MiB) of one CLI process, {Path(args.corpus).name}, by number of examples")
    print(f"{'command':32s} " + " ".join(f"{n:>8d}" for n in args.sizes) + f" {'last/first':>11s}")
    for label, values in table.items():
        print(f"{label:32s} " + " ".join(f"{v:8.0f}" for v in values) + f" {values[-1] / values[0]:11.2f}")


def run_only_queries() -> list[str]:
    import inspect

    from attnstore.queries import QUERIES, load_all

    load_all()
    return sorted(
        name for name, spec in QUERIES.items() if not [p for p, v in spec.parameters().items() if v.default is inspect.Parameter.empty]
    )


if __name__ == "__main__":
    main()
