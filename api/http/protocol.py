"""`attnstore serve --workers N` (N > 1): uvicorn's HTTP protocol with TCP_NODELAY on every connection, and a
listening socket of its own for each worker process (`listening_sockets`, `run_workers`).

With several workers, uvicorn binds the listening socket itself (`socket.socket(family)`: protocol number 0), and
asyncio sets TCP_NODELAY only on sockets whose protocol is IPPROTO_TCP, so every connection the workers accept keeps
Nagle's algorithm: a response written in two parts (headers, body) waits for the client's delayed ACK, 40 ms per
request on Linux (issue 29: 450 requests/s instead of 6000 for /api/health). One process (`uvicorn.run(app)`) binds
through asyncio and is not affected. uvicorn takes this class by its import path (`http=`: api/serve.py's
NODELAY_PROTOCOL), so its worker processes, started with `spawn`, import it themselves. (With a socket per worker
the parent binds them, as uvicorn bound its one, so the same holds.)
"""

import socket

try:  # what uvicorn's `http="auto"` picks: httptools where installed, else h11
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Protocol
except ImportError:
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Protocol  # type: ignore[assignment]


class NoDelayProtocol(_Protocol):
    """uvicorn's protocol (httptools or h11) that turns Nagle's algorithm off on its connection's socket."""

    def connection_made(self, transport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover (a socket that does not take it keeps its default)
                pass
        super().connection_made(transport)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def claim_port(host: str, port: int) -> int:
    """The port `serve` will listen on: `port`, or a free one for 0; OSError (EADDRINUSE) where any socket listens on
    it already. Probed with a socket without SO_REUSEPORT, which the kernel refuses beside any listener (SO_REUSEADDR
    only lets it past connections in TIME_WAIT): the workers' own sockets take SO_REUSEPORT, with which a second
    server of the same user would join the first one's port and take half its connections."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        return int(probe.getsockname()[1])


def listening_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` sockets bound to (host, port) with SO_REUSEPORT, one per worker process: the kernel then spreads new
    connections over them by a hash of each connection's addresses. On one shared socket the first worker awake
    accepts a whole burst of connections (asyncio accepts up to the backlog per wake-up), so 20 connections opened at
    once often all went to one of two workers and the other idled (benchmarks/load.py: /api/health at 5,000
    requests/s in such runs, 9,500 in the others). A port another process listens on is refused (`claim_port`)."""
    port = claim_port(host, port)
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(_family(host), socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            sock.set_inheritable(True)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def run_workers(app: str, workers: int, host: str, port: int, **options) -> None:
    """`uvicorn.run(app, workers=N, ...)` with a listening socket of its own for each worker (`listening_sockets`);
    OSError where the port cannot be had."""
    import uvicorn

    config = uvicorn.Config(app, workers=workers, host=host, port=port, **options)
    sockets = listening_sockets(host, port, workers)
    try:
        supervise(config, sockets)
    except KeyboardInterrupt:
        pass
    finally:
        for sock in sockets:
            sock.close()


def supervise(config, sockets: list[socket.socket]) -> None:
    """uvicorn's supervisor of worker processes (restarts a worker that dies, stops them on Ctrl-C / SIGTERM), each
    worker with its own listening socket of `sockets` (`listening_sockets`), also when it is started again."""
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors.multiprocess import Multiprocess, Process, logger

    class OwnSocketEach(Multiprocess):
        def __init__(self) -> None:
            super().__init__(config, sockets=[])
            self.own: dict[int, socket.socket] = {}  # id(process) -> its socket

        def start(self, sock: socket.socket) -> Process:
            process = Process(config, [sock])
            self.own[id(process)] = sock
            process.start()
            return process

        def init_processes(self) -> None:
            self.processes = [self.start(sock) for sock in sockets]

        def keep_subprocess_alive(self) -> None:
            """uvicorn's, with a worker that died started again on its own socket."""
            if self.should_exit.is_set():
                return
            for idx, process in enumerate(self.processes):
                if process.is_alive(timeout=config.timeout_worker_healthcheck):
                    continue
                process.kill()
                process.join()
                if process.exitcode == STARTUP_FAILURE:  # would fail the same way again
                    logger.error(f"Child process [{process.pid}] failed to start, stopping the parent process.")
                    self.should_exit.set()
                    return
                if self.should_exit.is_set():
                    return
                logger.info(f"Child process [{process.pid}] died")
                self.processes[idx] = self.start(self.own.pop(id(process)))

        def restart_all(self) -> None:
            for idx, old in enumerate(list(self.processes)):
                if self.should_exit.is_set():
                    return
                old.terminate()
                old.join()
                self.processes[idx] = self.start(self.own.pop(id(old)))

        def handle_ttin(self) -> None:  # one socket per worker: the number of workers stays as started
            pass

        def handle_ttou(self) -> None:
            pass

    OwnSocketEach().run()
