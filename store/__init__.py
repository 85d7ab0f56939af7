"""Storage layer: SQL metadata + Zarr arrays. Imports nothing else of attnstore.

(`RunHandle.query` calls the query runner attnstore/__init__.py installs: queries depend on the store.)
`Store`, `open_store` and `RunHandle` are imported when first used (PEP 562): modules that need
only `store.errors` or `store.config` (the command line's start) do not load SQLAlchemy, zarr or pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .handle import RunHandle
    from .store import Store, open_store

_LAZY = {"RunHandle": ".handle", "Store": ".store", "open_store": ".store"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = ["RunHandle", "Store", "open_store"]
