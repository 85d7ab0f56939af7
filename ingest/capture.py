"""Forward passes that stop at the last attention map.

Ingest stores maps, never what a model computes after its last one: the last layer's value
product, attention output and feed-forward block, and a pooler. Skipping them made the forward
passes of all-MiniLM-L6-v2 over MRPC dev 1.17-1.30x faster, with maps bit-identical to the whole
pass (docs/PERFORMANCE.md, session 19). Which modules return the maps is found once at load
(`find_sources`), by the identity of the tensors they return, and the shortened pass is checked
there to return exactly the maps of the whole one; a model where either fails is run whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class _Enough(Exception):
    """Raised by the hook that catches the last map: nothing after it is computed."""


@dataclass(frozen=True)
class AttentionSources:
    """The modules whose outputs are the maps, in the order they are called in a forward pass."""

    modules: tuple[Any, ...]  # distinct modules (one module may return several layers' maps: ALBERT shares its layer)
    index: tuple[int, ...]  # where in each module's output tuple its map is
    n_maps: int  # maps per forward pass (the model's layers)


def _tensors(output) -> list:
    return list(output) if isinstance(output, (tuple, list)) else []


def find_sources(model, run: Callable[[], Any]) -> AttentionSources | None:
    """Which modules return the maps of `run()` (a whole forward pass with output_attentions=True).

    Hooks on every module note where each returned tensor is first seen: modules finish inside
    out, so that is the innermost module that returns it. None if some map comes from no module's
    output tuple, or if the shortened pass does not give exactly the same maps.
    """
    seen: dict[int, tuple[Any, Any, int]] = {}  # id(tensor) -> (tensor, module, index); the tensor is kept so ids are not reused
    order: list[Any] = []

    def note(module, _args, output):
        order.append(module)
        for k, t in enumerate(_tensors(output)):
            if hasattr(t, "data_ptr") and id(t) not in seen:
                seen[id(t)] = (t, module, k)

    handles = [m.register_forward_hook(note) for m in model.modules() if m is not model]
    try:
        attentions = run().attentions
    finally:
        for h in handles:
            h.remove()
    found = [seen.get(id(a)) for a in attentions]
    if not attentions or any(f is None for f in found):
        return None
    modules: list[Any] = []
    index: list[int] = []
    for _, module, k in found:  # type: ignore[misc]  # None refused above
        if any(m is module for m in modules):
            if index[next(i for i, m in enumerate(modules) if m is module)] != k:
                return None
            continue
        modules.append(module)
        index.append(k)
    sources = AttentionSources(tuple(modules), tuple(index), len(attentions))
    import torch

    shortened = attention_maps(model, {}, sources, run=run)
    if len(shortened) != len(attentions) or not all(torch.equal(a, b) for a, b in zip(shortened, attentions)):
        return None
    return sources


def attention_maps(model, inputs: dict, sources: AttentionSources, run: Callable[[], Any] | None = None) -> tuple:
    """The maps of one forward pass of `model(**inputs, output_attentions=True)` (or `run()`), stopped
    as soon as the last one is returned."""
    caught: list = []

    def hook(k: int):
        def catch(_module, _args, output):
            caught.append(output[k])
            if len(caught) == sources.n_maps:
                raise _Enough

        return catch

    handles = [m.register_forward_hook(hook(k)) for m, k in zip(sources.modules, sources.index)]
    try:
        if run is not None:
            run()
        else:
            model(**inputs, output_attentions=True)
    except _Enough:
        pass
    finally:
        for h in handles:
            h.remove()
    return tuple(caught)
