"""attnstore: store a corpus's transformer attention maps once, query them many times.

>>> import attnstore
>>> store = attnstore.open_store()          # ./attnstore-data (SQLite + Zarr)
>>> store.runs()                           # DataFrame of runs
>>> store.attention("my-run", 0).shape     # (layer, head, query, key)
>>> attnstore.run_query(store, "entropy", run="my-run")
"""

# Absolute imports: pytest imports this file as the repository root's package under the
# checkout's folder name, which relative imports would not survive.
from attnstore.queries import run_query
from attnstore.store import Store, open_store
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

__version__ = "0.1.0"
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
