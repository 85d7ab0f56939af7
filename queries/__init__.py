"""Stored queries: one module per analysis, each `f(store, *, run, ...) -> pandas.DataFrame`; the engine that runs
them is the `engine` sub-package.

>>> from attnstore.queries import run_query
>>> run_query(store, "entropy", run="MRPC-dev-all-MiniLM-L6-v2")
"""

from __future__ import annotations

from .engine import QUERIES, QuerySpec, get_query, load_all, register, run_query

__all__ = ["QUERIES", "QuerySpec", "get_query", "load_all", "register", "run_query"]
