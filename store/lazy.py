"""A module imported at its first use: `arrays = LazyModule("attnstore.store.arrays")`.

zarr's import (with numcodecs, fsspec and zarr's asyncio loop: ~0.12-0.15 s of `attnstore runs`' ~1 s; `python
benchmarks/cli_startup.py --old OLD --home H --rounds 10 -- runs`, docs/PERFORMANCE.md, 2026-11-28)
is what the commands that read SQL only (`runs`, `show`, `sql`, `examples`, `tokens`, ...) would import and
never use. reader.py, writer.py and store.py reach arrays.py, direct.py and remote.py, the modules that import zarr,
through such proxies, so zarr is imported by the first call that touches an array.

Every attribute is taken from the real module when asked for (never copied), so a test's monkeypatch of the module is
seen. A first use from several threads at once imports the module once: importlib's module locks make the others wait
for it (importlib.util.LazyLoader, which swaps the module's class during its first use, is not thread-safe on Python
3.11). Type checkers see the real modules (`if TYPE_CHECKING:` imports in the modules that use this).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    __slots__ = ("_name", "_module")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:  # only called for names the proxy does not have itself
        module = self._module
        if module is None:
            module = importlib.import_module(self._name)  # whole before it is kept: another thread's use waits for it
            self._module = module
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported at its first use>"
