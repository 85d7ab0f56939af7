"""A bounded load test of `attnstore serve` on loopback: N concurrent clients for T seconds.

Starts `attnstore serve` (uvicorn, one process) on 127.0.0.1 in a subprocess over a store, warms
every endpoint once (so a query's first computation is not timed), then runs N client threads,
each with its own HTTP connection, cycling through the example, maps, query, metric and search
endpoints for T seconds (and at most --max-requests requests in all). Prints requests/s,
p50/p99 latency and errors per endpoint, and the server's resident memory (RSS) after warm-up,
at the end and its peak (sampled every 0.5 s). Traffic goes to 127.0.0.1 only; the server is
stopped at the end.

    python benchmarks/load.py --home attnstore-data --clients 20 --seconds 30
    python benchmarks/load.py --db postgresql+psycopg://... --root /shared/attention.zarr --run NAME

Needs the `serve` extra (fastapi, uvicorn) and httpx.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict

import httpx
import numpy as np


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def start_server(args, port: int) -> subprocess.Popen:
    store = []
    for flag in ("db", "root", "home"):
        if getattr(args, flag):
            store += [f"--{flag}", getattr(args, flag)]
    command = [sys.executable, "-m", "attnstore.api.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--no-access-log", *store]
    if args.threads:
        command += ["--threads", str(args.threads)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    log = open(args.server_log, "w", encoding="utf-8") if args.server_log else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(command, env=env, stdout=log, stderr=log, text=True)


def wait_ready(base: str, server: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode} (see --server-log)")
        try:
            if httpx.get(base + "/api/info", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the server did not answer within {timeout_s:.0f} s")


def endpoints(base: str, run: str, info: dict, examples: list[int], rng: random.Random) -> list[tuple[str, callable]]:
    """(name, function returning a URL + params) for each kind of request; the viewer's reads and the queries."""
    r = f"{base}/api/runs/{run}"
    layers, heads = info["n_layers"], info["n_heads"]
    return [
        ("examples page", lambda: (f"{r}/examples", {"offset": rng.randrange(0, max(1, len(examples) - 50)), "limit": 50})),
        ("example + tokens", lambda: (f"{r}/examples/{rng.choice(examples)}", {})),
        (
            "maps, one head (JSON)",
            lambda: (
                f"{r}/examples/{rng.choice(examples)}/attention",
                {"layer": rng.randrange(layers), "head": rng.randrange(heads), "digits": 4},
            ),
        ),
        (
            "maps, one layer (JSON)",
            lambda: (f"{r}/examples/{rng.choice(examples)}/attention", {"layer": rng.randrange(layers), "digits": 4}),
        ),
        ("maps, every head (.npy)", lambda: (f"{r}/examples/{rng.choice(examples)}/attention", {"format": "npy"})),
        ("query relative_position", lambda: (f"{r}/queries/relative_position", {})),
        ("head metric entropy", lambda: (f"{r}/head_metrics/entropy.entropy", {})),
        (
            "search NOUN + top-5",
            lambda: (
                f"{r}/search",
                {
                    "upos": "NOUN",
                    "layer": rng.randrange(layers),
                    "head": rng.randrange(heads),
                    "limit": 20,
                    "offset": rng.choice((0, 20, 40)),
                },
            ),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=None)
    parser.add_argument("--root", default=None)
    parser.add_argument("--home", default=None)
    parser.add_argument("--run", default=None, help="Run to read (default: the first run).")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--max-requests", type=int, default=500_000, help="Stop after this many requests in all.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="The server's --threads (default: its own).")
    parser.add_argument("--server-log", default=None, help="Write the server's output to this file.")
    args = parser.parse_args()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server(args, port)
    try:
        wait_ready(base, server)
        runs = httpx.get(base + "/api/runs", timeout=30).json()["runs"]
        run = args.run or runs[0]["run"]
        info = httpx.get(f"{base}/api/runs/{run}", timeout=30).json()["run"]
        listing = httpx.get(f"{base}/api/runs/{run}/examples", params={"limit": 500, "skipped": "false"}, timeout=30).json()
        examples = [e["example"] for e in listing["items"]]
        warm = endpoints(base, run, info, examples, random.Random(args.seed))
        started = time.monotonic()
        with httpx.Client(timeout=300) as http:
            for name, make in warm:  # first computations (queries, caches) are not timed
                url, params = make()
                response = http.get(url, params=params)
                if response.status_code != 200:
                    raise SystemExit(f"warm-up {name}: {response.status_code} {response.text[:300]}")
        print(
            f"server pid {server.pid}; run {run!r}: {info['n_stored']} examples, {info['n_layers']} x {info['n_heads']} heads; "
            f"warm-up {time.monotonic() - started:.1f} s"
        )
        rss_start = rss_mib(server.pid)
        rss_peak = rss_start
        latencies: dict[str, list[float]] = defaultdict(list)
        errors: dict[str, int] = defaultdict(int)
        lock = threading.Lock()
        count = [0]
        stop = threading.Event()

        def client(n: int) -> None:
            rng = random.Random(args.seed * 1000 + n)
            kinds = endpoints(base, run, info, examples, rng)
            mine: dict[str, list[float]] = defaultdict(list)
            failed: dict[str, int] = defaultdict(int)
            with httpx.Client(timeout=30) as http:
                i = n
                while not stop.is_set():
                    with lock:
                        if count[0] >= args.max_requests:
                            break
                        count[0] += 1
                    name, make = kinds[i % len(kinds)]
                    i += 1
                    url, params = make()
                    t0 = time.perf_counter()
                    try:
                        response = http.get(url, params=params)
                        response.read()
                        ok = response.status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    mine[name].append(time.perf_counter() - t0)
                    if not ok:
                        failed[name] += 1
            with lock:
                for name, values in mine.items():
                    latencies[name].extend(values)
                for name, value in failed.items():
                    errors[name] += value

        threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(args.clients)]
        t_start = time.monotonic()
        for t in threads:
            t.start()
        rss_half = None
        while time.monotonic() - t_start < args.seconds and any(t.is_alive() for t in threads):
            time.sleep(0.5)
            rss_peak = max(rss_peak, rss_mib(server.pid))
            if rss_half is None and time.monotonic() - t_start >= args.seconds / 2:
                rss_half = rss_mib(server.pid)
        stop.set()
        for t in threads:
            t.join(60)
        elapsed = time.monotonic() - t_start
        rss_end = rss_mib(server.pid)

        total = sum(len(v) for v in latencies.values())
        print(
            f"{args.clients} clients for {elapsed:.1f} s on 127.0.0.1: {total} requests, {total / elapsed:.1f} requests/s, "
            f"{sum(errors.values())} errors"
        )
        print()
        print("| endpoint | requests | requests/s | p50 ms | p99 ms | errors |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, _ in warm:
            values = np.array(latencies.get(name, [float("nan")])) * 1000
            print(
                f"| {name} | {len(latencies.get(name, []))} | {len(latencies.get(name, [])) / elapsed:.1f} | "
                f"{np.percentile(values, 50):.1f} | {np.percentile(values, 99):.1f} | {errors.get(name, 0)} |"
            )
        every = np.concatenate([np.array(v) for v in latencies.values()]) * 1000 if latencies else np.array([np.nan])
        print(
            f"| **all** | {total} | {total / elapsed:.1f} | {np.percentile(every, 50):.1f} | {np.percentile(every, 99):.1f} | "
            f"{sum(errors.values())} |"
        )
        print()
        print(
            f"server RSS: {rss_start:.0f} MiB after warm-up, {rss_half or float('nan'):.0f} MiB half-way, {rss_end:.0f} MiB at the end, "
            f"peak {rss_peak:.0f} MiB"
        )
        if sum(errors.values()):
            raise SystemExit(1)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
