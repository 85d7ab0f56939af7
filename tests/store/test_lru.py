"""store/lru.py: the one least-recently-used map every cache uses (direct reads' blocks, block windows, the server's
kept answers): entries and weights bounded, the newest kept whatever its weight, order by use, safe across threads."""

from __future__ import annotations

import threading

import pytest

from attnstore.store.lru import LRU


def test_entries_are_bounded_least_recently_used_out_first():
    cache: LRU[str, int] = LRU(max_entries=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recently used
    cache.put("c", 3)
    assert cache.keys() == ["a", "c"] and "b" not in cache and len(cache) == 2
    assert cache.get("b", "none") == "none"
    assert cache.get("a", touch=False) == 1 and cache.keys() == ["a", "c"]  # looked at, not moved
    assert cache.pop("a") == 1 and cache.pop("a", 0) == 0 and cache.keys() == ["c"]


def test_weight_is_bounded_and_the_newest_is_kept_whatever_its_weight():
    cache: LRU[str, bytes] = LRU(max_weight=10, weigh=len)
    cache.put("a", b"1234")
    cache.put("b", b"12345")
    assert cache.weight == 9
    cache.put("c", b"123")  # 12 > 10: "a" goes
    assert cache.keys() == ["b", "c"] and cache.weight == 8
    cache.put("big", b"x" * 50)
    assert cache.keys() == ["big"] and cache.weight == 50
    cache.put("big", b"xy")  # replaced: its old weight is taken off
    assert cache.weight == 2
    cache.clear()
    assert len(cache) == 0 and cache.weight == 0
    with pytest.raises(ValueError, match="max_weight needs weigh"):
        LRU(max_weight=1)


def test_threads_keep_its_counts_right():
    cache: LRU[int, bytes] = LRU(max_entries=50, max_weight=400, weigh=len)

    def work(seed: int) -> None:
        for i in range(2000):
            key = (seed * 7919 + i) % 120
            if i % 3:
                cache.put(key, b"x" * (key % 16))
            else:
                cache.get(key)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) <= 50 and cache.weight == sum(len(cache.get(k, touch=False)) for k in cache.keys()) <= 400
