"""What loopback HTTP costs without attnstore: a bare asyncio server answering every GET with kept bytes, under wrk.

    python benchmarks/bare_server.py [--bytes 417000] [--bodies 256] [--processes 2] [--seconds 6] [--sendfile]

`--processes` server processes share a port (SO_REUSEPORT, TCP_NODELAY), each answering every request with the next
of `--bodies` random bodies of `--bytes` bytes (headers and body written as two kept byte strings, as uvicorn writes
a kept attnstore answer; `--sendfile`: the body sent from a memfd with `loop.sendfile`). `wrk -t2 -c20` drives it for
`--seconds`; the script prints requests/s and the CPU time per request of the servers and of wrk (from /proc and
getrusage). Compare with `benchmarks/load.py`'s "maps, every head (.npy)" line (~417 KB for an MRPC pair), to tell
what the body's copies through the kernel cost from what the server's own work costs (docs/PERFORMANCE.md, 2026-11-28
"the CLI's heap and the reduces' temporaries" and "where the targets stand").
Needs Linux and wrk (Debian: `apt-get install wrk`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import time


def serve(port: int, size: int, bodies: int, sendfile: bool) -> None:
    """One server process (run as a child of this script)."""
    kept = [os.urandom(size) for _ in range(bodies)]
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: %d\r\n\r\n" % size
    files = []
    for body in kept if sendfile else []:
        fd = os.memfd_create("body")
        os.write(fd, body)
        files.append(os.fdopen(fd, "rb"))
    turn = [0]

    class Answer(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.transport = transport
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def data_received(self, data: bytes) -> None:  # wrk sends one GET at a time per connection
            turn[0] += 1
            if sendfile:
                asyncio.get_running_loop().create_task(self.send_file(files[turn[0] % bodies]))
            else:
                self.transport.write(head)
                self.transport.write(kept[turn[0] % bodies])

        async def send_file(self, file) -> None:
            self.transport.write(head)
            await asyncio.get_running_loop().sendfile(self.transport, file, 0, size)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Answer, "127.0.0.1", port, reuse_port=True)
        await server.serve_forever()

    asyncio.run(main())


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (/proc/PID/stat, fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=417_000, help="bytes of each body (~417 KB: every head of an MRPC pair)")
    parser.add_argument("--bodies", type=int, default=256, help="distinct bodies, answered in turn")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--sendfile", action="store_true", help="send each body from a memfd with loop.sendfile")
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)  # a child: serve on this port
    args = parser.parse_args()
    small = [f"--{name}" for name in ("bytes", "bodies", "processes", "seconds") if getattr(args, name) < 1]
    if small:
        parser.error(f"{', '.join(small)}: give 1 or more")
    if args.serve:
        serve(args.serve, args.bytes, args.bodies, args.sendfile)
        return
    if not shutil.which("wrk"):
        raise SystemExit("needs wrk on PATH (Debian: apt-get install wrk)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    child = [sys.executable, __file__, "--serve", str(port), "--bytes", str(args.bytes), "--bodies", str(args.bodies)]
    servers = [subprocess.Popen(child + (["--sendfile"] if args.sendfile else [])) for _ in range(args.processes)]
    try:
        deadline = time.monotonic() + 30
        while True:  # until the port answers
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or any(s.poll() is not None for s in servers):
                    raise SystemExit("the bare server did not start") from None
                time.sleep(0.2)
        time.sleep(1)  # every process listening
        before = sum(cpu_seconds(s.pid) for s in servers)
        wrk_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        command = ["wrk", "-t2", "-c20", f"-d{args.seconds}s", f"http://127.0.0.1:{port}/"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.seconds + 30)
        wrk_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_cpu = sum(cpu_seconds(s.pid) for s in servers) - before
    finally:
        for s in servers:
            s.terminate()
            s.wait(timeout=10)
    found = re.search(r"Requests/sec:\s+([0-9.]+)", done.stdout)
    if done.returncode != 0 or not found:
        raise SystemExit(f"wrk failed: {done.stdout[-500:]} {done.stderr[-500:]}")
    rate = float(found.group(1))
    requests = rate * args.seconds
    wrk_cpu = (wrk_after.ru_utime - wrk_before.ru_utime) + (wrk_after.ru_stime - wrk_before.ru_stime)
    how = "sendfile from a memfd" if args.sendfile else "kept bytes written"
    print(
        f"bare asyncio, {args.processes} process(es), {args.bodies} bodies of {args.bytes:,} bytes ({how}): {rate:,.0f} requests/s; "
        f"CPU per request: servers {server_cpu / requests * 1e3:.3f} ms, wrk {wrk_cpu / requests * 1e3:.3f} ms"
    )


if __name__ == "__main__":
    main()
