"""One query call's request, built once at the door (`run_query`) and read by every later step.

A query over one run's maps declares the map sources it can answer from (`@register(..., sources=...)`); the engine,
not the query, owns the parameters every such query shares: `examples` (which of the run's examples) and `weights`
(which source: the maps as stored, or the maps weighted by the value norms). `run_query` validates them once against
the query and the run, and puts them in a frozen `QueryRequest` for the call; the framework's reads (`summary_parts`,
`summary_totals`, `iter_maps`, `storage_ranges`, ...) take the request's examples and source wherever their caller
names none, so a query module holds only its analysis: it never forwards, and so can never forget, either parameter.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType

from ..errors import InvalidArgumentError

# The map sources a query over one run's maps may read. "attention": the attention weights, from the per-row statistics
# a causal LM's run keeps (store/row_stats.py) where the query's kind answers from them, else the maps as stored;
# "maps": the maps as stored, always; "norm": each key's attention weighted by its value norm ||f_h(x_j)||, rows
# renormalised (Kobayashi et al. 2020; runs ingested with value norms).
SOURCES: dict[str, str] = {
    "attention": "the attention weights: from the per-row statistics a causal LM's run keeps where the query answers from "
    "them (no map is read), else the maps as stored",
    "maps": "the maps as stored, even where the run keeps row statistics the query could answer from (to check them)",
    "norm": "each key's attention weighted by its value norm (Kobayashi et al. 2020), rows renormalised; runs ingested with value norms",
}
MAP_SOURCES = ("attention", "maps", "norm")  # what a query whose reduce reads only the maps answers from: any source
ATTENTION_ONLY = ("attention", "maps")  # a query that reads the stored maps beside something else (value norms, gradients)

# The parameters the engine gives every query over one run's maps (QuerySpec.parameters lists them after its own).
ENGINE_PARAMS = ("examples", "weights")


@dataclass(frozen=True)
class QueryRequest:
    """What one query call asks, bound and validated once: the query, its run (id and name, the committed state it is
    answered over), its own parameters, and the engine's: `examples` (None: every committed example) and `source`."""

    query: str
    run_id: int
    run: str
    params: Mapping
    examples: tuple[int, ...] | None
    source: str
    state: str
    n_examples: int


_CURRENT: ContextVar[QueryRequest | None] = ContextVar("attnstore_query_request", default=None)


def current_request(run_id: int | None = None) -> QueryRequest | None:
    """The request of the query call running in this context (None outside one), if it is over run `run_id` (any
    run when None): a read of another run (a pair of runs) is never given this one's examples or source."""
    request = _CURRENT.get()
    if request is None or (run_id is not None and request.run_id != int(run_id)):
        return None
    return request


@contextmanager
def serving(request: QueryRequest) -> Iterator[QueryRequest]:
    """The request in effect while its query runs (a context variable: each thread and task has its own)."""
    token = _CURRENT.set(request)
    try:
        yield request
    finally:
        _CURRENT.reset(token)


class _Requested:
    """The default of `examples` in the framework's reads: the current request's, where there is one for the run."""

    def __repr__(self) -> str:
        return "REQUESTED"


REQUESTED = _Requested()


def requested_examples(run_id: int, examples=REQUESTED):
    """`examples` as given, or (REQUESTED) the current request's for run `run_id` (None: every example)."""
    if examples is not REQUESTED:
        return examples
    request = current_request(run_id)
    return None if request is None else request.examples


def requested_source(run_id: int, params: Mapping) -> dict:
    """`params` with `weights` set to the current request's source for run `run_id`, where the caller gave none."""
    request = current_request(run_id)
    if "weights" in params or request is None or request.source == "attention":  # "maps" is kept: it binds another key
        return dict(params)
    return {**params, "weights": request.source}


@contextmanager
def asked(store, run, examples=None, weights: str = "attention") -> Iterator[QueryRequest]:
    """The request `run_query` would build for run `run` with these `examples` and source (`weights`), in effect for
    calling a query module's own functions directly (`dependency_counts`, `feature_totals`, ...) in Python."""
    info = store.run_info(run)
    chosen = None if examples is None else tuple(int(e) for e in examples)
    request = QueryRequest("(direct)", info.id, info.name, MappingProxyType({}), chosen, weights, info.status, info.n_stored)
    with serving(request):
        yield request


def whole_run(run_id: int) -> bool:
    """Whether the query call in effect asks for every committed example of run `run_id` (no `examples=`)."""
    return requested_examples(run_id) is None


def asked_of(info) -> str:
    """What the query call is over, for its messages: "run 'X'", or "the asked-for examples of run 'X'"."""
    return f"run {info.name!r}" if whole_run(info.id) else f"the asked-for examples of run {info.name!r}"


def check_source(query: str, source: str, accepted: tuple[str, ...]) -> str:
    """`source` if the query answers from it; else one line saying why not and what would work."""
    if source not in SOURCES:
        known = "; ".join(f"{name!r}: {what}" for name, what in SOURCES.items())
        raise InvalidArgumentError(f"weights={source!r} is no map source; the sources are {known}")
    if source not in accepted:
        raise InvalidArgumentError(
            f"query {query!r} answers from {', '.join(repr(s) for s in accepted)} only, not weights={source!r} "
            f"({SOURCES[source]}): it reads more than the maps (or one map of one example), so another source would "
            "not be what it measures"
        )
    return source
