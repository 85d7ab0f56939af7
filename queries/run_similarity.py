"""K3 (Kovaleva et al. 2019, Sec. 4.3, Fig. 5): how much each head's maps change between two runs.

Two runs over the same examples with the same tokenizer (typically pre-trained vs fine-tuned
model): per head, the cosine similarity of the flattened L x L maps of each example, averaged
over the examples (at most `max_examples`, a seeded random sample when there are more).
"""

from __future__ import annotations

import contextvars
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import per_head_frame
from .errors import InvalidArgumentError, NotFoundError
from .registry import register

if TYPE_CHECKING:
    from ..store import Store
    from ..store.arrays import SummaryParts

# Maps of both runs held for one group of examples: at most about this many cells per run. Two groups are held at
# once (one compared while the next is read), so about 4 x BATCH_CELLS cells in all.
BATCH_CELLS = 1 << 23
# Examples whose token rows (both runs') are compared at once when the pair's cosines are built.
TOKEN_CHECK_EXAMPLES = 4096
# Rows of the pair's kept cosines read back at once (its chunks hold 4,096 examples at most).
SUMMARY_ROWS = 4096


def shared_examples(
    store: Store, a, b, examples=None, max_examples: int | None = 1000, seed: int = 0, check_tokens: bool = True
) -> pd.DataFrame:
    """Examples stored (not skipped) in both runs: example, example_id, length, offset; checked to be the same inputs
    (unless `check_tokens` is false: the caller checked every shared example before). `max_examples` None: all."""
    if a.dataset_id != b.dataset_id:
        raise InvalidArgumentError(
            f"runs {a.name!r} ({a.dataset}:{a.split}) and {b.name!r} ({b.dataset}:{b.split}) share no dataset: "
            "run_similarity compares the maps of the same examples; ingest both models over the same dataset"
        )
    if (a.n_layers, a.n_heads) != (b.n_layers, b.n_heads):
        raise InvalidArgumentError(
            f"runs {a.name!r} ({a.n_layers} layers x {a.n_heads} heads) and {b.name!r} "
            f"({b.n_layers} x {b.n_heads}) have differently shaped models; maps cannot be compared head by head"
        )
    ea, eb = (store.examples(info.id, texts=False) for info in (a, b))
    ea, eb = ea[~ea["skipped"]], eb[~eb["skipped"]]
    both = ea[["example", "example_id", "length", "offset"]].merge(eb[["example_id", "length"]], on="example_id", suffixes=("", "_other"))
    if examples is not None:
        wanted = sorted({int(e) for e in examples})
        missing = sorted(set(wanted) - set(both["example"]))
        if missing:
            raise NotFoundError(f"example(s) {missing[:10]} are not stored in both runs {a.name!r} and {b.name!r}")
        both = both[both["example"].isin(wanted)]
    if both.empty:
        raise InvalidArgumentError(f"runs {a.name!r} and {b.name!r} have no stored example in common")
    if max_examples is not None and max_examples < 1:
        raise InvalidArgumentError(f"max_examples must be at least 1, not {max_examples}")
    if max_examples is not None and len(both) > max_examples:
        keep = np.random.default_rng(seed).choice(len(both), size=max_examples, replace=False)
        both = both.iloc[np.sort(keep)]
    both = both.sort_values("example").reset_index(drop=True)
    if check_tokens:
        check_same_tokens(store, a, b, both)
    return both


def check_same_tokens(store: Store, a, b, both: pd.DataFrame) -> None:
    """Refuse, naming the first example, when the two runs tokenised an example differently."""
    chosen = set(both["example"])
    ta, tb = (store.token_table(info.id, chosen)[["example", "position", "token", "token_id"]] for info in (a, b))
    joined = ta.merge(tb, on=["example", "position"], how="outer", suffixes=("", "_other"), indicator=True)
    bad = joined[(joined["_merge"] != "both") | (joined["token_id"] != joined["token_id_other"])]
    if bad.empty:
        return
    first = bad.sort_values(["example", "position"]).iloc[0]
    example, position = int(first["example"]), int(first["position"])
    if first["_merge"] != "both":
        la = int(both.loc[both["example"] == example, "length"].iloc[0])
        lb = int(both.loc[both["example"] == example, "length_other"].iloc[0])
        what = f"{la} tokens in {a.name!r}, {lb} in {b.name!r} (truncation or tokenizer differ)"
    else:
        what = (
            f"token {position} is {first['token']!r} (id {int(first['token_id'])}) in {a.name!r} but "
            f"{first['token_other']!r} (id {int(first['token_id_other'])}) in {b.name!r}"
        )
    n = bad["example"].nunique()
    raise InvalidArgumentError(
        f"runs {a.name!r} and {b.name!r} tokenised example {example} differently: {what}"
        f"{f' ({n} examples differ)' if n > 1 else ''}; run_similarity needs the same tokenizer "
        "and the same inputs"
    )


def batches(shared: pd.DataFrame, cells_per_example, limit: int | None = None) -> list[list[int]]:
    """Groups of examples, consecutive in the first run's storage order (so each group is read as a few contiguous
    slabs, not the whole stretch of the array its examples are spread over), whose maps hold at most about `limit` cells."""
    limit = BATCH_CELLS if limit is None else limit
    out: list[list[int]] = []
    group: list[int] = []
    size = 0
    in_storage_order = shared.sort_values("offset", kind="stable") if "offset" in shared else shared
    for example, length in zip(in_storage_order["example"], in_storage_order["length"]):
        cells = cells_per_example * int(length) ** 2
        if group and size + cells > limit:
            out.append(group)
            group, size = [], 0
        group.append(int(example))
        size += cells
    if group:
        out.append(group)
    return out


def paired_maps(store: Store, a, b, groups: list[list[int]]) -> Generator[tuple[int, np.ndarray, np.ndarray], None, None]:
    """(example, its maps in run `a`, in run `b`) group by group, in `a`'s storage order within each; a thread reads
    the next group (both runs) while the caller works on this one, so decoding and arithmetic overlap."""

    def read(group: list[int]) -> list[tuple[int, np.ndarray, np.ndarray]]:
        theirs = dict(store.iter_attention(b.id, group))
        return [(example, maps, theirs.pop(example)) for example, maps in store.iter_attention(a.id, group)]

    def submit(pool: ThreadPoolExecutor, group: list[int]) -> Future:
        return pool.submit(contextvars.copy_context().run, read, group)  # the caller's progress listener, if any

    with ThreadPoolExecutor(1, thread_name_prefix="attnstore-similarity") as pool:
        ahead = submit(pool, groups[0]) if groups else None
        for following in [*groups[1:], None]:
            assert ahead is not None
            current = ahead.result()
            ahead = submit(pool, following) if following is not None else None
            yield from current


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(layer, head, L, L) x 2 -> (layer, head): cosine similarity of the flattened maps, summed in float64.

    The product of two float16 values is exact in float32 (11 + 11 significant bits), so float16 maps (the
    default) are multiplied in float32, half the memory traffic of float64; other maps in float64.
    """
    work = np.float32 if a.dtype == b.dtype == np.float16 else np.float64
    a = a.reshape(*a.shape[:2], -1).astype(work)
    b = b.reshape(*b.shape[:2], -1).astype(work)
    dot = (a * b).sum(-1, dtype=np.float64)
    norms = np.sqrt((a * a).sum(-1, dtype=np.float64) * (b * b).sum(-1, dtype=np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norms > 0, dot / np.where(norms > 0, norms, 1), np.nan)


PAIR_VERSION = 1  # of the per-pair cache below; bump when `cosine` changes


class _RunGrew(Exception):
    """A run grew while the pair's cosines were built: they are not kept (the caller streams this time)."""


def pair_cosines(store: Store, a, b) -> SummaryParts | None:
    """Every shared example's per-head cosines between runs `a` and `b`, kept beside run `a`'s maps, to read
    range by range (`.n` examples; `.arrays["example"]`, `.arrays["cosine"]` (n, layer, head), in `a`'s storage order).

    A one-run summary cannot serve this query (it needs both runs' maps of an example at once), so the
    pair has its own: `summary/similarity-<a's uid>-<b's uid>/` in `a`'s group, stamped with both runs'
    committed counts (either run growing rebuilds it). Built by one pass over both runs the first time and
    saved a group of examples at a time (never held whole); None where nothing can be kept (a read-only store,
    a layout-1 run), a run grew meanwhile, or some shared example was tokenised differently (the caller's
    sample may still avoid it): the caller then streams.
    """
    name = f"similarity-{a.manifest.get('uid') or a.id}-{b.manifest.get('uid') or b.id}"
    stamp = {"version": PAIR_VERSION, "n_examples": store.n_committed(a.id), "other_examples": store.n_committed(b.id)}
    found = store.run_summary_parts(a.id, name, stamp)
    if found is not None:
        return found
    if store.read_only or not store.can_keep_summaries(a.id):
        return None
    everything = shared_examples(store, a, b, max_examples=None, check_tokens=False)
    try:  # a range of examples' token rows at a time (`everything` is in example order), not both runs' whole tables
        for start in range(0, len(everything), TOKEN_CHECK_EXAMPLES):
            check_same_tokens(store, a, b, everything.iloc[start : start + TOKEN_CHECK_EXAMPLES])
    except InvalidArgumentError:
        return None
    groups = batches(everything, a.n_layers * a.n_heads)

    def parts() -> Iterator[dict[str, np.ndarray]]:
        with closing(paired_maps(store, a, b, groups)) as pairs:
            for group in groups:
                done = [next(pairs) for _ in group]
                yield {
                    "example": np.asarray([example for example, _, _ in done], dtype=np.int64),
                    "cosine": np.stack([cosine(maps, theirs) for _, maps, theirs in done]),
                }
        if store.n_committed(a.id) != stamp["n_examples"]:
            raise _RunGrew

    try:
        if not store.save_run_summary_parts(a.id, name, parts(), stamp, n_examples=len(everything)):
            return None
    except _RunGrew:
        return None  # saved without a stamp: never read
    return store.run_summary_parts(a.id, name, stamp)


def kept_similarity(kept: SummaryParts, shared: pd.DataFrame) -> tuple[np.ndarray, int]:
    """(sum of the kept cosines of the `shared` examples, how many): read range by range in the cache's order,
    `a`'s storage order, which is the order the streaming path adds them in, so the sums are bit-identical."""
    wanted = np.sort(shared["example"].to_numpy(np.int64))
    cosines = kept.arrays["cosine"]
    total, n = np.zeros(cosines.shape[1:]), 0
    for start in range(0, kept.n, SUMMARY_ROWS):
        hit = np.isin(np.asarray(kept.arrays["example"][start : start + SUMMARY_ROWS]), wanted)
        if hit.any():
            for row in np.asarray(cosines[start : start + SUMMARY_ROWS])[hit]:
                total += row
                n += 1
    return total, n


@register("run_similarity")
def run_similarity(store: Store, *, run, other: str | None = None, examples=None, max_examples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Kovaleva K3: per head, mean cosine similarity between the maps of two runs over the same examples.

    `other`: the run to compare with (required). Examples are matched by their stored id (both runs must be over the same dataset, and
    must have tokenised each compared example into the same token ids). At most
    `max_examples` shared examples are compared (a random sample drawn with `seed` when
    there are more, as the paper sampled 1000 dev examples).
    Columns: layer, head, similarity (mean over examples of the cosine of the two flattened
    L x L maps), n_examples.
    """
    if other is None:
        raise InvalidArgumentError("run_similarity compares two runs: name the other one, e.g. --param other=RUN")
    a, b = store.run_info(run), store.run_info(other)
    kept = pair_cosines(store, a, b)
    shared = shared_examples(store, a, b, examples, max_examples, seed, check_tokens=kept is None)
    total = np.zeros((a.n_layers, a.n_heads))
    n = 0
    if kept is not None:  # the same per-example cosines, added in the same order as the streaming path below
        total, n = kept_similarity(kept, shared)
    else:
        for _, maps, theirs in paired_maps(store, a, b, batches(shared, a.n_layers * a.n_heads)):
            total += cosine(maps, theirs)
            n += 1
    frame = per_head_frame(a, similarity=total / n)
    frame["n_examples"] = n
    frame.attrs["other"] = b.name
    return frame
