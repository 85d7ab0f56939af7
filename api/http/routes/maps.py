"""One example's attention maps (layer, head, query, key): JSON for small slices, numpy's `.npy` for binary, within
the cell budget of each format."""

import gzip
import re

import numpy as np
from fastapi import APIRouter, Header, Query
from fastapi.responses import Response

from ....store.errors import InvalidArgumentError, TooLargeError
from ..encoding import accepts_gzip, dumps, float16_json, npy_bytes
from ..lane import EXAMPLE, RUN, Lane, choice, integer, text
from ..responses import answers
from ..settings import ServeSettings
from ..state import Server
from . import Example, Heads, Layers, Run, Srv, answer_here_or_on_a_thread


def parse_indices(text: str | None, name: str, size: int) -> list[int]:
    """'0,2,5-7' (or nothing / 'all': every one) -> 0-based indices, each checked against `size`."""
    if text is None or not text.strip() or text.strip().lower() == "all":
        return list(range(size))
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                first, last = (int(x) for x in part.split("-", 1))
                if last < first:
                    raise ValueError
                values = range(first, last + 1)
            else:
                values = range(int(part), int(part) + 1)
        except ValueError:
            raise InvalidArgumentError(f"{name}={text!r}: give 0-based {name}s and ranges like 0,2,5-7") from None
        for v in values:
            if not 0 <= v < size:
                raise InvalidArgumentError(f"{name} {v} is out of range: the model has {size} {name}s (0..{size - 1})")
            if v not in out:
                out.append(v)
    return out


def parse_rows(text: str | None, length: int) -> range | None:
    """'START-END' (0-based, inclusive) query rows of an example of `length` tokens -> a range; nothing: every row."""
    if text is None or not text.strip() or text.strip().lower() == "all":
        return None
    first, sep, last = text.strip().partition("-")
    try:
        start, stop = int(first), (int(last) if sep else int(first)) + 1
    except ValueError:
        raise InvalidArgumentError(f"rows={text!r}: give a 0-based range of query rows like 0-511") from None
    if not 0 <= start < stop <= length:
        raise InvalidArgumentError(f"rows={text!r} is out of range: the example has {length} query rows (0..{length - 1})")
    return range(start, stop)


def checked_slice(srv: Server, run: str, example: int, layer: str | None, head: str | None, binary: bool, rows: str | None = None) -> tuple:
    """The run's info, the checked layers, heads, the example's length and its query rows (None: all), within the cell
    budget of the format."""
    info = srv.info(run)
    layers = parse_indices(layer, "layer", info.n_layers)
    heads = parse_indices(head, "head", info.n_heads)
    length = int(srv.example_row(info, example)["length"])
    row_range = parse_rows(rows, length)
    n_rows = length if row_range is None else len(row_range)
    cells = len(layers) * len(heads) * n_rows * length
    budget = srv.settings.max_cells if binary else srv.settings.max_json_cells
    if cells > budget:
        raise TooLargeError(
            f"{len(layers)} layer(s) x {len(heads)} head(s) x {n_rows} x {length} tokens = {cells} cells, over this server's "
            f"budget of {budget} cells per {'.npy' if binary else 'JSON'} response; ask for a slice: layer=L&head=H&rows=0-511"
            + ("" if binary else f", or format=npy (budget {srv.settings.max_cells})")
        )
    return info, layers, heads, length, row_range


def read_slice(srv: Server, example: int, checked: tuple) -> tuple[dict, np.ndarray]:
    """The maps of a checked slice (`checked_slice`): (description, array (layer, head, query, key)); a block of query
    rows where it names one (a Q/K run rebuilds only those: store/qk.py)."""
    info, layers, heads, length, rows = checked
    srv.reading(read_span(layers, heads, info.n_heads, length))
    maps = srv.store.attention(info.id, example, layer=layers, head=heads, rows=rows)
    about = {"run": info.name, "example": example, "layers": layers, "heads": heads, "shape": list(maps.shape), "dtype": str(maps.dtype)}
    if rows is not None:
        about["rows"] = [rows.start, rows.stop - 1]
    return about, maps


def read_span(layers: list[int], heads: list[int], n_heads: int, length: int) -> int:
    """The cells `store.attention` reads for them: the span of the layers, and of the heads within one layer."""
    n_layers = max(layers) - min(layers) + 1
    span_heads = max(heads) - min(heads) + 1 if n_layers == 1 else n_heads
    return n_layers * span_heads * length * length


def maps_response(s: Server, example: int, checked: tuple, format: str, digits: int | None) -> Response:
    about, maps = read_slice(s, example, checked)
    if format == "npy":
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", about["run"])[:80]
        return Response(
            npy_bytes(maps),
            media_type="application/octet-stream",
            headers={
                "Content-Disposition": f'attachment; filename="{name}-example{example}.npy"',
                "X-Attnstore-Layers": ",".join(map(str, about["layers"])),
                "X-Attnstore-Heads": ",".join(map(str, about["heads"])),
            },
        )
    return Response(maps_json(about, maps, digits), media_type="application/json")


def maps_json(about: dict, maps: np.ndarray, digits: int | None) -> str:
    text = float16_json(maps, digits)  # the same bytes as below, without a float conversion per value
    if text is not None:
        head = dumps({**about, "attention": None})
        assert head.endswith('"attention":null}')
        return head[: -len("null}")] + text + "}"
    values = maps.astype(np.float64)
    if digits is not None:
        values = np.round(values, digits)
    return dumps({**about, "attention": values.tolist()})


# Answers (JSON or .npy) of at most this many cells (one head of up to 90 tokens: <= ~60 KB of JSON, 16 KB of .npy)
# are kept, 1,024 of them: the viewer asks for one head after another and back, and writing one costs more than
# FastAPI's routing of it (~0.06 ms for 2,500 cells of JSON).
KEPT_CELLS = 8192
# Larger answers are kept too, up to KEPT_LARGE_BYTES of bodies per process, least recently used out first (a client
# asks for a layer again as it asks for a head again): `.npy` ones of up to KEPT_LARGE_CELLS cells (one layer of 12
# heads up to 73 tokens, 55 KB for a layer of MRPC), compressed JSON ones of up to KEPT_GZIP_CELLS (a layer up to 147
# tokens; ~200 KB for a layer of MRPC, where compressing it costs ~6 ms).
KEPT_LARGE_CELLS = 1 << 16
KEPT_GZIP_CELLS = 1 << 18
KEPT_LARGE_BYTES = 64 << 20
# `.npy` answers larger still, up to KEPT_ARRAY_CELLS cells (every head of an example of up to 120 tokens, 72 maps: ~430
# KB for an MRPC pair), are kept within KEPT_ARRAY_BYTES of their own, so they never push a layer out: a kept one is
# answered on the event loop without a thread, a read or a copy (written per request, every head as `.npy` served 0.31-
# 0.33 of the trivial endpoint's requests/s: python benchmarks/load.py --home H --clients 20 --seconds 8,
# docs/PERFORMANCE.md 2026-11-27). The rest is written per request.
KEPT_ARRAY_CELLS = 1 << 20
KEPT_ARRAY_BYTES = 128 << 20
# JSON answers of at least GZIP_MIN_BYTES go gzip-compressed to a client whose Accept-Encoding admits it (browsers,
# requests and httpx do), at level 1 (nginx's default): float JSON text shrinks 2.8x (one layer of MRPC: 565 KB -> 202
# KB in 5.5 ms); level 6 gives 3.6x (157 KB) but takes 22 ms, and under load a layer's first answers then took most of
# the load bench's warm-up (docs/PERFORMANCE.md, 2026-11-27 "range reductions for five more kinds; larger HTTP answers kept").
GZIP_MIN_BYTES = 16 * 1024
GZIP_LEVEL = 1


def maps_answer(
    s: Server,
    run: str,
    example: int,
    layer: str | None = None,
    head: str | None = None,
    format: str = "json",
    digits: int | None = None,
    gzip: bool = False,
    rows: str | None = None,
) -> Response:
    """The maps endpoint's answer (its parameters' defaults are the endpoint's), in one of the heavy slots; a small one
    kept while the store's metadata is unchanged (as the example answers), a larger one written per request. `gzip`:
    the client accepts gzip, so a large JSON answer goes compressed (`compressed`)."""
    with s.heavy():
        checked = checked_slice(s, run, example, layer, head, binary=format == "npy", rows=rows)
        info, layers, heads, length, row_range = checked
        cells = len(layers) * len(heads) * (length if row_range is None else len(row_range)) * length
        packed = format == "json" and gzip

        def answer() -> Response:
            plain = maps_response(s, example, checked, format, digits)
            return compressed(plain) if packed else plain

        span = None if row_range is None else (row_range.start, row_range.stop)
        key = (info.id, info.status, info.n_stored, example, tuple(layers), tuple(heads), span, format, digits, packed)
        if cells <= KEPT_CELLS:
            return s.kept("maps answers", key, answer, 1024)
        if cells <= (KEPT_GZIP_CELLS if packed else KEPT_LARGE_CELLS):
            return s.kept("maps answers (large)", key, answer, 4096, KEPT_LARGE_BYTES)
        if format == "npy" and cells <= KEPT_ARRAY_CELLS:
            return s.kept("maps answers (arrays)", key, answer, 4096, KEPT_ARRAY_BYTES)
        return answer()


def compressed(answer: Response) -> Response:
    """A JSON answer gzip-compressed (Content-Encoding: gzip) if it is at least GZIP_MIN_BYTES, else as it is; either
    way marked `Vary: Accept-Encoding` (a cache between keeps the two forms apart)."""
    body = bytes(answer.body)
    if len(body) < GZIP_MIN_BYTES:
        answer.headers["Vary"] = "Accept-Encoding"
        return answer
    headers = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"}
    return Response(gzip.compress(body, GZIP_LEVEL, mtime=0), media_type="application/json", headers=headers)


def lanes(settings: ServeSettings) -> list[Lane]:
    """The maps endpoint's plain requests, for the fast lane (lane.py): the parameters as the endpoint bounds them."""
    params = {"layer": text(200), "head": text(200), "format": choice("json", "npy"), "digits": integer(1, 8), "rows": text(40)}
    return [Lane(rf"/api/runs/{RUN}/examples/{EXAMPLE}/attention", params, maps_answer, gzip=True)]


def router(settings: ServeSettings) -> APIRouter:
    api = APIRouter()

    @api.get(
        "/api/runs/{run}/examples/{example}/attention",
        tags=["examples"],
        responses={200: {"content": {"application/json": {}, "application/octet-stream": {}}}, **answers(404, 413)},
    )
    async def attention(
        run: str = Run,
        example: int = Example,
        layer: str | None = Layers,
        head: str | None = Heads,
        format: str = Query("json", pattern="^(json|npy)$", description="json (nested lists) or npy (numpy's binary file)."),
        digits: int | None = Query(None, ge=1, le=8, description="JSON only: round to this many decimals."),
        rows: str | None = Query(
            None, max_length=40, description="A block of query rows, 0-based and inclusive (0-511): long examples, Q/K runs."
        ),
        accept_encoding: str = Header("", include_in_schema=False),
        s: Server = Srv,
    ) -> Response:
        """One example's maps (layer, head, query, key), as JSON or .npy, within the cell budget. A JSON answer of 16 KB
        or more goes gzip-compressed to a client that accepts it (Accept-Encoding: gzip)."""
        gz = accepts_gzip(accept_encoding)
        return await answer_here_or_on_a_thread(s, lambda: maps_answer(s, run, example, layer, head, format, digits, gz, rows))

    return api
