"""Queries are plain functions `f(store, *, run, ...) -> DataFrame`, registered by name.

The CLI and any other front end look them up here; nothing is ever `eval`-ed. Besides this package's own modules,
installed packages add queries through the entry-point group `attnstore.queries` (PLUGIN_GROUP; CONTRIBUTING.md,
"A query in a package of its own"): each entry point names a module whose import registers its queries with
`@register`, as datasette and xarray find their plugins.
"""

from __future__ import annotations

import inspect
import math
import numbers
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import InvalidArgumentError, UnknownQueryError
from .request import ENGINE_PARAMS

if TYPE_CHECKING:  # pandas and the store are imported by the queries themselves, not to look one up
    import pandas as pd


@dataclass(frozen=True)
class QuerySpec:
    name: str
    func: Callable[..., pd.DataFrame]
    summary: str
    per_head: bool
    # how `--save` keeps a result: None, every numeric column to head_metrics (per-head queries); else
    # save(store, run, frame, params) -> a one-line account of what was saved (e.g. head_match's own table)
    save: Callable[..., str] | None = None
    source: str = "attnstore"  # the package that registered it: attnstore, or a plugin's distribution
    # The map sources it answers from (queries/engine/request.py SOURCES), for a query over one run's maps: the engine then
    # gives it `examples` and `weights` (ENGINE_PARAMS), which its function does not take. Empty: a query of its own
    # kind (one example's map, a pair of runs), whose function takes what it reads.
    sources: tuple[str, ...] = ()
    # The datasets it answers on: None, any; else (datasets.format, how to make one), e.g. a generated dataset whose
    # examples the analysis is defined on (ingest/generated.py). `run_query` refuses any other run in one line.
    dataset: tuple[str, str] | None = None

    def parameters(self) -> dict[str, inspect.Parameter]:
        """Keyword parameters a user may set (besides store and run): the function's own, then the engine's."""
        sig = inspect.signature(self.func)
        own = {n: p for n, p in sig.parameters.items() if n not in ("store", "run")}
        if self.sources:
            keyword = inspect.Parameter.KEYWORD_ONLY
            own["examples"] = inspect.Parameter("examples", keyword, default=None)
            own["weights"] = inspect.Parameter("weights", keyword, default="attention", annotation=str)
        return own

    def own_parameters(self) -> dict[str, inspect.Parameter]:
        """The parameters its function takes (besides store and run)."""
        return {n: p for n, p in inspect.signature(self.func).parameters.items() if n not in ("store", "run")}


QUERIES: dict[str, QuerySpec] = {}


PLUGIN_GROUP = "attnstore.queries"
_source = "attnstore"  # the package whose modules are being imported (`load_all`): what `register` records
_loaded: set[str] = set()  # "builtins", "plugins": what `load_all` has imported in this process


class PluginWarning(UserWarning):
    """A query plugin could not be loaded: its queries are missing; every other query works."""


def register(
    name: str,
    *,
    per_head: bool = True,
    save: Callable[..., str] | None = None,
    sources: tuple[str, ...] = (),
    dataset: tuple[str, str] | None = None,
):
    """Register `func(store, *, run, ...)` as query `name`. `sources`: for a query over one run's maps, the map
    sources it answers from (queries/engine/request.py: MAP_SOURCES, ATTENTION_ONLY); the engine then owns its `examples` and
    `weights`, so its function takes neither and reads them through the framework (queries/engine/request.py).
    `dataset`: (the dataset format it needs, how to make such a dataset), for a query defined on generated inputs."""

    def wrap(func):
        summary = (func.__doc__ or "").strip().splitlines()[0]
        taken_by_engine = [p for p in ENGINE_PARAMS if p in inspect.signature(func).parameters]
        if sources and taken_by_engine:
            raise InvalidArgumentError(
                f"query {name!r} ({func.__module__}) takes {', '.join(taken_by_engine)}: the engine gives those to a query "
                "registered with sources= (queries/engine/request.py); drop them from its function"
            )
        taken = QUERIES.get(name)
        if taken is not None and (taken.func.__module__, taken.func.__qualname__) != (func.__module__, func.__qualname__):
            raise InvalidArgumentError(
                f"query {name!r} of {func.__module__} ({_source}) is registered already, by {taken.func.__module__} "
                f"({taken.source}): give it another name"
            )
        QUERIES[name] = QuerySpec(name, func, summary, per_head, save, _source, tuple(sources), dataset)
        return func

    return wrap


def load_all(plugins: bool = True) -> None:
    """Import every module of the queries package, so each query registers itself (`@register`): a new query is
    one module dropped in here, with no list to extend; then (`plugins`) the modules the installed packages name in
    the entry-point group PLUGIN_GROUP. A plugin that fails to load (an import error, a name already taken) is left
    out with one PluginWarning naming it and its package; the others load."""
    import importlib
    import pkgutil
    from pathlib import Path

    if "builtins" not in _loaded:
        queries = __package__.rpartition(".")[0]  # attnstore.queries: the engine's parent holds the query modules
        for module in pkgutil.iter_modules([str(Path(__file__).parent.parent)]):
            # the compiled reduces (engine/kernels.py) and the engine register nothing
            if not module.name.startswith("_") and module.name != "engine":
                importlib.import_module(f"{queries}.{module.name}")
        _loaded.add("builtins")
    if plugins and "plugins" not in _loaded:
        _loaded.add("plugins")
        _load_plugins()


def _load_plugins() -> None:
    import warnings
    from importlib.metadata import entry_points

    global _source
    for point in sorted(entry_points(group=PLUGIN_GROUP), key=lambda p: p.name):
        package = point.dist.name if point.dist is not None else point.value
        before = dict(QUERIES)
        _source = package
        try:
            point.load()
        except Exception as exc:  # noqa: BLE001 (any failure of another package's code leaves out its queries only)
            QUERIES.clear()
            QUERIES.update(before)  # none of a plugin that failed half-way
            warnings.warn(
                PluginWarning(
                    f"query plugin {point.name!r} ({point.value}, package {package}) was not loaded: "
                    f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; fix or uninstall that package"
                ),
                stacklevel=3,
            )
        finally:
            _source = "attnstore"


def get_query(name: str) -> QuerySpec:
    load_all()
    if name not in QUERIES:
        raise UnknownQueryError(f"no query named {name!r}; available: {', '.join(sorted(QUERIES))}")
    return QUERIES[name]


def parse_examples(text: str) -> list[int]:
    """'0,3,10-19' -> [0, 3, 10, ..., 19] (example positions)."""
    out: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part.strip()[1:]:
                first, last = (int(x) for x in part.split("-", 1))
                if last < first:
                    backwards = part.strip()
                    break
                out.extend(range(first, last + 1))
            elif part.strip():
                out.append(int(part))
        else:
            backwards = None
    except ValueError:
        raise InvalidArgumentError(f"examples={text!r}: give positions and ranges like 0,3,10-19") from None
    if backwards:
        raise InvalidArgumentError(f"examples={text!r}: range {backwards!r} ends before it starts; write FIRST-LAST, like 10-19")
    if any(p < 0 for p in out):
        raise InvalidArgumentError(f"examples={text!r}: positions start at 0; give positions and ranges like 0,3,10-19")
    return out


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_KINDS = {bool: ("true or false", "true"), int: ("an integer", "0"), float: ("a number", "0.5"), str: ("text", "x")}


def param_type(spec: QuerySpec, name: str) -> tuple[type, bool]:
    """(bool, int, float or str; whether None is allowed) from the annotation, else from the default."""
    from ...store import Store

    param = spec.parameters()[name]
    try:
        # Query modules import Store for type checking only: name it here so every annotation resolves.
        hint = typing.get_type_hints(spec.func, localns={"Store": Store}).get(name, inspect.Parameter.empty)
    except Exception:  # some annotation does not resolve: read this one's text
        hint = _simple_annotation(param.annotation)
    nullable = param.default is None
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        nullable = nullable or type(None) in args
        members = [a for a in args if a is not type(None)]
        hint = members[0] if len(members) == 1 else inspect.Parameter.empty
    if hint in _KINDS:
        return hint, nullable
    default = param.default
    if type(default) in _KINDS:
        return type(default), nullable
    return str, nullable


def check_param_names(spec: QuerySpec, names) -> None:
    """InvalidArgumentError naming the first of `names` the query does not take, and the ones it does."""
    params = spec.parameters()
    for key in names:
        if key not in params:
            raise InvalidArgumentError(f"query {spec.name!r} has no parameter {key!r}; it takes: {', '.join(params) or 'none'}")


def coerce_params(spec: QuerySpec, raw: dict[str, str]) -> dict:
    """Turn `key=value` strings from the command line into typed keyword arguments."""
    check_param_names(spec, raw)
    out = {}
    for key, value in raw.items():
        out[key] = _coerce(spec, key, value)
        if key in INDEX_PARAMS and isinstance(out[key], int) and out[key] < 0:
            raise InvalidArgumentError(
                f"parameter {key} of query {spec.name!r} must be 0 or more ({key}s are numbered from 0), not {value!r}; "
                f"e.g. --param {key}=0"
            )
    return out


# Parameters that index the model's layers or heads: 0-based, never counted from the end (-1 is not the last head).
INDEX_PARAMS = ("layer", "head")


def check_index_params(spec: QuerySpec, params: dict, n_layers: int, n_heads: int, run_name: str) -> None:
    """Refuse a `layer` or `head` parameter that is not an index of the run's model (negative, too large, not an integer)."""
    for key, size in (("layer", n_layers), ("head", n_heads)):
        value = params.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) < size:
            raise InvalidArgumentError(
                f"parameter {key} of query {spec.name!r} is {value!r}, out of range: run {run_name!r}'s model has "
                f"{size} {key}s, numbered 0..{size - 1}"
            )


_NAMED = {"bool": bool, "int": int, "float": float, "str": str, "None": type(None)}


def _simple_annotation(text):
    """`int`, `int | None`, `Optional[int]` written as text, without evaluating anything; else no hint."""
    if not isinstance(text, str):
        return text
    text = text.strip("'\"").replace(" ", "").replace("typing.", "")
    if text.startswith("Optional[") and text.endswith("]"):
        text = text[len("Optional[") : -1] + "|None"
    names = text.split("|")
    if all(n in _NAMED for n in names):
        return typing.Union[tuple(_NAMED[n] for n in names)]  # noqa: UP007 (built from a tuple at run time)
    return inspect.Parameter.empty


def _coerce(spec: QuerySpec, key: str, value: str):
    default = spec.parameters()[key].default
    kind, nullable = param_type(spec, key)
    what, sample = _KINDS[kind]
    if default is not inspect.Parameter.empty and default is not None and type(default) is kind:
        sample = str(default).lower() if kind is bool else str(default)
    where = f"parameter {key} of query {spec.name!r}"
    if not value.strip():
        shown = (
            ""
            if default is inspect.Parameter.empty
            else " or leave it out for every example"
            if key == "examples"
            else f" or leave it out for the default {default!r}"
        )
        raise InvalidArgumentError(f"{where} needs a value, not {value!r}: give --param {key}=VALUE{shown}")
    if key == "examples":
        return parse_examples(value)
    if nullable and value.strip().lower() in ("none", "null"):
        return None
    text = value.strip()
    try:
        if kind is bool:
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError
            return text.lower() in _TRUE
        if kind is int:
            return int(text)
        if kind is float:
            number = float(text)
            if not math.isfinite(number):
                raise ValueError
            return number
    except ValueError:
        also = " (or none)" if nullable else ""
        raise InvalidArgumentError(f"{where} must be {what}{also}, not {value!r}; e.g. --param {key}={sample}") from None
    return value
