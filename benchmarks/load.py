"""A bounded load test of `attnstore serve` on loopback: the endpoints a viewer and a script use, under N connections.

Starts `attnstore serve` on 127.0.0.1 in a subprocess over a store (`--workers` processes, `--threads` each) and warms
every endpoint (so a query's first computation, in each worker, is not timed). Then, with `--client wrk` (the default
where `wrk` is on PATH: a C load generator, so the client is not the bottleneck), it runs
`wrk -t2 -cN -dTs --latency` against each endpoint of the mix in turn, each rotating over `--paths` URLs with random
examples, layers and heads (a Lua script), and against the trivial endpoint `GET /api/health` before and after them.
wrk sends `Accept-Encoding: gzip` (as browsers, requests and httpx do), so large JSON answers come compressed;
`--no-gzip` sends none.
It prints, per endpoint, requests/s, its ratio to the trivial endpoint's in the same run, p50/p99 latency, non-2xx
answers and socket errors, and pass / fail against issue 29's targets (ratio >= 0.5, p99 < 100 ms); plus the
machine's load average before and after, and the server's resident memory (all its processes).

With `--client python` it runs N client threads (httpx), each with its own connection, cycling through the mix for
T seconds, as before wrk: that client is itself the bottleneck on a small machine (its figures are the client's).
Traffic goes to 127.0.0.1 only, every run is bounded in time; the server is stopped at the end.

    python benchmarks/load.py --home attnstore-data --clients 20 --seconds 10             # wrk, where installed
    python benchmarks/load.py --home attnstore-data --client python --clients 20 --seconds 30
    python benchmarks/load.py --db postgresql+psycopg://... --root /shared/attention.zarr --run NAME

Needs the `serve` extra (fastapi, uvicorn), httpx, and for the default client `wrk` (Debian: `apt-get install wrk`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from urllib.parse import quote, urlencode

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


def tree_rss_mib(pid: int) -> float:
    """RSS of a process and its children (a server's worker processes)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children[ppid].append(int(entry))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += rss_mib(p)
        except OSError:
            continue
        todo.extend(children.get(p, []))
    return total


def loadavg() -> str:
    with open("/proc/loadavg", encoding="ascii") as fh:
        return " ".join(fh.read().split()[:3])


def start_server(args, port: int) -> subprocess.Popen:
    store = []
    for flag in ("db", "root", "home"):
        if getattr(args, flag):
            store += [f"--{flag}", getattr(args, flag)]
    command = [sys.executable, "-m", "attnstore.api.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--no-access-log", *store]
    if args.threads:
        command += ["--threads", str(args.threads)]
    if args.workers:
        command += ["--workers", str(args.workers)]
    if args.no_fast_lane:
        command.append("--no-fast-lane")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    log = open(args.server_log, "w", encoding="utf-8") if args.server_log else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(command, env=env, stdout=log, stderr=log, text=True)


def serving(args) -> tuple[subprocess.Popen, str, str]:
    """`attnstore serve` started on a free port and answering: (the server, its base URL, the run asked for or the
    first run); the caller stops the server."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server(args, port)
    try:
        wait_ready(base, server)
        runs = httpx.get(base + "/api/runs", timeout=30).json()["runs"]
    except BaseException:
        server.kill()
        raise
    return server, base, args.run or runs[0]["run"]


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
    r = f"{base}/api/runs/{quote(run, safe='')}"
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
        (
            "maps, one head (.npy)",
            lambda: (
                f"{r}/examples/{rng.choice(examples)}/attention",
                {"layer": rng.randrange(layers), "head": rng.randrange(heads), "format": "npy"},
            ),
        ),
        (
            "maps, one layer (.npy)",
            lambda: (f"{r}/examples/{rng.choice(examples)}/attention", {"layer": rng.randrange(layers), "format": "npy"}),
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


WRK_SCRIPT = """
%s
local paths = {%s}
local threads = 0
function setup(thread)
  thread:set("next_path", threads * 7919)
  threads = threads + 1
end
function request()
  next_path = next_path + 1
  return wrk.format("GET", paths[(next_path %% #paths) + 1])
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("ATTNSTORE_WRK {\\"requests\\": %%d, \\"duration_us\\": %%d, \\"bytes\\": %%d, \\"non2xx\\": %%d, " ..
    "\\"connect\\": %%d, \\"read\\": %%d, \\"write\\": %%d, \\"timeout\\": %%d, \\"p50_us\\": %%d, \\"p90_us\\": %%d, " ..
    "\\"p99_us\\": %%d, \\"max_us\\": %%d}\\n", summary.requests, summary.duration, summary.bytes, e.status, e.connect,
    e.read, e.write, e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


def lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def wrk(base: str, paths: list[str], args, seconds: float) -> dict:
    """One wrk run over `paths` (rotating; each of its threads from another place): its summary as a dict."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False, encoding="utf-8") as fh:
        accept = 'wrk.headers["Accept-Encoding"] = "gzip"' if args.gzip else ""  # as browsers, requests and httpx send
        fh.write(WRK_SCRIPT % (accept, ",\n".join(lua_string(p) for p in paths)))
        script = fh.name
    try:
        command = [
            args.wrk, f"-t{args.wrk_threads}", f"-c{args.clients}", f"-d{max(1, round(seconds))}s", "--latency",
            "--timeout", "10s", "-s", script, base + paths[0],
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60, check=False)
    finally:
        os.unlink(script)
    found = re.search(r"^ATTNSTORE_WRK (\{.*\})$", done.stdout, re.M)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"wrk failed ({done.returncode}): {done.stdout[-500:]} {done.stderr[-500:]}")
    out = json.loads(found.group(1))
    out["rps"] = out["requests"] / (out["duration_us"] / 1e6)
    return out


def paths_of(base: str, make, n: int) -> list[str]:
    out = []
    for _ in range(n):
        url, params = make()
        out.append(url[len(base) :] + ("?" + urlencode(params) if params else ""))
    return out


def run_wrk(args, base: str, server: subprocess.Popen, warm: list, kinds: list) -> None:
    """Each endpoint of the mix in turn under `--clients` wrk connections, the trivial endpoint before and after."""
    trivial = ["/api/health"]
    load_before = loadavg()
    print(f"load average before: {load_before}")
    for _name, make in kinds:  # every worker's first computation (a query in each process) is not timed
        wrk(base, paths_of(base, make, args.paths), args, args.warm_seconds)
    rss_warm = tree_rss_mib(server.pid)
    results: list[tuple[str, dict]] = [("trivial: GET /api/health (before)", wrk(base, trivial, args, args.seconds))]
    for name, make in kinds:
        results.append((name, wrk(base, paths_of(base, make, args.paths), args, args.seconds)))
    results.append(("trivial: GET /api/health (after)", wrk(base, trivial, args, args.seconds)))
    load_after = loadavg()
    rss_end = tree_rss_mib(server.pid)
    ceiling = (results[0][1]["rps"] + results[-1][1]["rps"]) / 2
    print(
        f"wrk -t{args.wrk_threads} -c{args.clients} -d{args.seconds:.0f}s per endpoint on 127.0.0.1, "
        f"{'Accept-Encoding: gzip' if args.gzip else 'no Accept-Encoding'}; "
        f"server: {args.workers or 'default'} worker(s), {args.threads or 'default'} thread(s) each; "
        f"trivial endpoint {results[0][1]['rps']:.0f} requests/s before the mix, {results[-1][1]['rps']:.0f} after, "
        f"ratios against their mean {ceiling:.0f}"
    )
    print()
    print(
        "| endpoint | requests | requests/s | ratio to trivial | p50 ms | p99 ms | non-2xx | socket errors | ratio >= 0.5 | p99 < 100 ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|:-:|:-:|")
    failed = 0
    for name, r in results:
        ratio = r["rps"] / ceiling
        sockets = r["connect"] + r["read"] + r["write"] + r["timeout"]
        ratio_ok, p99_ok = ratio >= 0.5, r["p99_us"] < 100_000
        failed += r["non2xx"] + sockets
        print(
            f"| {name} | {r['requests']} | {r['rps']:.0f} | {ratio:.2f} | {r['p50_us'] / 1000:.1f} | {r['p99_us'] / 1000:.1f} | "
            f"{r['non2xx']} | {sockets} | {'pass' if ratio_ok else 'FAIL'} | {'pass' if p99_ok else 'FAIL'} |"
        )
    print()
    print(f"load average before: {load_before}; after: {load_after}")
    print(f"server RSS (every process): {rss_warm:.0f} MiB after warm-up, {rss_end:.0f} MiB at the end")
    if failed:
        raise SystemExit(f"{failed} requests failed (non-2xx or socket errors)")


def run_python(args, base: str, server: subprocess.Popen, warm: list, run: str, info: dict, examples: list[int]) -> None:
    """`--clients` httpx threads cycling through the mix for `--seconds` (the client is the bottleneck)."""
    rss_start = tree_rss_mib(server.pid)
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

    load_before = loadavg()
    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(args.clients)]
    t_start = time.monotonic()
    for t in threads:
        t.start()
    rss_half = None
    while time.monotonic() - t_start < args.seconds and any(t.is_alive() for t in threads):
        time.sleep(0.5)
        rss_peak = max(rss_peak, tree_rss_mib(server.pid))
        if rss_half is None and time.monotonic() - t_start >= args.seconds / 2:
            rss_half = tree_rss_mib(server.pid)
    stop.set()
    for t in threads:
        t.join(60)
    elapsed = time.monotonic() - t_start
    rss_end = tree_rss_mib(server.pid)

    total = sum(len(v) for v in latencies.values())
    print(
        f"{args.clients} client threads (httpx) for {elapsed:.1f} s on 127.0.0.1: {total} requests, {total / elapsed:.1f} requests/s, "
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
    print(f"load average before: {load_before}; after: {loadavg()}")
    print(
        f"server RSS (every process): {rss_start:.0f} MiB after warm-up, {rss_half or float('nan'):.0f} MiB half-way, "
        f"{rss_end:.0f} MiB at the end, peak {rss_peak:.0f} MiB"
    )
    if sum(errors.values()):
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=None)
    parser.add_argument("--root", default=None)
    parser.add_argument("--home", default=None)
    parser.add_argument("--run", default=None, help="Run to read (default: the first run).")
    parser.add_argument(
        "--client",
        choices=("wrk", "python"),
        default="wrk" if shutil.which("wrk") else "python",
        help="wrk (the default where it is on PATH): each endpoint in turn under --clients connections; python: httpx threads "
        "cycling through the mix.",
    )
    parser.add_argument("--clients", type=int, default=20, help="Concurrent connections (wrk) or client threads (python).")
    parser.add_argument("--seconds", type=float, default=None, help="Per endpoint with wrk (default 10), in all with python (30).")
    parser.add_argument("--warm-seconds", type=float, default=2.0, help="wrk: untimed seconds per endpoint before the timed runs.")
    parser.add_argument("--paths", type=int, default=256, help="wrk: distinct URLs per endpoint (random examples, layers, heads).")
    parser.add_argument("--wrk", default="wrk", help="The wrk executable.")
    parser.add_argument("--wrk-threads", type=int, default=2)
    parser.add_argument(
        "--no-gzip",
        dest="gzip",
        action="store_false",
        help="wrk: send no Accept-Encoding (by default it sends gzip, as browsers, requests and httpx do: large JSON "
        "answers then come compressed)",
    )
    parser.add_argument("--max-requests", type=int, default=500_000, help="python: stop after this many requests in all.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="The server's --threads (default: its own).")
    parser.add_argument("--workers", type=int, default=None, help="The server's --workers (default: its own).")
    parser.add_argument("--no-fast-lane", action="store_true", help="Start the server with --no-fast-lane (FastAPI answers all).")
    parser.add_argument("--server-log", default=None, help="Write the server's output to this file.")
    args = parser.parse_args()
    if args.seconds is None:
        args.seconds = 10.0 if args.client == "wrk" else 30.0

    server, base, run = serving(args)
    try:
        info = httpx.get(f"{base}/api/runs/{quote(run, safe='')}", timeout=30).json()["run"]
        listing = httpx.get(f"{base}/api/runs/{quote(run, safe='')}/examples", params={"limit": 500, "skipped": "false"}, timeout=30).json()
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
            f"warm-up {time.monotonic() - started:.1f} s; client {args.client}"
        )
        if args.client == "wrk":
            run_wrk(args, base, server, warm, endpoints(base, run, info, examples, random.Random(args.seed + 1)))
        else:
            run_python(args, base, server, warm, run, info, examples)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
