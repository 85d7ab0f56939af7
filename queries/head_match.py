"""Cross-model head matching: which head of run B does what head h of run A does, over the same examples.

Longer than ~500 lines on purpose: the shared units, the distances, both nulls and the kind whose per-example
matrices the three queries combine are one analysis, changed together (a change of the units or a null changes the
kind's version and every query's columns).

Two runs over the same dataset rows (models, tokenizers, numbers of layers and heads may differ).
Each example's maps of both runs become maps over shared **units** through the stored words
(the `word_maps` rule, queries/word_level.py: attention *to* a unit sums its tokens' columns,
*from* a word averages its pieces' rows): a start unit (the tokenizer's cls, else bos, role), a
separator unit (sep, else eos: a pair's two separators are one unit) and every word that has
tokens in both runs (words cut by either run's truncation are dropped in both). An absent role
(no start token) gives a zero column. Rows (the query words) are renormalised over the units
kept, so they are distributions again; with `specials="drop"` the two special units are left
out and rows renormalised over the words. Where either run is causal (decoder-only), a query
word keeps only the start unit and the words up to itself, in both runs.

Distance between head a of A and head b of B on one example (`metric`):
- "js" (default): the mean over query words of the Jensen-Shannon divergence (nats) of their
  two rows (bounded by log 2, the divergence `head_distances` sums);
- "cosine": 1 - cosine similarity of the two flattened word maps (Kovaleva et al.'s Fig. 5);
- "frobenius": the Frobenius norm of their difference (Wu et al. 2020).
The example distances are averaged over the examples (each example once).

Two nulls, each a one-sided paired test over the examples (z = mean(null - real) / (sd(null - real) / sqrt(n)),
p from the normal tail):
- the **positional null** (`position_*`, the one to read): per example, head a of A is compared with a map built
  from position alone, its *positional template*: attention spread evenly over the tokens, reweighted by how much
  more or less a attends, on that example, to the start unit, the separator unit, the previous, same and next word
  and the other words than even attention does (`position_template`). A match passes when head b of B reproduces
  a's maps better than a's own positional and special-token profile does, so what the two heads share is more than
  "both attend to [CLS] and the previous word". A randomly initialised model of the same architecture fails it
  (docs/QUERIES.md);
- the **sentence null** (`null_*`, `z`, `p_value`): each example of A is paired with a *different* example of B
  of similar word count (the examples sorted by word count, each paired with its successor, the last with the
  first) and the two are compared over their first min(n, m) words. It only says that both heads' maps depend on
  the sentence: most head pairs pass it, and so does a randomly initialised model.

The assignment is one-to-one, by the Hungarian method (scipy's `linear_sum_assignment`;
rectangular when the head counts differ, so heads of the larger model stay unmatched); `best_*`
is each head's nearest head of B regardless of the others. Per example the two (heads of A) x
(heads of B) matrices, real and null, and A's heads' distances to their positional templates are the
`head_match` summary kind of the pair (kept in A's group, fingerprinted with both runs' committed counts and B's
uid, queries/engine/).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.progress import reporting
from .common import is_causal, special_role_masks
from .engine import SummaryKind, register, register_kind, summary_totals
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

METRICS = ("js", "cosine", "frobenius")
SPECIALS = ("keep", "drop")
READ_GROUP = 64  # examples whose maps (both runs, and the null partners) are held at once


# ---------------------------------------------------------------- units shared by the two runs


def shared_examples(store: Store, a: RunInfo, b: RunInfo) -> pd.DataFrame:
    """Examples stored (not skipped) in both runs, with A's storage offset and their word count."""
    if a.dataset_id != b.dataset_id:
        raise InvalidArgumentError(
            f"runs {a.name!r} ({a.dataset}:{a.split}) and {b.name!r} ({b.dataset}:{b.split}) share no examples: "
            "head_match compares the maps of the same examples; ingest both models over the same dataset"
        )
    ea, eb = (store.examples(info.id, texts=False) for info in (a, b))
    ea, eb = ea[~ea["skipped"]], eb[~eb["skipped"]]
    both = ea[["example", "example_id", "offset"]].merge(eb[["example_id"]], on="example_id")
    if both.empty:
        raise InvalidArgumentError(f"runs {a.name!r} and {b.name!r} have no stored example in common")
    counts = store.word_counts(a.id)
    both = both.assign(n_words=both["example"].map(lambda e: counts.get(int(e), 0)).astype(int))
    return both.sort_values("example").reset_index(drop=True)


def null_partners(shared: pd.DataFrame) -> dict[int, int]:
    """Each example's null partner: the next example by word count (ties by position), the last paired with the first."""
    order = shared.sort_values(["n_words", "example"], kind="stable")["example"].to_numpy(np.int64)
    if len(order) < 2:
        return {}
    return {int(e): int(p) for e, p in zip(order, np.roll(order, -1))}


def _token_roles(store: Store, info: RunInfo, examples) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per example: (word position per token, -1 for none; start-role mask; separator-role mask)."""
    table = store.token_table(info.id, examples)
    start, sep = special_role_masks(info, table)
    words = pd.array(table["word_position"], dtype="Int64").fillna(-1).to_numpy(np.int64)
    out = {}
    for example, rows in table.groupby("example", sort=False).indices.items():
        out[int(example)] = (words[rows], start[rows], sep[rows])
    return out


def unit_maps(maps: np.ndarray, roles, words: np.ndarray, specials: str, causal: bool) -> np.ndarray:
    """(heads, words, units) maps of one example over the shared units: the rows of `words` (word positions, in
    order) as distributions over [start, separator] (with specials="keep") + `words`."""
    word_of, start, sep = roles
    maps = maps.reshape(-1, *maps.shape[-2:]).astype(np.float64)  # (heads, L, L)
    columns = ([start, sep] if specials == "keep" else []) + [word_of == w for w in words]
    to_units = maps @ np.stack(columns, axis=1).astype(np.float64)  # (heads, L, units): columns summed per unit
    pieces = np.stack([word_of == w for w in words]).astype(np.float64)  # (words, L)
    rows = np.einsum("wl,hlu->hwu", pieces / pieces.sum(1, keepdims=True), to_units)  # rows averaged over pieces
    if causal:  # a query word sees the start unit and the words up to itself
        rows = rows * _visible(len(words), specials)
    total = rows.sum(-1, keepdims=True)
    return np.divide(rows, total, out=np.zeros_like(rows), where=total > 0)


def _visible(n_words: int, specials: str) -> np.ndarray:
    """(words, units) what a causal query word sees: the start unit and the words up to itself."""
    n_special = 2 if specials == "keep" else 0
    visible = np.zeros((n_words, n_special + n_words), dtype=bool)
    visible[:, 0] = specials == "keep"
    visible[:, n_special:] = np.tri(n_words, dtype=bool)
    return visible


# The parts of a row a positional template is built from, in order (the first two with specials="keep" only).
POSITION_PARTS = ("start", "separator", "previous", "same", "next", "other words")


def position_parts(n_words: int, specials: str, causal: bool) -> np.ndarray:
    """(parts, words, units) booleans: which units of query word i are its start unit, separator unit, previous,
    same and next word, and the other words (POSITION_PARTS); a part a row lacks (the first word's previous, a causal
    row's next word and separator) is empty."""
    n_special = 2 if specials == "keep" else 0
    parts = np.zeros((len(POSITION_PARTS), n_words, n_special + n_words), dtype=bool)
    if n_special:
        parts[0, :, 0] = parts[1, :, 1] = True
    rows = np.arange(n_words)
    for k, offset in ((2, -1), (3, 0), (4, 1)):
        keys = rows + offset
        inside = (keys >= 0) & (keys < n_words)
        parts[k, rows[inside], n_special + keys[inside]] = True
    parts[5, :, n_special:] = ~parts[2:5, :, n_special:].any(0)
    if causal:
        parts &= _visible(n_words, specials)[None]
    return parts


def position_template(x: np.ndarray, specials: str, causal: bool, unit_tokens: np.ndarray | None = None) -> np.ndarray:
    """(heads, words, units) the positional templates of unit maps x (heads, words, units): attention spread evenly
    over the tokens (each unit in proportion to its `unit_tokens`, its tokens in A; default one each; what a causal row
    sees), reweighted per part of POSITION_PARTS by how much more or less the head attends to that part than even
    attention does (its share on the part over the example's rows that have it, divided by even attention's share on
    the same rows), rows renormalised; a row that is not a distribution in x stays zero. What position and the
    special units alone say about the head's maps on this example: the positional null's yardstick. A head that
    attends evenly is its own template, and so is one that attends only to one part (the previous word, the start)."""
    n_words, n_units = x.shape[1], x.shape[2]
    parts = position_parts(n_words, specials, causal).astype(np.float64)  # (parts, words, units)
    even = np.ones(n_units) if unit_tokens is None else np.asarray(unit_tokens, dtype=np.float64)
    even = np.broadcast_to(even, (n_words, n_units)) * parts.any(0)  # what each row sees
    total = even.sum(-1, keepdims=True)
    even = np.divide(even, total, out=np.zeros_like(even), where=total > 0)
    rows = x.sum(-1) > 0  # (heads, words): the rows that are distributions
    share = np.einsum("hwu,kwu->hk", x * rows[..., None], parts)  # the head's share on each part, summed over rows
    expected = np.einsum("hw,wu,kwu->hk", rows.astype(np.float64), even, parts)  # even attention's, on the same rows
    ratio = np.divide(share, expected, out=np.zeros_like(share), where=expected > 0)  # (heads, parts)
    template = np.einsum("hk,kwu->hwu", ratio, parts) * even[None] * rows[..., None]
    total = template.sum(-1, keepdims=True)
    return np.divide(template, total, out=np.zeros_like(template), where=total > 0)


def _entropy(p: np.ndarray) -> np.ndarray:
    logs = np.log(p, out=np.zeros_like(p), where=p > 0)
    return -(p * logs).sum(-1)


def distances(x: np.ndarray, y: np.ndarray, metric: str) -> np.ndarray:
    """(heads of A, heads of B) distances between unit maps x (HA, n, U) and y (HB, n, U) of one example."""
    if metric == "js":
        hx, hy = _entropy(x), _entropy(y)  # (HA, n), (HB, n)
        both = (x.sum(-1) > 0)[:, None, :] & (y.sum(-1) > 0)[None, :, :]  # rows that are distributions in both
        out = np.empty((len(x), len(y)))
        for a in range(len(x)):  # one head of A at a time: (HB, n, U) temporaries
            js = _entropy(0.5 * (x[a][None] + y)) - 0.5 * (hx[a][None] + hy)
            js = np.maximum(js, 0.0)  # rounding can leave -1e-17
            used = both[a]
            out[a] = np.where(used.any(-1), (js * used).sum(-1) / np.maximum(used.sum(-1), 1), np.nan)
        return out
    fx, fy = x.reshape(len(x), -1), y.reshape(len(y), -1)
    if metric == "cosine":
        norms = np.linalg.norm(fx, axis=1)[:, None] * np.linalg.norm(fy, axis=1)[None, :]
        with np.errstate(invalid="ignore", divide="ignore"):
            return 1.0 - np.where(norms > 0, (fx @ fy.T) / np.where(norms > 0, norms, 1), np.nan)
    square = (fx**2).sum(1)[:, None] + (fy**2).sum(1)[None, :] - 2 * fx @ fy.T
    return np.sqrt(np.maximum(square, 0.0))


def paired_distances(x: np.ndarray, y: np.ndarray, metric: str) -> np.ndarray:
    """(heads,) the distance between head k of x and head k of y (both (heads, n, U)): `distances`' diagonal."""
    if metric == "js":
        js = np.maximum(_entropy(0.5 * (x + y)) - 0.5 * (_entropy(x) + _entropy(y)), 0.0)  # (heads, n)
        used = (x.sum(-1) > 0) & (y.sum(-1) > 0)
        count = used.sum(-1)
        return np.where(count > 0, (js * used).sum(-1) / np.maximum(count, 1), np.nan)
    fx, fy = x.reshape(len(x), -1), y.reshape(len(y), -1)
    if metric == "cosine":
        norms = np.linalg.norm(fx, axis=1) * np.linalg.norm(fy, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return 1.0 - np.where(norms > 0, (fx * fy).sum(1) / np.where(norms > 0, norms, 1), np.nan)
    return np.sqrt(((fx - fy) ** 2).sum(1))


# ---------------------------------------------------------------- the pair's per-example matrices


def _other(store: Store, params: dict) -> RunInfo:
    if not params["other"]:
        raise InvalidArgumentError("head_match compares two runs: name the other one, e.g. --param other=RUN")
    return store.run_info(params["other"])


def _covers(store: Store, a: RunInfo, params: dict) -> np.ndarray:
    shared = shared_examples(store, a, _other(store, params))["example"].to_numpy(np.int64)
    order = store.storage_order(a.id)
    return order[np.isin(order, shared)]


def _state(store: Store, a: RunInfo, params: dict) -> dict:
    b = _other(store, params)
    return {
        "n_examples": int(store.n_committed(a.id)),
        "other_examples": int(store.n_committed(b.id)),
        "other_uid": str(b.manifest.get("uid") or b.id),
    }


def _prepare(store: Store, a: RunInfo, examples, other: str, metric: str, specials: str):
    b = store.run_info(other)
    shared = shared_examples(store, a, b)
    partners = null_partners(shared)
    examples = [int(e) for e in examples]
    needed = sorted(set(examples) | {partners[e] for e in examples if e in partners})
    causal = is_causal(store, a) or is_causal(store, b)
    return b, partners, _token_roles(store, a, examples), _token_roles(store, b, needed), causal, metric, specials


def _read(store: Store, a: RunInfo, examples, context) -> Iterator[tuple[int, tuple]]:
    """(example, (its maps in A, in B, its null partner's maps in B, the partner)) in A's storage order, a group of
    READ_GROUP examples at a time."""
    b, partners = context[0], context[1]
    examples = [int(e) for e in examples]
    for start in range(0, len(examples), READ_GROUP):
        group = examples[start : start + READ_GROUP]
        wanted = sorted(set(group) | {partners[e] for e in group if e in partners})
        with reporting(_uncounted):  # a progress bar counts A's examples, one per example compared, not B's reads
            theirs = dict(store.iter_attention(b.id, wanted))
        for example, maps in store.iter_attention(a.id, group):
            partner = partners.get(example)
            yield example, (maps, theirs[example], None if partner is None else theirs[partner], partner)


def _uncounted(n: int) -> None:
    """The progress listener while B's maps are read: they are not counted."""


def _words(roles) -> np.ndarray:
    word_of = roles[0]
    return np.unique(word_of[word_of >= 0])


def _reduce(context, example: int, pair) -> dict[str, np.ndarray]:
    _, _, roles_a, roles_b, causal, metric, specials = context
    maps_a, maps_b, maps_null, partner = pair
    ra, rb = roles_a[example], roles_b[example]
    words = np.intersect1d(_words(ra), _words(rb))  # words cut in either run are dropped in both
    x = unit_maps(maps_a, ra, words, specials, causal)
    real = distances(x, unit_maps(maps_b, rb, words, specials, causal), metric)
    pieces = (ra[0][None, :] == words[:, None]).sum(1)  # each word's tokens in A, then the special units'
    unit_tokens = np.concatenate([[ra[1].sum(), ra[2].sum()] if specials == "keep" else [], pieces])
    position = paired_distances(x, position_template(x, specials, causal, unit_tokens), metric)
    null = np.full_like(real, np.nan)
    if maps_null is not None:  # the first min(n, m) words of the two unrelated examples, position by position
        rn = roles_b[partner]
        theirs = _words(rn)
        k = min(len(_words(ra)), len(theirs))
        null = distances(
            unit_maps(maps_a, ra, _words(ra)[:k], specials, causal), unit_maps(maps_null, rn, theirs[:k], specials, causal), metric
        )
    return {"distance": real, "null": null, "position": position, "n_words": np.asarray(len(words), dtype=np.int64)}


TOTALS_BLOCK = 256  # examples summed at a time: bounds the temporaries of a range of 4,096 (n x A's heads x B's)


SUM_FIELDS = ("real", "null", "null_sq", "diff", "diff_sq", "position_diff", "position_diff_sq")  # (heads of A, of B)
COUNT_FIELDS = ("n_real", "n_null", "n_position")  # (heads of A, heads of B), int32


def _totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A range's sums of what the queries combine: per (head of A, head of B) the distances and their count; over the
    examples with a null partner the null distances, their squares, the null-minus-real differences, their squares and
    their count; over the examples where A's head has a positional template distance, the template-minus-real
    differences, their squares and their count; per head of A the template distances (`position`) and their count;
    `examples`: the range's examples. Kept per range (queries/engine/), so a whole-run query adds a row per 4,096
    examples instead of reading every example's two matrices (~166 KB per example for 72 x 144 heads)."""
    shape = part["distance"].shape[1:]
    out: dict[str, np.ndarray] = {name: np.zeros(shape) for name in SUM_FIELDS}
    out.update({name: np.zeros(shape, np.int32) for name in COUNT_FIELDS})
    out.update(position=np.zeros(shape[0]), n_position_a=np.zeros(shape[0], np.int32))
    for start in range(0, len(part["example"]), TOTALS_BLOCK):
        r, s = part["distance"][start : start + TOTALS_BLOCK], part["null"][start : start + TOTALS_BLOCK]
        t = part["position"][start : start + TOTALS_BLOCK]  # (examples, heads of A)
        seen = ~np.isnan(r)
        both = seen & ~np.isnan(s)
        d = np.where(both, s - r, 0.0)
        null = np.where(both, s, 0.0)
        out["real"] += np.where(seen, r, 0.0).sum(0)
        out["null"] += null.sum(0)
        out["null_sq"] += (null * null).sum(0)
        out["diff"] += d.sum(0)
        out["diff_sq"] += (d * d).sum(0)
        out["n_real"] += seen.sum(0, dtype=np.int32)
        out["n_null"] += both.sum(0, dtype=np.int32)
        templated = seen & ~np.isnan(t)[:, :, None]
        p = np.where(templated, t[:, :, None] - r, 0.0)
        out["position_diff"] += p.sum(0)
        out["position_diff_sq"] += (p * p).sum(0)
        out["n_position"] += templated.sum(0, dtype=np.int32)
        out["position"] += np.where(np.isnan(t), 0.0, t).sum(0)
        out["n_position_a"] += (~np.isnan(t)).sum(0, dtype=np.int32)
    out["examples"] = np.asarray(len(part["example"]), np.int64)
    return out


HEAD_MATCH = register_kind(
    SummaryKind(
        "head_match",
        2,
        _prepare,
        _reduce,
        defaults={"other": "", "metric": "js", "specials": "keep"},
        covers=_covers,
        read=_read,
        state=_state,
        one_run=False,
        totals=_totals,
    )
)


# ---------------------------------------------------------------- the queries


def _check(metric: str, specials: str) -> None:
    if metric not in METRICS:
        raise InvalidArgumentError(f"metric={metric!r}: use 'js' (mean Jensen-Shannon divergence of rows), 'cosine' or 'frobenius'")
    if specials not in SPECIALS:
        raise InvalidArgumentError(f"specials={specials!r}: use 'keep' (start and separator units) or 'drop' (words only)")


def match_sums(store: Store, run, other, examples, metric: str, specials: str) -> tuple[RunInfo, RunInfo, dict]:
    """The pair's per-example matrices summed over the examples (and the sums the null test needs): the kept ranges'
    totals added for the whole run, else each part's (`summary_totals`)."""
    _check(metric, specials)
    if other is None:
        raise InvalidArgumentError("head_match compares two runs: name the other one, e.g. --param other=RUN")
    a, b = store.run_info(run), store.run_info(other)
    sums = summary_totals(store, a, HEAD_MATCH, examples, other=b.name, metric=metric, specials=specials)
    if not sums:  # no shared example
        shape = (a.n_layers * a.n_heads, b.n_layers * b.n_heads)
        sums = {name: np.zeros(shape) for name in SUM_FIELDS + COUNT_FIELDS}
        sums.update(position=np.zeros(shape[0]), n_position_a=np.zeros(shape[0]), examples=np.asarray(0))
    n_examples = int(sums.pop("examples"))
    return a, b, {**sums, "n_examples": n_examples}


def _mean(total: np.ndarray, count: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.where(count > 0, count, 1), np.nan)


def _sd(total: np.ndarray, squares: np.ndarray, count: np.ndarray) -> np.ndarray:
    mean = _mean(total, count)
    with np.errstate(invalid="ignore", divide="ignore"):
        var = np.where(count > 1, (squares - count * mean**2) / np.where(count > 1, count - 1, 1), np.nan)
    return np.sqrt(np.maximum(var, 0))


def _paired_z(diff: np.ndarray, squares: np.ndarray, count: np.ndarray, rows: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Per row, the one-sided paired test's z for its chosen column: mean(null - real) / (sd(null - real) / sqrt(n)),
    from the sums of the differences and their squares; NaN with fewer than two examples or no spread."""
    n = count[rows, chosen]
    mean = _mean(diff, count)[rows, chosen]
    sd = _sd(diff, squares, count)[rows, chosen]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n > 1) & (sd > 0), mean / (sd / np.sqrt(np.maximum(n, 1))), np.nan)


def _tail(z: np.ndarray) -> np.ndarray:
    """The normal upper tail of each z (NaN stays NaN)."""
    return np.array([0.5 * math.erfc(v / math.sqrt(2)) if np.isfinite(v) else np.nan for v in z])


@register("head_match_matrix", per_head=False)
def head_match_matrix(
    store: Store, *, run, other: str | None = None, metric: str = "js", specials: str = "keep", examples=None
) -> pd.DataFrame:
    """Distance between every head of run A and every head of run `other` (B), over the examples both store.

    Columns: layer, head (of A), other_layer, other_head (of B), distance (mean over examples
    of the per-example distance: metric="js" the mean over query words of the Jensen-Shannon
    divergence of their rows, "cosine" 1 - cosine of the flattened word maps, "frobenius"
    the norm of their difference), null_mean (the same between unrelated examples of similar
    word count), position_null (the head of A's mean distance to its own positional template:
    a pair whose distance is below it reproduces the head's maps better than position and the
    special units alone), n_examples. Maps are compared over the words both runs keep, with a
    start and a separator unit (specials="keep") or words only ("drop"); see
    queries/head_match.py.
    """
    a, b, sums = match_sums(store, run, other, examples, metric, specials)
    distance, null = _mean(sums["real"], sums["n_real"]), _mean(sums["null"], sums["n_null"])
    position = _mean(sums["position"], sums["n_position_a"])
    ha, hb = np.meshgrid(np.arange(a.n_layers * a.n_heads), np.arange(b.n_layers * b.n_heads), indexing="ij")
    frame = pd.DataFrame(
        {
            "layer": (ha // a.n_heads).ravel(),
            "head": (ha % a.n_heads).ravel(),
            "other_layer": (hb // b.n_heads).ravel(),
            "other_head": (hb % b.n_heads).ravel(),
            "distance": distance.ravel(),
            "null_mean": null.ravel(),
            "position_null": position[ha.ravel()],
            "n_examples": sums["n_examples"],
        }
    )
    frame.attrs["other"] = b.name
    return frame


def assign(distance: np.ndarray) -> np.ndarray:
    """One-to-one assignment minimising the total distance (Hungarian method, scipy): per row its column, -1 where
    the matrix has more rows than columns and the row is left out. NaN distances count as unmatchable."""
    try:
        from scipy.optimize import linear_sum_assignment
    except ImportError:
        raise InvalidArgumentError("head_match needs scipy for the assignment: pip install 'attnstore[ingest]' (or scipy)") from None
    cost = np.where(np.isnan(distance), np.nanmax(distance) * 10 + 1 if np.isfinite(distance).any() else 1.0, distance)
    rows, cols = linear_sum_assignment(cost)
    out = np.full(len(distance), -1, dtype=np.int64)
    out[rows] = cols
    return out


def save_matches(store: Store, run, frame: pd.DataFrame, params: dict) -> str:
    """`--save`: the rows go to the head_matches table, keyed by both runs and the parameters."""
    n = store.save_head_matches(run, frame.attrs["other"], frame, params)
    return f"saved {n} rows to head_matches (run {run!r} against {frame.attrs['other']!r})"


@register("head_match", save=save_matches)
def head_match(store: Store, *, run, other: str | None = None, metric: str = "js", specials: str = "keep", examples=None) -> pd.DataFrame:
    """Cross-model head matching: for each head of run A, the head of run `other` (B) that does the same, one-to-one.

    Over the examples both runs store (any models and tokenizers; maps compared over the
    shared words, see head_match_matrix). Columns: layer, head (of A); match_layer,
    match_head, distance (the Hungarian assignment minimising the total distance;
    empty where B has fewer heads); best_layer, best_head, best_distance (the nearest head
    of B regardless of the others); margin (second nearest minus nearest); rank (the
    match's rank among B's heads for this head, 1 = nearest), row_z (the match's distance
    in standard deviations below the mean over B's heads); null_mean, null_sd (the matched
    pair's distance between unrelated examples of similar word count, over examples); z,
    p_value (one-sided paired test that the match is closer than that null: most head
    pairs pass it, a randomly initialised model too, so it only shows that the maps depend
    on the sentence); position_null (the head's mean distance to its positional template:
    attention spread evenly over the tokens, reweighted per example by how much the head
    attends to the start and separator units, the previous, same and next word and the other
    words), position_z, position_p
    (one-sided paired test that the match is closer than that template: the null to read,
    which a randomly initialised model fails; no match can pass it for a head its template
    reproduces, such as a pure previous-word head); n_examples.
    """
    a, b, sums = match_sums(store, run, other, examples, metric, specials)
    distance = _mean(sums["real"], sums["n_real"])
    match = assign(distance)
    rows = np.arange(len(distance))
    ordered = np.sort(np.where(np.isnan(distance), np.inf, distance), axis=1)
    best = np.nanargmin(np.where(np.isnan(distance), np.inf, distance), axis=1)
    chosen = np.where(match >= 0, match, 0)
    null_mean = _mean(sums["null"], sums["n_null"])[rows, chosen]
    null_sd = _sd(sums["null"], sums["null_sq"], sums["n_null"])[rows, chosen]
    z = _paired_z(sums["diff"], sums["diff_sq"], sums["n_null"], rows, chosen)
    position_z = _paired_z(sums["position_diff"], sums["position_diff_sq"], sums["n_position"], rows, chosen)
    p, position_p = _tail(z), _tail(position_z)
    matched = match >= 0
    # how exceptional the match is among the heads of B: its rank in the row (1 = nearest) and its distance in standard
    # deviations below the row's mean (the null above only says that the maps depend on the sentence)
    finite = np.where(np.isnan(distance), np.inf, distance)
    rank = (finite < finite[rows, chosen][:, None]).sum(1) + 1
    with np.errstate(invalid="ignore", divide="ignore"):
        row_z = (np.nanmean(distance, 1) - distance[rows, chosen]) / np.nanstd(distance, 1)
    frame = pd.DataFrame(
        {
            "layer": rows // a.n_heads,
            "head": rows % a.n_heads,
            "match_layer": pd.array(np.where(matched, match // b.n_heads, 0), dtype="Int64"),
            "match_head": pd.array(np.where(matched, match % b.n_heads, 0), dtype="Int64"),
            "distance": np.where(matched, distance[rows, chosen], np.nan),
            "best_layer": best // b.n_heads,
            "best_head": best % b.n_heads,
            "best_distance": ordered[:, 0],
            "margin": ordered[:, 1] - ordered[:, 0] if ordered.shape[1] > 1 else np.nan,
            "rank": pd.array(np.where(matched, rank, 0), dtype="Int64"),
            "row_z": np.where(matched, row_z, np.nan),
            "null_mean": np.where(matched, null_mean, np.nan),
            "null_sd": np.where(matched, null_sd, np.nan),
            "z": np.where(matched, z, np.nan),
            "p_value": np.where(matched, p, np.nan),
            "position_null": _mean(sums["position"], sums["n_position_a"]),
            "position_z": np.where(matched, position_z, np.nan),
            "position_p": np.where(matched, position_p, np.nan),
            "n_examples": sums["n_examples"],
        }
    )
    frame.loc[~matched, ["match_layer", "match_head", "rank"]] = pd.NA
    frame.attrs["other"] = b.name
    if is_causal(store, a) or is_causal(store, b):
        frame.attrs["note"] = "a causal run: each query word compared over the start unit and the words up to itself, in both runs"
    return frame


# ---------------------------------------------------------------- functional profiles

# Per-head metrics that make a head's functional profile: (query, its columns), all per-head frames of one run.
PROFILES = {
    "position": ("relative_position", ("to_previous", "to_self", "to_next")),
    "special": ("special_tokens", ("to_cls", "to_sep", "to_punct", "to_other")),
    "entropy": ("entropy", ("entropy",)),
    "patterns": ("pattern_heads", ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")),
}
DEFAULT_PROFILE = "position,special,entropy"


def head_profiles(store: Store, run, names: tuple[str, ...]) -> pd.DataFrame:
    """(heads, features) per-head metrics of one run, from the registered queries (kept summaries, as any call)."""
    from .engine import get_query

    columns = []
    for name in names:
        query, wanted = PROFILES[name]
        frame = get_query(query).func(store, run=run).sort_values(["layer", "head"])
        present = [c for c in wanted if c in frame.columns]
        columns.append(frame[present].set_axis([f"{name}.{c}" for c in present], axis=1).reset_index(drop=True))
    return pd.concat(columns, axis=1)


@register("head_profile_match")
def head_profile_match(
    store: Store, *, run, other: str | None = None, profile: str = DEFAULT_PROFILE, with_maps: bool = False
) -> pd.DataFrame:
    """Head matching by function: each head's vector of per-head metrics, matched one-to-one between two runs.

    Profiles (comma-separated `profile`): position (relative_position's to_previous, to_self,
    to_next), special (special_tokens' to_cls, to_sep, to_punct, to_other), entropy, patterns
    (pattern_heads' class shares). Each feature is standardised over both runs' heads
    together (z-scores); distance is Euclidean; one-to-one by the Hungarian method.
    Independent of tokenization: the runs need not share examples (they should share data
    for the profiles to be comparable). Columns: layer, head, match_layer, match_head,
    distance, best_layer, best_head, best_distance; with_maps=true also map_layer, map_head
    (head_match's assignment on the shared examples) and agrees.
    """
    from .common import parse_choices

    if other is None:
        raise InvalidArgumentError("head_profile_match compares two runs: name the other one, e.g. --param other=RUN")
    names = parse_choices(profile, tuple(PROFILES), "profile")
    a, b = store.run_info(run), store.run_info(other)
    pa, pb = head_profiles(store, a.id, names), head_profiles(store, b.id, names)
    shared = [c for c in pa.columns if c in pb.columns]
    both = pd.concat([pa[shared], pb[shared]], ignore_index=True).to_numpy(np.float64)
    spread = np.nanstd(both, axis=0)
    z = (both - np.nanmean(both, axis=0)) / np.where(spread > 0, spread, 1)
    z = np.nan_to_num(z)  # a metric a run does not have (NaN) adds nothing
    za, zb = z[: len(pa)], z[len(pa) :]
    distance = np.sqrt(((za[:, None, :] - zb[None, :, :]) ** 2).sum(-1))
    match = assign(distance)
    rows = np.arange(len(distance))
    best = distance.argmin(1)
    matched = match >= 0
    chosen = np.where(matched, match, 0)
    frame = pd.DataFrame(
        {
            "layer": rows // a.n_heads,
            "head": rows % a.n_heads,
            "match_layer": pd.array(np.where(matched, chosen // b.n_heads, 0), dtype="Int64"),
            "match_head": pd.array(np.where(matched, chosen % b.n_heads, 0), dtype="Int64"),
            "distance": np.where(matched, distance[rows, chosen], np.nan),
            "best_layer": best // b.n_heads,
            "best_head": best % b.n_heads,
            "best_distance": distance[rows, best],
        }
    )
    frame.loc[~matched, ["match_layer", "match_head"]] = pd.NA
    if with_maps:
        maps = head_match(store, run=a.id, other=b.name)
        frame["map_layer"], frame["map_head"] = maps["match_layer"], maps["match_head"]
        frame["agrees"] = (frame["map_layer"] == frame["match_layer"]) & (frame["map_head"] == frame["match_head"])
        frame.attrs["note"] = f"the two matchings agree on {int(frame['agrees'].fillna(False).sum())} of {len(frame)} heads"
    frame.attrs["other"] = b.name
    frame.attrs["features"] = shared
    return frame
