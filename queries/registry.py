"""Queries are plain functions `f(store, *, run, ...) -> DataFrame`, registered by name.

The CLI and any other front end look them up here; nothing is ever `eval`-ed.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from .errors import InvalidArgumentError, UnknownQueryError


@dataclass(frozen=True)
class QuerySpec:
    name: str
    func: Callable[..., pd.DataFrame]
    summary: str
    per_head: bool

    def parameters(self) -> dict[str, inspect.Parameter]:
        """Keyword parameters a user may set (besides store and run)."""
        sig = inspect.signature(self.func)
        return {n: p for n, p in sig.parameters.items() if n not in ("store", "run")}


QUERIES: dict[str, QuerySpec] = {}


def register(name: str, *, per_head: bool = True):
    def wrap(func):
        summary = (func.__doc__ or "").strip().splitlines()[0]
        QUERIES[name] = QuerySpec(name, func, summary, per_head)
        return func

    return wrap


def get_query(name: str) -> QuerySpec:
    from . import load_all

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
                first, last = part.split("-", 1)
                out.extend(range(int(first), int(last) + 1))
            elif part.strip():
                out.append(int(part))
    except ValueError:
        raise InvalidArgumentError(f"examples={text!r}: give positions and ranges like 0,3,10-19") from None
    return out


def coerce_params(spec: QuerySpec, raw: dict[str, str]) -> dict:
    """Turn `key=value` strings from the command line into typed keyword arguments."""
    params = spec.parameters()
    out = {}
    for key, value in raw.items():
        if key not in params:
            raise InvalidArgumentError(f"query {spec.name!r} has no parameter {key!r}; it takes: {', '.join(params) or 'none'}")
        default = params[key].default
        if key == "examples":
            out[key] = parse_examples(value)
        elif isinstance(default, bool):
            out[key] = value.lower() in ("1", "true", "yes", "on")
        elif isinstance(default, int):
            out[key] = int(value)
        elif isinstance(default, float):
            out[key] = float(value)
        else:
            out[key] = value
    return out
