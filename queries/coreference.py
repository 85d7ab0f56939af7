"""C7 (Clark et al. 2019, Sec. 4.3, Table 2): antecedent selection by attention heads.

For every mention that has an antecedent in its window (an earlier mention of the same
entity), a head is right when the mention's head word attends most (word-level maps,
special tokens and the word itself excluded) to the head word of one of its antecedents.
Baselines pick one earlier mention and are right when it is of the same entity:
`nearest` (the closest earlier mention), `head_match` (the closest with the same head
word; none, and so wrong, when there is no such mention) and `sieve` (exact string match, then head match, then number /
gender / person agreement of the head words, then the closest). Results are broken down
by the kind of the mention: pronoun, proper (name) or nominal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import iter_maps, per_head_frame, safe_divide
from .registry import register
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


def choose_antecedent(mention: dict, candidates: list[dict], method: str) -> dict | None:
    """The earlier mention a baseline picks (candidates in document order), or None."""
    if not candidates:
        return None
    nearest = candidates[-1]
    if method == "nearest":
        return nearest
    same_head = [c for c in candidates if c["head_form"] == mention["head_form"]]
    if method == "head_match":
        return same_head[-1] if same_head else None
    for rule in (
        lambda c: c["text"] == mention["text"],
        lambda c: c["head_form"] == mention["head_form"],
        lambda c: _agrees(c["feats"], mention["feats"]),
    ):
        hits = [c for c in candidates if rule(c)]
        if hits:
            return hits[-1]
    return nearest


def coreference_counts(store: Store, run, examples=None):
    info = store.run_info(run)
    words = {int(k): g.reset_index(drop=True) for k, g in store.word_table(info.id).groupby("example")}
    mentions = {int(k): g for k, g in store.mention_table(info.id).groupby("example")}
    tokens = {int(k): g for k, g in store.token_table(info.id)[["example", "word_position"]].groupby("example")}
    heads = np.zeros((len(KINDS), info.n_layers, info.n_heads))
    base = np.zeros((len(KINDS), len(BASELINES)))
    totals = np.zeros(len(KINDS))
    for example, maps in iter_maps(store, info, examples):
        if example not in mentions:
            continue
        w = words[example]
        forms = w["form"].str.lower().tolist()
        pred, unit_words = most_attended_words(maps, units_of(tokens[example]["word_position"]))
        unit_of = {int(p): i for i, p in enumerate(unit_words)}
        found: list[dict] = []
        for m in mentions[example].sort_values("doc_order").to_dict("records"):
            m["head_form"] = forms[m["head"]]
            m["text"] = " ".join(forms[m["word_start"] : m["word_end"]])
            m["feats"] = _feats(w["feats"].iloc[m["head"]])
            earlier = [c for c in found if c["doc_order"] < m["doc_order"]]
            antecedents = [c for c in earlier if c["entity"] == m["entity"]]
            found.append(m)
            if not antecedents or m["head"] not in unit_of:
                continue
            k = KINDS.index(m["kind"])
            targets = [unit_of[a["head"]] for a in antecedents if a["head"] in unit_of]
            heads[k] += np.isin(pred[:, :, unit_of[m["head"]]], targets)
            for b, method in enumerate(BASELINES):
                pick = choose_antecedent(m, earlier, method)
                base[k, b] += pick is not None and pick["entity"] == m["entity"]
            totals[k] += 1
    return info, heads, base, totals


@register("coreference")
def coreference(store: Store, *, run, examples=None) -> pd.DataFrame:
    """Per head, antecedent-selection accuracy: all mentions and by kind (pronoun, proper, nominal).

    Columns: layer, head, all, pronoun, proper, nominal. Needs a run over a corpus with
    coreference mentions (gum/ontogum).
    """
    info, heads, _, totals = coreference_counts(store, run, examples)
    columns = {"all": safe_divide(heads.sum(0), totals.sum())}
    columns.update({kind: safe_divide(heads[k], totals[k]) for k, kind in enumerate(KINDS)})
    return per_head_frame(info, **columns)


@register("coreference_summary", per_head=False)
def coreference_summary(store: Store, *, run, examples=None) -> pd.DataFrame:
    """Table 2 of Clark et al.: the best head (by all mentions) against the three baselines.

    Columns: method (`head L-H`, nearest, head_match, sieve), layer, head, all, pronoun,
    proper, nominal; plus a row `n` with the number of mentions of each kind.
    """
    info, heads, base, totals = coreference_counts(store, run, examples)
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
    rows.append(
        dict(method="n", layer=None, head=None, all=float(totals.sum()), **{kind: float(totals[k]) for k, kind in enumerate(KINDS)})
    )
    return pd.DataFrame(rows, columns=["method", "layer", "head", "all", *KINDS])
