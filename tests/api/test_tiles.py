"""The long-map tiles (api/http/routes/tiles.py) on a hand-made 600-token map: a tile at full resolution is the map's
cells, a zoomed-out one their max-pool, edge tiles padded with 0, one line for a tile or head that is not there; and
the long-map page is served."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
with warnings.catch_warnings():  # starlette's TestClient asks for httpx2; httpx still works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from attnstore.api.serve import ServeSettings, create_app  # noqa: E402
from attnstore.store.qk import max_pool  # noqa: E402

N = 600


def long_maps() -> np.ndarray:
    """1 layer x 2 heads over N tokens: head 0 random causal rows, head 1 each row on the token before (a diagonal)."""
    rng = np.random.default_rng(0)
    maps = np.tril(rng.random((1, 2, N, N))).astype(np.float32)
    maps[0, 1] = np.eye(N, k=-1)
    maps[0, 1, 0, 0] = 1.0
    return maps / maps.sum(-1, keepdims=True)


@pytest.fixture
def client(store, make_run):
    make_run(store, [long_maps()], [[f"t{i}" for i in range(N)]], name="long", specials={}, chunk_cells=1 << 16)
    with TestClient(create_app(store, ServeSettings(), allowed_hosts=["testserver"]), raise_server_exceptions=False) as c:
        yield c


def tile(client, **params) -> np.ndarray:
    response = client.get("/api/runs/long/examples/0/tile", params={"layer": 0, "head": 0, **params})
    assert response.status_code == 200, response.text
    assert response.headers["X-Attnstore-Length"] == str(N)
    return np.frombuffer(response.content, np.uint8).reshape(256, 256)


def shade(values: np.ndarray) -> np.ndarray:
    return np.rint(255 * np.sqrt(values)).astype(np.uint8)


def test_tiles_are_the_cells_and_their_max_pool(client):
    maps = long_maps()[0, 0]
    np.testing.assert_array_equal(tile(client, level=0, row=1, col=0), shade(maps[256:512, 0:256]))
    edge = tile(client, level=0, row=2, col=2)  # rows and keys 512..599, then nothing
    np.testing.assert_array_equal(edge[:88, :88], shade(maps[512:, 512:]))
    assert not edge[88:].any() and not edge[:, 88:].any()
    overview = tile(client, level=2)  # 4 x 4 cells a pixel: the whole map in 150 x 150 pixels
    np.testing.assert_array_equal(overview[:150, :150], shade(max_pool(maps, 4)))
    diagonal = tile(client, level=1, head=1)  # the previous-token head stays a visible line however far out
    p = np.arange(1, 256)  # pixel row p: rows 2p, 2p + 1, on keys 2p - 1 and 2p (pixels p - 1 and p)
    assert (diagonal[p, p] == 255).all() and (diagonal[p, p - 1] == 255).all()


def test_a_tile_or_head_that_is_not_there_is_one_line(client):
    response = client.get("/api/runs/long/examples/0/tile", params={"layer": 0, "head": 0, "level": 0, "row": 3, "col": 0})
    assert response.status_code == 400 and response.json()["error"] == ("tile (3, 0) at level 0: the example's 600 tokens make 3 x 3 tiles")
    response = client.get("/api/runs/long/examples/0/tile", params={"layer": 0, "head": 2})
    assert response.status_code == 400 and "the model has 1 layers and 2 heads" in response.json()["error"]
    assert client.get("/api/runs/long/examples/0/tile", params={"layer": 0, "head": 0, "level": 9}).status_code == 400


def test_the_long_map_page_is_served(client):
    page = client.get("/long")
    assert page.status_code == 200 and 'src="static/long.js"' in page.text and 'id="long-canvas"' in page.text
    assert client.get("/static/long.js").status_code == 200


def test_a_band_holds_as_many_rows_of_tiles_as_fit_its_pooled_cells():
    """Bands of at most 2^20 pooled cells: an 8,192-token map's 1,024 x 1,024 overview is one band (made by one request
    on every core), its full resolution one row of tiles a band; the 600-token map above, one band at every level."""
    from attnstore.api.http.routes.tiles import BAND_CELLS, band_rows

    assert BAND_CELLS == 1 << 20
    assert (band_rows(8192, 3), band_rows(8192, 2), band_rows(8192, 0)) == (4, 2, 1)
    assert band_rows(N, 0) == 6 and band_rows(N, 2) >= 1
