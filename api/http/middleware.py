"""ASGI middleware of the app: only the bound host's names are answered (`AllowedHosts`, against DNS rebinding);
requests that change state come from this server's own pages or a client that sends JSON, with a bounded body
(`RequestGuard`, against cross-site forms and unbounded bodies); and a run's path segment stays percent-encoded
until the endpoint (`RunSegment`), so a run named with a "/" sent as %2F is one segment."""

import json
from urllib.parse import quote, unquote, urlsplit

from starlette.datastructures import Headers
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import JSONResponse
from starlette.routing import Match, Mount

from .settings import host_of


class AllowedHosts(TrustedHostMiddleware):
    """Starlette's TrustedHostMiddleware (Host header names, `*.domain` patterns, `*` for any; the port is not
    compared), answering a refused Host with this API's JSON error and never redirecting."""

    async def __call__(self, scope, receive, send):
        if self.allow_any or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get("host")
        host = host_of(header)
        if host is not None and any(host == p or (p.startswith("*.") and host.endswith(p[1:])) for p in self.allowed_hosts):
            await self.app(scope, receive, send)
            return
        shown = repr(header[:100]) if header else "(none)"
        message = (
            f"Host header {shown} is not one this server answers ({', '.join(self.allowed_hosts)}): "
            "start it with `attnstore serve --allowed-host NAME` to answer another name"
        )
        await JSONResponse({"error": message}, status_code=400)(scope, receive, send)


# ------------------------------------------------------------------ run names in paths

RUNS_PATH = "/api/runs/"


def keep_run_segment(scope: dict) -> dict:
    """The scope with the run's path segment (/api/runs/RUN/...) still percent-encoded, the rest decoded.

    Servers decode %2F in the path before routing, so a run named `glue/MRPC-dev-x`, sent as `glue%2FMRPC-dev-x`,
    would span two segments and match no route. From the undecoded `raw_path` the run's segment is kept as sent
    (the endpoints decode it: `run_name`); without a raw path it is re-encoded, so decoding it gives it back.
    """
    root = scope.get("root_path", "") or ""
    path = scope.get("path", "")
    if not path.startswith(root + RUNS_PATH):
        return scope
    raw = scope.get("raw_path")
    segment: str | None = None
    tail = ""
    if raw is not None:
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            text = ""
        at = text.find(RUNS_PATH)
        if at >= 0 and unquote(text[:at]) == root:
            segment, slash, rest = text[at + len(RUNS_PATH) :].partition("/")
            tail = slash + unquote(rest)
    if segment is None:
        segment, slash, rest = path[len(root + RUNS_PATH) :].partition("/")
        segment, tail = quote(segment, safe=""), slash + rest
    return {**scope, "path": root + RUNS_PATH + segment + tail}


class RunSegment:
    """ASGI middleware: `keep_run_segment` on every HTTP request."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            scope = keep_run_segment(scope)
        await self.app(scope, receive, send)


def run_name(segment: str) -> str:
    """A run's path segment as `keep_run_segment` leaves it -> the run's name (or id)."""
    return unquote(segment)


# ------------------------------------------------------------------ state-changing requests and bodies

# The methods of this app's state-changing endpoints (tests/api/test_serve_attacks.py checks the schema has no other).
GUARDED_METHODS = frozenset({"POST"})
# Every response: no page of this server inside another site's frame (clickjacking of /label's buttons), no sniffing.
SECURITY_HEADERS = [
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]


def _refusal(status: int, message: str) -> tuple[dict, dict]:
    body = json.dumps({"error": message}).encode()
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *SECURITY_HEADERS],
    }
    return start, {"type": "http.response.body", "body": body}


DEFAULT_PORTS = {"http": "80", "https": "443"}


def _origin_scheme(origin: str) -> str:
    return urlsplit(origin.strip().lower()).scheme


def _netloc(host_header: str, scheme: str) -> str | None:
    """A Host header as `host:port` (the scheme's default port filled in), lower case; None if malformed."""
    host = host_of(host_header)
    if host is None:
        return None
    port = host_header.strip().lower()[len(host) :].lstrip(":") or DEFAULT_PORTS.get(scheme, "")
    return f"{host}:{port}"


def _origin_netloc(origin: str) -> str | None:
    """An Origin header (`scheme://host[:port]`) as `host:port`; None for "null" or anything but http(s)."""
    parts = urlsplit(origin.strip().lower())
    return _netloc(parts.netloc, parts.scheme) if parts.scheme in DEFAULT_PORTS and parts.netloc else None


class RequestGuard:
    """ASGI middleware: every response carries SECURITY_HEADERS; a POST (GUARDED_METHODS) to an endpoint is answered
    only if

    - it is not cross-site: an `Origin` header, where sent, is the request's own origin (its Host's host and port),
      and `Sec-Fetch-Site` is not `cross-site` (403);
    - its body is JSON (`Content-Type: application/json`), which no HTML form can send and which a page of another
      site can send only after a CORS preflight this server never grants (415): a form posted from any site could
      otherwise save results on an --allow-save server (`POST .../save` takes no body);
    - its body is at most `max_body_bytes` (413, decided from Content-Length before anything is read, or while a
      chunked body arrives): the body is read here and handed on whole, so no endpoint parses an unbounded one.
    """

    def __init__(self, app, max_body_bytes: int, routes: list):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.routes = routes  # the app's, still being added to when the middleware is made: read at each request

    def _routed(self, scope) -> bool:
        """Whether an endpoint takes this method at this path (a mount's static files take none): anything else is
        answered 404 / 405 by the routing, without reading a body, as it was."""
        return any(not isinstance(route, Mount) and route.matches(scope)[0] == Match.FULL for route in self.routes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message):
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(name, value) for name, value in SECURITY_HEADERS if name not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        if scope["method"] not in GUARDED_METHODS or not self._routed(scope):
            await self.app(scope, receive, send_secured)
            return
        refused = self._refusal(Headers(scope=scope))
        if refused is not None:
            for message in _refusal(*refused):
                await send(message)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                for reply in _refusal(413, self._too_large()):
                    await send(reply)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, handed = b"".join(chunks), False

        async def replay():
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the client's disconnect, if it goes

        await self.app(scope, replay, send_secured)

    def _too_large(self) -> str:
        return f"the request body is over {self.max_body_bytes} bytes, the most this server reads (ServeSettings.max_body_bytes)"

    def _refusal(self, headers: Headers) -> tuple[int, str] | None:
        origin = headers.get("origin")
        if origin is not None and _origin_netloc(origin) != _netloc(headers.get("host", ""), _origin_scheme(origin)):
            return 403, f"a request from another site (Origin {origin[:100]!r}) may not change this server's state"
        if headers.get("sec-fetch-site", "").lower() == "cross-site":
            return 403, "a request from another site (Sec-Fetch-Site: cross-site) may not change this server's state"
        media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            return 415, (
                f"send this request with `Content-Type: application/json` (got {media[:60] or 'none'!r}; "
                "a POST without a body takes it too): other types are what a cross-site form sends"
            )
        length = headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_body_bytes:
            return 413, self._too_large()
        return None
