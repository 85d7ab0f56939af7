"""Trees from heads (Htut et al. 2019, "Do Attention Heads in BERT Track Syntactic Dependencies?"; the Primer, Sec. 5.1).

Per head and sentence, on the word-level map (C5's rule, queries/word_level.py), two structures are read off:

- MAX: every word linked to the other word it attends to most (the first of equal weights);
- MST: the maximum spanning arborescence rooted at the gold root word (Chu-Liu/Edmonds), an edge head -> dependent
  scoring the dependent's attention to the head, a[dependent, head]; of several maximum trees (float16 maps tie often)
  the one the contractions reach, numpy's first of equals at every choice (`mst_heads`; `first_mst_heads` gives the
  first in head order, documented and ~6x slower, to measure the spread: docs/QUERIES.md);

and both are scored against the gold dependency tree as **undirected** attachment (UUAS): a gold edge (dependent,
head) is found when the structure links the two words, in either direction. `specials="exclude"` (default) reads the
map over words only; `"include"` keeps the special tokens as nodes (MAX may point at them and MST may pass through
them; an edge to a special token never matches a gold edge). The baseline links adjacent words (a right- or
left-branching chain, which are the same undirected); for a random-model baseline, run the same query on a run of the
model with random weights.

Each example's hits (per gold edge, for MAX and MST, per head) and the chain's, with the edges' relations, are the
`head_trees` summary kind, kept with the run, and counted per relation and range of examples (its range reduction), so
a whole-run query adds ~2,000 range rows at 8 M examples. The MST is a numpy Chu-Liu/Edmonds written here, checked against
networkx's `maximum_spanning_arborescence` in the tests: networkx takes about 11 ms per 20-word tree on this machine,
26 minutes for 72 heads x 2,000 sentences.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import per_head_frame
from .dependency import _decode_labels, relation_columns, run_relations
from .engine import MAP_SOURCES, SummaryKind, register, register_kind, summary_totals
from .errors import InvalidArgumentError
from .word_level import units_of, word_level

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

SPECIALS = ("exclude", "include")
METHODS = ("max", "mst")


# ---------------------------------------------------------------- structures


def max_links(scores: np.ndarray) -> np.ndarray:
    """Per node (row), the other node it scores highest (the first of equals)."""
    s = np.array(scores, dtype=np.float64)
    np.fill_diagonal(s, -np.inf)
    return s.argmax(1)


def _cycle(heads: np.ndarray, root: int) -> list[int]:
    """A cycle of the head pointers (nodes in it), or [] if they form a tree towards `root`."""
    n = len(heads)
    state = np.zeros(n, dtype=np.int8)  # 0 unseen, 1 on the current path, 2 done
    for start in range(n):
        path = []
        node = start
        while node != root and state[node] == 0:
            state[node] = 1
            path.append(node)
            node = int(heads[node])
        if node != root and state[node] == 1:  # came back onto this path
            return path[path.index(node) :]
        for v in path:
            state[v] = 2
    return []


def _edmonds(s: np.ndarray, root: int) -> np.ndarray:
    """A maximum spanning arborescence of s[dependent, head] (float64, its diagonal and the root's row -inf), rooted at
    `root`, by Chu-Liu/Edmonds with numpy's argmax (the first of equals) at every choice: each node's best head, the
    first cycle met scanning the nodes in order contracted, its exits and entry the first of equals. Each node's head,
    -1 for the root."""
    n = len(s)
    heads = s.argmax(1)
    heads[root] = -1
    found = _cycle(heads, root)
    if not found:
        return heads
    cycle = np.asarray(found, dtype=np.int64)
    inside = np.zeros(n, dtype=bool)
    inside[cycle] = True
    rest = np.flatnonzero(~inside)
    c = len(rest)  # the contracted cycle's index in the smaller graph
    index = np.full(n, -1)
    index[rest] = np.arange(c)
    small = np.full((c + 1, c + 1), -np.inf)
    small[:c, :c] = s[rest[:, None], rest]
    exits = cycle[s[rest[:, None], cycle].argmax(1)]  # per outside dependent: its best head in the cycle
    small[:c, c] = s[rest, exits]
    gain = s[cycle[:, None], rest] - s[cycle, heads[cycle]][:, None]  # (cycle node, outside head): entering there
    enters = cycle[gain.argmax(0)]
    small[c, :c] = gain.max(0)
    inner = _edmonds(small, int(index[root]))
    out = heads.copy()
    for k, d in enumerate(rest):
        out[d] = -1 if d == root else (exits[k] if inner[k] == c else rest[inner[k]])
    entry = rest[inner[c]]
    out[enters[index[entry]]] = entry
    return out


TIE_TOLERANCE = 1e-12  # two trees whose float64 totals are this close are tied (sums of <= 1 weights err ~1e-14)


def _total(s: np.ndarray, heads: np.ndarray) -> float:
    kept = heads >= 0
    return float(s[np.flatnonzero(kept), heads[kept]].sum())


def _is_ancestor(heads: np.ndarray, node: int, of: int) -> bool:
    """Whether `node` lies on the path from `of` up to the root."""
    while of >= 0:
        if of == node:
            return True
        of = int(heads[of])
    return False


def _reduced_costs(s: np.ndarray, root: int) -> np.ndarray:
    """Per edge s[dependent, head]: how much lower than the maximum any tree that uses it must total (Chu-Liu/Edmonds'
    reduced costs, a lower bound): 0 on the maximum trees' edges, +inf where there is no edge."""
    n = len(s)
    best = s.max(1)
    heads = s.argmax(1)
    heads[root] = -1
    found = _cycle(heads, root)
    with np.errstate(invalid="ignore"):  # -inf - -inf: no edge
        if not found:
            rc = best[:, None] - s
        else:
            cycle = np.asarray(found, dtype=np.int64)
            inside = np.zeros(n, dtype=bool)
            inside[cycle] = True
            rest = np.flatnonzero(~inside)
            c = len(rest)
            index = np.full(n, -1)
            index[rest] = np.arange(c)
            small = np.full((c + 1, c + 1), -np.inf)
            small[:c, :c] = s[rest[:, None], rest]
            to_rest = s[rest[:, None], cycle]
            small[:c, c] = to_rest.max(1)
            gain = s[cycle[:, None], rest] - best[cycle][:, None]
            small[c, :c] = gain.max(0)
            inner = _reduced_costs(small, int(index[root]))
            rc = np.empty((n, n))
            rc[rest[:, None], rest] = inner[:c, :c]
            rc[rest[:, None], cycle] = inner[:c, c][:, None] + (small[:c, c][:, None] - to_rest)  # out of the cycle
            # into it: as the contracted edge, or as a second edge into the cycle (at most gain, <= 0)
            rc[cycle[:, None], rest] = np.minimum(inner[c, :c][None, :] + (small[c, :c][None, :] - gain), -gain)
            rc[cycle[:, None], cycle] = best[cycle][:, None] - s[cycle[:, None], cycle]
    rc[np.isnan(rc)] = np.inf
    rc[root] = np.inf
    return rc


def _scores(scores: np.ndarray, root: int) -> np.ndarray:
    s = np.array(scores, dtype=np.float64)
    np.fill_diagonal(s, -np.inf)
    s[root, :] = -np.inf  # the root has no head
    return s


def mst_heads(scores: np.ndarray, root: int) -> np.ndarray:
    """Maximum spanning arborescence (Chu-Liu/Edmonds) of scores[dependent, head], rooted at `root`: each node's head,
    -1 for the root. Of several maximum trees, the one `_edmonds`' choices (numpy's first of equals) reach."""
    return _edmonds(_scores(scores, root), root)


def first_mst_heads(scores: np.ndarray, root: int) -> np.ndarray:
    """As mst_heads, but of several maximum trees (totals within TIE_TOLERANCE of the maximum) the first in head
    order: node 0's head as low as a maximum tree allows, then node 1's, and so on (with no cycle among the best heads,
    each node's first best head: MAX's rule). Not the query's rule: it made the reduce ~6x slower (docs/QUERIES.md)."""
    s = _scores(scores, root)
    heads = _edmonds(s, root)
    possible = _reduced_costs(s, root) <= TIE_TOLERANCE  # the edges a maximum tree may use
    if not (possible & (np.arange(len(s))[None, :] < heads[:, None])).any():
        return heads  # no node has a head before its own that a maximum tree could use: the tree is the first
    total = _total(s, heads)
    fixed = s.copy()  # the rows decided so far keep only their head
    for d in range(len(s)):
        if d == root:
            continue
        for h in np.flatnonzero(possible[d, : heads[d]]):
            other = heads.copy()
            other[d] = h  # one edge swapped: a tree unless h lies under d; else the best tree with h -> d
            if _is_ancestor(heads, d, int(h)) or _total(s, other) < total - TIE_TOLERANCE:
                trial = fixed.copy()
                trial[d] = -np.inf
                trial[d, h] = s[d, h]
                with np.errstate(invalid="ignore"):  # no tree left: -inf - -inf in a contraction, an infinite total
                    other = _edmonds(trial, root)
                    if not np.isfinite(_total(trial, other)):
                        continue
            if _total(s, other) >= total - TIE_TOLERANCE:
                heads = other
                break
        fixed[d] = -np.inf
        fixed[d, heads[d]] = s[d, heads[d]]
    return heads


# ---------------------------------------------------------------- per example


def _prepare(store: Store, info: RunInfo, examples=None, specials: str = "exclude"):
    tokens = {int(e): g["word_position"] for e, g in store.token_table(info.id, examples)[["example", "word_position"]].groupby("example")}
    words = store.word_table(info.id, examples)
    words = words[words["deprel"].notna()]
    gold = {int(e): g[["position", "head", "deprel"]] for e, g in words.groupby("example")}
    return tokens, gold, specials


def _reduce(context, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    tokens, gold, specials = context
    shape = maps.shape[:2]
    empty = {
        "hits": np.zeros((0, 2, *shape), dtype=bool),
        "chain": np.zeros(0, dtype=bool),
        "relation": np.zeros(0, dtype=np.uint8),
        "relation_bytes": np.zeros(0, dtype=np.int32),
    }
    tree = gold.get(example)
    if tree is None:
        return empty
    units = units_of(tokens[example])
    node = units.index_of_words(tree["position"].to_numpy(np.int64))  # unit of each word (-1: cut)
    head_of = dict(zip(tree["position"].astype(int), tree["head"]))
    roots = [int(p) for p, h in head_of.items() if pd.isna(h)]
    unit_of = dict(zip(tree["position"].astype(int), node))
    if len(roots) != 1 or unit_of[roots[0]] < 0:
        return empty  # no single gold root with a unit: MST cannot be rooted
    keep = np.arange(len(units.word)) if specials == "include" else np.flatnonzero(units.is_word)
    local = np.full(len(units.word), -1)
    local[keep] = np.arange(len(keep))
    wmap = word_level(maps, units, keep).astype(np.float64)
    edges = [(unit_of[int(d)], unit_of[int(h)], rel) for d, h, rel in zip(tree["position"], tree["head"], tree["deprel"]) if not pd.isna(h)]
    edges = [(local[a], local[b], rel) for a, b, rel in edges if a >= 0 and b >= 0]
    if not edges:
        return empty
    dep, head = (np.array([e[k] for e in edges]) for k in (0, 1))
    root = int(local[unit_of[roots[0]]])
    hits = np.zeros((len(edges), 2, *shape), dtype=bool)
    for layer in range(shape[0]):
        for h in range(shape[1]):
            scores = wmap[layer, h]
            linked = max_links(scores)
            hits[:, 0, layer, h] = (linked[dep] == head) | (linked[head] == dep)
            tree_heads = mst_heads(scores, root)
            hits[:, 1, layer, h] = (tree_heads[dep] == head) | (tree_heads[head] == dep)
    word_rank = {u: k for k, u in enumerate(np.flatnonzero(units.is_word[keep]))}  # word order among the nodes
    chain = np.array([abs(word_rank[a] - word_rank[b]) == 1 for a, b in zip(dep, head)])
    labels = [str(e[2]).encode("utf-8") for e in edges]
    return {
        "hits": hits,
        "chain": chain,
        "relation": np.frombuffer(b"".join(labels), dtype=np.uint8).copy(),
        "relation_bytes": np.array([len(b) for b in labels], dtype=np.int32),
    }


def _totals(part: dict[str, np.ndarray], labels: list[str]) -> dict[str, np.ndarray]:
    """A range's counts on the run's relations (`labels`): `edges` (relation,), `hits` (relation, method, layer, head)
    and `chain` (relation,), int32 (a range's counts fit)."""
    hits = part["hits"]
    codes, names = _decode_labels(part["relation"], part["relation_bytes"])
    column = np.asarray(relation_columns(labels, names), dtype=np.int64)[codes] if len(codes) else np.zeros(0, np.int64)
    out = {
        "edges": np.bincount(column, minlength=len(labels)).astype(np.int32),
        "hits": np.zeros((len(labels), *hits.shape[1:]), dtype=np.int32),
        "chain": np.bincount(column, weights=part["chain"], minlength=len(labels)).astype(np.int32),
    }
    if len(column):  # the edges grouped by relation, each group's hits summed
        order = np.argsort(column, kind="stable")
        present, starts = np.unique(column[order], return_index=True)
        out["hits"][present] = np.add.reduceat(hits[order].view(np.uint8), starts, axis=0, dtype=np.int32)
    return out


# hits: (gold edges, method in METHODS order, layer, head); chain: (gold edges,); relation: the edges' relations as
# UTF-8 bytes, concatenated, with their lengths in relation_bytes (both ragged). Its range reduction counts them per
# relation of the run (the kind's labels, as `word_argmax`'s).
HEAD_TREES = register_kind(
    SummaryKind(
        "head_trees",
        4,  # the answers of 2 (the contractions' tree); 3 took the first maximum tree in head order, ~6x slower
        _prepare,
        _reduce,
        ragged=("hits", "chain", "relation", "relation_bytes"),
        defaults={"specials": "exclude"},
        totals=_totals,
        labels=run_relations,
        threads=True,
    )
)


def tree_counts(store: Store, run, specials: str = "exclude") -> tuple[RunInfo, dict]:
    """Per relation with gold edges (sorted): gold edges, MAX and MST hits per head (method, layer, head), chain hits;
    added from the kept range counts for the whole run (O(ranges)), else from each part's."""
    if specials not in SPECIALS:
        raise InvalidArgumentError(f"specials={specials!r}: use 'exclude' (words only) or 'include' ([CLS]/[SEP] as nodes)")
    info = store.run_info(run)
    totals = summary_totals(store, info, HEAD_TREES, specials=specials)
    labels = totals.pop("labels").tolist()
    counts: dict[str, list] = {}
    for r, relation in enumerate(labels):
        if totals["edges"][r]:  # a relation of the run with no scorable edge here (cut, or other examples): none
            counts[relation] = [int(totals["edges"][r]), totals["hits"][r].astype(np.float64), int(totals["chain"][r])]
    if not counts:
        raise InvalidArgumentError(f"run {info.name!r} has no gold dependency trees to score (ingest a treebank such as ud/en_ewt)")
    return info, counts


@register("head_trees", sources=MAP_SOURCES)
def head_trees(store: Store, *, run, specials: str = "exclude", min_count: int = 100) -> pd.DataFrame:
    """Trees from heads (Htut et al. 2019): undirected attachment accuracy of each head's MAX links and MST.

    Columns: layer, head, uuas_max, uuas_mst (over every gold non-root edge), then
    `<relation>:max` and `<relation>:mst` for each relation with at least min_count edges.
    MAX links every word to the word it attends to most; MST is the maximum spanning tree of
    the word-level map rooted at the gold root (edge head -> dependent scored by the
    dependent's attention to the head). specials="exclude": words only; "include": [CLS]/[SEP]
    as nodes too. The adjacent-word baseline is in frame.attrs["chain_uuas"].
    """
    info, counts = tree_counts(store, run, specials)
    n = sum(c[0] for c in counts.values())
    total = sum(c[1] for c in counts.values())
    columns = {"uuas_max": total[0] / n, "uuas_mst": total[1] / n}
    for relation, (edges, hits, _) in sorted(counts.items()):
        if edges >= min_count:
            columns[f"{relation}:max"], columns[f"{relation}:mst"] = hits[0] / edges, hits[1] / edges
    frame = per_head_frame(info, **columns)
    frame.attrs["chain_uuas"] = sum(c[2] for c in counts.values()) / n
    frame.attrs["n_edges"] = n
    return frame


@register("head_trees_summary", per_head=False, sources=MAP_SOURCES)
def head_trees_summary(store: Store, *, run, specials: str = "exclude", min_count: int = 100) -> pd.DataFrame:
    """Per relation (and `all`): the best head's MAX and MST undirected accuracy against the adjacent-word baseline.

    Columns: relation, n (gold edges), max_layer, max_head, max_uuas, mst_layer, mst_head,
    mst_uuas, chain_uuas (a chain of adjacent words). Relations with fewer than min_count
    edges are left out; ties go to the lowest layer and head.
    """
    info, counts = tree_counts(store, run, specials)
    n = sum(c[0] for c in counts.values())
    entries = [("all", n, sum(c[1] for c in counts.values()), sum(c[2] for c in counts.values()))]
    entries += [(r, e, h, ch) for r, (e, h, ch) in sorted(counts.items(), key=lambda kv: -kv[1][0]) if e >= min_count]
    rows = []
    for relation, edges, hits, chain in entries:
        row = dict(relation=relation, n=int(edges))
        for m, method in enumerate(METHODS):
            acc = hits[m] / edges
            layer, head = np.unravel_index(np.argmax(acc), acc.shape)
            row.update({f"{method}_layer": int(layer), f"{method}_head": int(head), f"{method}_uuas": float(acc[layer, head])})
        row["chain_uuas"] = chain / edges
        rows.append(row)
    return pd.DataFrame(rows)
