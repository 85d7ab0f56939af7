"""The viewer and the API reference: static files from api/web/ (no build step, nothing loaded from outside)."""

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

WEB_DIR = Path(__file__).parents[2] / "web"  # api/web/


def router() -> APIRouter:
    api = APIRouter()

    @api.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @api.get("/label", include_in_schema=False)
    def label() -> FileResponse:
        return FileResponse(WEB_DIR / "label.html", headers={"Cache-Control": "no-cache"})

    @api.get("/long", include_in_schema=False)
    def long_map() -> FileResponse:
        return FileResponse(WEB_DIR / "long.html", headers={"Cache-Control": "no-cache"})

    @api.get("/docs", include_in_schema=False)
    def docs() -> FileResponse:
        return FileResponse(WEB_DIR / "docs.html", headers={"Cache-Control": "no-cache"})

    return api


def mount_static(app: FastAPI) -> None:
    """/static/...: the viewer's files (a mount, which a router cannot carry)."""
    app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
