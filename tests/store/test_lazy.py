"""store/lazy.py: a module imported at its first use, read through on every use."""

from __future__ import annotations

import sys
import threading

import pytest

from attnstore.store.lazy import LazyModule


@pytest.fixture
def unimported(monkeypatch):
    """A small stdlib module, out of sys.modules for the test (put back after it)."""
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    return "colorsys"


def test_imported_at_the_first_use_and_each_name_read_from_the_module(unimported, monkeypatch):
    lazy = LazyModule(unimported)
    assert unimported not in sys.modules and "imported at its first use" in repr(lazy)
    assert lazy.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
    module = sys.modules[unimported]
    monkeypatch.setattr(module, "ONE_THIRD", 0.5)  # a test's monkeypatch of the module is seen through the proxy
    assert lazy.ONE_THIRD == 0.5
    with pytest.raises(AttributeError):
        _ = lazy.no_such_name


def test_a_first_use_from_many_threads_at_once_imports_one_module(unimported):
    lazy = LazyModule(unimported)
    start = threading.Barrier(8)
    seen = []

    def use() -> None:
        start.wait()
        seen.append(lazy.hsv_to_rgb)

    threads = [threading.Thread(target=use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 8 and all(f is sys.modules[unimported].hsv_to_rgb for f in seen)


def test_a_missing_module_fails_at_its_first_use():
    lazy = LazyModule("attnstore.store.no_such_module")
    with pytest.raises(ModuleNotFoundError):
        _ = lazy.anything
