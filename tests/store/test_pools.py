"""store/pools.py: a pool sized by its environment variable, none for one thread."""

from __future__ import annotations

import pytest

from attnstore.store.errors import InvalidArgumentError
from attnstore.store.pools import SizedPool


def test_a_pool_is_sized_by_its_variable_and_none_for_one_thread(monkeypatch):
    pool = SizedPool("ATTNSTORE_TEST_THREADS", "attnstore-test")
    monkeypatch.setenv("ATTNSTORE_TEST_THREADS", "3")
    assert pool.threads() == 3 and pool.get() is pool.get() and pool.get()._max_workers == 3
    monkeypatch.setenv("ATTNSTORE_TEST_THREADS", "1")
    assert pool.get() is None
    monkeypatch.setenv("ATTNSTORE_TEST_THREADS", "x")
    with pytest.raises(InvalidArgumentError, match="ATTNSTORE_TEST_THREADS='x': give a whole number of threads, 1 or more"):
        pool.get()
