"""Tiles of one head's map, for browsing a long example by zooming (the viewer's long-map page, /long).

A tile is TILE x TILE pixels of one (layer, head) map at a zoom `level`: each pixel covers 2**level x 2**level cells and
shows their maximum (max-pooling: a sink column or a diagonal stays visible however far out), as one byte,
round(255 * sqrt(weight)) (the square root spreads the small weights most cells hold). Tile (row, col) covers query
rows [row, row + 1) x TILE x 2**level and keys likewise; cells past the example's end are 0. Only the rows of the tile's
band (one or more rows of tiles, at most BAND_CELLS pooled cells) are read (a Q/K run rebuilds only those:
store/qk.py), and a band, pooled, is kept for its other tiles: a view of an 8,192-token map never ships or holds the
map.
"""

import threading

import numpy as np
from fastapi import APIRouter, Query
from fastapi.responses import Response

from ....store.errors import InvalidArgumentError
from ..responses import answers
from ..settings import ServeSettings
from ..state import Server
from . import Example, Run, Srv, answer_here_or_on_a_thread

TILE = 256
MAX_LEVEL = 8  # 2**8 x 256 = 65,536 tokens in one tile
BAND_BYTES = 256 * 2**20  # the pooled bands the server keeps
# A band holds as many rows of tiles as fit in this many pooled cells (at least one): a zoomed-out view of a long map is
# then made by one request, on every core, while its other tiles wait for it (an 8,192-token map's 1,024 x 1,024
# overview: one band, not four made two at a time: `pytest tests/api/test_long_map_browser.py -s`).
BAND_CELLS = 1 << 20


def band_rows(length: int, level: int) -> int:
    """Rows of tiles in one band at `level` for an example of `length` tokens."""
    return max(1, BAND_CELLS // (TILE * -(-length // 2**level)))


def pooled_band(srv: Server, info, example: int, length: int, layer: int, head: int, level: int, band_row: int) -> np.ndarray:
    """Band `band_row` of the head's map (its band_rows(...) rows of tiles), max-pooled by 2**level over rows and keys:
    (<= band_rows x TILE, ceil(length / 2**level)) uint8 (`store.pooled_attention`: a Q/K run's without rebuilding the
    map)."""
    factor = 2**level
    span = band_rows(length, level) * TILE * factor
    first = band_row * span
    rows = range(first, min(length, first + span))
    srv.reading(len(rows) * length)
    pooled = srv.store.pooled_attention(info.id, example, layer, head, rows, factor)  # its own: shaded in place
    np.clip(pooled, 0, 1, out=pooled)
    np.sqrt(pooled, out=pooled)
    pooled *= 255
    return np.rint(pooled, out=pooled).astype(np.uint8)


_making: dict[tuple, threading.Lock] = {}  # the bands being made: a band's other tiles wait for it, not make it again
_making_lock = threading.Lock()


def band(s: Server, info, example: int, length: int, layer: int, head: int, level: int, band_row: int) -> np.ndarray:
    """Pooled band `band_row`, kept; made in one of the server's heavy slots, once however many of its tiles ask at once."""
    key = (info.id, info.status, info.n_stored, example, layer, head, level, band_row)

    def make() -> np.ndarray:
        with _making_lock:
            lock = _making.setdefault(key, threading.Lock())
        with lock:
            try:
                return s.kept("tile bands", key, made, 4096, BAND_BYTES)  # made by the tile that held the lock first
            finally:
                with _making_lock:
                    _making.pop(key, None)

    def made() -> np.ndarray:
        with s.heavy():
            return pooled_band(s, info, example, length, layer, head, level, band_row)

    return s.kept("tile bands", key, make, 4096, BAND_BYTES)


def tile_answer(s: Server, run: str, example: int, layer: int, head: int, level: int, row: int, col: int) -> Response:
    info = s.info(run)
    if not (0 <= layer < info.n_layers and 0 <= head < info.n_heads):
        raise InvalidArgumentError(f"layer {layer}, head {head}: the model has {info.n_layers} layers and {info.n_heads} heads (0-based)")
    length = int(s.example_row(info, example)["length"])
    span = TILE * 2**level
    tiles = -(-length // span)
    if not (0 <= row < tiles and 0 <= col < tiles):
        raise InvalidArgumentError(f"tile ({row}, {col}) at level {level}: the example's {length} tokens make {tiles} x {tiles} tiles")
    per_band = band_rows(length, level)
    top = row % per_band * TILE  # the tile's first row in its band
    part = band(s, info, example, length, layer, head, level, row // per_band)[top : top + TILE, col * TILE : (col + 1) * TILE]
    tile = np.zeros((TILE, TILE), np.uint8)
    tile[: part.shape[0], : part.shape[1]] = part
    headers = {"X-Attnstore-Length": str(length), "X-Attnstore-Tile": f"{level},{row},{col}", "Cache-Control": "private, max-age=60"}
    return Response(tile.tobytes(), media_type="application/octet-stream", headers=headers)


def router(settings: ServeSettings) -> APIRouter:
    api = APIRouter()

    @api.get(
        "/api/runs/{run}/examples/{example}/tile",
        tags=["examples"],
        responses={200: {"content": {"application/octet-stream": {}}}, **answers(400, 404)},
    )
    async def tile(
        run: str = Run,
        example: int = Example,
        layer: int = Query(..., ge=0, description="Layer, 0-based."),
        head: int = Query(..., ge=0, description="Head, 0-based."),
        level: int = Query(0, ge=0, le=MAX_LEVEL, description="Zoom level: each pixel covers 2**level x 2**level cells."),
        row: int = Query(0, ge=0, description="Tile row: query rows row*256*2**level onwards."),
        col: int = Query(0, ge=0, description="Tile column: keys col*256*2**level onwards."),
        s: Server = Srv,
    ) -> Response:
        """A 256 x 256 tile of one head's map: 65,536 bytes, row-major, each round(255 * sqrt(w)) of the largest weight w
        among the 2**level x 2**level cells it covers (0 past the example's end). Headers: X-Attnstore-Length (the
        example's tokens), X-Attnstore-Tile (level,row,col)."""
        return await answer_here_or_on_a_thread(s, lambda: tile_answer(s, run, example, layer, head, level, row, col))

    return api
