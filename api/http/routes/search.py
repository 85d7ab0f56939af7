"""The corpus search (in the spirit of exBERT): tokens by word form, token text, UPOS tag and dependency relation,
listed by example, with where each hit attends in a chosen head; and the tags and relations a run's words have, for
the search form. The SQL is the store's (store/search.py)."""

from typing import Any

import numpy as np
from fastapi import APIRouter, Query
from fastapi.responses import Response

from ....store import search as corpus
from ....store.errors import InvalidArgumentError
from ..encoding import dumps, json_value
from ..lane import RUN, Lane, choice, integer, text
from ..responses import answers, ok
from ..settings import ServeSettings
from ..state import Server
from . import Offset, Run, Srv, answer_here_or_on_a_thread


def annotation_values(srv: Server, run: str) -> dict:
    """UPOS tags and dependency relations of the run's words, most frequent first (for the search form)."""
    info = srv.info(run)
    return {"run": info.name, **srv.annotation_counts(info)}


def search(
    srv: Server,
    run: str,
    word: str | None,
    token: str | None,
    upos: str | None,
    deprel: str | None,
    pieces: str,
    layer: int | None,
    head: int | None,
    k: int,
    offset: int,
    limit: int,
) -> dict:
    """Tokens whose word form / token / UPOS / relation match, by example; for a chosen head, where each one attends."""
    info = srv.info(run)
    if not any(v not in (None, "") for v in (word, token, upos, deprel)):
        raise InvalidArgumentError("search needs at least one of word, token, upos, deprel")
    if pieces not in ("first", "all"):
        raise InvalidArgumentError(f"pieces={pieces!r}: give first (one hit per word) or all (every wordpiece)")
    if (layer is None) != (head is None):
        raise InvalidArgumentError("give both layer and head (0-based) to see where the hits attend, or neither")
    if layer is not None and not 0 <= layer < info.n_layers:
        raise InvalidArgumentError(f"layer {layer} is out of range: the model has {info.n_layers} layers (0..{info.n_layers - 1})")
    if head is not None and not 0 <= head < info.n_heads:
        raise InvalidArgumentError(f"head {head} is out of range: the model has {info.n_heads} heads (0..{info.n_heads - 1})")
    first = pieces == "first" and not token

    def find() -> tuple[list[dict[str, Any]], int, dict[int, dict]]:
        """The hits and their examples' tokens (SQL), kept while the store is unchanged: the same for every head."""
        found, total = corpus.find_tokens(srv.sql, info.id, word, token, upos, deprel, first, limit, offset)
        hits: list[dict[str, Any]] = [{column: json_value(value) for column, value in hit.items()} for hit in found]
        for hit in hits:
            hit["is_special"] = bool(hit["is_special"])
        examples = sorted({h["example"] for h in hits})
        contexts: dict[int, dict] = {e: {"tokens": [], "is_special": [], "word_position": []} for e in examples}
        if examples:  # every listed example's tokens in one statement
            for example, tok, special, word_position in corpus.example_tokens(srv.sql, info.id, info.dataset_id, examples):
                context = contexts[example]
                context["tokens"].append(str(tok))
                context["is_special"].append(bool(special))
                context["word_position"].append(json_value(word_position))
        for hit in hits:
            head_word = hit.get("head")
            positions = contexts[hit["example"]]["word_position"]
            hit["head_positions"] = [] if head_word is None else [i for i, w in enumerate(positions) if w == head_word]
        return hits, total, contexts

    key = (info.id, info.n_stored, word, token, upos, deprel, first, limit, offset)
    kept_hits, total, contexts = srv.kept("search hits", key, find, 256)
    hits = [dict(hit) for hit in kept_hits]  # this answer's own: the attention below is added to them
    if layer is not None:
        srv.reading(sum(len(c["tokens"]) ** 2 for c in contexts.values()))
        maps = {e: srv.store.attention(info.id, e, layer=[layer], head=[head])[0, 0] for e in contexts}
        for hit in hits:
            context = contexts[hit["example"]]
            row = maps[hit["example"]][hit["position"]].astype(np.float64)
            top = np.argsort(-row, kind="stable")[:k]
            hit["attention"] = np.round(row, 4).tolist()
            hit["top"] = [{"position": int(j), "token": context["tokens"][j], "weight": round(float(row[j]), 4)} for j in top]
    return {
        "run": info.name,
        "layer": layer,
        "head": head,
        "k": k,
        "total": total,
        "offset": offset,
        "limit": limit,
        "hits": hits,
        "examples": {str(e): c for e, c in contexts.items()},
    }


def search_answer(
    s: Server,
    run: str,
    word: str | None = None,
    token: str | None = None,
    upos: str | None = None,
    deprel: str | None = None,
    pieces: str = "first",
    layer: int | None = None,
    head: int | None = None,
    k: int = 5,
    offset: int = 0,
    limit: int = 20,
) -> Response:
    """The search endpoint's answer (its parameters' defaults are the endpoint's), in one of the heavy slots; its JSON
    text kept while the store is unchanged (the viewer pages through hits and switches heads back and forth; a fresh
    answer reads a head of each listed example and writes their rows, ~1 ms for a page of 20)."""
    with s.heavy():
        info = s.info(run)
        key = (info.id, info.status, info.n_stored, word, token, upos, deprel, pieces, layer, head, k, offset, limit)
        body = s.kept(
            "search answers", key, lambda: dumps(search(s, run, word, token, upos, deprel, pieces, layer, head, k, offset, limit)), 256
        )
        return Response(body, media_type="application/json")


def lanes(settings: ServeSettings) -> list[Lane]:
    """The search's plain requests, for the fast lane (lane.py), bounded as the endpoint bounds them."""
    params = {
        "word": text(200),
        "token": text(200),
        "upos": text(32),
        "deprel": text(64),
        "pieces": choice("first", "all"),
        "layer": integer(0),
        "head": integer(0),
        "k": integer(1, settings.max_top_k),
        "offset": integer(0),
        "limit": integer(1, settings.max_search_page),
    }
    return [Lane(rf"/api/runs/{RUN}/search", params, search_answer)]


def router(settings: ServeSettings) -> APIRouter:
    api = APIRouter()

    @api.get("/api/runs/{run}/annotations", tags=["search"], responses=answers(404))
    def annotations(run: str = Run, s: Server = Srv) -> Response:
        """The UPOS tags and dependency relations of the run's words, with counts."""
        with s.heavy():
            return ok(annotation_values(s, run))

    @api.get("/api/runs/{run}/search", tags=["search"], responses=answers(404))
    async def search_tokens(
        run: str = Run,
        word: str | None = Query(None, max_length=200, description="Word form (case-insensitive)."),
        token: str | None = Query(None, max_length=200, description="Token (wordpiece) text (case-insensitive)."),
        upos: str | None = Query(None, max_length=32, description="Universal POS tag, e.g. NOUN."),
        deprel: str | None = Query(None, max_length=64, description="Dependency relation, e.g. nsubj."),
        pieces: str = Query("first", description="first: the first wordpiece of each matching word; all: every piece."),
        layer: int | None = Query(None, ge=0, description="With head: where each hit attends in this head."),
        head: int | None = Query(None, ge=0),
        k: int = Query(5, ge=1, le=settings.max_top_k, description="Most-attended tokens listed per hit."),
        offset: int = Offset,
        limit: int = Query(20, ge=1, le=settings.max_search_page),
        s: Server = Srv,
    ) -> Response:
        """Corpus search: tokens by word, token, POS or relation, by example; with layer and head, each hit's
        attention row and its top-k attended tokens."""
        return await answer_here_or_on_a_thread(
            s, lambda: search_answer(s, run, word, token, upos, deprel, pieces, layer, head, k, offset, limit)
        )

    return api
