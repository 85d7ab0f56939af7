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
from .engine import SummaryKind, kept_ranges, register, register_kind, summary_totals
from .errors import InvalidArgumentError, NotFoundError

if TYPE_CHECKING:
    from ..store import Store

# Maps of both runs held for one group of examples: at most about this many cells per run. Two groups are held at
# once (one compared while the next is read), so about 4 x BATCH_CELLS cells in all.
BATCH_CELLS = 1 << 23
# Examples whose token rows (both runs') are compared at once before the pair's cosines are computed.
TOKEN_CHECK_EXAMPLES = 4096


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


# ---------------------------------------------------------------- the pair's per-example cosines (queries/engine/)
# One run's summary cannot serve this query (it needs both runs' maps of an example at once), so the pair of runs is a
# kind of its own: kept in run `a`'s group under the other run's name (`pair_cosines.<digest>`), fingerprinted with
# both runs' committed counts and the other run's uid (either run growing, or another run of that name, rebuilds it);
# it covers the examples stored in both runs, in `a`'s storage order. Each range of examples is checked to have the
# same tokens in both runs first (InvalidArgumentError naming the first that differs): where some example of the
# whole pair differs, nothing is kept and the query's own sample is computed (and checked) alone.


def _other(store: Store, params: dict):
    return store.run_info(params["other"])


def _pair_covers(store: Store, a, params: dict) -> np.ndarray:
    shared = shared_examples(store, a, _other(store, params), max_examples=None, check_tokens=False)["example"].to_numpy(np.int64)
    order = store.storage_order(a.id)
    return order[np.isin(order, shared)]


def _pair_state(store: Store, a, params: dict) -> dict:
    b = _other(store, params)
    return {
        "n_examples": int(store.n_committed(a.id)),
        "other_examples": int(store.n_committed(b.id)),
        "other_uid": str(b.manifest.get("uid") or b.id),
    }


def _pair_prepare(store: Store, a, examples, other: str):
    b = store.run_info(other)
    shared = shared_examples(store, a, b, max_examples=None, check_tokens=False)
    shared = shared[shared["example"].isin(np.asarray(examples, dtype=np.int64))]
    for start in range(0, len(shared), TOKEN_CHECK_EXAMPLES):  # a range of examples' token rows at a time
        check_same_tokens(store, a, b, shared.iloc[start : start + TOKEN_CHECK_EXAMPLES])
    return b, shared


def _pair_read(store: Store, a, examples, context) -> Iterator[tuple[int, tuple[np.ndarray, np.ndarray]]]:
    b, shared = context
    with closing(paired_maps(store, a, b, batches(shared, a.n_layers * a.n_heads))) as pairs:
        for example, maps, theirs in pairs:
            yield example, (maps, theirs)


def _pair_reduce(context, example: int, pair: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    return {"cosine": cosine(*pair)}


def _pair_totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A range's cosines summed per head and its examples counted: what a whole-run run_similarity divides."""
    return {"cosine": part["cosine"].sum(0), "examples": np.asarray(len(part["example"]), np.int64)}


PAIR_COSINES = register_kind(
    SummaryKind(
        "pair_cosines",
        1,
        _pair_prepare,
        _pair_reduce,
        defaults={"other": ""},
        covers=_pair_covers,
        read=_pair_read,
        state=_pair_state,
        one_run=False,
        totals=_pair_totals,
    )
)


@register("run_similarity")
def run_similarity(
    store: Store, *, run, other: str | None = None, examples=None, max_examples: int | None = 1000, seed: int = 0
) -> pd.DataFrame:
    """Kovaleva K3: per head, mean cosine similarity between the maps of two runs over the same examples.

    `other`: the run to compare with (required). Examples are matched by their stored id (both runs must be over the same dataset, and
    must have tokenised each compared example into the same token ids). At most
    `max_examples` shared examples are compared (a random sample drawn with `seed` when
    there are more, as the paper sampled 1000 dev examples; `none`: all). Over all of them (no `examples`, and no more
    than `max_examples`) the cosines' sums kept per range of examples are added, without the runs' example rows.
    Columns: layer, head, similarity (mean over examples of the cosine of the two flattened
    L x L maps), n_examples.
    """
    if other is None:
        raise InvalidArgumentError("run_similarity compares two runs: name the other one, e.g. --param other=RUN")
    a, b = store.run_info(run), store.run_info(other)
    kept = kept_ranges(store, a, PAIR_COSINES, other=b.name) if examples is None else None  # built as before, once
    if kept is not None and kept.n_examples() and (max_examples is None or kept.n_examples() <= max_examples):
        totals = summary_totals(store, a, PAIR_COSINES, other=b.name)  # every shared example: the kept ranges added
    else:
        shared = shared_examples(store, a, b, examples, max_examples, seed, check_tokens=False)
        totals = summary_totals(store, a, PAIR_COSINES, shared["example"], other=b.name)  # in a's storage order
    n = int(totals["examples"])
    frame = per_head_frame(a, similarity=totals["cosine"] / n)
    frame["n_examples"] = n
    frame.attrs["other"] = b.name
    return frame
