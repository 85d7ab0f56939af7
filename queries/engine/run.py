"""The door of every query call: `run_query` checks the parameters once, pins the run, and builds the call's request."""

from __future__ import annotations

import warnings
from types import MappingProxyType
from typing import TYPE_CHECKING

from ...store.errors import IncompleteRunWarning, InvalidArgumentError, NotFoundError
from .registry import check_index_params, check_param_names, get_query
from .request import ENGINE_PARAMS, QueryRequest, check_source, serving

if TYPE_CHECKING:
    from ...store import Store


def run_query(store: Store, name: str, *, run, **params):
    """Run query `name` over `run` as one consistent snapshot of its committed examples.

    A run still being written, or interrupted, is queried over the examples stored so far
    with an IncompleteRunWarning (and `frame.attrs["run_state"]` says which); a run with
    no stored example raises NotFoundError. A query over one run's maps gets the engine's
    `examples` and `weights` (its map source) through one request built here (engine/request.py).
    """
    spec = get_query(name)
    check_param_names(spec, params)  # as the command line says it, not a TypeError from the query's function
    engine = {key: params.pop(key) for key in ENGINE_PARAMS if key in params} if spec.sources else {}
    source = check_source(spec.name, engine.get("weights", "attention"), spec.sources) if spec.sources else "attention"
    examples = engine.get("examples")
    if examples is not None:
        examples = _positions(examples)
    with store.pinned(run) as info:
        check_index_params(spec, params, info.n_layers, info.n_heads, info.name)  # head=-1 is refused, not head 11
        if spec.dataset is not None and info.dataset_format != spec.dataset[0]:
            raise InvalidArgumentError(
                f"query {spec.name!r} needs a run over a {spec.dataset[0]} dataset; run {info.name!r} is over "
                f"{info.dataset}:{info.split} ({info.dataset_format}): {spec.dataset[1]}"
            )
        state, holder = store.run_state(info.id)
        n_stored = store.n_committed(info.id)
        if n_stored == 0:
            why = {
                "writing": f"it is being written by {holder.describe()}" if holder else "it is being written",
                "interrupted": "its ingest was interrupted before the first batch was stored; run the ingest again",
                "complete": "every example was skipped (longer than the length limit)",
            }[state]
            raise NotFoundError(f"run {info.name!r} has no stored examples to query: {why}")
        if state != "complete":
            what = "is still being written" if state == "writing" else "was interrupted (resume it with the same ingest command)"
            warnings.warn(
                IncompleteRunWarning(f"run {info.name!r} {what}: results cover the {n_stored} examples stored so far"), stacklevel=2
            )
        if not spec.sources:
            frame = spec.func(store, run=run, **params)
        else:
            if source == "norm":
                store.require_value_norms(info.id)  # a run without them: one line, before anything is read
            request = QueryRequest(spec.name, info.id, info.name, MappingProxyType(dict(params)), examples, source, state, n_stored)
            with serving(request):
                frame = spec.func(store, run=run, **params)
    frame.attrs.update(run_state=state, n_examples=n_stored)
    return frame


def _positions(examples) -> tuple[int, ...]:
    """`examples=` as example positions (a list, a range, an array, "0,3,10-19"); at least one."""
    from numbers import Integral

    from .registry import parse_examples

    values = parse_examples(examples) if isinstance(examples, str) else list(examples)
    if any(isinstance(e, bool) or not isinstance(e, Integral) for e in values):
        raise InvalidArgumentError(f"examples={examples!r}: give example positions (integers), like [0, 3] or '0,3,10-19'")
    if not values:
        raise InvalidArgumentError("examples= selects no example: give positions, or leave it out for every example")
    return tuple(int(e) for e in values)
