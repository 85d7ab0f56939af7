"""Errors raised by queries."""

from ..store.errors import AttnStoreError, InvalidArgumentError, NotFoundError

__all__ = ["AttnStoreError", "InvalidArgumentError", "KernelBuildError", "NotFoundError", "UnknownQueryError"]


class UnknownQueryError(NotFoundError):
    """No query is registered under that name."""


class KernelBuildError(AttnStoreError, ImportError):
    """A compiled reduce (queries/_*.c) is not built, or its build is older than its source (queries/engine/kernels.py)."""
