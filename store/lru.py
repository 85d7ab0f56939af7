"""One small least-recently-used map, for every cache that keeps the last N things (or N bytes of them).

The block cache of direct reads (store/direct.py), the block windows of a store (store/reader.py) and the server's
kept answers (api/http/state.py) are each one `LRU`: the eviction rule is written once, here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
_MISSING = object()


class LRU(Generic[K, V]):
    """At most `max_entries` entries (None: any number) and, with `weigh`, at most `max_weight` of their weights (the
    newest entry is kept whatever its weight); the least recently used out first. Every method holds the map's own
    lock, so it is safe across threads (a compound step, such as read-then-put, is not atomic: callers needing that
    hold their own lock)."""

    def __init__(self, max_entries: int | None = None, max_weight: int | None = None, weigh: Callable[[V], int] | None = None):
        if max_weight is not None and weigh is None:
            raise ValueError("max_weight needs weigh")
        self.max_entries = max_entries
        self.max_weight = max_weight
        self._weigh = weigh
        self.weight = 0
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def keys(self) -> list[K]:
        """The keys now, least recently used first (a copy)."""
        with self._lock:
            return list(self._items)

    def get(self, key: K, default=None, touch: bool = True):
        """The value of `key` (made the most recently used, unless `touch` is false), else `default`."""
        with self._lock:
            value = self._items.get(key, _MISSING)
            if value is _MISSING:
                return default
            if touch:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        """Keep `value` under `key` as the most recently used, then evict past the bounds."""
        with self._lock:
            old = self._items.pop(key, _MISSING)
            if old is not _MISSING and self._weigh is not None:
                self.weight -= self._weigh(old)  # type: ignore[arg-type]
            self._items[key] = value
            if self._weigh is not None:
                self.weight += self._weigh(value)
            while self._items and (
                (self.max_entries is not None and len(self._items) > self.max_entries)
                or (self.max_weight is not None and len(self._items) > 1 and self.weight > self.max_weight)
            ):
                _, dropped = self._items.popitem(last=False)
                if self._weigh is not None:
                    self.weight -= self._weigh(dropped)

    def pop(self, key: K, default=None):
        with self._lock:
            value = self._items.pop(key, _MISSING)
            if value is _MISSING:
                return default
            if self._weigh is not None:
                self.weight -= self._weigh(value)  # type: ignore[arg-type]
            return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.weight = 0
