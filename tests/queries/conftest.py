import numpy as np
import pytest

from attnstore.tests.snapshots import store_with

TOKENS = [["[CLS]", "a", ",", "b", "[SEP]"], ["[CLS]", "c", "[SEP]"]]


def hand_maps(length: int) -> np.ndarray:
    """(layer 2, head 2, L, L): L0H0 all to [CLS]; L0H1 previous token (row 0: itself);
    L1H0 uniform; L1H1 all to the last token ([SEP])."""
    maps = np.zeros((2, 2, length, length), dtype=np.float32)
    maps[0, 0, :, 0] = 1
    maps[0, 1, 0, 0] = 1
    for i in range(1, length):
        maps[0, 1, i, i - 1] = 1
    maps[1, 0] = 1 / length
    maps[1, 1, :, length - 1] = 1
    return maps


@pytest.fixture(name="hand_maps")
def hand_maps_fixture():
    return hand_maps


def build_hand_run(store, make_run):
    return make_run(store, [hand_maps(len(t)) for t in TOKENS], TOKENS, name="hand")


# For a test of `hand_run`, the store with that run, built once per session on SQLite and copied (tests/snapshots.py).
store = store_with("hand_run", build_hand_run)


@pytest.fixture
def hand_run(store):
    """Two ragged examples (L=5, L=3) spread over 64-cell chunks, stored as float32 (built by `store` above)."""
    return "hand"
