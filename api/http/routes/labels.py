"""Labelling attention-pattern classes in the browser (Kovaleva et al. K1): the next map for a labeller, and a label
written to pattern_labels as source "human:NAME" (api/pattern_labels.py: `next_map`, `save_labels`, the same writer
as `attnstore patterns import`). Writing needs a server started with --allow-save; reading does not."""

import math

import numpy as np
import pandas as pd
from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import BaseModel, Field

from ....store.errors import InvalidArgumentError, ReadOnlyStoreError
from ...pattern_labels import labeller_source, labellers, next_map, save_labels
from ..responses import answers, ok
from ..settings import ServeSettings
from ..state import Server
from . import Srv

MAX_SKIPPED = 200  # maps a page may ask to pass over


class Label(BaseModel):
    """One map's class, given by a labeller."""

    labeller: str = Field(description="Who labels (1 to 58 printable characters): written as source human:NAME.", max_length=200)
    run: str = Field(description="Run id or name.", max_length=500)
    example: int = Field(ge=0, description="Example position (0-based).")
    layer: int = Field(ge=0)
    head: int = Field(ge=0)
    label: str = Field(description="vertical, diagonal, vertical+diagonal, block or heterogeneous.", max_length=32)


def parse_skip(text: str | None) -> set[tuple[str, int, int, int]]:
    """'RUN_ID.EXAMPLE.LAYER.HEAD,...' -> keys; RUN_ID is the run's numeric id."""
    out: set[tuple[str, int, int, int]] = set()
    for part in (text or "").split(","):
        if not part.strip():
            continue
        try:
            run, example, layer, head = (int(x) for x in part.strip().split("."))
        except ValueError:
            raise InvalidArgumentError(f"skip={part!r}: give maps as RUN_ID.EXAMPLE.LAYER.HEAD, comma-separated") from None
        out.add((str(run), example, layer, head))
    if len(out) > MAX_SKIPPED:
        raise InvalidArgumentError(f"skip names {len(out)} maps; at most {MAX_SKIPPED}")
    return out


def next_for(srv: Server, labeller: str, run: str | None, skip: str | None) -> dict:
    keys = parse_skip(skip)
    names = {}
    for run_id in {k[0] for k in keys}:
        names[run_id] = srv.info(run_id).name
    skipped = {(names[r], e, la, h) for r, e, la, h in keys}
    max_length = math.isqrt(srv.settings.max_json_cells)  # a map of one head fits one JSON answer
    item = next_map(srv.store, labeller, run=run, skip=skipped, max_length=max_length)
    source = labeller_source(labeller)
    done = len(srv.store.pattern_labels(source=source))
    if item is None:
        return {"labeller": labeller.strip(), "source": source, "labelled": done, "map": None}
    item["attention"] = np.round(item["attention"], 5).tolist()
    return {"labeller": labeller.strip(), "source": source, "labelled": done, "writable": srv.settings.allow_save, "map": item}


def write_label(srv: Server, body: Label) -> dict:
    if not srv.settings.allow_save:
        raise ReadOnlyStoreError(
            "this server is read-only: labels are not saved; start it with `attnstore serve --allow-save` to label maps"
        )
    source = labeller_source(body.labeller)
    info = srv.info(body.run)
    row = pd.DataFrame([dict(run=info.name, example=body.example, layer=body.layer, head=body.head, label=body.label)])
    saved = save_labels(srv.store, row, source=source)
    done = len(srv.store.pattern_labels(source=source))
    return {"saved": saved, "source": source, "run": info.name, "labelled": done}


def router(settings: ServeSettings) -> APIRouter:
    api = APIRouter()

    @api.get("/api/label/next", tags=["labels"], responses=answers(400, 404))
    def label_next(
        labeller: str = Query(description="Who labels (1 to 58 printable characters).", max_length=200),
        run: str | None = Query(None, description="Only this run (id or name); default every complete run.", max_length=500),
        skip: str | None = Query(None, description="Maps to pass over: RUN_ID.EXAMPLE.LAYER.HEAD, comma-separated.", max_length=8000),
        s: Server = Srv,
    ) -> Response:
        """The next map for a labeller: one they have not labelled, maps where the rules and the stored CNN labels
        disagree first; with its tokens, its attention (L x L), the rules' class and the CNN's. `map` is null when
        none is left."""
        with s.heavy():
            return ok(next_for(s, labeller, run, skip))

    @api.post("/api/label", tags=["labels"], responses=answers(400, 403, 404))
    def label(body: Label, s: Server = Srv) -> Response:
        """Write one map's class as the labeller's (pattern_labels, source human:NAME); only on a server started with
        --allow-save. Labelling a map again replaces the labeller's earlier label."""
        return ok(write_label(s, body))

    @api.get("/api/label/labellers", tags=["labels"])
    def label_labellers(s: Server = Srv) -> Response:
        """Every human label source with its labeller and number of labels."""
        frame = labellers(s.store)
        return ok({"labellers": [dict(source=r.source, labeller=r.labeller, n_labels=int(r.n_labels)) for r in frame.itertuples()]})

    return api
