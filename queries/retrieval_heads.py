"""Retrieval heads (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context Factuality"), from a run of
the generated needle-in-a-haystack dataset ingested with the model's generation (`--generate 50`).

As the authors' code computes it (nightdessert/Retrieval_Head, retrieval_head_detection.py, read): at each decoding
step the generated token w comes from the last token's row; a head copies at that step when its top-1 attention in
that row is on a needle position holding w, and then scores 1 / (needle length). The needle's span is where the prompt
first holds over 90 % of the needle's distinct token ids (their `find_needle_idx`). An example counts only when the
model retrieved the needle: the ROUGE-1 recall (with stemming) of the needle in the answer is over 0.5. Per head, the
retrieval score is the mean over those examples; heads scoring over 0.1 are retrieval heads.

A causal run's maps over prompt + generation are the attention of each decoding step (ingest/generation.py), so only
the rows that generated a token are read: in a Q/K run only those rows are rebuilt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.row_stats import ExampleRows
from .common import per_head_frame
from .engine import ATTENTION_ONLY, SummaryKind, register, register_kind, requested_examples, summary

if TYPE_CHECKING:
    from ..store import Store
    from ..store.records import RunInfo

DATASET = (
    "needle",
    "ingest --dataset generated/needle:L1000,2000 --generate 50 with a causal model (e.g. --model SmolLM2-135M-Instruct)",
)
THRESHOLD = 0.1  # Wu et al.: retrieval heads score over 0.1
RECALL = 0.5  # an example counts when the needle's ROUGE-1 recall in the answer is over 50


def needle_span(prompt_ids: np.ndarray, needle_ids: list[int]) -> tuple[int, int]:
    """The authors' `find_needle_idx`: the first window of len(needle) prompt tokens holding over 90 % of the needle's
    distinct ids; (-1, -1) where none does."""
    wanted = set(needle_ids)
    for start in range(len(prompt_ids)):
        if len(set(prompt_ids[start : start + len(needle_ids)].tolist()) & wanted) / len(wanted) > 0.9:
            return start, start + len(needle_ids)
    return -1, -1


def answer_text(pieces: list[str]) -> str:
    """The generated tokens' text from their stored strings (byte-level BPE's Ġ and Ċ, SentencePiece's ▁)."""
    return "".join(pieces).replace("Ġ", " ").replace("▁", " ").replace("Ċ", "\n")


def needle_recall(needle: str, answer: str) -> float:
    """ROUGE-1 recall of the needle in the answer, with Porter stemming (rouge_score, as the authors score it)."""
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        from .errors import InvalidArgumentError

        raise InvalidArgumentError("retrieval_heads scores answers with rouge-score: pip install 'attnstore[decoder]'") from None

    return float(rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True).score(needle, answer)["rouge1"].recall)


def layout(store: Store, info: RunInfo, examples=None) -> dict[int, dict]:
    """Per example with a generation: the prompt length, the needle span, the generated ids and the answer's recall."""
    needle_ids = info.dataset_options.get("needle_ids", [])
    out = {}
    tokens = store.token_table(info.id, examples)[["example", "token", "token_id", "segment"]]
    for example, rows in tokens.groupby("example", sort=False):
        generated = rows["segment"].to_numpy() == 1
        if not generated.any():
            continue
        ids = rows["token_id"].to_numpy()
        start = int(np.argmax(generated))
        span = needle_span(ids[:start], needle_ids)
        answer = answer_text(rows["token"][generated].tolist())
        out[int(example)] = dict(start=start, n=len(ids), span=span, ids=ids, answer=answer)
    return out


def _prepare(store: Store, info: RunInfo, examples=None):
    return layout(store, info, examples), (info.n_layers, info.n_heads)


def _read(store: Store, info: RunInfo, examples, context):
    """(example, the rows that generated a token: from the last prompt token to the one before the last token), or
    None for an example without a generation or whose needle is not found."""
    for example in examples:
        item = context[0].get(int(example))
        if item is None or item["span"][0] < 0:
            yield int(example), None
            continue
        yield int(example), store.attention(info.id, int(example), rows=range(item["start"] - 1, item["n"] - 1))


def _reduce(context, example: int, rows) -> dict[str, np.ndarray]:
    items, shape = context
    item = items.get(int(example))
    if rows is None or item is None:
        return {"score": np.zeros(shape), "counted": np.asarray(0, np.int64)}
    return _copies(item, rows.astype(np.float32).argmax(-1))  # (layer, head, step): top-1 key of each decoding step's row


def _rows(context, example: int, rows: ExampleRows) -> dict[str, np.ndarray]:
    """`_reduce` from a causal LM run's row statistics: each decoding step's top-1 key, kept at ingest from the float32
    row (the maps' float16 rounding can tie two keys the float32 row tells apart)."""
    items, shape = context
    item = items.get(int(example))
    if item is None or item["span"][0] < 0:
        return {"score": np.zeros(shape), "counted": np.asarray(0, np.int64)}
    assert rows.top is not None  # the kind reads them (rows_top)
    return _copies(item, rows.top[item["start"] - 1 : item["n"] - 1, :, :, 0].transpose(1, 2, 0))


def _copies(item: dict, top: np.ndarray) -> dict[str, np.ndarray]:
    """The fields from each step's top-1 key (layer, head, step)."""
    first, last = item["span"]
    generated = item["ids"][item["start"] :]  # the token each step wrote
    copies = (top >= first) & (top < last) & (item["ids"][top] == generated)
    return {"score": copies.sum(-1) / (last - first), "counted": np.asarray(1, np.int64)}


RETRIEVAL = register_kind(
    SummaryKind("retrieval_heads", 1, _prepare, _reduce, read=_read, rows=_rows, rows_fields=("top_0",), rows_top=True)
)


@register("retrieval_heads", sources=ATTENTION_ONLY, dataset=DATASET)
def retrieval_heads(store: Store, *, run, threshold: float = THRESHOLD) -> pd.DataFrame:
    """Wu et al. 2024: per head, the share of the needle it copies while the model writes the answer.

    Columns: layer, head, retrieval (each decoding step whose top-1 attention is on a needle token equal to the token
    written scores 1 / needle length; summed over an example's steps, averaged over the examples whose answer recalls
    the needle: ROUGE-1 recall > 0.5), retrieval_head (over `threshold`). frame.attrs: examples (with a generation),
    retrieved (those counted), answers ({example: the generated text}), needle.
    """
    info = store.run_info(run)
    items = layout(store, info, requested_examples(info.id))
    fields = summary(store, info, RETRIEVAL)
    needle = info.dataset_options.get("needle", "")
    retrieved = [e for e, item in items.items() if item["span"][0] >= 0 and needle_recall(needle, item["answer"]) > RECALL]
    keep = np.isin(fields["example"], retrieved) & (fields["counted"] == 1)
    score = fields["score"][keep].mean(0) if keep.any() else np.full((info.n_layers, info.n_heads), np.nan)
    frame = per_head_frame(info, retrieval=score)
    frame["retrieval_head"] = frame["retrieval"] > threshold
    frame.attrs.update(
        examples=len(items),
        retrieved=len(retrieved),
        answers={e: item["answer"].strip() for e, item in items.items()},
        needle=needle.strip(),
        threshold=threshold,
    )
    return frame
