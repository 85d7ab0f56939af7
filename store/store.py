"""The `Store` callers get from `open_store`: the reads of `StoreReader` and the writes of `StoreWriter`.

Reading lives in store/reader.py, writing (and `RunWriter`) in store/writer.py, the run
handle in store/handle.py.
"""

from __future__ import annotations

from .config import resolve_locations
from .handle import RunHandle
from .reader import RunRef
from .writer import StoreWriter, run_lease_name, validate_run_name

__all__ = ["Store", "open_store", "run_lease_name", "validate_run_name"]


def open_store(db: str | None = None, root: str | None = None, home: str | None = None) -> Store:
    """Open the store: `db` URL and array `root`, each from argument > environment > default.

    Connects and checks the schema; never creates or migrates anything
    (`attnstore db upgrade` does that).
    """
    return Store(resolve_locations(db=db, root=root, home=home))


class Store(StoreWriter):
    """A store: SQL metadata at `locations.db_url` plus Zarr arrays under `locations.array_root`.

    A store whose SQLite file or local array root this process cannot write is opened
    read-only: every read works, every write raises ReadOnlyStoreError.
    """

    def run(self, run: RunRef) -> RunHandle:
        """A handle bound to one run (name, or the id `attnstore runs` shows); NotFoundError as `run_info`.

        `store.run(name).tokens(0)` is `store.tokens(name, 0)`; `.query("entropy")` runs a registered query.
        """
        return RunHandle(self, self.run_info(run))
