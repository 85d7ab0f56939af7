"""C7 (Clark et al. 2019, Sec. 4.3, Table 2): antecedent selection by attention heads.

For every mention that has an antecedent in its window (an earlier mention of the same
entity), a head is right when the mention's head word attends most (word-level maps,
special tokens and the word itself excluded) to the head word of one of its antecedents.
Baselines pick one earlier mention and are right when it is of the same entity:
`nearest` (the closest earlier mention), `head_match` (the closest with the same head
word; none, and so wrong, when there is no such mention) and `sieve` (exact string match, then head match, then number /
gender / person agreement of the head words, then the closest). Results are broken down
by the kind of the mention: pronoun, proper (name) or nominal.

What each mention head word attends to most, per head, is kept with the run (`MENTION_ARGMAX`,
queries/summary.py) by one pass the first time; later calls read it instead of the maps.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import per_head_frame, safe_divide
from .registry import register
from .summary import SummaryKind, ragged_rows, register_kind, storage_ranges, summary_parts
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


# ---------------------------------------------------------------- predictions kept with the run
# Per example, for each word that heads a mention and has a unit, in unit (token) order: its position (`word`)
# and, per (layer, head), the position of the other word it attends to most (`attended`, from
# `most_attended_words`). One pass over the run computes them (queries/summary.py); a query then reads a few
# kilobytes per example instead of every map.


def _mention_argmax_prepare(store: Store, info, examples=None):
    table = store.token_table(info.id, examples)[["example", "word_position"]]
    tokens = {int(k): g["word_position"] for k, g in table.groupby("example")}
    heads = {int(k): np.unique(g["head"].to_numpy(dtype=np.int64)) for k, g in store.mention_table(info.id, examples).groupby("example")}
    return tokens, heads, (info.n_layers, info.n_heads)


def _mention_argmax_reduce(context, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    tokens, heads, shape = context
    units = units_of(tokens[example])
    words = units.word[units.is_word]
    rows = np.flatnonzero(np.isin(words, heads.get(example, ())))
    attended = np.zeros((0, *shape), dtype=np.int32)
    if rows.size:
        pred, unit_words = most_attended_words(maps, units)
        chosen = pred[:, :, rows]
        named = np.where(chosen >= 0, unit_words[np.maximum(chosen, 0)], -1)  # -1: no prediction (a tie, or all 0)
        attended = np.moveaxis(named, -1, 0).astype(np.int32)  # (mention heads, layer, head)
    return {"word": words[rows].astype(np.int32), "attended": attended}


# version 2: a tie or a row of zeros predicts nothing (-1), the rule `dependency` follows; version 1 took the first index
MENTION_ARGMAX = register_kind(
    SummaryKind("mention_argmax", 2, _mention_argmax_prepare, _mention_argmax_reduce, ragged=("word", "attended"), threads=True)
)

# A source of predictions yields, per example with mentions: (example, ids, rows, predictions): `ids` maps the
# position of each word with a unit (at least every mention head's) to what `predictions[rows[position]]`, a
# (layer, head) array, names the attended word by (a unit index, or the word's position when kept).
Predictions = Iterator[tuple[int, dict[int, int], dict[int, int], np.ndarray]]


def _predictions(parts: Iterable[dict[str, np.ndarray]], wanted: Callable[[int], bool]) -> Predictions:
    for arrays in parts:  # one part of the summary at a time
        for i, example in enumerate(arrays["example"].tolist()):
            if wanted(example):
                positions = ragged_rows(arrays, "word", i).tolist()
                yield example, {p: p for p in positions}, {p: r for r, p in enumerate(positions)}, ragged_rows(arrays, "attended", i)


def _by_example(frame: pd.DataFrame) -> dict[int, slice]:
    """Rows of each example in a frame sorted by example."""
    example = frame["example"].to_numpy(dtype=np.int64)
    bounds = np.flatnonzero(np.diff(example)) + 1
    starts, ends = np.r_[0, bounds], np.r_[bounds, len(example)]
    return {int(example[a]): slice(int(a), int(b)) for a, b in zip(starts, ends) if b > a}


class _RangeTables:
    """The mentions (and, for the baselines, the words) of one range of examples at a time, in storage order: loaded
    when the first example of the next range comes, so a run's tables are never held whole."""

    def __init__(self, store: Store, info, ranges: list[np.ndarray], baselines: bool) -> None:
        self.store, self.info, self.baselines = store, info, baselines
        self.pending = iter(ranges)
        self.members: set[int] = set()
        self.mentions: dict[int, list[dict]] = {}  # per example, in document order
        self.forms: list[str] = []
        self.feats: list = []
        self.word_rows: dict[int, slice] = {}

    def _reach(self, example: int) -> None:
        while example not in self.members:
            part = next(self.pending)  # examples come in storage order, as the ranges do
            self.members = set(part.tolist())
            table = self.store.mention_table(self.info.id, part).sort_values(["example", "doc_order"], kind="stable")
            records = [dict(zip(table.columns, row)) for row in zip(*(table[c].tolist() for c in table.columns))]
            self.mentions = {e: records[rows] for e, rows in _by_example(table).items()}
            if self.baselines:  # the baselines compare the mentions' words
                words = self.store.word_table(self.info.id, part)  # sorted by example, position
                self.forms, self.feats = words["form"].str.lower().tolist(), words["feats"].tolist()
                self.word_rows = _by_example(words)

    def has_mentions(self, example: int) -> bool:
        self._reach(example)
        return example in self.mentions


def coreference_counts(store: Store, run, examples=None, baselines: bool = True, weights: str = "attention"):
    """(info, head hits (kinds, layer, head), baseline hits (kinds, baselines; zeros without `baselines`), mentions per kind).

    The heads' predictions are the `MENTION_ARGMAX` summary (queries/summary.py: kept with the run, built by one
    pass the first time).
    """
    info = store.run_info(run)
    ranges = storage_ranges(store, info, examples)  # NotFoundError naming asked-for examples the run lacks
    any_mention = any(len(store.mention_table(info.id, part)) for part in ranges)  # stops at the first range with one
    tables = _RangeTables(store, info, ranges, baselines)
    heads = np.zeros((len(KINDS), info.n_layers, info.n_heads))
    base = np.zeros((len(KINDS), len(BASELINES)))
    totals = np.zeros(len(KINDS))
    # no mention: nothing worth a pass, and no map to read
    predictions = (
        _predictions(summary_parts(store, info, MENTION_ARGMAX, examples, weights=weights), tables.has_mentions)
        if any_mention
        else iter(())
    )
    for example, ids, rows, pred in predictions:
        if baselines:
            forms, feats = tables.forms[tables.word_rows[example]], tables.feats[tables.word_rows[example]]
        found: list[dict] = []  # the mentions so far, in document order
        orders: list[int] = []
        for m in tables.mentions[example]:
            if baselines:
                text = " ".join(forms[m["word_start"] : m["word_end"]])
                m = dict(m, head_form=forms[m["head"]], text=text, feats=_feats(feats[m["head"]]))
            earlier = found[: bisect_left(orders, m["doc_order"])]
            antecedents = [c for c in earlier if c["entity"] == m["entity"]]
            found.append(m)
            orders.append(m["doc_order"])
            if not antecedents or m["head"] not in ids:
                continue
            k = KINDS.index(m["kind"])
            targets = np.array([ids[a["head"]] for a in antecedents if a["head"] in ids])
            heads[k] += (pred[rows[m["head"]]][..., None] == targets).any(-1)  # the head attends most to an antecedent's
            for b, pick in enumerate(baseline_picks(m, earlier) if baselines else ()):
                base[k, b] += pick is not None and pick["entity"] == m["entity"]
            totals[k] += 1
    return info, heads, base, totals


@register("coreference")
def coreference(store: Store, *, run, examples=None, weights: str = "attention") -> pd.DataFrame:
    """Per head, antecedent-selection accuracy: all mentions and by kind (pronoun, proper, nominal).

    Columns: layer, head, all, pronoun, proper, nominal. Needs a run over a corpus with
    coreference mentions (gum/ontogum).
    weights="norm": each key's attention weighted by its value norm (Kobayashi et al. 2020), rows renormalised
      (runs ingested with value norms); "attention" (default): the maps as stored.
    """
    info, heads, _, totals = coreference_counts(store, run, examples, baselines=False, weights=weights)
    columns = {"all": safe_divide(heads.sum(0), totals.sum())}
    columns.update({kind: safe_divide(heads[k], totals[k]) for k, kind in enumerate(KINDS)})
    return per_head_frame(info, **columns)


@register("coreference_summary", per_head=False)
def coreference_summary(store: Store, *, run, examples=None, weights: str = "attention") -> pd.DataFrame:
    """Table 2 of Clark et al.: the best head (by all mentions) against the three baselines.

    Columns: method (`head L-H`, nearest, head_match, sieve), layer, head (integers; blank for
    the baselines), all, pronoun, proper, nominal (accuracies). The number of mentions of each
    kind is in `frame.attrs["n_mentions"]` ({"all": ..., "pronoun": ..., ...}) and in the note
    the command line prints.
    weights="norm": each key's attention weighted by its value norm (Kobayashi et al. 2020), rows renormalised
      (runs ingested with value norms); "attention" (default): the maps as stored.
    """
    info, heads, base, totals = coreference_counts(store, run, examples, weights=weights)
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
