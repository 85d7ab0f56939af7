"""C5 (Clark et al. 2019, Sec. 4.1): word-level attention maps from wordpiece maps.

Attention *to* a split word is the sum of the attention to its pieces; attention *from*
a split word is the mean of its pieces' rows, so every row still sums to 1. Special
tokens stay units of their own; a word with no pieces (e.g. cut by truncation) has no
unit. Used by the dependency, coreference and probe queries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.float16 import as_float32
from .common import unique_argmax
from .registry import register
from .summary import layer_parts, scratch

if TYPE_CHECKING:
    from ..store import Store


@dataclass(frozen=True)
class Units:
    """The units of a word-level map: words (by word position) and special tokens."""

    word: np.ndarray  # per unit: word position, or -1 for a special token
    token: np.ndarray  # per unit: first token position
    assign: np.ndarray  # (units, tokens) 0/1: which tokens make up each unit

    @property
    def is_word(self) -> np.ndarray:
        return self.word >= 0

    def index_of_words(self, positions) -> np.ndarray:
        """Unit index of each word position (-1 where the word has no unit)."""
        lookup = {int(w): i for i, w in enumerate(self.word) if w >= 0}
        return np.array([lookup.get(int(p), -1) for p in positions], dtype=np.int64)


def units_of(word_positions: np.ndarray) -> Units:
    """Units from each token's word position (negative / NaN for special tokens), in token order."""
    word_positions = np.asarray(pd.array(word_positions, dtype="Int64").fillna(-1), dtype=np.int64)
    keys = [(w, t) if w < 0 else (w, -1) for t, w in enumerate(word_positions)]
    order: dict[tuple[int, int], int] = {}
    for key in keys:
        order.setdefault(key, len(order))
    assign = np.zeros((len(order), len(keys)), dtype=np.float32)
    assign[[order[k] for k in keys], np.arange(len(keys))] = 1
    first = assign.argmax(axis=1)
    return Units(word=np.array([k[0] for k in order]), token=first, assign=assign)


def word_level(maps: np.ndarray, units: Units) -> np.ndarray:
    """(..., L, L) token maps -> (..., U, U) unit maps: columns summed, rows averaged (float32)."""
    mean_rows = units.assign / units.assign.sum(axis=1, keepdims=True)
    if maps.dtype != np.float16 or maps.ndim != 4:
        return mean_rows @ as_float32(maps) @ units.assign.T  # float16 by table (store/float16.py)
    # An example's (layer, head, L, L) maps a few layers at a time, cast and averaged over rows in buffers the thread
    # keeps (8 MiB or more each, `scratch`): the same products as of the whole example, without its float32 copy and
    # (U, L) products (each a fresh mmap above 1 MiB under the CLI's heap, store/heap.py; session 38).
    n_units, length = mean_rows.shape
    out = np.empty((*maps.shape[:2], n_units, n_units), np.float32)
    for part in layer_parts(maps):
        cast = as_float32(maps[part], scratch("maps", maps[part].shape))
        rows = np.matmul(mean_rows, cast, out=scratch("rows", (*cast.shape[:2], n_units, length)))
        np.matmul(rows, units.assign.T, out=out[part])
    return out


def most_attended_words(maps: np.ndarray, units: Units, transpose: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """For every head and word: the index of the *other* word it attends to most (with `transpose`, the other word
    attending to it most), special tokens ignored. One rule for every query that reads predictions (`dependency`,
    `coreference`): a word whose largest weight is 0, or is reached by more than one word, predicts nothing (-1),
    where the authors' np.argmax would name the first such word (docs/QUERIES.md gives the size of the difference).

    Returns (pred, words): pred is (layer, head, n_words) indices into `words` (-1: no prediction), the word
    positions of the word units in order.
    """
    keep = np.flatnonzero(units.is_word)
    wmap = word_level(maps, units)[:, :, keep][:, :, :, keep]
    diag = np.arange(len(keep))
    wmap[:, :, diag, diag] = 0
    return unique_argmax(np.swapaxes(wmap, -1, -2) if transpose else wmap), units.word[keep]


@register("word_maps", per_head=False)
def word_maps(store: Store, *, run, example: int = 0, layer: int = 0, head: int = 0) -> pd.DataFrame:
    """One head's word-level map for one example, as a long table (from, to, attention).

    Columns: from_unit, to_unit (unit indices), from_word, to_word (word positions, -1 for
    special tokens), from_form, to_form, attention. Rows of each `from_unit` sum to 1.
    """
    toks = store.tokens(run, example)
    units = units_of(toks["word_position"])
    maps = store.attention(run, example, layer=layer, head=head)[0, 0]
    wmap = word_level(maps, units)
    forms = [toks["word"].iloc[t] if w >= 0 else toks["token"].iloc[t] for w, t in zip(units.word, units.token)]
    n = len(units.word)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return pd.DataFrame(
        {
            "from_unit": i.ravel(),
            "to_unit": j.ravel(),
            "from_word": units.word[i.ravel()],
            "to_word": units.word[j.ravel()],
            "from_form": np.array(forms, dtype=object)[i.ravel()],
            "to_form": np.array(forms, dtype=object)[j.ravel()],
            "attention": wmap.ravel().astype(float),
        }
    )
