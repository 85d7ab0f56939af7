"""Per-row statistics of a causal LM's attention, kept at ingest: what the decoder queries read instead of the maps.

While each block of rows passes (ingest/row_stats.py), ingest reduces every row of every head to a few numbers, taken
from the full float32 row before the maps are rounded to their storage dtype (or, in the Q/K tier, never stored):

- `first_0` .. `first_3`: the attention on positions 0 .. 3 (0 for a position after the row);
- `entropy`: the row's entropy, -sum_j a_ij log a_ij, in nats;
- `learned_sink`: 1 - the row's sum: the share a learned sink logit takes (gpt-oss), about 0 for other models (kept
  this way, not as the sum, so float16 keeps a small share to 2^-11 of itself, not of 1);
- `column`: this token as a key: the attention it gets summed over the rows at or after it, divided by their number
  (n - k in an n-token example: H2O's normalised accumulated score), rounded down to float16, and `column_rest`, what
  that rounding dropped, so that their sum (`ExampleRows.column`) keeps it to about 2^-22 relative: keys are ranked
  by it;
- `distance_0` .. `distance_15`: the row's attention by distance d = i - j: bin 0 holds d = 0, bin b (1 .. 14)
  2^(b-1) <= d < 2^b, bin 15 every d >= 2^14; so the mass on the last w keys is a sum of bins for w a power of 2;
- `top_0` .. `top_7`: the row's 8 largest weights, largest first; their keys are in the `row_top` array (int32, -1
  where the row has fewer keys). The row's residual mass is 1 - `learned_sink` - their sum;
- `duplicate`: the attention on the latest earlier token with the row's token id, and `induction`: on the token after
  that one (0 where the id did not occur before): Olsson et al.'s duplicate-token and prefix-matching keys. On
  ingest/generated.py's repeated tokens (no id twice in a copy) they are A[i, i - T] and A[i, i - T + 1] for each
  second-copy row i (queries/induction_heads.py).

`row_stats` holds the 34 values (token, layer, head, field) in float16 (2^-11 relative), `row_top` the 8 keys: 100
bytes per row and head, against 2 n bytes for a float16 map row of an n-token example. Tokens are in storage order,
as token_id's. Runs kept before `duplicate` and `induction` existed hold the first 32 fields (`stored_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STATS = "row_stats"
TOP = "row_top"
POSITIONS = 4
DISTANCE_BINS = 16
TOP_K = 8
FIELDS = (
    *(f"first_{p}" for p in range(POSITIONS)),
    "entropy",
    "learned_sink",
    "column",
    "column_rest",
    *(f"distance_{b}" for b in range(DISTANCE_BINS)),
    *(f"top_{k}" for k in range(TOP_K)),
    "duplicate",  # last, so that the positions of the 32 fields kept before them hold in every run
    "induction",
)
FIELD = {name: i for i, name in enumerate(FIELDS)}
FIRST = slice(FIELD["first_0"], FIELD["first_0"] + POSITIONS)
DISTANCE = slice(FIELD["distance_0"], FIELD["distance_0"] + DISTANCE_BINS)
TOP_VALUES = slice(FIELD["top_0"], FIELD["top_0"] + TOP_K)
# Chunks of one field of 1,024 tokens (1,024 x SmolLM2's 270 heads x 2 bytes: 553 KB before compression): a query reads
# only the fields it needs (attention_sink 5 of 32).
CHUNK_TOKENS = 1 << 10
BYTES_PER_ROW_HEAD = len(FIELDS) * 2 + TOP_K * 4

ATTRIBUTES = {
    "description": "per token (as a query row) and head, statistics of its attention row taken from the full float32 "
    "row at ingest; `column` is per token as a key; tokens in storage order, as token_id (attnstore store/row_stats.py)",
    "fields": list(FIELDS),
    "distance_bins": "bin 0: d = 0; bin b: 2^(b-1) <= d < 2^b; bin 15: d >= 2^14 (d = row - key)",
}
TOP_ATTRIBUTES = {"description": f"per token and head, the keys of the row's {TOP_K} largest weights (top_0 .. top_7), -1 for none"}


def manifest() -> dict:
    """The run manifest's `row_stats` entry: what the two arrays hold."""
    return {"arrays": [STATS, TOP], "dtype": "float16", "top_dtype": "int32", "top_k": TOP_K, **ATTRIBUTES}


def stored_fields(entry: dict) -> tuple[str, ...]:
    """The fields a run keeps, from its manifest's `row_stats` entry: FIELDS, or the first 32 of them in a run kept
    before `duplicate` and `induction` (its entry lists them)."""
    return tuple(entry.get("fields", FIELDS))


def earlier_occurrences(token_ids, n: int):
    """(example, n) int64: for each position, the latest earlier position holding the same token id, -1 for none (and
    past an example's end): where the `duplicate` and `induction` fields look."""
    earlier = np.full((len(token_ids), n), -1, dtype=np.int64)
    for b, ids in enumerate(token_ids):
        last: dict[int, int] = {}
        for i, token in enumerate(list(ids)[:n]):
            earlier[b, i] = last.get(token, -1)
            last[token] = i
    return earlier


def bins_within(recent: int) -> int | None:
    """How many distance bins hold exactly the keys i - recent + 1 .. i (d < recent), or None where `recent` is not a
    power of 2 up to 2^14 (the bins cannot give it)."""
    if recent < 1 or recent & (recent - 1) or recent > 1 << (DISTANCE_BINS - 2):
        return None
    return recent.bit_length()  # d < 1: bin 0; d < 2^b: bins 0 .. b


def field_indices(names: tuple[str, ...] | None) -> list[int] | None:
    """The positions in FIELDS of `names` (field names, or group names: "first", "distance", "top"), sorted; None: all."""
    if names is None:
        return None
    groups = {"first": FIRST, "distance": DISTANCE, "top": TOP_VALUES}
    wanted: set[int] = set()
    for name in names:
        part = groups.get(name)
        wanted.update(range(part.start, part.stop) if part is not None else [FIELD[name]])
    return sorted(wanted)


@dataclass(frozen=True)
class ExampleRows:
    """One example's row statistics: `stats` (token, layer, head, field) float16 as stored, of the fields `read` (their
    positions in FIELDS; None: all), and `top` (token, layer, head, TOP_K) int32 keys, or None where not read."""

    stats: np.ndarray
    top: np.ndarray | None
    read: list[int] | None = None

    @property
    def n(self) -> int:
        return int(self.stats.shape[0])

    def _at(self, index: int) -> int:
        if self.read is None:
            return index
        if index not in self.read:
            raise KeyError(f"row statistic {FIELDS[index]!r} was not read (read: {[FIELDS[i] for i in self.read]})")
        return self.read.index(index)

    def field(self, name: str) -> np.ndarray:
        """(layer, head, token) float64 of one field."""
        return self.stats[..., self._at(FIELD[name])].astype(np.float64).transpose(1, 2, 0)

    def column(self) -> np.ndarray:
        """(layer, head, key) float64: each key's column over the rows at or after it, `column` + `column_rest`."""
        return self.field("column") + self.field("column_rest")

    def fields(self, part: slice) -> np.ndarray:
        """(layer, head, token, k) float64 of consecutive fields (FIRST, DISTANCE, TOP_VALUES)."""
        at = [self._at(i) for i in range(part.start, part.stop)]
        return self.stats[..., at[0] : at[-1] + 1].astype(np.float64).transpose(1, 2, 0, 3)
