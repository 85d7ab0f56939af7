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


def open_store(db: str | None = None, root: str | None = None, home: str | None = None, read_only: bool | None = None) -> Store:
    """Open the store: `db` URL and array `root`, each from argument > environment > default.

    Connects and checks the schema; never creates or migrates anything
    (`attnstore db upgrade` does that). `read_only=True` (or ATTNSTORE_READ_ONLY=1) opens it
    for reading only: every write raises ReadOnlyStoreError before it starts.
    """
    return Store(resolve_locations(db=db, root=root, home=home, read_only=read_only))


class Store(StoreWriter):
    """A store: SQL metadata at `locations.db_url` plus Zarr arrays under `locations.array_root`.

    A store whose SQLite file, PostgreSQL tables or local array root this user cannot write,
    or one opened with `read_only`, is read-only: every read works, every write raises
    ReadOnlyStoreError.
    """

    def run(self, run: RunRef) -> RunHandle:
        """A handle bound to one run (name, or the id `attnstore runs` shows); NotFoundError as `run_info`.

        `store.run(name).tokens(0)` is `store.tokens(name, 0)`; `.query("entropy")` runs a registered query.
        """
        return RunHandle(self, self.run_info(run))
