"""A query's per-example reduction, declared as a `SummaryKind`, and the registry of kinds.

A query that reduces every example's maps to a few numbers per (layer, head) names those numbers as a `SummaryKind`:
`prepare(store, info, examples, **params)` builds the run-level inputs once per range of examples, `reduce(context,
example, maps)` gives one example's fields. The query itself only combines the per-example fields, which the engine
hands it range by range, in storage order (engine/kept.py). The key of a kind's summary is its name for its default
parameters (`clark`), else the name and a digest of the parameters (`clark.3f1c...`); its stamp is the result's
fingerprint (kind, version, the parameters that change its values, the run's committed state), compared whole, as HF
datasets fingerprints its cache.

Fields whose first axis is a per-example unit (words of a sentence) are `ragged`: concatenated over the examples, with
`<field>_start` (n + 1 offsets) to find each example's rows.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidArgumentError
from .sources import check_weights

if TYPE_CHECKING:
    from ...store import Store
    from ...store.records import RunInfo


@dataclass(frozen=True, eq=False)
class SummaryKind:
    """A per-example reduction: `reduce(context, example, maps)` -> {field: array}, with
    `context = prepare(store, info, examples, **params)` built once per range of examples.

    Optional hooks, for kinds that are not one run's maps example by example (a pair of runs):
    `covers(store, info, params)` the examples it summarises, in storage order (default: the run's
    committed examples); `read(store, info, examples, context)` (example, maps) in that order
    (default: the run's maps); `state(store, info, params)` the committed state its values depend on
    (default: {"n_examples": the run's committed examples}).
    """

    name: str
    version: int
    prepare: Callable[..., Any]
    reduce: Callable[[Any, int, Any], dict[str, np.ndarray]]
    ragged: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)  # the parameters that change its values, with defaults
    covers: Callable[[Store, RunInfo, dict], np.ndarray] | None = None
    read: Callable[[Store, RunInfo, np.ndarray, Any], Iterator[tuple[int, Any]]] | None = None
    state: Callable[[Store, RunInfo, dict], dict] | None = None
    one_run: bool = True  # built for one run with its default parameters (`attnstore summarize`); False: a pair of runs
    # A range's reduction: `totals(part)` -> {field: array of a fixed shape}, sums over the part's examples of what the
    # kind's queries combine, derived from its per-example fields alone, so that adding the totals of consecutive
    # ranges gives those of all of them. Kept per range beside the summary; `summary_totals` adds them.
    totals: Callable[..., dict[str, np.ndarray]] | None = None
    # Where the totals count on an axis whose entries only the run names (its dependency relations, which differ from
    # range to range): `labels(store, info)` -> those names, sorted, read once before a pass; `totals(part, labels)`
    # then counts on that axis, and the labels are kept with the ranges and returned with the totals.
    labels: Callable[[Store, RunInfo], list[str]] | None = None
    # The per-example fields `totals` reads (None: all of them): the totals of a sample, or of `examples=`, read only
    # these from a kept summary (besides the example column).
    totals_fields: tuple[str, ...] | None = None
    # Its totals are integer counts, the same however its examples are grouped: a sample's totals are then taken over
    # batches of rows from several ranges (one `totals` call per batch, not one per range a sample touches).
    integer_totals: bool = False
    # `reduce` may run on several threads at once (numpy alone, its loops release the GIL, nothing shared is changed):
    # one pass then reads and decodes on its thread while the others reduce (`reduced`), every core busy.
    threads: bool = False
    # `reduce` takes a Q/K run's maps as `store.qk.LayerMaps` (maps.layer(i), rebuilt a layer at a time) as well as
    # arrays: an example's maps are then never rebuilt whole (weights="attention"; "norm" weights whole arrays).
    by_layer: bool = False
    # `rows(context, example, rows)` gives the same fields as `reduce` from the example's per-row statistics
    # (store/row_stats.ExampleRows), which a causal LM's run keeps from ingest: a pass over such a run then reads no
    # map (engine/sources.py `reads_rows`). `rows_accept(params)`: whether the statistics give the kind for these
    # parameters (None: for any).
    rows: Callable[[Any, int, Any], dict[str, np.ndarray]] | None = None
    rows_accept: Callable[[Mapping[str, Any]], bool] | None = None
    # The statistics `rows` reads (field names, or the groups "first", "distance", "top"; None: all; each field is
    # stored in chunks of its own), or a function of the bound parameters giving them, and whether it reads each
    # row's top keys (`row_top`).
    rows_fields: tuple[str, ...] | Callable[[Mapping[str, Any]], tuple[str, ...]] | None = None
    rows_top: bool = False
    # The dataset format its examples are defined on (datasets.format, e.g. "repeated_tokens"), None: any; a run over
    # another is left out of the kinds kept at ingest (engine/passes.py `row_kinds`).
    dataset: str | None = None

    def bind(self, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Its parameters with the defaults filled in; an unknown one is a programming error. `weights` (every kind that
        reads one run's maps): "attention" (the maps, left out of the bound parameters so keys stay as they were) or
        "norm" (the maps weighted by the value norms, rows renormalised: `queries.common.weighted_maps`)."""
        params = dict(params or {})
        weights = check_weights(params.pop("weights", "attention"))
        if weights == "maps" and self.rows is None:  # the maps are what it reads anyway: one key
            weights = "attention"
        if weights == "norm" and self.read is not None:
            raise InvalidArgumentError(f"weights={weights!r} is for queries over one run's maps; {self.name!r} reads something else")
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise TypeError(f"summary kind {self.name!r} takes no parameter(s) {sorted(unknown)}; it takes {sorted(self.defaults)}")
        bound = {**self.defaults, **params}
        for name, default in self.defaults.items():  # 0 and 0.0 are one parameter value, with one key
            value = bound[name]
            if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
                bound[name] = float(value)
        if weights != "attention":
            bound["weights"] = weights
        return bound

    def key(self, params: Mapping[str, Any]) -> str:
        """Where its summary is kept in the run's group: its name, plus a digest of non-default parameters."""
        return self.bound_key(self.bind(params))

    def bound_key(self, params: Mapping[str, Any]) -> str:
        """`key` of parameters `bind` gave."""
        if params == dict(self.defaults):
            return self.name
        digest = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:12]
        return f"{self.name}.{digest}"

    def stamp(self, n_examples: int | dict, params: Mapping[str, Any] | None = None) -> dict:
        """The fingerprint a kept summary must carry to be read back: version, committed state, non-default parameters."""
        return self.bound_stamp(n_examples, self.bind(params))

    def bound_stamp(self, n_examples: int | dict, params: Mapping[str, Any]) -> dict:
        """`stamp` of parameters `bind` gave."""
        state = {"n_examples": int(n_examples)} if not isinstance(n_examples, dict) else n_examples
        extra = {} if params == dict(self.defaults) else {"params": json.loads(json.dumps(params, sort_keys=True, default=str))}
        return {"version": self.version, **state, **extra}


KINDS: dict[str, SummaryKind] = {}


def register_kind(kind: SummaryKind) -> SummaryKind:
    KINDS[kind.name] = kind
    return kind


def run_kinds() -> dict[str, SummaryKind]:
    """The kinds `attnstore summarize` can build for one run ahead of time (with their default parameters)."""
    from .registry import load_all

    load_all()
    return {name: kind for name, kind in sorted(KINDS.items()) if kind.one_run}


def kind_named(name: str) -> SummaryKind:
    from .registry import load_all

    load_all()  # kinds are registered by the query modules that use them
    return KINDS[name]


# Examples per range: one process builds a summary range by range (as each Dask worker does: `prepare` then reads
# only that range's token and word rows), keeps each range's part as it is built, and queries read a kept summary
# back range by range, so neither the build nor a query holds a whole run's summary.
SUMMARY_RANGE = 4096


def _assemble(kind: SummaryKind, examples: list[int], rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-example field dicts -> stacked (fixed) and concatenated (ragged) arrays, in the given order."""
    out: dict[str, np.ndarray] = {"example": np.asarray(examples, dtype=np.int64)}
    if not rows:
        return out
    for name in rows[0]:
        values = [row[name] for row in rows]
        if name in kind.ragged:
            sizes = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
            out[name] = np.concatenate(values)
            out[f"{name}_start"] = np.r_[0, np.cumsum(sizes)].astype(np.int64)
        else:
            out[name] = np.stack([np.asarray(v) for v in values])
    return out


def concatenate(kind: SummaryKind, parts: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Parts of one run's summary (consecutive example ranges) -> one, as if built in one pass."""
    parts = [p for p in parts if len(p["example"])]
    if not parts:
        return {"example": np.zeros(0, dtype=np.int64)}
    out: dict[str, np.ndarray] = {}
    for name in parts[0]:
        if name.endswith("_start") and name[: -len("_start")] in kind.ragged:
            shifts = np.cumsum([0] + [int(p[name][-1]) for p in parts[:-1]])
            out[name] = np.concatenate([parts[0][name][:1]] + [p[name][1:] + s for p, s in zip(parts, shifts)])
        else:
            out[name] = np.concatenate([p[name] for p in parts])
    return out


def ragged_rows(arrays: dict[str, np.ndarray], name: str, index: int) -> np.ndarray:
    """Example number `index` (0-based, in the summary's order)'s rows of ragged `name`."""
    start = arrays[f"{name}_start"]
    return arrays[name][start[index] : start[index + 1]]


def range_reduction(store: Store, info: RunInfo, kind: SummaryKind) -> tuple[Callable[[dict], dict] | None, list[str] | None]:
    """The kind's range reduction for this run (`part` -> its totals; None where it declares none) and its labels
    (None where its totals have no labelled axis)."""
    if kind.totals is None or kind.labels is None:
        return kind.totals, None
    labels = kind.labels(store, info)
    return functools.partial(kind.totals, labels=labels), labels
