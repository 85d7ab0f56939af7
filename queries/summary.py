"""Per-example sums behind Clark et al.'s standard per-head statistics, computed once per run and reused.

`relative_position`, `special_tokens` (with the default punctuation) and `entropy` all reduce
each example's maps to a few (layer, head) sums: attention on the three diagonals, attention
received by [CLS]-like / separator / punctuation / other keys, separator-to-separator mass,
row entropies. Those sums, with each example's counts (L, separators, [CLS]-like tokens), are
all the three queries need, for any subset of examples and either averaging. Reading them
costs a few kilobytes per example instead of decoding every cell.

They are built by one streaming pass over the run the first time one of the three queries runs
on a writable store (or by `attnstore summarize`), and kept beside the run's maps in its Zarr
group (layout 2) under `summary/clark/`, stamped with the number of examples they cover: a run
that has grown since (a resumed ingest) is summarised again. A read-only store, a layout-1 run
or other parameters (another `punct`) take the streaming path, with the same results (tests
compare both to 1e-12).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .common import iter_maps, token_flags

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

NAME = "clark"
VERSION = 1
DEFAULT_PUNCT = ".,"
COUNTS = ("length", "n_cls", "n_sep")
SUMS = (
    "to_previous",
    "to_self",
    "to_next",
    "received_cls",
    "received_sep",
    "received_punct",
    "received_other",
    "sep_from_sep",
    "sep_from_other",
    "entropy",
    "entropy_from_cls",
)


def example_sums(maps: np.ndarray, cls: np.ndarray, sep: np.ndarray, punct: np.ndarray) -> dict[str, np.ndarray]:
    """One example's (layer, head) sums over its query tokens, as the three queries compute them."""
    from .entropy import row_entropy  # the same function the entropy query uses

    out = {}
    for name, k in (("to_previous", -1), ("to_self", 0), ("to_next", 1)):
        out[name] = np.diagonal(maps, offset=k, axis1=2, axis2=3).sum(-1, dtype=np.float64)
    received = maps.sum(axis=2, dtype=np.float64)  # (layer, head, key)
    other = ~(cls | sep | punct)
    for name, mask in (("cls", cls), ("sep", sep), ("punct", punct), ("other", other)):
        out[f"received_{name}"] = received[..., mask].sum(-1)
    to_sep = maps[..., sep].sum(-1, dtype=np.float64)  # (layer, head, query)
    out["sep_from_sep"] = to_sep[..., sep].sum(-1)
    out["sep_from_other"] = to_sep[..., ~sep].sum(-1)
    h = row_entropy(maps.astype(np.float32, copy=False))
    out["entropy"] = h.sum(-1, dtype=np.float64)
    out["entropy_from_cls"] = h[..., cls].sum(-1, dtype=np.float64)
    return out


def _build(store: Store, info: RunInfo) -> dict[str, np.ndarray]:
    flags = token_flags(store, info, DEFAULT_PUNCT)
    rows: dict[str, list] = {name: [] for name in ("example", *COUNTS, *SUMS)}
    for example, maps in iter_maps(store, info):
        f = flags[example]
        rows["example"].append(example)
        rows["length"].append(maps.shape[-1])
        rows["n_cls"].append(int(f.cls.sum()))
        rows["n_sep"].append(int(f.sep.sum()))
        for name, value in example_sums(maps, f.cls, f.sep, f.punct).items():
            rows[name].append(value)
    shape = (0, info.n_layers, info.n_heads)
    return {
        name: np.asarray(values, dtype=np.int64 if name in ("example", *COUNTS) else np.float64)
        if values
        else np.zeros((0,) if name in ("example", *COUNTS) else shape)
        for name, values in rows.items()
    }


def summaries(store: Store, info: RunInfo, examples=None, punct: str = DEFAULT_PUNCT) -> dict[str, np.ndarray] | None:
    """The per-example sums of the run's committed examples (or of `examples`), in storage order; None where
    the streaming path must be taken (other punctuation, a layout-1 run, nothing stored and a read-only store)."""
    if punct != DEFAULT_PUNCT:
        return None
    committed = store.examples(info.id)
    committed = committed[~committed["skipped"]]
    stamp = {"version": VERSION, "n_examples": int(len(committed)), "punct": DEFAULT_PUNCT}
    arrays = store.run_summary(info.id, NAME, stamp)
    if arrays is None:
        if store.read_only or not store.can_keep_summaries(info.id):
            return None
        arrays = _build(store, info)  # one streaming pass (a caller's progress bar counts it)
        if len(arrays["example"]) != stamp["n_examples"]:
            return None  # the run grew while it was read: stream this time
        store.save_run_summary(info.id, NAME, arrays, stamp)
    if examples is not None:
        wanted = np.fromiter((int(e) for e in examples), dtype=np.int64)
        missing = np.setdiff1d(wanted, arrays["example"])
        if missing.size:
            return None  # let the streaming path raise its NotFoundError naming them
        keep = np.isin(arrays["example"], wanted)
        arrays = {name: values[keep] for name, values in arrays.items()}
    return arrays
