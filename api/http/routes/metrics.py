"""Per-head metrics of a run: those saved in head_metrics, and a few cheap ones computed on request when none are
saved (COMPUTABLE), each as a layers x heads matrix for the viewer's Heads tab."""

from typing import Any

import numpy as np
from fastapi import APIRouter, Query
from fastapi import Path as PathParam
from fastapi.responses import Response

from ....store.errors import NotFoundError
from ..encoding import dumps, json_value
from ..lane import RUN, Lane
from ..responses import answers, ok
from ..settings import ServeSettings
from ..state import Server
from . import Run, Scan, Srv, answer_here_or_on_a_thread

# Per-head metrics the server computes on request when none are saved (cheap, one pass over the maps).
COMPUTABLE: dict[str, tuple[str, ...]] = {
    "entropy": ("entropy", "entropy_from_cls", "uniform_entropy", "uniform_entropy_from_cls"),
    "special_tokens": ("to_cls", "to_sep", "to_punct", "to_other", "sep_from_sep", "sep_from_other"),
    "relative_position": ("to_previous", "to_self", "to_next"),
}


def head_metric_list(srv: Server, run: str) -> dict:
    info = srv.info(run)
    saved = srv.store.head_metrics(info.id)
    metrics = []
    if not saved.empty:
        for (metric, params), group in saved.groupby(["metric", "params"], sort=True):
            values = group["value"].dropna()
            metrics.append(
                {
                    "metric": metric,
                    "params": params,
                    "source": "saved",
                    "n": len(group),
                    "min": json_value(values.min()) if len(values) else None,
                    "max": json_value(values.max()) if len(values) else None,
                }
            )
    names = {m["metric"] for m in metrics}
    for query, columns in COMPUTABLE.items():
        for column in columns:
            if f"{query}.{column}" not in names:
                metrics.append({"metric": f"{query}.{column}", "params": None, "source": "on request", "n": None, "min": None, "max": None})
    return {"run": info.name, "n_layers": info.n_layers, "n_heads": info.n_heads, "metrics": metrics}


def head_metric_matrix(srv: Server, run: str, metric: str, params: str | None, scan: bool = False) -> dict:
    """A layers x heads matrix of one metric: saved values, else (entropy, special_tokens,
    relative_position) computed now over at most `max_query_examples` examples (`scan`: as `Server.query_frame`)."""
    info = srv.info(run)
    saved = srv.store.head_metrics(info.id, metric=metric)
    values = np.full((info.n_layers, info.n_heads), np.nan)
    out: dict[str, Any] = {"run": info.name, "metric": metric, "n_layers": info.n_layers, "n_heads": info.n_heads}
    if not saved.empty:
        available = sorted(saved["params"].unique().tolist(), key=lambda p: (p != "{}", p))
        if params is not None and params not in available:
            raise NotFoundError(f"metric {metric!r} of run {info.name!r} is saved with params {available}, not {params!r}")
        chosen = params if params is not None else available[0]
        rows = saved[saved["params"] == chosen]
        for layer, head_, value in zip(rows["layer"], rows["head"], rows["value"]):
            if 0 <= layer < info.n_layers and 0 <= head_ < info.n_heads:
                values[int(layer), int(head_)] = np.nan if value is None else value
        out.update(source="saved", params=chosen, params_available=available)
    else:
        query, _, column = metric.partition(".")
        if column not in COMPUTABLE.get(query, ()):
            known = ", ".join(f"{q}.*" for q in COMPUTABLE)
            raise NotFoundError(
                f"run {info.name!r} has no saved metric {metric!r} (save it with `attnstore query {query or 'NAME'} --save`); "
                f"this server computes only {known} on request"
            )
        positions = srv.stored_positions(info)
        if not positions:
            raise NotFoundError(f"run {info.name!r} has no stored examples")
        cap = srv.settings.max_query_examples
        kwargs: dict[str, Any] = {"examples": positions[:cap]} if len(positions) > cap else {}
        with srv.heavy():
            frame = srv.query_frame(info, query, kwargs, n_examples=min(cap, len(positions)), scan=scan)
        for layer, head_, value in zip(frame["layer"], frame["head"], frame[column]):
            values[int(layer), int(head_)] = value
        note = (
            f"computed now over the first {cap} of {len(positions)} examples"
            if kwargs
            else f"computed now over all {len(positions)} examples"
        )
        out.update(source="computed", params="{}", params_available=[], n_examples=min(cap, len(positions)), note=note)
    finite = values[np.isfinite(values)]
    out.update(
        values=[[json_value(v) for v in row] for row in values.tolist()],
        min=json_value(finite.min()) if finite.size else None,
        max=json_value(finite.max()) if finite.size else None,
    )
    return out


def metric_answer(s: Server, run: str, metric: str, params: str | None = None, scan: bool = False) -> Response:
    """The head metric endpoint's answer: its JSON text kept while the run is unchanged."""
    info = s.info(run)
    key = (info.id, info.status, info.n_stored, info.n_skipped, metric, params)  # scan=1 changes how, not what
    body = s.kept("metric answers", key, lambda: dumps(head_metric_matrix(s, run, metric, params, scan)), 256)
    return Response(body, media_type="application/json")


def lanes(settings: ServeSettings) -> list[Lane]:
    """A head metric asked without parameters, for the fast lane (lane.py)."""
    return [Lane(rf"/api/runs/{RUN}/head_metrics/(?P<metric>[^/]{{1,200}})", {}, metric_answer)]


def router(settings: ServeSettings) -> APIRouter:
    api = APIRouter()

    @api.get("/api/runs/{run}/head_metrics", tags=["head metrics"], responses=answers(404))
    def head_metrics(run: str = Run, s: Server = Srv) -> Response:
        """Saved per-head metrics of the run (with their parameters), and those computed on request."""
        return ok(head_metric_list(s, run))

    @api.get("/api/runs/{run}/head_metrics/{metric}", tags=["head metrics"], responses=answers(404, 409))
    async def head_metric(
        run: str = Run,
        metric: str = PathParam(description="query.column, e.g. entropy.entropy", max_length=200),
        params: str | None = Query(None, max_length=2000, description="The saved parameters (JSON text) when several were saved."),
        scan: bool = Scan,
        s: Server = Srv,
    ) -> Response:
        """One metric as a layers x heads matrix: saved, else computed now (entropy, special_tokens, relative_position)."""
        return await answer_here_or_on_a_thread(s, lambda: metric_answer(s, run, metric, params, scan))

    return api
