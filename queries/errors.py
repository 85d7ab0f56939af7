"""Errors raised by queries."""

from ..store.errors import AttnStoreError, InvalidArgumentError, NotFoundError

__all__ = ["AttnStoreError", "InvalidArgumentError", "NotFoundError", "UnknownQueryError"]


class UnknownQueryError(NotFoundError):
    """No query is registered under that name."""
