"""Typed sentences beside a cheap endpoint: `GET /api/health` latency while N clients type into `attnstore serve`.

Starts `attnstore serve` on 127.0.0.1 (benchmarks/load.py's server, `--workers` processes) over a store with a run of
a real model, loads the model in every worker (untimed), then for each answer form in turn (`npy`: the default,
float16 `.npy` of every map; `layer`: one layer's maps as `.npy`; `json`: every map as JSON, the former default)
runs `--clients` threads posting a sentence of about `--tokens` tokens to `POST /api/runs/RUN/scratch` in a loop,
with one more thread asking `GET /api/health` every 20 ms on its own connection. It prints per form the typed
requests answered (200), refused busy (503) and otherwise, their bytes and latency, and health's p50 / p99 / max
beside its figures with nobody typing, measured in the same run; pass / fail against p99 < 100 ms.

    python benchmarks/typed_load.py --home attnstore-data --clients 20 --seconds 20

Needs the `serve` and `ingest` extras and httpx. Traffic goes to 127.0.0.1 only; the server is stopped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from load import loadavg, serving  # noqa: E402

WORDS = (
    "the committee said on tuesday that its review of the proposed merger between the two regional banks would take "
    "at least another three months because several shareholders had raised questions about the valuation"
).split()


def sentence(tokens: int) -> str:
    """About `tokens` wordpieces of plain English (a word is about 1.1 of the default model's tokens)."""
    words = [WORDS[i % len(WORDS)] for i in range(int(tokens / 1.1))]
    return " ".join(words) + "."


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def health_probe(base: str, stop: threading.Event, took: list[float]) -> None:
    with httpx.Client(timeout=60) as http:
        while not stop.is_set():
            t0 = time.perf_counter()
            http.get(base + "/api/health")
            took.append(time.perf_counter() - t0)
            stop.wait(0.02)


def typing(base: str, url: str, body: dict, stop: threading.Event, results: list) -> None:
    with httpx.Client(timeout=120) as http:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                response = http.post(url, json=body)
                results.append((response.status_code, len(response.content), time.perf_counter() - t0))
                if response.status_code == 503:
                    stop.wait(float(response.headers.get("retry-after", "1")) / 5)  # back off, as a browser would retry
            except httpx.HTTPError as exc:
                results.append((type(exc).__name__, 0, time.perf_counter() - t0))


def phase(base: str, url: str, body: dict | None, clients: int, seconds: float) -> tuple[list[float], list]:
    stop = threading.Event()
    took: list[float] = []
    results: list = []
    threads = [threading.Thread(target=health_probe, args=(base, stop, took))]
    if body is not None:
        threads += [threading.Thread(target=typing, args=(base, url, body, stop, results)) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(180)
    return took, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=None)
    parser.add_argument("--root", default=None)
    parser.add_argument("--home", default=None)
    parser.add_argument("--run", default=None, help="Run whose model is typed into (default: the first run).")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=122, help="About this many tokens per typed sentence.")
    parser.add_argument("--seconds", type=float, default=20.0, help="Per answer form.")
    parser.add_argument("--forms", default="npy,layer,json", help="Answer forms to time, in order.")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--server-log", default=None)
    args = parser.parse_args()
    args.no_fast_lane = False

    server, base, run = serving(args)
    try:
        url = f"{base}/api/runs/{quote(run, safe='')}/scratch"
        text = sentence(args.tokens)
        info = httpx.get(base + "/api/info", timeout=30).json()
        cap = info.get("scratch", {}).get("max_tokens")
        if cap is not None and cap < args.tokens:
            print(f"note: the server runs the model on at most {cap} tokens: longer sentences are answered 413")
        forms = {"npy": {"text": text}, "layer": {"text": text, "layer": 0}, "json": {"text": text, "maps": "json"}}
        for _ in range(4 * (args.workers or 2)):  # each worker loads the model (a new connection may reach either)
            warm = httpx.post(url, json=forms["npy"], timeout=300)
            if warm.status_code != 200:
                raise SystemExit(f"warm-up: {warm.status_code} {warm.text[:300]}")
        length = warm.json()["length"]
        print(f"run {run!r}; a typed sentence of {length} tokens; {args.clients} typing clients; load {loadavg()}")
        idle, _ = phase(base, url, None, 0, min(args.seconds, 10.0))
        p99_idle = percentile(idle, 99) * 1000
        print(f"health with nobody typing: p50 {percentile(idle, 50) * 1000:.1f} ms, p99 {p99_idle:.1f} ms ({len(idle)} requests)")
        print("form   typed/s  200  503  other  bytes/answer  typed p50 ms  health p50 ms  p99 ms  max ms  p99 / idle  p99 < 100 ms")
        for name in args.forms.split(","):
            took, results = phase(base, url, forms[name], args.clients, args.seconds)
            statuses = Counter(r[0] for r in results)
            good = [r for r in results if r[0] == 200]
            size = statistics.median(r[1] for r in good) if good else 0
            typed_p50 = percentile([r[2] for r in good], 50) * 1000
            p99 = percentile(took, 99) * 1000
            other = sum(n for s, n in statuses.items() if s not in (200, 503))
            print(
                f"{name:<6} {len(good) / args.seconds:7.1f} {statuses[200]:4d} {statuses[503]:4d} {other:6d} {size:13,.0f} "
                f"{typed_p50:13.0f} {percentile(took, 50) * 1000:14.1f} {p99:7.1f} {max(took) * 1000:7.1f} "
                f"{p99 / p99_idle:11.1f}  {'pass' if p99 < 100 else 'FAIL'}"
            )
        print(f"load after: {loadavg()}")
    finally:
        server.terminate()
        try:
            server.wait(20)
        except Exception:  # noqa: BLE001
            server.kill()


if __name__ == "__main__":
    main()
