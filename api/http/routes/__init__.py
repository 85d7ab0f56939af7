"""The API's endpoints, one module per resource, each a `router(settings)` that `create_app` includes in this order:
runs (and /api/info), maps, typed text, head metrics, queries, search, SQL, labels (the labelling page), and the viewer's pages (web).

A router is made per app since the bounds of its parameters (page sizes, rows, top k) come from that app's
ServeSettings. Its endpoints are plain `def`s (FastAPI runs them in its thread pool) that get the app's `Server`
through the `Srv` dependency, and each does its work in a function of its module that takes the Server. The most
asked ones are `async def`s that answer through `answer_here_or_on_a_thread`: on the event loop from what is kept,
else on the thread pool (state.py). Below, the parameters several endpoints share.

No `from __future__ import annotations` in these modules: FastAPI reads the endpoints' annotations.
"""

from collections.abc import Callable

from fastapi import Depends, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ....store.errors import StorageIOError
from ..middleware import run_name
from ..state import NeedsThread, Server


async def current_server(request: Request) -> Server:
    """The app's Server (`app.state.server`, set when the app starts: its lifespan opens the store)."""
    server = getattr(request.app.state, "server", None)
    if server is None:
        raise StorageIOError("the store is not open (the server is starting or stopping)")
    return server


async def answer_here_or_on_a_thread(s: Server, work: Callable[[], Response]) -> Response:
    """`work()` on the event loop where what the server keeps answers it (`Server.inline`), else on the thread pool."""
    try:
        with s.inline():
            return work()
    except NeedsThread:
        pass
    return await run_in_threadpool(work)


async def run_param(
    run: str = PathParam(description="Run id (`attnstore runs`), or its name with any `/` in it sent as `%2F`."),
) -> str:
    return run_name(run)


Srv = Depends(current_server)
Run = Depends(run_param)
Scan = Query(
    False,
    description="Read the maps even where nothing summarised serves the query and this server cannot keep what it "
    "reads (a read-only store): without it such a query answers 409 before reading (docs/SERVE.md).",
)
Example = PathParam(description="Example position in the corpus (0-based).")
Offset = Query(0, ge=0, description="Rows to skip.")
Layers = Query(None, description="Layers, 0-based: 3, 0,2 or 0-5; default every layer.", max_length=200)
Heads = Query(None, description="Heads, 0-based: 3, 0,2 or 0-11; default every head.", max_length=200)
