"""Wall time of `attnstore` commands, two checkouts alternated in one sitting (a command's start-up, imports included).

    python benchmarks/cli_startup.py --old OLD_CHECKOUT --home STORE [--rounds 10] -- runs
    python benchmarks/cli_startup.py --old OLD_CHECKOUT --home STORE -- show MRPC-dev

OLD_CHECKOUT: a checkout of the version to compare with (e.g. `git worktree add /tmp/old <commit>`; its compiled
kernels, queries/_*.so, copied or built there if the command reduces maps); --new: the version under test (default:
this checkout). Each command runs as `python -m attnstore.api.cli ...` with `attnstore` imported from that checkout
(a folder holding an `attnstore` link to it, first on PYTHONPATH, ahead of the editable install), with this
interpreter, ATTNSTORE_HOME=STORE, old and new in turns; prints each version's median, minimum and maximum wall
seconds, and their ratio (docs/PERFORMANCE.md, 2026-11-28 "where the targets stand; zarr imported at its first use").
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def importable(checkout: Path, folder: Path, name: str) -> str:
    """A folder (made in `folder`) holding an `attnstore` link to `checkout`, for PYTHONPATH."""
    top = folder / name
    top.mkdir()
    (top / "attnstore").symlink_to(checkout.resolve(), target_is_directory=True)
    return str(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, type=Path, help="checkout of the version to compare with")
    parser.add_argument("--new", type=Path, default=HERE, help="checkout under test (default: this one)")
    parser.add_argument("--home", required=True, help="store folder (meta.sqlite, attention.zarr) the commands read")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the attnstore command line, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --, e.g. -- runs")
    with tempfile.TemporaryDirectory(prefix="attnstore-cli-startup-") as tmp:
        paths = {name: importable(checkout, Path(tmp), name) for name, checkout in (("old", args.old), ("new", args.new))}
        seconds: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(args.rounds):
            for name, path in paths.items():
                env = {**os.environ, "PYTHONPATH": path, "ATTNSTORE_HOME": args.home}
                start = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "attnstore.api.cli", *command], env=env, capture_output=True, timeout=300)
                seconds[name].append(time.perf_counter() - start)
                if done.returncode != 0:
                    raise SystemExit(f"{name}: `attnstore {' '.join(command)}` failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    print(f"attnstore {' '.join(command)}: {args.rounds} rounds, old and new in turns")
    for name, values in seconds.items():
        print(f"  {name}: median {statistics.median(values):.3f} s (min {min(values):.3f}, max {max(values):.3f})")
    print(f"  new / old: {statistics.median(seconds['new']) / statistics.median(seconds['old']):.2f}")


if __name__ == "__main__":
    main()
