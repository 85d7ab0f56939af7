"""Naive references for the queries' tests: each query computed the plain way, by decoding every asked-for example's maps
and reading its token, word, mention and frame rows straight from the store, with none of the query framework
(queries/engine/: no per-example summary, nothing kept, no ranges, no scheduler).

A query's tests compare its result (whatever the framework took: kept, built, computed for the call alone) with
`query(store, name, run=..., **params)` here. The references reuse the queries' output builders (`per_head_frame`,
`long_frame`) and their tables of conventions (relations, offsets, features), never their per-example reductions.

Imported as `attnstore.tests.queries.reference` (the tests run with --import-mode=importlib).
"""

from __future__ import annotations

from bisect import bisect_left
from contextlib import ExitStack
from math import lgamma
from unittest import mock

import numpy as np
import pandas as pd

from attnstore.queries import coreference as coreference_module
from attnstore.queries import dependency as dependency_module
from attnstore.queries import frame_heads as frame_heads_module
from attnstore.queries import head_clusters as head_clusters_module
from attnstore.queries import patterns as patterns_module
from attnstore.queries import run_query
from attnstore.queries import trees as trees_module
from attnstore.queries.common import is_causal, per_head_frame, safe_divide, token_flags
from attnstore.queries.coreference import BASELINES, KINDS, _by_example, _feats, baseline_picks
from attnstore.queries.dependency import OFFSETS, POSS_RELATIONS, POSSESSIVE_MARKERS, DependencyCounts, _empty_counts, word_predictions
from attnstore.queries.engine import REQUESTED, current_request, ranged_maps, requested_examples, storage_ranges, summary
from attnstore.queries.errors import InvalidArgumentError
from attnstore.queries.feature_attention import feature_masks, long_frame, parse_features
from attnstore.queries.frame_heads import FILTER_STEPS, FRAMES_SQL, FrameFilters, annotation_sets, check_frames, span_distance
from attnstore.queries.head_clusters import js_upper, square
from attnstore.queries.patterns import SCORES, pattern_scores, token_layout
from attnstore.queries.run_similarity import cosine, shared_examples
from attnstore.queries.token_to_token import parse_relations, relation_units
from attnstore.queries.trees import HEAD_TREES
from attnstore.queries.word_level import units_of, word_level


def _groups(frame: pd.DataFrame) -> dict[int, pd.DataFrame]:
    return {int(k): g for k, g in frame.groupby("example", sort=False)}


def _maps(store, info, examples=None, weights: str = "attention"):
    """(example, maps) of the run's stored examples (or `examples`) in storage order; weights="norm": each map weighted
    by its keys' value norms (read one example at a time) and every row renormalised, written out with loops."""
    order = [int(e) for part in storage_ranges(store, info, examples) for e in part]
    if weights == "attention":
        return store.iter_attention(info.id, order)
    return ((example, _norm_weighted(maps, store.value_norms(info.id, example))) for example, maps in store.iter_attention(info.id, order))


def _norm_weighted(maps: np.ndarray, norms: np.ndarray) -> np.ndarray:
    out = np.zeros(maps.shape, dtype=np.float64)
    for layer in range(maps.shape[0]):
        for head in range(maps.shape[1]):
            for i in range(maps.shape[2]):
                row = maps[layer, head, i].astype(np.float64) * norms[layer, head].astype(np.float64)
                if row.sum() > 0:
                    out[layer, head, i] = row / row.sum()
    return out.astype(np.float32)


def plogp32(maps: np.ndarray) -> np.ndarray:
    """p log p of each cell in float32 (0 log 0 = 0): the query's summands (store/float16.py computes them so)."""
    p = maps.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), np.float32(0))


# ---------------------------------------------------------------- Clark C1, C2, C4


def relative_position(store, *, run, examples=None, average: str = "example", weights: str = "attention"):
    info = store.run_info(run)
    shape = (info.n_layers, info.n_heads)
    prev, same, nxt = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    n_tokens = n_pairs = n_examples = 0
    for _, maps in _maps(store, info, examples, weights):
        length = maps.shape[-1]
        sums = [np.diagonal(maps, offset=k, axis1=2, axis2=3).sum(-1, dtype=np.float64) for k in (-1, 0, 1)]
        if average == "example":
            sums = [s / length for s in sums]
        prev += sums[0]
        same += sums[1]
        nxt += sums[2]
        n_tokens += length
        n_pairs += length - 1
        n_examples += 1
    if average == "example":
        frame = per_head_frame(info, to_previous=prev / n_examples, to_self=same / n_examples, to_next=nxt / n_examples)
    else:
        frame = per_head_frame(info, to_previous=prev / n_pairs, to_self=same / n_tokens, to_next=nxt / n_pairs)
    if is_causal(store, info):
        frame["to_next"] = np.nan
    return frame


def special_tokens(store, *, run, punct: str = ".,", examples=None, average: str = "example", weights: str = "attention"):
    per_example = average == "example"
    info = store.run_info(run)
    flags = token_flags(store, info, punct)
    shape = (info.n_layers, info.n_heads)
    to = {k: np.zeros(shape) for k in ("cls", "sep", "punct", "other")}
    sep_from_sep, sep_from_other = np.zeros(shape), np.zeros(shape)
    n_queries = n_sep = n_non_sep = 0
    for example, maps in _maps(store, info, examples, weights):
        f = flags[example]
        received = maps.sum(axis=2, dtype=np.float64)
        other = ~(f.cls | f.sep | f.punct)
        length, seps = maps.shape[-1], int(f.sep.sum())
        to_sep = maps[..., f.sep].sum(-1, dtype=np.float64)
        for name, mask in (("cls", f.cls), ("sep", f.sep), ("punct", f.punct), ("other", other)):
            to[name] += received[..., mask].sum(-1) / (length if per_example else 1)
        if seps:
            sep_from_sep += to_sep[..., f.sep].sum(-1) / (seps if per_example else 1)
        if length - seps:
            sep_from_other += to_sep[..., ~f.sep].sum(-1) / (length - seps if per_example else 1)
        n_queries += 1 if per_example else length
        n_sep += (1 if per_example else seps) if seps else 0
        n_non_sep += (1 if per_example else length - seps) if length - seps else 0
    return per_head_frame(
        info,
        **{f"to_{k}": safe_divide(v, n_queries) for k, v in to.items()},
        sep_from_sep=safe_divide(sep_from_sep, n_sep),
        sep_from_other=safe_divide(sep_from_other, n_non_sep),
    )


def entropy(store, *, run, examples=None, average: str = "example", weights: str = "attention"):
    per_example = average == "example"
    info = store.run_info(run)
    causal = is_causal(store, info)
    flags = token_flags(store, info)
    shape = (info.n_layers, info.n_heads)
    total, from_cls = np.zeros(shape), np.zeros(shape)
    n_queries = n_cls = 0
    uniform = uniform_cls = 0.0
    for example, maps in _maps(store, info, examples, weights):
        h = -plogp32(maps).astype(np.float64).sum(-1)  # float32 summands summed in float64, as the query (documented)
        cls_mask = flags[example].cls
        length, cls = maps.shape[-1], int(cls_mask.sum())
        uniform_sum = lgamma(length + 1) if causal else length * np.log(length)
        if per_example:
            total += h.sum(-1) / length
            uniform += uniform_sum / length
            n_queries += 1
            if cls:
                from_cls += h[..., cls_mask].sum(-1) / cls
                uniform_cls += np.log(length)
                n_cls += 1
        else:
            total += h.sum(-1)
            from_cls += h[..., cls_mask].sum(-1)
            uniform += uniform_sum
            uniform_cls += cls * np.log(length)
            n_queries += length
            n_cls += cls
    frame = per_head_frame(info, entropy=safe_divide(total, n_queries), entropy_from_cls=safe_divide(from_cls, n_cls))
    frame["uniform_entropy"] = safe_divide(uniform, n_queries)
    frame["uniform_entropy_from_cls"] = safe_divide(uniform_cls, n_cls)
    if causal:
        frame[["entropy_from_cls", "uniform_entropy_from_cls"]] = np.nan
    return frame


# ---------------------------------------------------------------- Clark C9


def _asked(store, run, examples, weights):
    """The examples and map source a reference computes over: those given, else the query request's (as the engine's
    reads take them: queries/engine/request.py), else every example and the maps as stored."""
    info = store.run_info(run)
    request = current_request(info.id)
    examples = requested_examples(info.id, examples)
    return examples, weights or (request.source if request is not None else "attention")


def head_distance_sum(store, run, smoothing: float = 0.001, *, examples=REQUESTED, weights=None):
    examples, weights = _asked(store, run, examples, weights)
    info = store.run_info(run)
    n = info.n_layers * info.n_heads
    upper = np.zeros(n * (n - 1) // 2)
    n_tokens = 0
    for _, maps in _maps(store, info, examples, weights):
        heads = maps.reshape(-1, *maps.shape[2:]).astype(np.float64)
        upper += js_upper(smoothing / heads.shape[-1] + (1 - smoothing) * heads, threads=1)
        n_tokens += maps.shape[-1]
    return info, square(upper, n), n_tokens


# ---------------------------------------------------------------- Kovaleva K5, K6, K3, K1


def feature_attention(store, *, run, features=None, examples=None, weights: str = "attention"):
    names = parse_features(features)
    info = store.run_info(run)
    fm = feature_masks(store, info, names)
    total = {f: np.zeros((info.n_layers, info.n_heads)) for f in names}
    count = dict.fromkeys(names, 0)
    for example, maps in _maps(store, info, examples, weights):
        received = maps.sum(axis=2, dtype=np.float64) / maps.shape[-1]
        for f in names:
            mask = fm.masks[example][f]
            if mask.any():
                total[f] += received[..., mask].max(-1)
                count[f] += 1
    return long_frame(range(info.n_layers), info.n_heads, names, total, count, "feature")


def token_to_token(store, *, run, relations=None, statistic: str = "token_max", examples=None, weights: str = "attention"):
    names = parse_relations(relations)
    info = store.run_info(run)
    linked = relation_units(store, info, names)
    total = {r: np.zeros((info.n_layers, info.n_heads)) for r in names}
    count, n_pairs = dict.fromkeys(names, 0), dict.fromkeys(names, 0)
    for example, maps in _maps(store, info, examples, weights):
        if example not in linked:
            continue
        word_positions, wanted = linked[example]
        units = units_of(word_positions)
        wmap = word_level(maps, units).astype(np.float64)
        for r, uv in wanted.items():
            if statistic == "word_mean":
                total[r] += wmap[:, :, uv[:, 0], uv[:, 1]].mean(-1)
            else:  # every token of A against every token of B, over every linked pair: the largest weight
                best = np.full((info.n_layers, info.n_heads), -np.inf)
                for a, b in uv:
                    for i in np.flatnonzero(word_positions == units.word[a]):
                        for j in np.flatnonzero(word_positions == units.word[b]):
                            best = np.maximum(best, maps[:, :, i, j].astype(np.float64))
                total[r] += best
            count[r] += 1
            n_pairs[r] += len(uv)
    frame = long_frame(range(info.n_layers), info.n_heads, names, total, count, "relation")
    frame["n_pairs"] = frame["relation"].map(n_pairs).astype(int)
    return frame


def cls_feature_attention(store, *, run, layer=None, features=None, pool: str = "max", examples=None, weights: str = "attention"):
    names = parse_features(features)
    info = store.run_info(run)
    layer = info.n_layers - 1 if layer is None else layer
    fm = feature_masks(store, info, names)
    total = {f: np.zeros((1, info.n_heads)) for f in names}
    count = dict.fromkeys(names, 0)
    for example, maps in _maps(store, info, examples, weights):
        cls = np.flatnonzero(fm.flags[example].cls)
        if not len(cls):
            continue
        row = maps[layer, :, cls[0], :].astype(np.float64)
        for f in names:
            mask = fm.masks[example][f]
            if mask.any():
                total[f][0] += row[:, mask].max(-1) if pool == "max" else row[:, mask].sum(-1)
                count[f] += 1
    frame = long_frame([int(layer)], info.n_heads, names, total, count, "feature")
    frame.insert(frame.columns.get_loc("value") + 1, "mean_over_heads", frame.groupby("feature", sort=False)["value"].transform("mean"))
    return frame


def run_similarity(store, *, run, other=None, examples=None, max_examples: int = 1000, seed: int = 0):
    a, b = store.run_info(run), store.run_info(other)
    shared = shared_examples(store, a, b, examples, max_examples, seed)  # checks the tokens too
    order = store.storage_order(a.id)
    chosen = order[np.isin(order, shared["example"].to_numpy())]
    total, n = np.zeros((a.n_layers, a.n_heads)), 0
    theirs = dict(store.iter_attention(b.id, chosen))
    for example, maps in store.iter_attention(a.id, chosen):
        total += cosine(maps, theirs[example])
        n += 1
    frame = per_head_frame(a, similarity=total / n)
    frame["n_examples"] = n
    return frame


def pattern_scores_of(store, info, kind, chosen):
    """The per-example rule scores of `chosen`, as the summary's fields, from each map directly."""
    layout = token_layout(store, info)
    rows = [(example, pattern_scores(maps, *layout[example])) for example, maps in store.iter_attention(info.id, chosen)]
    out = {"example": np.asarray([e for e, _ in rows], dtype=np.int64)}
    for key in SCORES:
        out[key] = np.stack([s[key] for _, s in rows]) if rows else np.zeros((0, info.n_layers, info.n_heads))
    return out


def dependency_counts(store, run, head2dep: str = "transpose", poss_apostrophe: bool = True, *, examples=REQUESTED, weights=None):
    """The counts from every example's maps, decoded and made word-level one example at a time, and the word table,
    read range by range (SUMMARY_RANGE examples in storage order)."""
    examples, weights = _asked(store, run, examples, weights)
    info = store.run_info(run)
    counts = _empty_counts(info, [])
    for part in storage_ranges(store, info, examples):
        counts = _add_counts(counts, _dependency_range(store, info, part, head2dep, poss_apostrophe, weights))
    if examples is not None:  # the relations of every stored example, as without `examples`
        for part in storage_ranges(store, info):
            words = store.word_table(info.id, part)
            relations = words["deprel"][words["deprel"].notna() & words["head"].notna()].unique()
            counts = _add_counts(counts, _empty_counts(info, sorted(relations)))
    return counts


def _add_counts(total: DependencyCounts, part: DependencyCounts) -> DependencyCounts:
    """Two sets of counts (of different examples) as one, over the union of their relations (sorted)."""
    relations = sorted(set(total.relations) | set(part.relations))
    out = _empty_counts(total.info, relations)
    index = {r: i for i, r in enumerate(relations)}
    for counts in (total, part):
        at = [index[r] for r in counts.relations]
        out.correct[..., at] += counts.correct
        out.totals[at] += counts.totals
        out.baseline[:, at] += counts.baseline
        out.n_root += counts.n_root
        out.baseline_root += counts.baseline_root
        out.no_prediction += counts.no_prediction
    return out


def _dependency_range(store, info, examples, head2dep, poss_apostrophe, weights="attention"):
    """`dependency_counts` of one range of committed examples: its relations, hits and baseline."""
    all_words = store.word_table(info.id, examples)
    words = all_words[all_words["deprel"].notna()]
    counts = _empty_counts(info, sorted(words["deprel"][words["head"].notna()].unique()))
    spans = all_words.groupby(["example", "segment", "sentence"])["position"].agg(["min", "max"])
    bounds = {tuple(int(x) for x in key): (int(lo), int(hi)) for key, lo, hi in zip(spans.index, spans["min"], spans["max"])}
    rel_index = {r: i for i, r in enumerate(counts.relations)}
    forms = {int(k): dict(zip(g["position"], g["form"])) for k, g in all_words.groupby("example", sort=False)}
    tokens = _groups(store.token_table(info.id, examples)[["example", "word_position"]])
    edges = _groups(words)
    for example, maps in _maps(store, info, examples, weights):
        if example not in edges:
            continue
        by_row, by_col, unit_words = word_predictions(maps, units_of(tokens[example]["word_position"]))
        word_units = {int(w): i for i, w in enumerate(unit_words)}
        e = edges[example]
        root = e["head"].isna().to_numpy()
        d_pos = e["position"].to_numpy(dtype=np.int64)
        h_pos = e["head"].fillna(-1).to_numpy(dtype=np.int64)  # -1: ROOT
        # the word whose prediction is judged: the dependent, or the 's after a possessor
        judged_pos = d_pos.copy()
        if poss_apostrophe:
            text = forms[example]
            for k, (rel, p) in enumerate(zip(e["deprel"], d_pos)):
                following = text.get(int(p) + 1)
                if rel in POSS_RELATIONS and following is not None and following.lower() in POSSESSIVE_MARKERS:
                    judged_pos[k] = p + 1
        dep = np.array([word_units.get(int(p), -1) for p in d_pos], dtype=np.int64)
        judged = np.array([word_units.get(int(p), -1) for p in judged_pos], dtype=np.int64)
        judged = np.where(judged >= 0, judged, dep)  # an 's cut by truncation: judge the dependent itself
        head = np.array([word_units.get(int(p), -1) if p >= 0 else -1 for p in h_pos], dtype=np.int64)
        ok = (dep >= 0) & (root | (head >= 0))
        root, dep, judged, head = root[ok], dep[ok], judged[ok], head[ok]
        d_pos, h_pos, judged_pos = d_pos[ok], h_pos[ok], judged_pos[ok]
        rels = e["deprel"].to_numpy()[ok]
        # predictions (layer, head, edges); -1 never matches: `head` is checked >= 0, root words always miss
        hit_dep2head = (by_row[:, :, judged] == head) & (head >= 0)
        if head2dep == "transpose":
            hit_head2dep = (by_col[:, :, judged] == head) & (head >= 0)
            none_head2dep = by_col[:, :, judged] < 0
        else:  # the head word's most-attended word is the (judged) dependent
            safe_head = np.where(head >= 0, head, 0)
            hit_head2dep = (by_row[:, :, safe_head] == judged) & (head >= 0)
            none_head2dep = (by_row[:, :, safe_head] < 0) | (head < 0)
        counts.no_prediction[0] += (by_row[:, :, judged] < 0).sum(-1)
        counts.no_prediction[1] += none_head2dep.sum(-1)
        nonroot = ~root
        onehot = np.zeros((int(nonroot.sum()), len(counts.relations)))
        onehot[np.arange(len(onehot)), [rel_index[r] for r in rels[nonroot]]] = 1
        counts.correct[0] += hit_dep2head[:, :, nonroot] @ onehot
        counts.correct[1] += hit_head2dep[:, :, nonroot] @ onehot
        counts.totals += onehot.sum(0)
        counts.n_root += int(root.sum())
        # the fixed-offset baseline, clamped to the judged word's sentence
        span = np.array([bounds[(example, int(s), int(t))] for s, t in e[["segment", "sentence"]].to_numpy()[ok]], dtype=np.int64).reshape(
            -1, 2
        )
        first, last = span[:, 0], span[:, 1]
        for k, off in enumerate(OFFSETS):
            target = judged_pos + off
            pred = np.where(target < first, -1, np.minimum(target, last))
            hit = pred == h_pos
            counts.baseline[k] += hit[nonroot] @ onehot
            counts.baseline_root[k] += hit[root].sum()
    return counts


def select_sentences(store, info, examples, f: FrameFilters) -> tuple[dict[int, list[tuple[tuple[int, int], list[tuple[int, int]]]]], dict]:
    """Annotation sets that pass the filters, per example: [(LU span, [core FE spans])], and the count after each filter."""
    check_frames(store, info, f)
    rows = store.sql(FRAMES_SQL, {"dataset": info.dataset_id})
    stored = store.examples(info.id, texts=False)
    stored = set(stored.loc[~stored["skipped"], "example"].astype(int))
    if examples is not None:
        stored &= {int(e) for e in examples}
    n_words = store.word_counts(info.id)
    counts = dict.fromkeys(FILTER_STEPS, 0)
    kept: dict[int, list] = {}
    for example, lu, elements in annotation_sets(rows):
        if example not in stored:
            continue
        counts["annotation_sets"] += 1
        if int(n_words.get(example, 0)) > f.max_words:
            continue
        counts["max_words"] += 1
        if lu is None or (f.one_word_target and lu[1] - lu[0] != 1):
            continue
        counts["target"] += 1
        if any(end - start > f.max_fe_words for start, end, _, _ in elements):
            continue
        counts["max_fe_words"] += 1
        core_spans = [(start, end) for start, end, core_type, in_set in elements if (core_type == "Core" if f.core == "type" else in_set)]
        if not core_spans:
            continue
        counts["has_core"] += 1
        near = core_spans if f.distance_to == "core" else [(start, end) for start, end, _, _ in elements]
        if any(span_distance(lu, span) < f.min_distance for span in near):
            continue
        counts["min_distance"] += 1
        kept.setdefault(example, []).append((lu, core_spans))
    return kept, counts


def _word_positions(store, info, examples) -> dict[int, np.ndarray]:
    """Per example, each token's word position (NaN for special tokens)."""
    table = store.token_table(info.id, examples)
    return {int(k): g["word_position"].to_numpy(dtype=float) for k, g in table.groupby("example")}


def _frame_scores(store, info, examples, f: FrameFilters, weights: str = "attention") -> tuple[np.ndarray, int, dict]:
    kept_sets, counts = select_sentences(store, info, examples, f)
    total = np.zeros((info.n_layers, info.n_heads))
    n = 0
    for example, maps, tokens in ranged_maps(store, info, sorted(kept_sets), lambda part: _word_positions(store, info, part)):
        if weights != "attention":
            maps = _norm_weighted(maps, store.value_norms(info.id, example))
        words = tokens[example]
        for lu, core_spans in kept_sets[example]:
            lu_tok = np.flatnonzero((words >= lu[0]) & (words < lu[1]))
            fe_tok = np.flatnonzero(np.any([(words >= s) & (words < e) for s, e in core_spans], axis=0))
            if not len(lu_tok) or not len(fe_tok):
                continue
            one_way = maps[:, :, lu_tok][:, :, :, fe_tok].max(axis=(-2, -1))
            other_way = maps[:, :, fe_tok][:, :, :, lu_tok].max(axis=(-2, -1))
            total += np.maximum(one_way, other_way).astype(np.float64)
            n += 1
    return total, n, counts


def _tokens_by_example(store, info, examples) -> dict[int, pd.DataFrame]:
    return {int(k): g for k, g in store.token_table(info.id, examples)[["example", "word_position"]].groupby("example")}


def _most_attended(wmap: np.ndarray) -> np.ndarray:
    """Per head and row of a word-level map (diagonal already 0): the column holding the row's largest value, or -1 when
    that value is 0 or is held by more than one column."""
    out = np.full(wmap.shape[:-1], -1, dtype=np.int64)
    for index in np.ndindex(*wmap.shape[:-1]):
        row = wmap[index]
        if len(row) and row.max() > 0 and (row == row.max()).sum() == 1:
            out[index] = int(row.argmax())
    return out


def _predictions(store, info, examples, wanted, weights="attention"):
    tokens = _groups(store.token_table(info.id, examples)[["example", "word_position"]])
    for example, maps in _maps(store, info, examples, weights):
        if wanted(example):
            units = units_of(tokens[example]["word_position"])
            keep = np.flatnonzero(units.is_word)
            wmap = word_level(maps, units)[:, :, keep][:, :, :, keep]
            wmap[:, :, np.arange(len(keep)), np.arange(len(keep))] = 0
            pred = _most_attended(wmap)
            unit_of = {int(p): i for i, p in enumerate(units.word[keep])}
            yield example, unit_of, unit_of, np.moveaxis(pred, -1, 0)


def frame_head_scores(store, run, filters: FrameFilters | None = None, *, examples=REQUESTED, weights=None):
    examples, weights = _asked(store, run, examples, weights)
    f = filters or FrameFilters()
    info = store.run_info(run)
    check_frames(store, info, f)
    total, n, counts = _frame_scores(store, info, examples, f, weights)
    counts["with_tokens"] = n
    if n == 0:
        steps = ", ".join(f"{k}: {v}" for k, v in counts.items())
        raise InvalidArgumentError(
            f"no FrameNet sentence of run {info.name!r} passes the filters ({f.describe()}); annotation sets left after each step: {steps}"
        )
    return info, total / n, n, counts


class _RangeTables:
    """The mentions (and, for the baselines, the words) of one range of examples at a time, in storage order: loaded
    when the first example of the next range comes, so a run's tables are never held whole."""

    def __init__(self, store, info, ranges: list[np.ndarray], baselines: bool) -> None:
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


def coreference_counts(store, run, baselines: bool = True, *, examples=REQUESTED, weights=None):
    examples, weights = _asked(store, run, examples, weights)
    info = store.run_info(run)
    ranges = storage_ranges(store, info, examples)
    tables = _RangeTables(store, info, ranges, baselines)
    heads = np.zeros((len(KINDS), info.n_layers, info.n_heads))
    base = np.zeros((len(KINDS), len(BASELINES)))
    totals = np.zeros(len(KINDS))
    for example, ids, rows, pred in _predictions(store, info, examples, tables.has_mentions, weights):
        if baselines:
            forms, feats = tables.forms[tables.word_rows[example]], tables.feats[tables.word_rows[example]]
        found: list[dict] = []
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
            heads[k] += (pred[rows[m["head"]]][..., None] == targets).any(-1)
            for b, pick in enumerate(baseline_picks(m, earlier) if baselines else ()):
                base[k, b] += pick is not None and pick["entity"] == m["entity"]
            totals[k] += 1
    return info, heads, base, totals


def tree_counts(store, run, specials: str = "exclude", *, examples=REQUESTED, weights=None):
    """`head_trees`' counts per relation added edge by edge from the kind's per-example fields (read whole), in the
    order the query added them before its range reduction: its combining step's reference (the per-example fields
    themselves are checked against networkx and by hand in tests/queries/test_trees.py)."""
    examples, weights = _asked(store, run, examples, weights)
    info = store.run_info(run)
    fields = summary(store, info, HEAD_TREES, examples, specials=specials, weights=weights)
    counts: dict[str, list] = {}
    if "hits" in fields:
        ends = np.cumsum(fields["relation_bytes"])
        raw = fields["relation"].tobytes()
        relations = [raw[e - n : e].decode("utf-8") for e, n in zip(ends, fields["relation_bytes"])]
        for row, relation in enumerate(relations):
            entry = counts.setdefault(relation, [0, np.zeros((2, info.n_layers, info.n_heads)), 0])
            entry[0] += 1
            entry[1] += fields["hits"][row]
            entry[2] += int(fields["chain"][row])
    if not counts:
        raise InvalidArgumentError(f"run {info.name!r} has no gold dependency trees to score (ingest a treebank such as ud/en_ewt)")
    return info, dict(sorted(counts.items()))


# ---------------------------------------------------------------- any query by name

_FRAMES = {"relative_position": relative_position, "special_tokens": special_tokens, "entropy": entropy}
_FRAMES |= {"feature_attention": feature_attention, "token_to_token": token_to_token}
_FRAMES |= {"cls_feature_attention": cls_feature_attention, "run_similarity": run_similarity}
# queries whose combining step is checked with their costly part replaced by the reference above
_PATCHED = {
    "head_distances": [(head_clusters_module, "head_distance_sum", head_distance_sum)],
    "head_clusters": [(head_clusters_module, "head_distance_sum", head_distance_sum)],
    "dependency": [(dependency_module, "dependency_counts", dependency_counts)],
    "dependency_summary": [(dependency_module, "dependency_counts", dependency_counts)],
    "coreference": [(coreference_module, "coreference_counts", coreference_counts)],
    "coreference_summary": [(coreference_module, "coreference_counts", coreference_counts)],
    "frame_heads": [(frame_heads_module, "frame_head_scores", frame_head_scores)],
    "frame_heads_top": [(frame_heads_module, "frame_head_scores", frame_head_scores)],
    "head_trees": [(trees_module, "tree_counts", tree_counts)],
    "head_trees_summary": [(trees_module, "tree_counts", tree_counts)],
    "pattern_classes": [(patterns_module, "summary", pattern_scores_of)],
    "pattern_heads": [(patterns_module, "summary", pattern_scores_of)],
    "pattern_proportions": [(patterns_module, "summary", pattern_scores_of)],
}


def query(store, name: str, *, run, **params) -> pd.DataFrame:
    """Query `name`'s result computed the naive way (the query's own frame-building step where it has one)."""
    if name in _FRAMES:
        return _FRAMES[name](store, run=run, **params)
    with ExitStack() as stack:
        for module, attribute, reference in _PATCHED[name]:
            stack.enter_context(mock.patch.object(module, attribute, reference))
        return run_query(store, name, run=run, **params)
