"""Shared pieces of queries: streaming maps with per-token categories, per-head frames."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.records import RunInfo
from .engine import kernel
from .errors import InvalidArgumentError, NotFoundError

if TYPE_CHECKING:
    from ..store import Store

SUBWORD_MARKERS = ("##", "Ġ", "▁")  # WordPiece, byte-level BPE, SentencePiece


@dataclass
class TokenFlags:
    """Boolean masks over one example's tokens (length L each)."""

    cls: np.ndarray
    sep: np.ndarray
    special: np.ndarray
    punct: np.ndarray


def special_id(info: RunInfo, role: str) -> int | None:
    entry = info.special_tokens.get(role)
    return None if entry is None else int(entry["id"])


def is_causal(store: Store, info: RunInfo) -> bool:
    """Whether the run's model attends only to earlier tokens (decoder-only: GPT-2, Llama), as probed when it was
    loaded (`models.causal`). Row i of a causal map sees i + 1 tokens, which changes baselines such as uniform
    attention; models registered before that column existed (NULL) count as bidirectional."""
    frame = store.sql("SELECT causal FROM models WHERE id = :i", {"i": int(info.model_id)})
    value = frame.iloc[0, 0] if len(frame) else None
    return bool(value) if value is not None and not pd.isna(value) else False


CAUSAL_NOTE = "causal model: the first token attends only to itself, and no token attends to a later one"


def special_role_masks(info: RunInfo, table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Masks over the rows of a token table: the start role ([CLS], else <s>/BOS) and the separator role
    ([SEP], else </s>/EOS; a token that is both counts as start). Roles come from the recorded tokenizer."""
    start_id = special_id(info, "cls") if "cls" in info.special_tokens else special_id(info, "bos")
    sep_id = special_id(info, "sep") if "sep" in info.special_tokens else special_id(info, "eos")
    special = table["is_special"].to_numpy(bool)
    ids = table["token_id"].to_numpy()
    start = special & (ids == start_id) if start_id is not None else np.zeros_like(special)
    sep = special & (ids == sep_id) & ~start if sep_id is not None else np.zeros_like(special)
    return start, sep


def token_flags(store: Store, info: RunInfo, punct: str = ".,", examples=None) -> dict[int, TokenFlags]:
    """Per example (of `examples`, default all), which tokens are the first special token ([CLS]-like),
    separators, other specials, punctuation.

    Roles come from the tokenizer recorded with the model (cls/sep, else bos/eos), never from strings.
    """
    table = store.token_roles(info.id, examples)
    special = table["is_special"].to_numpy(bool)
    is_cls, is_sep = special_role_masks(info, table)
    codes, texts = pd.factorize(table["token"])  # each distinct token's text stripped once, not every token's
    punct_text = pd.Series(texts).str.replace(r"^(##|Ġ|▁)", "", regex=True).isin(list(punct)).to_numpy(bool)
    is_punct = ~special & np.append(punct_text, False)[codes]  # code -1 (no text) takes the appended False
    bounds = np.flatnonzero(np.diff(table["example"].to_numpy())) + 1
    starts = np.r_[0, bounds]
    ends = np.r_[bounds, len(table)]
    examples = table["example"].to_numpy()
    return {int(examples[s]): TokenFlags(is_cls[s:e], is_sep[s:e], special[s:e], is_punct[s:e]) for s, e in zip(starts, ends) if e > s}


def per_head_frame(info: RunInfo, **columns: np.ndarray) -> pd.DataFrame:
    """A frame with one row per (layer, head) from (layer, head)-shaped arrays."""
    layer, head = np.meshgrid(np.arange(info.n_layers), np.arange(info.n_heads), indexing="ij")
    data = {"layer": layer.ravel(), "head": head.ravel()}
    data.update({name: np.asarray(values, dtype=float).ravel() for name, values in columns.items()})
    return pd.DataFrame(data)


def note_left_out(frame: pd.DataFrame, totals: np.ndarray, min_count: int) -> None:
    """frame.attrs["note"] where some relations were left out for having fewer than `min_count` edges (a small run can
    lose them all, and a table without them would not say why)."""
    totals = np.asarray(totals)
    if left_out := int(((totals < min_count) & (totals > 0)).sum()):
        frame.attrs["note"] = (
            f"{left_out} of {int((totals > 0).sum())} relations have fewer than min_count={min_count} edges and are left out "
            "(a smaller min_count keeps them: --param min_count=N)"
        )


def safe_divide(total: np.ndarray | float, count) -> np.ndarray:
    count = np.asarray(count, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.where(count > 0, count, 1), np.nan)


AVERAGES = ("example", "token")


def check_average(average: str) -> str:
    """The `average` parameter of the Clark C1/C2/C4 queries: "example" (Clark et al.'s code) or "token" (pooled)."""
    if average not in AVERAGES:
        raise InvalidArgumentError(
            f"average={average!r}: use 'example' (mean per example, then over examples: "
            f"Clark et al.'s code) or 'token' (pooled over every query token of the run)"
        )
    return average


def unique_argmax(scores: np.ndarray, transpose: bool = False) -> np.ndarray:
    """argmax over the last axis (with `transpose`, over the one before it: each column's), or -1 ("no prediction")
    where the maximum is not > 0, is reached more than once, or the line holds a NaN.

    A row of exact zeros (e.g. float16 underflow) or a tie predicts nothing, instead of the
    first index that numpy's argmax would return. Compiled (queries/_words.c): one pass a line.
    """
    scores = np.asarray(scores)
    if transpose and scores.ndim < 2:
        raise ValueError("unique_argmax(transpose=True) needs scores of two or more axes")
    scores = scores if scores.dtype in (np.float32, np.float64) else scores.astype(np.float64)
    lines = scores.shape[-2:] if scores.ndim >= 2 else (1, *scores.shape)  # one vector: a matrix of one row
    matrices = np.ascontiguousarray(scores.reshape(int(np.prod(scores.shape[:-2], dtype=np.int64)), *lines))
    n, rows, columns = matrices.shape
    out = np.empty((n, columns if transpose else rows), np.int64)
    kernel("_words").unique_argmax(matrices, n, rows, columns, out, transpose, matrices.dtype == np.float32)
    lead = scores.shape[:-2] + (scores.shape[-1:] if transpose else scores.shape[-2:-1])
    return out.reshape(lead)


def parse_choices(text: str | None, choices: tuple[str, ...], what: str) -> tuple[str, ...]:
    """'a,b' -> ('a', 'b') checked against `choices`; None or '' -> every choice. Unknown names raise InvalidArgumentError."""
    if text is None or not str(text).strip():
        return choices
    names = tuple(dict.fromkeys(n.strip().lower() for n in str(text).split(",") if n.strip()))
    unknown = [n for n in names if n not in choices]
    if unknown:
        raise InvalidArgumentError(f"unknown {what}(s) {', '.join(map(repr, unknown))}; choose from {', '.join(choices)} (comma-separated)")
    return names


ENV_MODEL_DIR = "ATTNSTORE_MODEL_DIR"


def model_source(store: Store, info: RunInfo, model_dir: str | None = None) -> str:
    """Where the run's model can be loaded from on this machine, for analyses that need the model itself.

    Tried in order: `model_dir` (or ATTNSTORE_MODEL_DIR) / the model's name (or the recorded folder's name);
    a fine-tuned model's checkpoint in the store's models folder; the folder recorded at ingest. A hub id
    recorded at ingest is returned as it is. A store copied to another machine thus finds its fine-tuned
    models, and others are pointed at with one option; anything else is a one-line error saying how.
    """
    recorded = str(info.manifest.get("model", {}).get("source") or "")
    candidates = []
    folder = model_dir or os.environ.get(ENV_MODEL_DIR)
    if folder:
        candidates += [Path(folder) / info.model] + ([Path(folder) / Path(recorded).name] if recorded else [])
    row = store.model_row(info.model)
    checkpoint = ((row or {}).get("training") or {}).get("checkpoint")
    if checkpoint and "://" not in store.locations.models_root:
        candidates.append(Path(store.locations.models_root) / checkpoint)
    if recorded:
        candidates.append(Path(recorded))
    for candidate in candidates:
        if (candidate / "config.json").is_file():
            return str(candidate)
    if recorded and not checkpoint and not Path(recorded).is_absolute() and not recorded.startswith((".", "~")):
        return recorded  # a hub id (bert-base-uncased, org/name): transformers finds it in its cache
    raise NotFoundError(
        f"run {info.name!r} needs model {info.model!r}, recorded at {recorded or '(nowhere)'}, which is not on this "
        f"machine; pass --model-dir DIR (a folder holding {info.model}/) or set {ENV_MODEL_DIR}, or copy the store's "
        f"models folder with it"
    )
