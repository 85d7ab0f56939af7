"""attnstore's compiled reduces (queries/_clark.c, queries/_patterns.c, queries/_words.c), the parts of one extension
module, attnstore.queries._kernels (queries/_kernels.c), imported on first use, so a source tree without it still
imports and runs the other queries, and a missing or stale build fails in one line naming the fix.

Each C file defines KERNEL_VERSION, raised whenever its arguments or results change; `VERSIONS` holds the version its
Python callers are written against, so an editable checkout whose build predates its C file says so instead of
computing the old thing."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import numpy as np

from ...store.float16 import value_table
from ..errors import KernelBuildError

VERSIONS = {"_clark": 1, "_patterns": 1, "_words": 1}
REBUILD = "rebuild attnstore: pip install -e . (needs a C compiler and Python's headers)"


@functools.cache
def kernel(name: str) -> ModuleType:
    """The part `name` of the compiled module attnstore.queries._kernels (its functions and KERNEL_VERSION, made by
    queries/<name>.c) if its KERNEL_VERSION is `VERSIONS[name]`; else KernelBuildError (an attnstore error, one line
    in the CLI, and an ImportError)."""
    version = VERSIONS[name]
    try:
        module = importlib.import_module(".._kernels", __package__)  # attnstore.queries._kernels
    except ImportError as exc:
        raise KernelBuildError(f"attnstore's compiled reduce queries/{name}.c is not built: {REBUILD}") from exc
    part = getattr(module, name, None)  # None: a build from before the file was a part of the module
    built = getattr(part, "KERNEL_VERSION", None)
    if part is None or built != version:
        raise KernelBuildError(
            f"attnstore's compiled reduce queries/{name}.c is a stale build (version {built}, want {version}): {REBUILD}"
        )
    return part


def as_kernel_maps(maps: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """(values, table, is_float16): maps as the float16-or-float64 kernels take them (queries/_kernels.h FOR_EACH_MAP),
    C-contiguous: float16 maps as their bits with the table of their values (store/float16.py), any other dtype cast to
    float64 with an empty table."""
    if maps.dtype == np.float16:
        return np.ascontiguousarray(maps).view(np.uint16), value_table(), True
    return np.ascontiguousarray(maps, dtype=np.float64), np.zeros(0, np.float32), False
