"""attnstore: store a corpus's transformer attention maps once, query them many times.

>>> import attnstore
>>> store = attnstore.open_store()          # ./attnstore-data (SQLite + Zarr)
>>> store.runs()                           # DataFrame of runs
>>> store.attention("my-run", 0).shape     # (layer, head, query, key)
>>> attnstore.run_query(store, "entropy", run="my-run")

`Store`, `open_store` and `run_query` are imported when first used (PEP 562), so that
`import attnstore` (and `attnstore --help`) does not pay for pandas, zarr and SQLAlchemy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from attnstore.store import handle as _handle

# Absolute imports: pytest imports this file as the repository root's package under the
# checkout's folder name, which relative imports would not survive.
from attnstore.store.errors import (
    AttnStoreError,
    BusyError,
    ConflictError,
    CorruptInputError,
    DamagedDataError,
    IncompleteRunWarning,
    InvalidArgumentError,
    NotFoundError,
    ReadOnlyStoreError,
    SchemaOutOfDateError,
    StorageIOError,
)
from attnstore.version import __version__

if TYPE_CHECKING:
    import pandas as pd

    from attnstore.queries import run_query
    from attnstore.store import Store, open_store

_LAZY = {"Store": "attnstore.store", "open_store": "attnstore.store", "run_query": "attnstore.queries"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'attnstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def _run_query(store: Store, name: str, **params: Any) -> pd.DataFrame:
    """`store.run(r).query(name)`: the store's run handle runs queries through this (store/handle.py), since the
    store imports nothing above it; the package's root, above every layer, wires the two together."""
    from attnstore.queries import run_query

    return run_query(store, name, **params)


_handle.use_query_runner(_run_query)

__all__ = [
    "AttnStoreError",
    "BusyError",
    "ConflictError",
    "CorruptInputError",
    "DamagedDataError",
    "IncompleteRunWarning",
    "InvalidArgumentError",
    "NotFoundError",
    "ReadOnlyStoreError",
    "SchemaOutOfDateError",
    "Store",
    "StorageIOError",
    "open_store",
    "run_query",
    "__version__",
]
