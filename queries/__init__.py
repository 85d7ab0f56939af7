"""Stored queries: one module per analysis, each `f(store, *, run, ...) -> pandas.DataFrame`.

    >>> from attnstore.queries import run_query
    >>> run_query(store, "entropy", run="MRPC-dev-all-MiniLM-L6-v2")
"""

from __future__ import annotations

from .registry import QUERIES, QuerySpec, get_query, register

_MODULES = ("relative_position", "special_tokens", "entropy", "word_level", "dependency", "coreference", "head_clusters")


def load_all() -> None:
    """Import every query module so each registers itself."""
    import importlib

    for name in _MODULES:
        importlib.import_module(f"{__name__}.{name}")


def run_query(store, name: str, *, run, **params):
    return get_query(name).func(store, run=run, **params)


__all__ = ["QUERIES", "QuerySpec", "get_query", "load_all", "register", "run_query"]
