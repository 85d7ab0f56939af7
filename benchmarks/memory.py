"""Peak memory of `attnstore ingest` and `attnstore query` as the corpus grows (should stay flat).

    python benchmarks/memory.py [--corpus ../shared/data/glue/MRPC/dev.tsv] [--sizes 100 200 408]

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
    """Run a command in a fresh child (via a tiny wrapper) and return its peak RSS in MiB."""
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, check=True, capture_output=True, text=True)
    return int(out.stdout.strip()) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--format", default="pairs-tsv")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 200, 408])
    args = parser.parse_args()
    cli = [sys.executable, "-m", "attnstore.api.cli"]
    home = tempfile.mkdtemp(prefix="attnstore-mem-")
    env = {**os.environ, "ATTNSTORE_HOME": home, "HF_HUB_OFFLINE": "1"}
    subprocess.run(cli + ["db", "upgrade"], env=env, check=True, stdout=subprocess.DEVNULL)
    print(f"{'examples':>8s} {'ingest peak MiB':>16s} {'query peak MiB':>15s}")
    for n in args.sizes:
        run = f"mem-{n}"
        ingest = peak_mib(cli + ["ingest", "--corpus", args.corpus, "--format", args.format, "--limit", str(n),
                                 "--annotate", "whitespace", "--name", run, "--no-progress"], env)
        query = peak_mib(cli + ["query", "special_tokens", "--run", run], env)
        print(f"{n:8d} {ingest:16.0f} {query:15.0f}")


if __name__ == "__main__":
    main()
