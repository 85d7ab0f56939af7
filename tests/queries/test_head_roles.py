"""Head confidence and roles (Voita et al. 2019) on hand-built maps, values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from attnstore.queries import run_query

# make_run gives a plain token the id 1000 + its length: "a" and "bb" occur twice in the run, "ccc" and "dddd" once,
# so the rarest token is at position 3 in both examples.
TOKENS = [["[CLS]", "a", "bb", "ccc", "[SEP]"], ["[CLS]", "a", "bb", "dddd", "[SEP]"]]


def designed(length: int = 5) -> np.ndarray:
    """1 layer, 2 heads. Head 0: each row on the previous token (row 0 on itself). Head 1: each row 0.6 on token 3
    (the rarest), 0.4 on the last ([SEP])."""
    maps = np.zeros((1, 2, length, length), dtype=np.float32)
    for i in range(length):
        maps[0, 0, i, max(i - 1, 0)] = 1
    maps[0, 1, :, 3] = 0.6
    maps[0, 1, :, length - 1] = 0.4
    return maps


def test_confidence_offsets_and_rare_words_by_hand(store, make_run):
    run = make_run(store, [designed(), designed()], TOKENS, name="roles")
    frame = run_query(store, "head_roles", run=run).set_index("head")
    # head 0: every largest weight is 1; rows 1-4 of each example point one back: 8 of 10 rows at offset -1
    assert frame.loc[0, "confidence"] == pytest.approx(1.0)
    assert (frame.loc[0, "top_offset"], frame.loc[0, "offset_share"], frame.loc[0, "positional"]) == (-1, pytest.approx(0.8), False)
    assert frame.loc[0, "rare_share"] == pytest.approx(2 / 10)  # only row 4 of each example points at token 3
    # head 1: 0.6 on token 3 is the largest weight once [SEP]'s 0.4 is left out; every row points at the rarest token;
    # its offsets 3, 2, 1, 0, -1 each once per example (the first of equal shares in -3..3 order is -1)
    assert frame.loc[1, "confidence"] == pytest.approx(0.6)
    assert (frame.loc[1, "top_offset"], frame.loc[1, "offset_share"]) == (-1, pytest.approx(0.2))
    assert frame.loc[1, "rare_share"] == pytest.approx(1.0) and frame.loc[1, "rare_chance"] == pytest.approx(0.2)


def test_a_previous_token_head_over_long_rows_is_positional(store, make_run):
    tokens = ["[CLS]", *(f"{'x' * (k + 1)}" for k in range(10)), "[SEP]"]
    run = make_run(store, [designed(12)], [tokens], name="positional")
    frame = run_query(store, "head_roles", run=run).set_index("head")
    assert frame.loc[0, "offset_share"] == pytest.approx(11 / 12) and bool(frame.loc[0, "positional"])
    assert not bool(frame.loc[1, "positional"])
