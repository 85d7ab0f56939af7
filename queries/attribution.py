"""Attention vs attribution (Jain & Wallace 2019, "Attention is not Explanation"; the Primer, Sec. 5.1).

Jain & Wallace asked whether attention weights rank the input tokens as a gradient-based attribution does, measuring
Kendall's tau between the two per example. Here the attribution is the run's stored saliency (gradient x input of its
fine-tuned classifier's prediction, `attnstore saliency`, ingest/saliency.py), ranked by its magnitude by default as the
authors did (saliency="absolute": their plotting code, successar/AttentionExplanation Trainers/PlottingBC.py
`process_grads`, takes the absolute value of gradient x input before Kendall's tau; saliency="signed" ranks the signed
product instead, a measurement the paper did not make), and the attention is, per head, the row
of the token the classifier reads: the first special token ([CLS]-like; the last token for a causal model, whose first
token sees only itself). Compared also: that row of the norm-weighted map (weights="norm", where the run keeps value
norms) and of the attention rollout up to each layer (queries/rollout.py), and, as the chance level, a random row
(seeded per example) against the same saliency. Keys: the example's non-special tokens (specials="include": all).

Kendall's tau is tau-b (ties counted as scipy.stats.kendalltau does), written with numpy so queries need no scipy; it is
undefined (NaN, left out of the means) where a row or the saliency is constant over the keys, e.g. uniform attention:
uniform attention ranks nothing, so it has no tau.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import is_causal, per_head_frame, token_flags
from .engine import (
    ATTENTION_ONLY,
    SummaryKind,
    iter_maps,
    iter_maps_with_norms,
    register,
    register_kind,
    requested_examples,
    summary_totals,
    weighted_maps,
)
from .errors import InvalidArgumentError
from .rollout import rollout, source_token

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

SPECIALS = ("exclude", "include")
SALIENCY = ("absolute", "signed")  # the first is the default: the authors' |gradient x input|


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's tau-b of each row of x (..., n) with y (n,); NaN where either is constant (or n < 2)."""
    n = y.shape[-1]
    if n < 2:
        return np.full(x.shape[:-1], np.nan)
    sx = np.sign(x[..., :, None] - x[..., None, :])
    sy = np.sign(y[:, None] - y[None, :])
    concordance = (sx * sy).sum((-2, -1)) / 2  # each pair counted twice over the full square
    untied_x = (np.abs(sx).sum((-2, -1))) / 2  # pairs with x_i != x_j
    untied_y = np.abs(sy).sum() / 2
    denominator = np.sqrt(untied_x * untied_y)
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = np.where(denominator > 0, concordance / np.where(denominator > 0, denominator, 1), np.nan)
    return tau


def _prepare(store: Store, info: RunInfo, examples=None, specials: str = "exclude", saliency: str = "absolute"):
    if saliency not in SALIENCY:
        raise InvalidArgumentError(
            f"saliency={saliency!r}: use 'absolute' (Jain & Wallace's |gradient x input|) or 'signed' (the signed product)"
        )
    if specials not in SPECIALS:
        raise InvalidArgumentError(f"specials={specials!r}: use 'exclude' (compare over the non-special tokens) or 'include'")
    meta = store.saliency_info(info.id)
    if not meta or not meta.get("complete"):
        list(store.iter_saliency(info.id, []))  # refuses in one line, naming the run and the command
    return token_flags(store, info, ".,", examples), is_causal(store, info), info.has_value_norms, specials, saliency


def _read(store: Store, info: RunInfo, examples, context) -> Iterator[tuple[int, tuple]]:
    """(example, (maps, saliency, value norms or None)), all in storage order."""
    with_norms = iter_maps_with_norms(store, info, examples) if context[2] else ((e, m, None) for e, m in iter_maps(store, info, examples))
    for (example, maps, norms), (same, saliency) in zip(with_norms, store.iter_saliency(info.id, examples)):
        assert example == same, (example, same)
        yield example, (maps, saliency, norms)


def _reduce(context, example: int, data: tuple) -> dict[str, np.ndarray]:
    flags, causal, _, specials, kind = context
    maps, saliency, norms = data
    if kind == "absolute":
        saliency = np.abs(saliency)
    f = flags[example]
    length = maps.shape[-1]
    source = source_token(f, length, causal)
    keys = np.arange(length) if specials == "include" else np.flatnonzero(~f.special)
    layers, heads = maps.shape[:2]
    nan_heads, nan_layers = np.full((layers, heads), np.nan), np.full(layers, np.nan)
    if source < 0 or len(keys) < 2:
        return {
            "tau": nan_heads,
            "tau_norm": nan_heads,
            "tau_rollout": nan_layers,
            "tau_random": nan_heads,
            "n_keys": np.asarray(len(keys)),
        }
    s = saliency[keys].astype(np.float64)
    rows = maps[:, :, source][..., keys].astype(np.float64)
    out = {"tau": kendall_tau_b(rows, s)}
    out["tau_norm"] = (
        kendall_tau_b(weighted_maps(maps, norms)[:, :, source][..., keys].astype(np.float64), s) if norms is not None else nan_heads
    )
    out["tau_rollout"] = kendall_tau_b(rollout(maps)[:, source][:, keys], s)
    random_rows = np.random.default_rng(example).random((layers, heads, len(keys)))  # chance: a row unrelated to the input
    out["tau_random"] = kendall_tau_b(random_rows, s)
    out["n_keys"] = np.asarray(len(keys), np.int64)
    return out


def _state(store: Store, info: RunInfo, params: dict) -> dict:
    """The committed examples and what the saliency is: kept taus are read back only for the saliency they were built
    from (a recomputed saliency, e.g. of another method, makes them stale)."""
    meta = store.saliency_info(info.id) or {}
    return {"n_examples": int(store.n_committed(info.id)), "saliency": {k: meta.get(k) for k in ("model", "method", "target", "n_tokens")}}


def seed_agreement(store: Store, info: RunInfo, seed_run: str, specials: str, saliency: str) -> float:
    """Mean Kendall tau-b between the saliencies of `info`'s run and `seed_run` over their shared examples (the same
    keys as the heads are compared on); refused in one line where an example's tokens differ."""
    other = store.run_info(seed_run)
    if other.dataset_id != info.dataset_id:
        raise InvalidArgumentError(
            f"seed_run {other.name!r} is over another dataset than run {info.name!r}: give a run over the same examples"
        )
    examples = requested_examples(info.id)  # the query's (queries/engine/request.py)
    flags = token_flags(store, info, ".,", examples)
    mine = dict(store.iter_saliency(info.id, examples))
    taus = []

    def token_ids(run_id: int) -> dict[int, np.ndarray]:  # grouped once: one pass over each run's token table
        return {
            int(e): g["token_id"].to_numpy() for e, g in store.token_table(run_id, list(mine))[["example", "token_id"]].groupby("example")
        }

    ours, theirs = token_ids(info.id), token_ids(other.id)
    for example, values in store.iter_saliency(other.id, list(mine)):
        a, b = ours[example], theirs.get(example, np.empty(0))
        if not np.array_equal(a, b):
            raise InvalidArgumentError(
                f"example {example} has other tokens in run {other.name!r} than in {info.name!r}: the seed run must tokenise alike"
            )
        keys = np.arange(len(a)) if specials == "include" else np.flatnonzero(~flags[example].special)
        x, y = mine[example][keys].astype(np.float64), values[keys].astype(np.float64)
        if saliency == "absolute":
            x, y = np.abs(x), np.abs(y)
        taus.append(kendall_tau_b(x[None], y)[0])
    taus_array = np.asarray(taus, dtype=np.float64)
    return float(np.nanmean(taus_array)) if np.isfinite(taus_array).any() else float("nan")


def _totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A range's reduction, what `attention_attribution` adds: per head, the taus summed over the examples where each is
    defined (not NaN) and those counts (`n_<tau>`), the squares of `tau` (for its standard deviation); per layer the
    same for `tau_rollout`."""
    out: dict[str, np.ndarray] = {}
    for k in ("tau", "tau_norm", "tau_random", "tau_rollout"):
        values = part[k]
        defined = ~np.isnan(values)
        out[k] = np.where(defined, values, 0).sum(0)
        out[f"n_{k}"] = defined.sum(0).astype(np.int64)
    out["tau_sq"] = np.nan_to_num(part["tau"] ** 2).sum(0)
    return out


ATTRIBUTION_TAU = register_kind(
    SummaryKind(
        "attribution_tau",
        2,  # 2: the default saliency became "absolute" (the authors'); version 1's default key holds signed taus
        _prepare,
        _reduce,
        read=_read,
        state=_state,
        defaults={"specials": "exclude", "saliency": "absolute"},
        totals=_totals,
    )
)


@register("attention_attribution", sources=ATTENTION_ONLY)
def attention_attribution(
    store: Store, *, run, specials: str = "exclude", saliency: str = "absolute", seed_run: str | None = None
) -> pd.DataFrame:
    """Jain & Wallace 2019: per head, mean Kendall tau between the [CLS] row's attention and gradient x input saliency.

    Columns: layer, head;
    tau: Kendall's tau-b between the head's attention from the classifier's token ([CLS]-like;
      a causal model's last token) to each key and the keys' saliency, per example, then the
      mean over the examples where it is defined (n_examples);
    tau_norm: the same for the norm-weighted row (weights="norm"; NaN without value norms);
    tau_rollout: the same for the attention rollout up to the head's layer (one value per layer);
    tau_random: a random row (seeded per example) against the same saliency: the chance level;
    tau_sd: the standard deviation of tau over the examples;
    tau_seed (with `seed_run`, a run of the same task's classifier fine-tuned with another seed,
      over the same examples and tokens): the mean tau between the two runs' saliencies, the
      same for every head: how far two equally trained models' attributions agree.
    Keys: the non-special tokens (specials="include": all), as the authors' code drops the first
    and last token. saliency="absolute" (default, the authors' |gradient x input|: ranked by
    magnitude, either direction, as their code takes the absolute value before Kendall's tau) or
    "signed" (the signed product: words pushing towards the prediction rank above those pushing
    against it). Needs the run's saliency (`attnstore
    saliency --run RUN`, on a run of a classifier fine-tuned in this store).
    """
    info = store.run_info(run)
    shape = (info.n_layers, info.n_heads)
    # the whole run adds its kept range reductions (O(ranges)); a subset adds each part's
    totals = summary_totals(store, info, ATTRIBUTION_TAU, specials=specials, saliency=saliency)
    sums = {k: totals.get(k, np.zeros(shape)) for k in ("tau", "tau_norm", "tau_random", "tau_sq")}
    counts = {k: totals.get(f"n_{k}", np.zeros(shape)).astype(np.float64) for k in ("tau", "tau_norm", "tau_random")}
    rollout_sum = totals.get("tau_rollout", np.zeros(info.n_layers))
    rollout_count = totals.get("n_tau_rollout", np.zeros(info.n_layers)).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = {k: np.where(counts[k] > 0, sums[k] / np.maximum(counts[k], 1), np.nan) for k in counts}
        variance = np.where(
            counts["tau"] > 1, (sums["tau_sq"] - counts["tau"] * means["tau"] ** 2) / np.maximum(counts["tau"] - 1, 1), np.nan
        )
        rolled = np.where(rollout_count > 0, rollout_sum / np.maximum(rollout_count, 1), np.nan)
    columns = {}
    if seed_run is not None:
        columns["tau_seed"] = np.full(shape, seed_agreement(store, info, seed_run, specials, saliency))
    return per_head_frame(
        info,
        **columns,
        tau=means["tau"],
        tau_norm=means["tau_norm"],
        tau_rollout=np.repeat(rolled[:, None], info.n_heads, axis=1),
        tau_random=means["tau_random"],
        tau_sd=np.sqrt(np.clip(variance, 0, None)),
        n_examples=counts["tau"],
    )
