"""Progress of long reads, reported without threading a callback through every query.

`Store.iter_attention` calls `advance()` once per example it yields; a caller that wants a
progress bar (the CLI's `query`, `report` and `probe train`) wraps its work in
`reporting(callback)`. Nothing is reported, and nothing is imported, when no one listens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_listener: ContextVar[Callable[[int], object] | None] = ContextVar("attnstore_progress", default=None)


def advance(n: int = 1) -> None:
    """Report that `n` more examples were read."""
    listener = _listener.get()
    if listener is not None:
        listener(n)


@contextmanager
def reporting(callback: Callable[[int], object]) -> Iterator[None]:
    """Within this scope, every example read calls `callback(n)` (e.g. a tqdm bar's `update`)."""
    token = _listener.set(callback)
    try:
        yield
    finally:
        _listener.reset(token)
