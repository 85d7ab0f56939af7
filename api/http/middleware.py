"""ASGI middleware of the app: only the bound host's names are answered (`AllowedHosts`, against DNS rebinding), and
a run's path segment stays percent-encoded until the endpoint (`RunSegment`), so a run named with a "/" sent as %2F
is one segment."""

from urllib.parse import quote, unquote

from starlette.datastructures import Headers
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import JSONResponse

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
