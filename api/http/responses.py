"""The API's answers: JSON bodies (`ok`), errors as `{"error": "one line"}` (`error`, the exception handlers), and
the error answers the OpenAPI schema lists for each endpoint (`answers`, with the body `ApiError`; no 422)."""

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...store.errors import AttnStoreError
from .encoding import dumps
from .settings import ERROR_STATUS, RETRY_AFTER_S, ServerBusyError, log, status_for


class ApiError(BaseModel):
    """Every error's body."""

    error: str = Field(description="One line saying what went wrong and what to do; never a traceback.")


def answers(*statuses: int) -> dict:
    return {status: {"model": ApiError, "description": ERROR_STATUS[status]} for status in statuses}


def ok(payload: Any, status: int = 200) -> Response:
    return Response(dumps(payload), status_code=status, media_type="application/json")


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


# A request that fails validation is answered with its first few problems, each quoting at most SHOWN_CHARS of the
# value it got: the answer stays a line however large the request (a 30 MB body was once quoted once per field).
MAX_PROBLEMS = 5
SHOWN_CHARS = 60


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, dict | list) else f"a {type(value).__name__} of {len(value)} entries"
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"


def add_error_handlers(app: FastAPI) -> None:
    """Every error answered as `{"error": "one line"}`: attnstore's errors with their status (`status_for`), a request
    that fails validation 400, Starlette's own (an unknown endpoint, a method not allowed), and anything unexpected
    500 (logged here with its traceback, never sent)."""

    @app.exception_handler(AttnStoreError)
    def attnstore_error(request: Request, exc: AttnStoreError):
        status = status_for(exc)
        if isinstance(exc, ServerBusyError):
            log.warning("%s %s: %s", request.method, request.url.path, exc)
            return JSONResponse({"error": str(exc)}, status_code=status, headers={"Retry-After": str(RETRY_AFTER_S)})
        if status >= 500:
            log.error("%s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return error(status, str(exc))

    @app.exception_handler(RequestValidationError)
    def validation_error(request: Request, exc: RequestValidationError):
        problems = []
        errors = exc.errors()
        for e in errors[:MAX_PROBLEMS]:
            loc = list(e.get("loc", ()))
            where = ".".join(str(x) for x in (loc[1:] if loc and loc[0] in ("query", "path", "body", "header") else loc))
            problems.append(
                f"{where[:80] or 'request'}: {e.get('msg', 'invalid')}" + (f" (got {_shown(e['input'])})" if "input" in e and where else "")
            )
        if len(errors) > MAX_PROBLEMS:
            problems.append(f"and {len(errors) - MAX_PROBLEMS} more")
        return error(400, "; ".join(problems) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, exc: StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path} (see /docs)"
        return error(exc.status_code, message)

    @app.exception_handler(Exception)
    def unexpected(request: Request, exc: Exception):
        log.error("%s %s failed", request.method, request.url.path, exc_info=(type(exc), exc, exc.__traceback__))
        return error(500, f"internal error ({type(exc).__name__}); the server's log has the details")


def without_validation_answers(app: FastAPI) -> None:
    """The app's OpenAPI schema without FastAPI's 422 answers: this server answers a request that fails validation 400."""
    schema_of = app.openapi

    def openapi() -> dict:
        """FastAPI's schema without its 422 answers: this server answers a request that fails validation 400."""
        spec = schema_of()
        for methods in spec.get("paths", {}).values():
            for operation in methods.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            spec.get("components", {}).get("schemas", {}).pop(name, None)
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
