"""Clark et al. 2019's per-head statistics: relative position (Sec 3.1), attention to special tokens and punctuation
(Sec 3.2, Fig 2) and entropy (Sec 3.3, Fig 4), three queries over one summary kind, `clark`.

The `clark` kind reduces each example to its (layer, head) sums over its query tokens: attention on the three
diagonals, attention received by [CLS]-like / separator / punctuation / other keys, separator-to-separator mass and row
entropies, with its counts (L, separators, [CLS]-like tokens); its parameter is the punctuation set. Its range totals
(`_clark_totals`) are what the three queries divide: the pooled sums (average="token"), the sums of each example's means
(average="example"), the query-token counts and the uniform-entropy sums.

The sums are one compiled reduce (queries/_clark.c), which reads each cell once: its float32 value and p log p looked up
together for float16 maps (store/float16.py `value_plogp_table`), every field summed in double, without the GIL, so the
reduce threads of a pass share the cores. numpy needed five passes and two lookups a cell (~3.4 ns a cell on one
thread; `python benchmarks/reduce.py --home H --run MRPC-dev --kinds clark`, docs/PERFORMANCE.md, 2026-11-28 "the
heaviest reduces compiled"). float32 maps (stores written with --dtype float32, maps built by hand) have their p log p
computed by numpy first, with `row_entropy`'s float32 arithmetic, and go through the same loop.
"""

from __future__ import annotations

from math import lgamma
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.float16 import TINY, plogp, value_plogp_table
from ..store.qk import LayerMaps
from .common import CAUSAL_NOTE, check_average, is_causal, per_head_frame, safe_divide, token_flags
from .engine import MAP_SOURCES, SummaryKind, kernel, register, register_kind, summary_totals

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo


# ---------------------------------------------------------------- the kind

KEY_CLS, KEY_SEP, KEY_PUNCT = 1, 2, 4  # a key token's bits (queries/_clark.c KEY_*)

CLARK_FIELDS = (
    *("to_previous", "to_self", "to_next"),
    *(f"received_{k}" for k in ("cls", "sep", "punct", "other")),
    *("sep_from_sep", "sep_from_other", "entropy", "entropy_from_cls"),
)


def example_sums(maps: np.ndarray | LayerMaps, cls: np.ndarray, sep: np.ndarray, punct: np.ndarray) -> dict[str, np.ndarray]:
    """One example's (layer, head) sums over its query tokens, as `relative_position`, `special_tokens` and `entropy`
    use them: maps (layer, head, query, key), or a Q/K run's `LayerMaps`; cls / sep / punct: boolean masks of the
    keys. Each field is float64 of shape (layer, head), summed over the example's query tokens (`received_*` over its
    keys of that kind as well; `received_other` over keys of none of the three; `sep_from_*` over separator / other
    query tokens)."""
    n_layers, n_heads, length = maps.shape[0], maps.shape[1], maps.shape[-1]
    keys = (np.asarray(cls, np.uint8) * KEY_CLS) | (np.asarray(sep, np.uint8) * KEY_SEP)
    keys |= np.asarray(punct, np.uint8) * KEY_PUNCT
    out = np.empty((len(CLARK_FIELDS), n_layers, n_heads), np.float64)
    n_maps = n_layers * n_heads
    if maps.dtype == np.float16:
        codes = np.ascontiguousarray(maps).view(np.uint16)
        kernel("_clark").sums(codes, n_maps, length, keys, value_plogp_table(), out, True)
    else:
        # A layer at a time through one scratch buffer (a Q/K run's maps rebuilt a layer at a time, `LayerMaps`): a whole
        # example's maps and p log p took 2 x 4.5 GiB at 2,048 tokens (`python benchmarks/decoder_capture.py`).
        if isinstance(maps, LayerMaps):  # a Q/K run's rows: no key past a row, so p log p is 0 there
            layer_of = maps.layer
            blocks = [(r, min(length, r + CAUSAL_ROWS)) for r in range(0, length, CAUSAL_ROWS)]
            logs = np.zeros((n_heads, length, length), np.float32)  # the keys past each block stay 0 for every layer
        else:
            values = np.ascontiguousarray(maps, dtype=np.float32).reshape(n_layers, n_heads, length, length)
            layer_of = values.__getitem__  # type: ignore[assignment]  # values[i]: (head, row, key), as maps.layer(i)
            blocks = [(0, length)]
            logs = np.empty((n_heads, length, length), np.float32)
        sums = np.empty((len(CLARK_FIELDS), n_heads), np.float64)
        for layer in range(n_layers):
            layer_maps = layer_of(layer)
            for r0, r1 in blocks:  # row_entropy's float32 p log p (below), 0 log 0 = 0, over the keys rows r0..r1 see
                part = logs[:, r0:r1, :r1]
                np.maximum(layer_maps[:, r0:r1, :r1], TINY, out=part)
                np.log(part, out=part)
                part *= layer_maps[:, r0:r1, :r1]
            kernel("_clark").sums(layer_maps, n_heads, length, keys, logs, sums, False)
            out[:, layer] = sums
    return dict(zip(CLARK_FIELDS, out, strict=True))


DEFAULT_PUNCT = ".,"
CAUSAL_ROWS = 256  # rows of a causal layer whose p log p is taken at once, over the keys they see


# Hand-written on purpose: scipy (scipy.special.entr) is only in the ingest extra, and queries need numpy alone.
def row_entropy(maps: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Entropy in nats of every attention row: (..., query, key) -> (..., query); 0 log 0 = 0.

    A 0 is raised to the dtype's smallest normal number before the log (0 x log(tiny) = 0): unlike a masked log
    (`where=maps > 0`, 2-3x slower), it also changes values below that (subnormals, none in float16 maps cast to
    float32) by less than 1e-36. float16 maps are computed in float32 (float16's smallest normal, 6e-5, would raise
    their subnormals), each summand looked up by value (store/float16.py: the same float32 arithmetic, done once per
    float16 value). `out`: float32 scratch of the maps' shape for float16 maps, else of their shape and dtype."""
    if maps.dtype == np.float16:
        logs = plogp(maps, out=out)
        return -logs.sum(-1)
    tiny = np.finfo(maps.dtype).tiny
    logs = np.maximum(maps, tiny, out=out)
    np.log(logs, out=logs)
    logs *= maps
    return -logs.sum(-1)


def _clark_prepare(store: Store, info: RunInfo, examples=None, punct: str = DEFAULT_PUNCT):
    return token_flags(store, info, punct, examples)


def _clark_reduce(flags, example: int, maps: np.ndarray) -> dict[str, np.ndarray]:
    f = flags[example]
    counts = {
        "length": np.asarray(maps.shape[-1], np.int64),
        "n_cls": np.asarray(f.cls.sum(), np.int64),
        "n_sep": np.asarray(f.sep.sum(), np.int64),
    }
    return {**counts, **example_sums(maps, f.cls, f.sep, f.punct)}


# Each (layer, head) field's query tokens: an example's mean of the field is its sum over them divided by their count.
CLARK_UNITS = {
    **{name: "tokens" for name in ("to_previous", "to_self", "to_next", "entropy")},
    **{f"received_{k}": "tokens" for k in ("cls", "sep", "punct", "other")},
    "sep_from_sep": "sep",
    "sep_from_other": "others",
    "entropy_from_cls": "cls",
}


def _clark_totals(part: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A range's reduction of the Clark fields, what `relative_position`, `special_tokens` and `entropy` combine:

    `<field>`: its sum over the range's examples (the pooled average, average="token");
    `mean_<field>`: the sum over the examples that have such query tokens of the example's mean (average="example");
    `n_<unit>`: the query tokens of each unit (tokens, sep, others: non-separators, cls); `examples_<unit>`: the examples
    that have any; `examples`: all of them;
    `log_length` / `length_log_length` / `lgamma_length` / `lgamma_per_length`: sums of log L, L log L, log L!, log L! / L
    (the uniform-attention entropies, L keys or a causal query's i + 1), and `cls_log_length` / `log_length_with_cls`: of
    n_cls log L and of log L over the examples with a [CLS]-like token."""
    length = part["length"].astype(np.int64)
    counts = {"tokens": length, "sep": part["n_sep"].astype(np.int64), "cls": part["n_cls"].astype(np.int64)}
    counts["others"] = length - counts["sep"]
    out: dict[str, np.ndarray] = {"examples": np.asarray(len(length), np.int64)}
    for unit, n in counts.items():
        out[f"n_{unit}"] = n.sum()
        out[f"examples_{unit}"] = np.asarray((n > 0).sum(), np.int64)
    for name, unit in CLARK_UNITS.items():
        values, n = part[name], counts[unit].astype(np.float64)
        used = n > 0
        out[name] = values.sum(0)
        out[f"mean_{name}"] = (values[used] / n[used][:, None, None]).sum(0)
    as_float = length.astype(np.float64)
    log_l = np.log(as_float)
    log_factorial = np.fromiter((lgamma(x + 1) for x in length.tolist()), dtype=np.float64, count=len(length))
    out["log_length"] = log_l.sum()
    out["length_log_length"] = (as_float * log_l).sum()
    out["lgamma_length"] = log_factorial.sum()
    out["lgamma_per_length"] = (log_factorial / as_float).sum()
    out["cls_log_length"] = (counts["cls"] * log_l).sum()
    out["log_length_with_cls"] = log_l[counts["cls"] > 0].sum()
    return out


# punct: the characters counted as punctuation keys (special_tokens' parameter); the default's summary is `clark`.
# Version 3: compiled (queries/_clark.c), row entropies summed in float64 (in float32 before: within 1e-7 relative).
CLARK = register_kind(
    SummaryKind(
        "clark", 3, _clark_prepare, _clark_reduce, defaults={"punct": DEFAULT_PUNCT}, totals=_clark_totals, threads=True, by_layer=True
    )
)


# ---------------------------------------------------------------- the queries


@register("relative_position", sources=MAP_SOURCES)
def relative_position(store: Store, *, run, average: str = "example") -> pd.DataFrame:
    """Mean attention per head from each token to the previous, the same and the next token.

    Columns: layer, head, to_previous, to_self, to_next.
    average="example" (default, Clark et al.'s code): per example, the sum of a[i, i-1]
      (a[i, i], a[i, i+1]) over its L query tokens divided by L, then the mean over examples;
      the first (last) token has no previous (next) token and counts as 0.
    average="token" (pooled): to_previous = mean of a[i, i-1] over every query token of the
      run that has a previous token (i >= 1), to_next likewise (i <= L-2), to_self over all
      query tokens; long examples weigh more.
    All tokens count, special tokens included (as in the paper).
    Causal models (models.causal): to_next is NaN, since no token can attend to the next one
    (it would be 0 by construction); frame.attrs["note"] says so.
    """
    check_average(average)
    info = store.run_info(run)
    causal = is_causal(store, info)
    # the Clark summary's totals: kept per range for the whole run, else from each example's sums
    t = summary_totals(store, info, CLARK)
    names = ("to_previous", "to_self", "to_next")
    if average == "example":  # each example's mean over its L query tokens, then the mean over examples
        frame = per_head_frame(info, **{name: safe_divide(t[f"mean_{name}"], int(t["examples"])) for name in names})
    else:  # pooled: to_previous over the tokens that have a previous token (i >= 1), to_next likewise
        n_pairs = int(t["n_tokens"]) - int(t["examples"])
        frame = per_head_frame(
            info,
            to_previous=safe_divide(t["to_previous"], n_pairs),
            to_self=safe_divide(t["to_self"], int(t["n_tokens"])),
            to_next=safe_divide(t["to_next"], n_pairs),
        )
    if causal:
        frame["to_next"] = np.nan
        frame.attrs["note"] = f"{CAUSAL_NOTE}: to_next is NaN"
    return frame


@register("special_tokens", sources=MAP_SOURCES)
def special_tokens(store: Store, *, run, punct: str = ".,", average: str = "example") -> pd.DataFrame:
    """Mean attention per head to [CLS]-like, [SEP]-like and punctuation tokens, and from [SEP] to [SEP].

    Columns: layer, head;
    to_cls, to_sep, to_punct, to_other: attention mass a query token gives each kind of
      key token, averaged over query tokens (the four sum to 1); `to_other` includes other
      special tokens; punctuation = non-special tokens whose text (without subword marker)
      is one of the characters in `punct`;
    sep_from_sep: mean attention a separator token gives to separator tokens;
    sep_from_other: the same for all other query tokens.
    average="example" (default, Clark et al.'s code): each mean is taken within an example
      (over its L query tokens; over its separators for sep_from_sep, its other tokens for
      sep_from_other), then over the examples (those that have such query tokens);
    average="token": pooled over every query token of the run.
    Special tokens are identified by the tokenizer's ids recorded with the model.
    """
    check_average(average)
    info = store.run_info(run)
    # the Clark summary's totals: kept per range for the whole run, else from each example's sums
    t = summary_totals(store, info, CLARK, punct=punct)
    frame = _from_totals(info, t, average == "example")
    absent = [what for what, unit in (("[CLS]-like", "cls"), ("separator", "sep")) if not int(t[f"n_{unit}"])]
    if absent and int(t["n_tokens"]):  # a decoder's tokenizer adds neither: zeros by construction, not a measurement
        columns = " and ".join(c for c, what in (("to_cls", "[CLS]-like"), ("to_sep, sep_from_sep", "separator")) if what in absent)
        frame.attrs["note"] = (
            f"the run's tokens include no {' and no '.join(absent)} token (its tokenizer adds none), so {columns} "
            "are 0 or empty by construction: they measure nothing here"
        )
    return frame


def _from_totals(info, t: dict[str, np.ndarray], per_example: bool) -> pd.DataFrame:
    """The means from the Clark totals: per example, the sum of each example's mean over the examples that have such
    query tokens divided by their number; pooled, the sum over the run's query tokens divided by theirs."""
    prefix, count = ("mean_", "examples_") if per_example else ("", "n_")

    def mean(name: str) -> np.ndarray:
        return safe_divide(t[f"{prefix}{name}"], int(t[f"{count}{CLARK_UNITS[name]}"]))

    return per_head_frame(
        info,
        **{f"to_{k}": mean(f"received_{k}") for k in ("cls", "sep", "punct", "other")},
        sep_from_sep=mean("sep_from_sep"),
        sep_from_other=mean("sep_from_other"),
    )


@register("entropy", sources=MAP_SOURCES)
def entropy(store: Store, *, run, average: str = "example") -> pd.DataFrame:
    """Mean entropy (nats) of each head's attention, over all query tokens and from the first special token only.

    Columns: layer, head;
    entropy: mean over query tokens of -sum_j a_ij log a_ij;
    entropy_from_cls: the same over [CLS]-like query tokens only (tokenizer's cls/bos id);
    uniform_entropy: mean log(L) over the same query tokens, what uniform attention would give;
      for a causal model (models.causal) uniform attention over what each query sees: log(i + 1)
      for the query at position i;
    uniform_entropy_from_cls: log(L) averaged over the [CLS]-like queries.
    average="example" (default, Clark et al.'s code): each mean is taken within an example,
      then over the examples (for the *_from_cls columns, those with a [CLS]-like token);
    average="token": pooled over every query token of the run (long examples weigh more).
    Causal models: the *_from_cls columns are NaN (the first token sees only itself, so its
    entropy is 0 by construction), and frame.attrs["note"] says so.
    """
    check_average(average)
    per_example = average == "example"
    info = store.run_info(run)
    causal = is_causal(store, info)
    # the Clark summary's totals: kept per range for the whole run, else from each example's sums
    t = summary_totals(store, info, CLARK)
    # Uniform attention over the keys a query sees: all L (sum over the L queries: L log L), or (causal) the i + 1 up
    # to itself (log L!).
    if per_example:  # each example's means, counted once
        total, from_cls = t["mean_entropy"], t["mean_entropy_from_cls"]
        n_queries, n_cls = int(t["examples"]), int(t["examples_cls"])
        uniform = float(t["lgamma_per_length"] if causal else t["log_length"])
        uniform_cls = float(t["log_length_with_cls"])
    else:
        total, from_cls = t["entropy"], t["entropy_from_cls"]
        n_queries, n_cls = int(t["n_tokens"]), int(t["n_cls"])
        uniform = float(t["lgamma_length"] if causal else t["length_log_length"])
        uniform_cls = float(t["cls_log_length"])
    frame = per_head_frame(info, entropy=safe_divide(total, n_queries), entropy_from_cls=safe_divide(from_cls, n_cls))
    frame["uniform_entropy"] = safe_divide(uniform, n_queries)
    frame["uniform_entropy_from_cls"] = safe_divide(uniform_cls, n_cls)
    if causal:
        frame[["entropy_from_cls", "uniform_entropy_from_cls"]] = np.nan
        frame.attrs["note"] = f"{CAUSAL_NOTE}: uniform_entropy is over each query's visible prefix; *_from_cls are NaN"
    return frame
