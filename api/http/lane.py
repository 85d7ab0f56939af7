"""The fast lane: the most asked GET requests, in their plain form, answered before FastAPI's routing (issue 29).

Under load, FastAPI's own work per request (routing, solving the endpoint's dependencies, validating each parameter
with pydantic, its exception and exit-stack layers) cost more than the answer of a kept example's maps: py-spy on
one head's maps as .npy, 20 connections: the endpoint's work 22 % of the server's time, FastAPI's request handling
around it 41 %. A `Lane` is one endpoint's path and query parameters, each parsed by a strict parser that accepts a
subset of what FastAPI accepts (canonical decimal integers within the endpoint's bounds, texts within its length, one
of its choices), and the same function the endpoint calls. The `FastLane` middleware answers a GET request whose path
matches a lane and whose query has only that lane's parameters, each once and accepted by its parser, on the event
loop inside `Server.inline()` (only from what the server keeps, as `answer_here_or_on_a_thread` does).

Anything else goes on to FastAPI unchanged, which answers it as it always did: another method, an unknown, repeated
or empty parameter, a value the lane's parser does not accept, an answer that needs a thread (`NeedsThread`: a cache
miss, SQL, a large read, a busy slot) and any error (so a 404, 413 or 422 is always FastAPI's, with its message). A
lane's answer is the endpoint's own answer (same function, same arguments: tests/api/test_serve_lane.py compares
every lane's answers with FastAPI's, byte for byte). The lane sits inside `AllowedHosts` and `RunSegment`: a refused
Host header is refused before it, and a run's segment reaches it still encoded. `ServeSettings.fast_lane=False`
(`attnstore serve --no-fast-lane`) turns it off.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from fastapi.responses import Response

from .encoding import accepts_gzip
from .middleware import run_name
from .state import NeedsThread, Server

Parser = Callable[[str], Any]  # a query value -> the endpoint's argument; ValueError where the lane leaves it to FastAPI


def integer(low: int, high: int | None = None) -> Parser:
    """A decimal integer in [low, high], written plainly (no sign, spaces or leading zeros): a subset of pydantic's."""

    def parse(text: str) -> int:
        if not text.isdigit() or not text.isascii() or (len(text) > 1 and text[0] == "0") or len(text) > 12:
            raise ValueError(text)
        value = int(text)
        if value < low or (high is not None and value > high):
            raise ValueError(text)
        return value

    return parse


def text(max_length: int) -> Parser:
    def parse(value: str) -> str:
        if not value or len(value) > max_length:
            raise ValueError(value)
        return value

    return parse


def choice(*values: str) -> Parser:
    def parse(value: str) -> str:
        if value not in values:
            raise ValueError(value)
        return value

    return parse


def flag(value: str) -> bool:
    """true / false as sent by a client (pydantic also takes 1/0, yes/no, on/off: those go to FastAPI)."""
    if value == "true":
        return True
    if value == "false":
        return False
    raise ValueError(value)


RUN = r"(?P<run>[^/]+)"  # still percent-encoded (RunSegment): decoded with run_name
EXAMPLE = r"(?P<example>[0-9]{1,12})"
EXAMPLE_INDEX = integer(0)


@dataclass(frozen=True)
class Lane:
    """One endpoint's plain GET requests: its path (a regex over the path with named groups: `run` is decoded, an
    `example` parsed as an integer), its query parameters' parsers, and `answer(server, **arguments) -> Response`, the
    endpoint's own work (called inside `Server.inline()`)."""

    path: str
    params: dict[str, Parser]
    answer: Callable[..., Response]
    gzip: bool = False  # the answer also takes `gzip`: whether the request's Accept-Encoding admits it

    def arguments(self, match: re.Match, query: bytes) -> dict[str, Any] | None:
        """The answer's arguments from the path and query, or None where FastAPI must parse them."""
        args: dict[str, Any] = {}
        for name, value in match.groupdict().items():
            if name == "run":
                args["run"] = run_name(value)
            elif name == "example":
                try:
                    args["example"] = EXAMPLE_INDEX(value)
                except ValueError:
                    return None
            else:
                args[name] = value
        if query:
            try:
                pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True, strict_parsing=True)
            except ValueError:
                return None
            for key, value in pairs:
                parser = self.params.get(key)
                if parser is None or key in args:
                    return None
                try:
                    args[key] = parser(value)
                except ValueError:
                    return None
        return args


def header(scope, name: bytes) -> str:
    """A request header's value (the repeated ones joined with commas, as RFC 9110 allows); "" where absent."""
    values = [value.decode("latin-1") for key, value in scope.get("headers", ()) if key.lower() == name]
    return ", ".join(values)


class FastLane:
    """ASGI middleware: a GET request a lane takes is answered here from what the server keeps; the rest go on."""

    def __init__(self, app, lanes: list[Lane]):
        self.app = app
        self.lanes = [(re.compile(lane.path), lane) for lane in lanes]

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "GET":
            response = self.answer(scope)
            if response is not None:
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def answer(self, scope) -> Response | None:
        server: Server | None = getattr(scope["app"].state, "server", None)
        if server is None or scope.get("root_path"):
            return None
        path = scope["path"]
        for pattern, lane in self.lanes:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            args = lane.arguments(match, scope.get("query_string", b""))
            if args is None:
                return None
            if lane.gzip:
                args["gzip"] = accepts_gzip(header(scope, b"accept-encoding"))
            try:
                with server.inline():
                    return lane.answer(server, **args)
            except NeedsThread:
                return None
            except Exception:  # any error is FastAPI's to answer, with its status and message
                return None
        return None
