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

from .common import unique_argmax
from .engine import as_kernel_maps, kernel, register

if TYPE_CHECKING:
    from ..store import Store


@dataclass(frozen=True)
class Units:
    """The units of a word-level map: words (by word position) and special tokens."""

    word: np.ndarray  # per unit: word position, or -1 for a special token
    token: np.ndarray  # per unit: first token position
    assign: np.ndarray  # (units, tokens) 0/1: which tokens make up each unit
    of_token: np.ndarray  # per token: its unit (int64)

    @property
    def is_word(self) -> np.ndarray:
        return self.word >= 0

    def index_of_words(self, positions) -> np.ndarray:
        """Unit index of each word position (-1 where the word has no unit)."""
        lookup = {int(w): i for i, w in enumerate(self.word) if w >= 0}
        return np.array([lookup.get(int(p), -1) for p in positions], dtype=np.int64)


def units_of(word_positions) -> Units:
    """Units from each token's word position (negative / NaN / NA for special tokens), in token order."""
    if isinstance(word_positions, pd.Series):  # a token table's column: Int64 with NA, or float with NaN
        floats = word_positions.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        floats = pd.array(word_positions, dtype="Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    positions = np.where(np.isnan(floats), -1, floats).astype(np.int64).tolist()
    keys = [(w, t) if w < 0 else (w, -1) for t, w in enumerate(positions)]
    order: dict[tuple[int, int], int] = {}
    for key in keys:
        order.setdefault(key, len(order))
    of_token = np.array([order[k] for k in keys], dtype=np.int64)
    assign = np.zeros((len(order), len(keys)), dtype=np.float32)
    assign[of_token, np.arange(len(keys))] = 1
    first = assign.argmax(axis=1)
    return Units(word=np.array([k[0] for k in order], dtype=np.int64), token=first, assign=assign, of_token=of_token)


def word_level(maps: np.ndarray, units: Units, keep: np.ndarray | None = None) -> np.ndarray:
    """(..., L, L) token maps -> (..., U, U) unit maps: columns summed, rows averaged, in float64 from the float16 (by
    table) or float64 values, rounded to float32 (compiled, queries/_words.c: each cell read once; numpy's two float32
    matrix products, after a float32 cast, differed by float32 rounding). `keep`: only these units' rows and columns,
    in that order (K x K)."""
    lead, length = maps.shape[:-2], maps.shape[-1]
    keep = np.arange(len(units.word), dtype=np.int64) if keep is None else np.asarray(keep, dtype=np.int64)
    out = np.empty((*lead, len(keep), len(keep)), np.float32)
    values, table, is_float16 = as_kernel_maps(maps)
    n_maps = int(np.prod(lead, dtype=np.int64))
    kernel("_words").word_maps(values, n_maps, length, units.of_token, len(units.word), keep, table, out, is_float16)
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
    wmap = word_level(maps, units, keep)
    diag = np.arange(len(keep))
    wmap[:, :, diag, diag] = 0
    return unique_argmax(wmap, transpose=transpose), units.word[keep]


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
