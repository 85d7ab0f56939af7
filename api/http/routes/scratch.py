"""Type a sentence and look: POST /api/runs/RUN/scratch runs the run's model on a typed sentence (or pair) and answers
its tokens and its maps (every map, or one layer's or head's) as an ingest would store them (ingest/scratch.py), as
`.npy` of the stored dtype by default (JSON is bounded by the cells it may hold), without keeping them; `"save": true`
keeps the sentence as a run of its own, on a server started with --allow-save.

The run's model is loaded on the first request and kept for the server's life (`cached_model`). Without the ingest
extra (torch, transformers) the endpoint answers 501 in one line; a text over `max_scratch_chars` characters or
`max_scratch_tokens` tokens 413, naming the limit.
"""

import base64
import io
import time

import numpy as np
from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel, Field

from ....store.errors import InvalidArgumentError, ReadOnlyStoreError, TooLargeError
from ..encoding import json_value
from ..responses import answers, ok
from ..settings import NotAvailableError, ServeSettings, log
from ..state import Server
from . import Run, Srv


class TypedText(BaseModel):
    """A sentence, or a pair, to run the run's model on."""

    text: str = Field(description="The sentence (segment A). Tabs and line breaks are read as spaces.", max_length=100_000)
    text_b: str | None = Field(None, description="The pair's second sentence (segment B), if any.", max_length=100_000)
    maps: str = Field(
        "npy",
        pattern="^(json|npy)$",
        description="How the maps are answered: npy (the default: numpy's .npy file of the stored dtype, float16 for "
        "the default model, base64-encoded, in `attention_npy`; what the viewer asks for) or json (nested lists in "
        "`attention`, at most the server's max_json_cells cells: ask for one `layer` and/or `head`).",
    )
    layer: int | None = Field(None, ge=0, description="Answer only this layer's maps (0-based; default: every layer).")
    head: int | None = Field(None, ge=0, description="Answer only this head's maps in each layer answered (0-based).")
    digits: int | None = Field(None, ge=1, le=8, description="json only: round to this many decimals.")
    save: bool = Field(False, description="Also keep the sentence as a run of its own (scratch/RUN/DIGEST); --allow-save only.")


def scratch_available(settings: ServeSettings) -> dict:
    """Whether this server can run a model on typed text, and why not (GET /api/info's `scratch`)."""
    import importlib.util

    if not settings.scratch:
        return {"available": False, "why": "this server was started with --no-scratch"}
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        return {
            "available": False,
            "why": f"the ingest extra is not installed ({missing[0]} is missing): pip install torch==2.13.0 'attnstore[ingest]'",
        }
    return {"available": True, "max_tokens": settings.max_scratch_tokens, "max_chars": settings.max_scratch_chars}


def npy_base64(maps: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.save(buffer, maps, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _selected(attention: np.ndarray, body: TypedText, max_json_cells: int) -> np.ndarray:
    """The maps asked for, (layer, head, query, key) with the layer and head axes kept; 400 for a layer or head the
    model lacks, 413 for JSON of more than `max_json_cells` cells (JSON costs ~20 bytes a cell to write and send:
    every map of a 122-token sentence was 22 MB and 2.5 s of one worker's time)."""
    n_layers, n_heads = attention.shape[:2]
    if body.layer is not None and body.layer >= n_layers:
        raise InvalidArgumentError(f"layer {body.layer}: the model has layers 0..{n_layers - 1}")
    if body.head is not None and body.head >= n_heads:
        raise InvalidArgumentError(f"head {body.head}: the model has heads 0..{n_heads - 1}")
    maps = attention if body.layer is None else attention[body.layer : body.layer + 1]
    maps = maps if body.head is None else maps[:, body.head : body.head + 1]
    if body.maps == "json" and maps.size > max_json_cells:
        raise TooLargeError(
            f"the maps asked for are {maps.size:,} cells, over this server's {max_json_cells:,} as JSON: ask for one "
            '`layer` (and `head`), or `"maps": "npy"` (2 bytes a cell)'
        )
    return maps


def run_typed(srv: Server, run: str, body: TypedText) -> dict:
    if not srv.settings.scratch:
        raise NotAvailableError("this server was started with --no-scratch: it does not run models on typed text")
    from ....ingest.scratch import ModelRuntimeMissingError, attention_for_run, require_model_runtime, save_scratch

    try:
        require_model_runtime()
    except ModelRuntimeMissingError as exc:
        raise NotAvailableError(f"this server cannot run a model on typed text: {exc}") from None
    if body.save and not srv.settings.allow_save:
        raise ReadOnlyStoreError(
            "this server is read-only: a typed sentence is not kept; start it with `attnstore serve --allow-save` to save it as a run"
        )
    cap = srv.settings.max_scratch_chars
    for name, value in (("text", body.text), ("text_b", body.text_b)):
        if value is not None and len(value) > cap:
            raise TooLargeError(f"{name} is {len(value)} characters; this server runs the model on at most {cap} characters per segment")
    info = srv.info(run)
    started = time.perf_counter()
    limit = min(srv.settings.max_scratch_tokens, info.max_length)
    try:
        typed = attention_for_run(srv.store, info.name, body.text, body.text_b, max_tokens=limit)
    except TooLargeError as exc:
        raise TooLargeError(
            f"{exc}: this server runs the model on at most {limit} tokens (`attnstore serve --max-scratch-tokens`"
            f"{'' if limit == srv.settings.max_scratch_tokens else ', and the run stores at most ' + str(info.max_length)}); "
            "shorten the text"
        ) from None
    maps = _selected(typed.attention, body, srv.settings.max_json_cells)
    answer = {
        "run": info.name,
        "run_id": info.id,
        "model": typed.model,
        "text": typed.text,
        "text_b": typed.text_b,
        "n_layers": int(typed.attention.shape[0]),
        "n_heads": int(typed.attention.shape[1]),
        "length": len(typed.tokens),
        "shape": list(maps.shape),
        "layers": list(range(typed.attention.shape[0])) if body.layer is None else [body.layer],
        "heads": list(range(typed.attention.shape[1])) if body.head is None else [body.head],
        "dtype": str(maps.dtype),
        "truncated": typed.truncated,
        "full_length": typed.full_length,
        "max_tokens": limit,
        "tokenization": typed.tokenization,
        "weights_match": typed.settings.get("weights_match"),
        "tokens": [{k: json_value(v) for k, v in t.items()} for t in typed.tokens],
        "words": [{k: json_value(v) for k, v in w.items()} for w in typed.words],
        "model_seconds": round(typed.seconds, 4),
        "saved": None,
    }
    if body.maps == "npy":
        answer["attention_npy"] = npy_base64(maps)
    else:
        values = maps.astype(np.float64)
        answer["attention"] = (np.round(values, body.digits) if body.digits is not None else values).tolist()
    if body.save:
        saved = save_scratch(srv.store, info.name, body.text, body.text_b)
        answer["saved"] = {"run": saved.name, "run_id": saved.id, "n_stored": saved.n_stored}
    answer["seconds"] = round(time.perf_counter() - started, 4)
    log.info("typed text on run %r: %d tokens in %.3f s", info.name, len(typed.tokens), answer["seconds"])
    return answer


def router(settings: ServeSettings) -> APIRouter:
    api = APIRouter()

    @api.post("/api/runs/{run}/scratch", tags=["examples"], responses=answers(400, 403, 404, 413, 501))
    def scratch(body: TypedText, run: str = Run, s: Server = Srv) -> Response:
        """Run the run's model on a typed sentence (or pair) and answer its tokens and every map (layer, head, query,
        key), as an ingest would store them; nothing is kept unless `save` (--allow-save). The model is loaded on
        the first request and kept. 501 without the ingest extra; 413 over `max_scratch_tokens` tokens."""
        with s.heavy():
            return ok(run_typed(s, run, body))

    return api
