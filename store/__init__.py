"""Storage layer: SQL metadata + Zarr arrays. Imports nothing else of attnstore."""

from .store import Store, open_store

__all__ = ["Store", "open_store"]
