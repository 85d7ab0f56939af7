"""The package's version (pyproject.toml says the same): its own module, so that ingest records it without importing
the package's root, which wires the layers together (attnstore/__init__.py)."""

__version__ = "0.1.0"
