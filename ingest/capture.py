"""Forward passes that stop at the last attention map.

Ingest stores maps, never what a model computes after its last one: the last layer's value
product, attention output and feed-forward block, and a pooler. Skipping them made the forward
passes of all-MiniLM-L6-v2 over MRPC dev 1.17-1.30x faster, with maps bit-identical to the whole
pass (docs/PERFORMANCE.md, 2026-11-24 "a forward pass that stops at the last map"). Which modules
return the maps is found once at load (`find_sources`), by the identity of the tensors they
return, and the shortened pass is checked there to return exactly the maps of the whole one; a
model where either fails is run whole.

Ingest runs two passes at once on a CPU (ingest/runner.py), so the hooks that catch the maps are
installed once per module and each thread collects only its own pass's maps.
"""

from __future__ import annotations

import threading
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
        _uninstall(sources)
        return None
    return sources


_collecting = threading.local()  # .caught: this thread's maps so far; .n_maps: when to stop
_install_lock = threading.Lock()


def _catch(index: int):
    def catch(_module, _args, output):
        caught = getattr(_collecting, "caught", None)
        if caught is None:  # a pass not run by attention_maps (a whole pass, another thread's model use)
            return
        caught.append(output[index])
        if len(caught) == _collecting.n_maps:
            raise _Enough

    return catch


def _install(sources: AttentionSources) -> None:
    """The catching hooks, once per module: registering a hook per pass would change a module's
    hook dict while another thread's pass iterates over it."""
    with _install_lock:
        for module, index in zip(sources.modules, sources.index):
            installed = getattr(module, "_attnstore_catch", None)  # (index, hook handle)
            if installed is None or installed[0] != index:
                if installed is not None:
                    installed[1].remove()
                module._attnstore_catch = (index, module.register_forward_hook(_catch(index)))


def _uninstall(sources: AttentionSources) -> None:
    with _install_lock:
        for module in sources.modules:
            installed = getattr(module, "_attnstore_catch", None)
            if installed is not None:
                installed[1].remove()
                del module._attnstore_catch


def attention_maps(model, inputs: dict, sources: AttentionSources, run: Callable[[], Any] | None = None) -> tuple:
    """The maps of one forward pass of `model(**inputs, output_attentions=True)` (or `run()`), stopped
    as soon as the last one is returned. Safe to call from several threads at once."""
    _install(sources)
    caught: list = []
    _collecting.caught, _collecting.n_maps = caught, sources.n_maps
    try:
        if run is not None:
            run()
        else:
            model(**inputs, output_attentions=True)
    except _Enough:
        pass
    finally:
        _collecting.caught = None
    return tuple(caught)


def maps_of_whole_pass(run: Callable[[], Any], sources: AttentionSources) -> tuple[Any, tuple]:
    """(the output of `run()`, a whole forward pass with output_attentions=True run to its end, and its maps caught
    as `attention_maps` catches them). Safe to call from several threads at once, where the output's own `attentions`
    are not: transformers records them with hooks on the shared modules, which catch another thread's pass too."""
    _install(sources)
    caught: list = []
    _collecting.caught, _collecting.n_maps = caught, -1  # never reached: the pass runs on
    try:
        output = run()
    finally:
        _collecting.caught = None
    if len(caught) != sources.n_maps:
        raise RuntimeError(f"caught {len(caught)} attention maps in a whole pass, expected {sources.n_maps}")
    return output, tuple(caught)
