"""Per-example summaries: what one streaming pass keeps of each example's maps, computed once per run and reused.

A query that reduces every example's maps to a few numbers per (layer, head) need not decode
every cell each time it runs: a `SummaryKind` names those numbers (`reduce`, given the run-level
inputs `prepare` builds once), one pass over the run computes them, and they are kept beside the
run's maps in its Zarr group (layout 2) under `summary/<kind>/`, stamped with the kind's version
and the number of examples they cover. A run that has grown since (a resumed ingest) is
summarised again. Reading them costs kilobytes per example instead of every cell.

The pass is built the first time a query needs it on a writable store (or by `attnstore
summarize`). With a Dask scheduler (`--scheduler`, ATTNSTORE_SCHEDULER; queries/scheduler.py)
the run's examples are split into contiguous ranges and summarised on the workers; the parts
are concatenated in storage order, so the values equal the one-process pass exactly. On a
read-only store or a layout-1 run nothing can be kept: with a scheduler the values are still
computed on the workers for this query; without one the query takes its streaming path, with
the same results (tests compare both).

Fields whose first axis is a per-example unit (words of a sentence) are `ragged`: concatenated
over the examples, with `<field>_start` (n + 1 offsets) to find each example's rows.

The Clark kind (`CLARK`) backs `relative_position`, `special_tokens` (default punctuation) and
`entropy`: attention on the three diagonals, attention received by [CLS]-like / separator /
punctuation / other keys, separator-to-separator mass and row entropies, with each example's
counts (L, separators, [CLS]-like tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .common import iter_maps, token_flags

if TYPE_CHECKING:
    from ..store import Store
    from ..store.arrays import SummaryParts
    from ..store.records import RunInfo


@dataclass(frozen=True)
class SummaryKind:
    """A per-example summary: `reduce(context, example, maps)` -> {field: array}, with `context = prepare(store, info, examples)`."""

    name: str
    version: int
    # (store, info, examples) -> the run-level inputs of `reduce`; `examples` (None: the whole run) is a worker's
    # range, which a kind may use to read only those examples' rows
    prepare: Callable[[Store, RunInfo, Any], Any]
    reduce: Callable[[Any, int, np.ndarray], dict[str, np.ndarray]]
    ragged: tuple[str, ...] = ()  # fields whose first axis varies by example: concatenated, with <field>_start

    def stamp(self, n_examples: int) -> dict:
        return {"version": self.version, "n_examples": int(n_examples)}


KINDS: dict[str, SummaryKind] = {}


def register_kind(kind: SummaryKind) -> SummaryKind:
    KINDS[kind.name] = kind
    return kind


def kind_named(name: str) -> SummaryKind:
    from . import load_all

    load_all()  # kinds are registered by the query modules that use them
    return KINDS[name]


# ---------------------------------------------------------------- building and keeping


def _assemble(kind: SummaryKind, examples: list[int], rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-example field dicts -> stacked (fixed) and concatenated (ragged) arrays, in the given order."""
    out: dict[str, np.ndarray] = {"example": np.asarray(examples, dtype=np.int64)}
    if not rows:
        return out
    for field in rows[0]:
        values = [row[field] for row in rows]
        if field in kind.ragged:
            sizes = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
            out[field] = np.concatenate(values)
            out[f"{field}_start"] = np.r_[0, np.cumsum(sizes)].astype(np.int64)
        else:
            out[field] = np.stack([np.asarray(v) for v in values])
    return out


# Examples per range: one process builds a summary range by range (as each Dask worker does: `prepare` then reads
# only that range's token and word rows), keeps each range's part as it is built, and queries read a kept summary
# back range by range, so neither the build nor a query holds a whole run's summary.
SUMMARY_RANGE = 4096


def summarise_examples(store: Store, info: RunInfo, kind: SummaryKind, examples=None) -> dict[str, np.ndarray]:
    """One streaming pass over `examples` (default: every committed example), in storage order."""
    context = kind.prepare(store, info, examples)
    order: list[int] = []
    rows: list[dict[str, np.ndarray]] = []
    for example, maps in iter_maps(store, info, examples):
        order.append(example)
        rows.append(kind.reduce(context, example, maps))
    return _assemble(kind, order, rows)


def concatenate(kind: SummaryKind, parts: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Parts of one run's summary (consecutive example ranges) -> one, as if built in one pass."""
    parts = [p for p in parts if len(p["example"])]
    if not parts:
        return {"example": np.zeros(0, dtype=np.int64)}
    out: dict[str, np.ndarray] = {}
    for field in parts[0]:
        if field.endswith("_start") and field[: -len("_start")] in kind.ragged:
            shifts = np.cumsum([0] + [int(p[field][-1]) for p in parts[:-1]])
            out[field] = np.concatenate([parts[0][field][:1]] + [p[field][1:] + s for p, s in zip(parts, shifts)])
        else:
            out[field] = np.concatenate([p[field] for p in parts])
    return out


def select(kind: SummaryKind, arrays: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    """The summary of the examples where `keep` (a boolean mask over arrays["example"]) is true."""
    out = {}
    for field, values in arrays.items():
        if field in kind.ragged:
            start = arrays[f"{field}_start"]
            out[field] = values[np.repeat(keep, np.diff(start))]  # each kept example's rows, in order
        elif field.endswith("_start") and field[: -len("_start")] in kind.ragged:
            sizes = np.diff(values)[keep]
            out[field] = np.r_[0, np.cumsum(sizes)].astype(np.int64)
        else:
            out[field] = values[keep]
    return out


def ragged_rows(arrays: dict[str, np.ndarray], field: str, index: int) -> np.ndarray:
    """Example number `index` (0-based, in the summary's order)'s rows of ragged `field`."""
    start = arrays[f"{field}_start"]
    return arrays[field][start[index] : start[index + 1]]


def in_storage_order(store: Store, info: RunInfo) -> np.ndarray:
    """The run's committed (not skipped) examples in storage order (int64: 8 bytes per example)."""
    return store.storage_order(info.id)


def ranges(examples: np.ndarray, size: int | None = None) -> list[np.ndarray]:
    """Consecutive ranges of `size` (default SUMMARY_RANGE) examples."""
    size = size or SUMMARY_RANGE
    return [examples[i : i + size] for i in range(0, len(examples), size)]


def storage_ranges(store: Store, info: RunInfo, examples=None) -> list[np.ndarray]:
    """The run's committed examples (or those of `examples`) in storage order, in consecutive ranges of SUMMARY_RANGE;
    NotFoundError naming any of `examples` that is not stored."""
    order = in_storage_order(store, info)
    if examples is not None:
        wanted = np.unique(np.fromiter((int(e) for e in examples), dtype=np.int64))
        missing = np.setdiff1d(wanted, order)
        if missing.size:
            from .errors import NotFoundError

            raise NotFoundError(f"run {info.name!r} has no stored example(s) {missing[:10].tolist()}")
        order = order[np.isin(order, wanted)]
    return ranges(order)


def ranged_maps(store: Store, info: RunInfo, examples, prepare: Callable[[np.ndarray], Any]) -> Iterator[tuple[int, np.ndarray, Any]]:
    """(example, maps, context) over the run's committed examples (or `examples`) in storage order, with
    `context = prepare(range)` built for each range of SUMMARY_RANGE examples: a streaming query's per-example
    tables (token flags, words) then stay the size of one range at any run size."""
    for part in storage_ranges(store, info, examples):
        context = prepare(part)
        for example, maps in iter_maps(store, info, part):
            yield example, maps, context


def _built_parts(store: Store, info: RunInfo, kind: SummaryKind, order: np.ndarray, scheduler: str | None) -> Iterator[dict]:
    """The kind's summary of `order` (storage order), part by part: on the scheduler's workers, or range by range here."""
    from .scheduler import summarise_on

    if scheduler is not None:
        yield from summarise_on(scheduler, store, info, kind, order)
    else:
        for part in ranges(order):
            yield summarise_examples(store, info, kind, part)


def _saved_parts(kind: SummaryKind, saved: SummaryParts, wanted: np.ndarray | None) -> Iterator[dict[str, np.ndarray]]:
    """A kept summary read back range by range (of `wanted` examples only, if given); ranges with none are skipped."""
    for start in range(0, saved.n, SUMMARY_RANGE):
        part = saved.part(start, min(start + SUMMARY_RANGE, saved.n))
        if wanted is not None:
            part = select(kind, part, np.isin(part["example"], wanted))
        if len(part["example"]):
            yield part


def keep(store: Store, info: RunInfo, kind: SummaryKind) -> SummaryParts | None:
    """The kind's kept summary of the run's committed examples (`.n`, `.part(start, stop)`), built part by part and
    kept first if it is not (on the Dask scheduler in effect, if any). None where it cannot be kept (a read-only
    store, a layout-1 run) or the run grew while it was read."""
    from .scheduler import current_scheduler

    stamp = kind.stamp(store.n_committed(info.id))
    saved = store.run_summary_parts(info.id, kind.name, stamp)
    if saved is not None or store.read_only or not store.can_keep_summaries(info.id):
        return saved
    parts = _built_parts(store, info, kind, in_storage_order(store, info), current_scheduler())
    if not store.save_run_summary_parts(info.id, kind.name, parts, stamp, n_examples=stamp["n_examples"]):
        return None  # the run grew while it was read: stream this time
    return store.run_summary_parts(info.id, kind.name, stamp)


def kept_parts(store: Store, info: RunInfo, kind: SummaryKind, examples: Iterable | None = None) -> Iterable[dict[str, np.ndarray]] | None:
    """The kind's summary of the run's committed examples (or of `examples`), in storage order, as consecutive parts
    of at most SUMMARY_RANGE examples (fields as `summarise_examples` gives them for those alone).

    Read from the run's group when kept there with a matching stamp; else built part by part (on the Dask
    scheduler in effect, if any) and kept when the store and run allow, or, on a read-only store with a
    scheduler, computed on the workers for this query alone. None where the caller must take its streaming
    path: nothing kept, nothing can be kept and no scheduler is set, or `examples` names one not stored.
    """
    from .scheduler import current_scheduler

    wanted = None if examples is None else np.fromiter((int(e) for e in examples), dtype=np.int64)
    saved = keep(store, info, kind)
    if saved is not None:
        if wanted is not None and np.setdiff1d(wanted, saved.arrays["example"][:]).size:
            return None  # let the streaming path raise its NotFoundError naming them
        return _saved_parts(kind, saved, wanted)
    scheduler = current_scheduler()
    if scheduler is None or (not store.read_only and store.can_keep_summaries(info.id)):
        return None  # nothing can be kept and nothing computes it elsewhere, or the run grew while it was read
    order = in_storage_order(store, info)
    if wanted is not None:
        if np.setdiff1d(wanted, order).size:
            return None
        order = order[np.isin(order, wanted)]
    return (part for part in _built_parts(store, info, kind, order, scheduler) if len(part["example"]))


def kept(store: Store, info: RunInfo, kind: SummaryKind, examples: Iterable | None = None) -> dict[str, np.ndarray] | None:
    """`kept_parts` as one summary (for queries that need every example's numbers at once)."""
    parts = kept_parts(store, info, kind, examples)
    return None if parts is None else concatenate(kind, parts)


# ---------------------------------------------------------------- Clark et al.'s standard statistics

DEFAULT_PUNCT = ".,"


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


def _clark_prepare(store: Store, info: RunInfo, examples=None):
    return token_flags(store, info, DEFAULT_PUNCT, examples)


def _clark_reduce(flags, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    f = flags[example]
    counts = {
        "length": np.asarray(maps.shape[-1], np.int64),
        "n_cls": np.asarray(f.cls.sum(), np.int64),
        "n_sep": np.asarray(f.sep.sum(), np.int64),
    }
    return {**counts, **example_sums(maps, f.cls, f.sep, f.punct)}


CLARK = register_kind(SummaryKind("clark", 2, _clark_prepare, _clark_reduce))


def summaries(store: Store, info: RunInfo, examples=None, punct: str = DEFAULT_PUNCT) -> Iterable[dict[str, np.ndarray]] | None:
    """The Clark per-example sums of the run's committed examples (or of `examples`), in storage order, as parts of
    at most SUMMARY_RANGE examples (`kept_parts`); None where the streaming path must be taken (other punctuation,
    or nothing kept, nothing keepable and no scheduler)."""
    if punct != DEFAULT_PUNCT:
        return None
    return kept_parts(store, info, CLARK, examples)
