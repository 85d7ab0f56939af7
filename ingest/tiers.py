"""Which tier a decoder run stores (docs/DECODERS.md): dense maps, or post-RoPE queries and keys with each row's
log-sum-exp (store/qk.py), chosen by `--tier` or by the corpus's lengths; and what the manifest says of the capture.
"""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING

from . import streaming
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .model import LoadedModel
    from .runner import DatasetPlan
    from .settings import RunSettings


def capture_manifest(loaded: LoadedModel) -> dict:
    """The run manifest's `capture` entry: how the maps were taken (ingest/streaming.py), where and in which dtype."""
    entry: dict = {"path": loaded.capture, "device": loaded.device, "compute_dtype": loaded.compute_dtype}
    if loaded.capture == "streaming":
        entry.update(query_block=streaming.QUERY_BLOCK, output="sdpa (eager where the model soft-caps or has sink logits)")
    if loaded.sink_logits:  # rows sum to less than 1; queries.attention_sink reports the sinks' mass
        entry["sink_logits"] = True
    return entry


def qk_crossover(loaded: LoadedModel, qk_dtype: str) -> int:
    """Tokens above which the Q/K tier keeps fewer bytes than dense float16 maps, per token and layer: (H + H_kv) d s
    + 4 H bytes against H L, the causal maps' H L 2 bytes less the half that are zeros, which compression removes
    (docs/DECODERS.md measures it on stored runs)."""
    assert loaded.qk is not None
    width = 2 if qk_dtype == "float16" else 4
    per_token = (loaded.n_heads + loaded.qk["n_kv_heads"]) * loaded.qk["head_dim"] * width + 4 * loaded.n_heads
    return -(-per_token // loaded.n_heads)


TIER_SAMPLE = 64  # examples whose token counts choose the default tier


def choose_tier(settings: RunSettings, loaded: LoadedModel, source, plan: DatasetPlan, scheduler) -> str:
    """The run's tier: --tier if given (qk refused in one line where the model's maps cannot be rebuilt from Q/K, or on
    a Dask scheduler), else qk where it can be used and the corpus's first TIER_SAMPLE chosen examples average more
    tokens than `qk_crossover`, else dense."""
    if settings.tier == "qk":
        if loaded.qk is None:
            raise InvalidArgumentError(
                f"--tier qk: the maps of model {loaded.name!r} cannot be rebuilt from stored queries and keys "
                f"({loaded.qk_refusal}); use --tier dense"
            )
        if scheduler is not None:
            raise InvalidArgumentError(
                "--tier qk is not written by an ingest on a Dask scheduler: leave out --scheduler or use --tier dense"
            )
    if settings.tier is not None:
        return settings.tier
    if loaded.qk is None or scheduler is not None:
        return "dense"
    chosen = set(plan.chosen[:TIER_SAMPLE])
    texts = [(r.text_a, r.text_b) for r in islice((r for r in source.read() if r.position in chosen), TIER_SAMPLE)]
    if not texts:
        return "dense"
    tokenizer = loaded.tokenizer
    lengths = [len(tokenizer(a, b or None, truncation=True, max_length=settings.max_length)["input_ids"]) for a, b in texts]
    return "qk" if sum(lengths) / len(lengths) > qk_crossover(loaded, settings.qk_dtype) else "dense"
