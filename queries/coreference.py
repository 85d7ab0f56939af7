"""C7 (Clark et al. 2019, Sec. 4.3, Table 2): antecedent selection by attention heads.

For every mention that has an antecedent in its window (an earlier mention of the same
entity), a head is right when the mention's head word attends most (word-level maps,
special tokens and the word itself excluded) to the head word of one of its antecedents.
Baselines pick one earlier mention and are right when it is of the same entity:
`nearest` (the closest earlier mention), `head_match` (the closest with the same head
word; none, and so wrong, when there is no such mention) and `sieve` (exact string match, then head match, then number /
gender / person agreement of the head words, then the closest). Results are broken down
by the kind of the mention: pronoun, proper (name) or nominal.

What each mention head word attends to most, per head, and each example's counts are kept with the run
(`MENTION_ARGMAX`, queries/engine/) by one pass the first time; later calls add the counts (per range of examples
for the whole run) instead of reading the maps.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import per_head_frame, safe_divide
from .engine import MAP_SOURCES, SummaryKind, asked_of, is_kept, register, register_kind, storage_ranges, summary_totals, whole_run
from .errors import InvalidArgumentError
from .word_level import most_attended_words, units_of

if TYPE_CHECKING:
    from ..store import Store

KINDS = ("pronoun", "proper", "nominal")
BASELINES = ("nearest", "head_match", "sieve")
AGREEMENT = ("Number", "Gender", "Person")


def _feats(text) -> dict:
    if not isinstance(text, str) or text in ("", "_"):
        return {}
    return dict(item.split("=", 1) for item in text.split("|") if "=" in item)


def _agrees(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in AGREEMENT if k in a and k in b)


def baseline_picks(mention: dict, candidates: list[dict]) -> tuple[dict | None, ...]:
    """The earlier mention each of BASELINES picks (candidates in document order), or None; one pass over them."""
    if not candidates:
        return (None,) * len(BASELINES)
    same_text = same_head = None
    for c in candidates:  # the last of each kind wins: the nearest
        if c["text"] == mention["text"]:
            same_text = c
        if c["head_form"] == mention["head_form"]:
            same_head = c
    sieve = same_text if same_text is not None else same_head
    if sieve is None:
        agreeing = [c for c in candidates if _agrees(c["feats"], mention["feats"])]
        sieve = agreeing[-1] if agreeing else candidates[-1]
    return candidates[-1], same_head, sieve


def choose_antecedent(mention: dict, candidates: list[dict], method: str) -> dict | None:
    """The earlier mention a baseline picks (candidates in document order), or None: `nearest` (the closest),
    `head_match` (the closest with the same head word) or `sieve` (exact string match, then head match, then
    agreement of the head words' features, then the closest)."""
    nearest, head_match, sieve = baseline_picks(mention, candidates)
    return nearest if method == "nearest" else head_match if method == "head_match" else sieve


# ---------------------------------------------------------------- predictions and counts kept with the run
# Per example, for each word that heads a mention and has a unit, in unit (token) order: its position (`word`)
# and, per (layer, head), the position of the other word it attends to most (`attended`, from
# `most_attended_words`); and the example's counts, what a query adds: `hits` (KINDS, layer, head) mentions whose head
# word attends most to an antecedent's, `baseline_hits` (KINDS, BASELINES) and `mentions` (KINDS,) the mentions judged
# (those with an antecedent in the window and a head word with a unit). Antecedents are found within the example (a
# window), so the counts add over examples. One pass over the run computes them (queries/engine/); the kind's
# range reduction adds the counts of each range of examples, so a whole-run query adds ~2,000 rows at 8 M examples.


def _mention_argmax_prepare(store: Store, info, examples=None):
    table = store.token_table(info.id, examples)[["example", "word_position"]]
    tokens = {int(k): g["word_position"] for k, g in table.groupby("example")}
    mentions = store.mention_table(info.id, examples).sort_values(["example", "doc_order"], kind="stable")
    records = [dict(zip(mentions.columns, row)) for row in zip(*(mentions[c].tolist() for c in mentions.columns))]
    by_example = {e: records[rows] for e, rows in _by_example(mentions).items()}  # per example, in document order
    words = store.word_table(info.id, sorted(by_example)) if by_example else None  # the baselines compare mention words
    forms: dict[int, tuple[list[str], list]] = {}
    if words is not None:
        lower, feats = words["form"].str.lower().tolist(), words["feats"].tolist()
        forms = {e: (lower[rows], feats[rows]) for e, rows in _by_example(words).items()}
    return tokens, by_example, forms, (info.n_layers, info.n_heads)


def _mention_argmax_reduce(context, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    tokens, mentions, forms, shape = context
    units = units_of(tokens[example])
    words = units.word[units.is_word]
    found = mentions.get(example, [])
    rows = np.flatnonzero(np.isin(words, [m["head"] for m in found]))
    attended = np.zeros((0, *shape), dtype=np.int32)
    if rows.size:
        pred, unit_words = most_attended_words(maps, units)
        chosen = pred[:, :, rows]
        named = np.where(chosen >= 0, unit_words[np.maximum(chosen, 0)], -1)  # -1: no prediction (a tie, or all 0)
        attended = np.moveaxis(named, -1, 0).astype(np.int32)  # (mention heads, layer, head)
    positions = words[rows].astype(np.int32)
    hits, baseline_hits, judged = _mention_counts(found, forms.get(example), positions, attended, shape)
    return {"word": positions, "attended": attended, "hits": hits, "baseline_hits": baseline_hits, "mentions": judged}


def _mention_counts(mentions: list[dict], words, positions: np.ndarray, attended: np.ndarray, shape) -> tuple[np.ndarray, ...]:
    """One example's counts (see above) from its mentions in document order, its words' lowercased forms and features
    (`words`; the baselines compare them), and the attended word of each mention head word with a unit (`positions`)."""
    hits = np.zeros((len(KINDS), *shape), dtype=np.int32)
    baseline_hits = np.zeros((len(KINDS), len(BASELINES)), dtype=np.int32)
    judged = np.zeros(len(KINDS), dtype=np.int32)
    row_of = {int(p): r for r, p in enumerate(positions.tolist())}
    earlier: list[dict] = []  # the mentions so far, in document order
    orders: list[int] = []
    forms, feats = words if mentions else ([], [])  # an example with mentions has words
    for m in mentions:
        text = " ".join(forms[m["word_start"] : m["word_end"]])
        m = dict(m, head_form=forms[m["head"]], text=text, feats=_feats(feats[m["head"]]))
        before = earlier[: bisect_left(orders, m["doc_order"])]
        antecedents = [c for c in before if c["entity"] == m["entity"]]
        earlier.append(m)
        orders.append(m["doc_order"])
        if not antecedents or m["head"] not in row_of:
            continue
        k = KINDS.index(m["kind"])
        targets = np.array([a["head"] for a in antecedents if a["head"] in row_of])
        hits[k] += (attended[row_of[m["head"]]][..., None] == targets).any(-1)  # the head attends most to an antecedent's
        for b, pick in enumerate(baseline_picks(m, before)):
            baseline_hits[k, b] += pick is not None and pick["entity"] == m["entity"]
        judged[k] += 1
    return hits, baseline_hits, judged


def _mention_totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A range's counts: the examples' `hits`, `baseline_hits` and `mentions` summed (int64)."""
    return {name: part[name].sum(0, dtype=np.int64) for name in ("hits", "baseline_hits", "mentions")}


# version 2: a tie or a row of zeros predicts nothing (-1), the rule `dependency` follows; version 1 took the first index;
# version 3: each example's counts kept beside its predictions, and added per range
MENTION_ARGMAX = register_kind(
    SummaryKind(
        "mention_argmax",
        4,  # word maps compiled (queries/_words.c): float64 sums rounded to float32, not float32 products
        _mention_argmax_prepare,
        _mention_argmax_reduce,
        ragged=("word", "attended"),
        totals=_mention_totals,
        threads=True,
        integer_totals=True,
    )
)


def _by_example(frame: pd.DataFrame) -> dict[int, slice]:
    """Rows of each example in a frame sorted by example."""
    example = frame["example"].to_numpy(dtype=np.int64)
    bounds = np.flatnonzero(np.diff(example)) + 1
    starts, ends = np.r_[0, bounds], np.r_[bounds, len(example)]
    return {int(example[a]): slice(int(a), int(b)) for a, b in zip(starts, ends) if b > a}


def coreference_counts(store: Store, run, baselines: bool = True):
    """(info, head hits (kinds, layer, head), baseline hits (kinds, baselines; zeros without `baselines`), mentions per kind).

    Added from the `MENTION_ARGMAX` summary's counts (kept with the run, built by one pass the first time): for the whole
    run its kept ranges' (O(ranges)), else each part's. A run without mentions is not passed over: nothing to count.
    """
    info = store.run_info(run)
    heads = np.zeros((len(KINDS), info.n_layers, info.n_heads))
    base = np.zeros((len(KINDS), len(BASELINES)))
    totals = np.zeros(len(KINDS))
    kept = whole_run(info.id) and is_kept(store, info, MENTION_ARGMAX)
    # otherwise stop at the first range with a mention; NotFoundError naming asked-for examples the run lacks
    if kept or any(len(store.mention_table(info.id, part)) for part in storage_ranges(store, info)):
        counts = summary_totals(store, info, MENTION_ARGMAX)
        if counts:
            heads, totals = counts["hits"], counts["mentions"]
            base = counts["baseline_hits"] if baselines else base
    if not totals.sum():  # a table of NaN (or a "best head 0-0" picked from them) would look like a result
        raise InvalidArgumentError(
            f"{asked_of(info)}: no coreference mention with an antecedent in its window, so nothing to score; "
            "ask it of a run over a corpus with mentions (`attnstore ingest --dataset gum/ontogum:dev`)"
        )
    return info, heads, base, totals


@register("coreference", sources=MAP_SOURCES)
def coreference(store: Store, *, run) -> pd.DataFrame:
    """Per head, antecedent-selection accuracy: all mentions and by kind (pronoun, proper, nominal).

    Columns: layer, head, all, pronoun, proper, nominal. Needs a run over a corpus with
    coreference mentions (gum/ontogum).
    """
    info, heads, _, totals = coreference_counts(store, run, baselines=False)
    columns = {"all": safe_divide(heads.sum(0), totals.sum())}
    columns.update({kind: safe_divide(heads[k], totals[k]) for k, kind in enumerate(KINDS)})
    return per_head_frame(info, **columns)


@register("coreference_summary", per_head=False, sources=MAP_SOURCES)
def coreference_summary(store: Store, *, run) -> pd.DataFrame:
    """Table 2 of Clark et al.: the best head (by all mentions) against the three baselines.

    Columns: method (`head L-H`, nearest, head_match, sieve), layer, head (integers; blank for
    the baselines), all, pronoun, proper, nominal (accuracies). The number of mentions of each
    kind is in `frame.attrs["n_mentions"]` ({"all": ..., "pronoun": ..., ...}) and in the note
    the command line prints.
    """
    info, heads, base, totals = coreference_counts(store, run)
    overall = safe_divide(heads.sum(0), totals.sum())
    layer, head = np.unravel_index(np.nanargmax(np.nan_to_num(overall, nan=-1)), overall.shape)
    rows = [
        dict(
            method=f"head {layer}-{head}",
            layer=int(layer),
            head=int(head),
            all=float(overall[layer, head]),
            **{kind: float(safe_divide(heads[k, layer, head], totals[k])) for k, kind in enumerate(KINDS)},
        )
    ]
    for b, method in enumerate(BASELINES):
        rows.append(
            dict(
                method=method,
                layer=None,
                head=None,
                all=float(safe_divide(base[:, b].sum(), totals.sum())),
                **{kind: float(safe_divide(base[k, b], totals[k])) for k, kind in enumerate(KINDS)},
            )
        )
    frame = pd.DataFrame(rows, columns=["method", "layer", "head", "all", *KINDS]).astype({"layer": "Int64", "head": "Int64"})
    counts = {"all": int(totals.sum()), **{kind: int(totals[k]) for k, kind in enumerate(KINDS)}}
    frame.attrs["n_mentions"] = counts
    frame.attrs["note"] = (
        f"accuracies over {counts['all']} mentions with an antecedent in their window ("
        + ", ".join(f"{kind} {counts[kind]}" for kind in KINDS)
        + ")"
    )
    return frame
