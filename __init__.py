"""attnstore: store a corpus's transformer attention maps once, query them many times.

    >>> import attnstore
    >>> store = attnstore.open_store()          # ./attnstore-data (SQLite + Zarr)
    >>> store.runs()                           # DataFrame of runs
    >>> store.attention("my-run", 0).shape     # (layer, head, query, key)
"""

from .store import Store, open_store
from .store.errors import AttnStoreError

__version__ = "0.1.0"
__all__ = ["AttnStoreError", "Store", "open_store", "__version__"]
