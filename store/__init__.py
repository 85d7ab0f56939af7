"""Storage layer: SQL metadata + Zarr arrays. Imports nothing else of attnstore.

(`RunHandle.query` imports attnstore.queries when it is called: queries depend on the store.)
"""

from .handle import RunHandle
from .store import Store, open_store

__all__ = ["RunHandle", "Store", "open_store"]
