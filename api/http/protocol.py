"""uvicorn's HTTP protocol with TCP_NODELAY on every connection, for `attnstore serve --workers N` (N > 1).

With several workers, uvicorn binds the listening socket itself (`socket.socket(family)`: protocol number 0), and
asyncio sets TCP_NODELAY only on sockets whose protocol is IPPROTO_TCP, so every connection the workers accept keeps
Nagle's algorithm: a response written in two parts (headers, body) waits for the client's delayed ACK, 40 ms per
request on Linux (issue 29: 450 requests/s instead of 6000 for /api/health). One process (`uvicorn.run(app)`) binds
through asyncio and is not affected. uvicorn takes this class by its import path (`http=`: api/serve.py's
NODELAY_PROTOCOL), so its worker processes, started with `spawn`, import it themselves.
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
