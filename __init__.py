"""attnstore: store a corpus's transformer attention maps once, query them many times.

    >>> import attnstore
    >>> store = attnstore.open_store()          # ./attnstore-data (SQLite + Zarr)
    >>> store.runs()                           # DataFrame of runs
    >>> store.attention("my-run", 0).shape     # (layer, head, query, key)
"""

# Absolute imports: pytest imports this file as the repository root's package under the
# checkout's folder name, which relative imports would not survive.
from attnstore.store import Store, open_store
from attnstore.store.errors import AttnStoreError

__version__ = "0.1.0"
__all__ = ["AttnStoreError", "Store", "open_store", "__version__"]
