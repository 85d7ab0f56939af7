"""glibc heap settings for the two kinds of work a process does here (Linux; elsewhere nothing is changed).

- Reading maps (queries, the server): `for_reading()` pins the mmap threshold at 1 MiB, so freed
  slabs of maps go back to the OS. Left dynamic, the threshold rises after the first large free
  and later slabs land on the heap, where fragmentation makes peak memory creep up with corpus size.
- Running a model (ingest, fine-tuning, a Dask worker's forward passes): `for_forward()` pins it at
  32 MiB and the trim threshold at 128 MiB, so each batch's attention tensors reuse heap memory.
  With the threshold pinned low (1 MiB above, or 128 KiB wherever MALLOC_TRIM_THRESHOLD_ is set,
  as Dask's nanny does for its workers) every batch's tensors were fresh mmaps: 10x the page faults
  and +40-50 % CPU time in MRPC forward passes (`python benchmarks/heap.py --rounds 2`; docs/PERFORMANCE.md, 2026-11-24
  "every query on its own line; the heap and the forward pass").
  It also asks torch to put its CPU tensors of 2 MiB and more on transparent huge pages
  (THP_MEM_ALLOC_ENABLE, unless the environment sets it): a fresh `attnstore ingest` of MRPC dev took
  171 k page faults instead of 268 k and ran 4 % faster (docs/PERFORMANCE.md, 2026-11-24 "huge pages for the forward
  pass"). torch reads
  the setting at its first CPU allocation, so it takes effect only where for_forward() runs before any tensor.

And a process that loaded a model skips the interpreter's last full garbage collection (`skip_exit_collection`):
with torch and transformers imported it walks every object alive: such a process exits in 0.15-0.26 s instead of
0.93-1.04 s, and a LocalCluster of 2 such workers closes in 0.24-0.30 s instead of 1.35-1.64 s
(`python benchmarks/exit_collection.py`, 3 alternated rounds).
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def _mallopt(param: int, value: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").mallopt(param, value)
    except (OSError, AttributeError):  # not glibc
        pass


def for_reading() -> None:
    _mallopt(M_MMAP_THRESHOLD, 1 << 20)


def for_forward() -> None:
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    _mallopt(M_MMAP_THRESHOLD, 32 << 20)
    _mallopt(M_TRIM_THRESHOLD, 128 << 20)


_EXIT_COLLECTION_SKIPPED = False


def skip_exit_collection() -> None:
    """At exit, freeze what is alive (gc.freeze) so that the interpreter's final collection does not walk it: objects
    freed by their reference counts still are, and the operating system takes back the rest."""
    global _EXIT_COLLECTION_SKIPPED
    if not _EXIT_COLLECTION_SKIPPED:
        atexit.register(gc.freeze)
        _EXIT_COLLECTION_SKIPPED = True
