"""Forward passes and storing their maps: the loop a one-process ingest (ingest/runner.py) and each Dask worker of
a distributed one (ingest/distributed.py) run over planned batches.

`run_batches` runs `forward_passes()` passes at once on torch's threads while one writer thread hands each batch's
blocks to a `RunWriter` (store/writer.py) in batch order; `forward_attention` is one eager pass and `to_blocks`
its checked per-example blocks (also what the benchmarks time).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterable, Set
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from . import activations, capture, norms, streaming
from .align import Encoded, pad_inputs
from .errors import IngestError
from .model import LoadedModel
from .progress import progress_bar
from .row_stats import RowStats

ROW_SUM_TOLERANCE = 1e-3
_WHOLE_PASS = threading.Lock()  # forward_with_loss without capture's hooks


def _inputs(loaded: LoadedModel, batch: list[Encoded]) -> dict:
    """The batch padded, only what the model's forward takes, on the model's device."""
    inputs = loaded.model_inputs(pad_inputs(batch, loaded.pad_id))
    return inputs if loaded.device == "cpu" else {k: v.to(loaded.device) for k, v in inputs.items()}


def _sink(loaded: LoadedModel, lengths: list[int], dtype: str, qk_dtype: str | None, stop: bool, rows: RowStats | None = None):
    """The streaming sink of one pass (ingest/streaming.py): the maps in `dtype`, or, with `qk_dtype`, the Q/K tier's;
    `rows`: the pass's row statistics, reduced as each block passes."""
    import torch

    if qk_dtype is not None:
        assert loaded.qk is not None  # refused at the run's start otherwise
        return streaming.QKSink(loaded.n_layers, getattr(torch, qk_dtype), loaded.qk["windows"], lengths, rows=rows)
    return streaming.DenseSink(loaded.n_layers, loaded.causal, getattr(torch, dtype), stop=stop, rows=rows)


def forward_attention(
    loaded: LoadedModel,
    batch: list[Encoded],
    whole: bool = False,
    dtype: str = "float32",
    qk_dtype: str | None = None,
    rows: RowStats | None = None,
):
    """One forward pass; returns the maps and the lengths: per layer (batch, head, query, key), or as one (batch, layer,
    head, query, key) tensor in `dtype` where the streaming capture takes them (ingest/streaming.py), or with
    `qk_dtype` (the Q/K tier) that capture's (queries, keys, log-sum-exps). `rows`: row statistics the streaming
    capture fills as each block passes.

    The pass stops at the last map where the model allows it (ingest/capture.py, ingest/streaming.py): the maps are
    the same. `whole`: run the whole model (what a user recomputing maps runs; benchmarks).
    """
    import torch

    lengths = [e.length for e in batch]
    inputs = _inputs(loaded, batch)
    with torch.inference_mode():
        if loaded.capture == "streaming":
            sink = _sink(loaded, lengths, dtype, qk_dtype, stop=not whole, rows=rows)
            streaming.run_with(sink, lambda: loaded.model(**inputs))
            return sink.result(), lengths
        if loaded.attention_sources is not None and not whole:
            attentions = capture.attention_maps(loaded.model, inputs, loaded.attention_sources)
        else:
            attentions = loaded.model(**inputs, output_attentions=True).attentions
    _require_maps(loaded, attentions)
    return attentions, lengths


def forward_with_loss(
    loaded: LoadedModel, batch: list[Encoded], dtype: str = "float32", qk_dtype: str | None = None, rows: RowStats | None = None
):
    """One pass of the causal-LM model (`loaded.lm`) run whole, to its logits: the maps (as `forward_attention`, `rows`
    likewise), the lengths and each example's per-token loss (`token_loss`), maps and loss from the same pass."""
    import torch

    lengths = [e.length for e in batch]
    inputs = _inputs(loaded, batch)

    def run():
        return loaded.lm(**inputs, output_attentions=True, use_cache=False)

    with torch.inference_mode():
        if loaded.capture == "streaming":  # the decoder's pass, then its LM head a few hundred tokens at a time
            sink = _sink(loaded, lengths, dtype, qk_dtype, stop=False, rows=rows)
            output = streaming.run_with(sink, lambda: loaded.model(**inputs, use_cache=False))
            if getattr(output, "logits", None) is not None:  # a checkpoint whose decoder is the LM itself (GPT-2's)
                return sink.result(), lengths, token_loss(output.logits, inputs["input_ids"], lengths)
            return sink.result(), lengths, token_loss_by_chunks(loaded.lm, output.last_hidden_state, inputs["input_ids"], lengths)
        if loaded.attention_sources is not None:  # the maps caught by this thread's hooks (two passes run at once)
            output, attentions = capture.maps_of_whole_pass(run, loaded.attention_sources)
        else:  # the output's own maps, which a pass on another thread would mix into: one such pass at a time
            with _WHOLE_PASS:
                output = run()
            attentions = output.attentions
        losses = token_loss(output.logits, inputs["input_ids"], lengths)
    _require_maps(loaded, attentions)
    return attentions, lengths, losses


def _require_maps(loaded: LoadedModel, attentions) -> None:
    if not attentions or attentions[0] is None:
        raise IngestError(f"model {loaded.name!r} returned no attention maps with attn_implementation={loaded.attn_implementation!r}")


def token_loss_manifest() -> dict:
    """The run manifest's `token_loss` entry: what the run group's token_loss array holds, its unit."""
    from ..store import arrays

    return {"array": arrays.TOKEN_LOSS, "dtype": "float32", **arrays.TOKEN_LOSS_ATTRIBUTES}


def token_loss(logits, input_ids, lengths: list[int]) -> list[np.ndarray]:
    """Per example, its next-token loss per token, float32 nats: loss[i] = -log p(token[i+1] | tokens[..i]) from the
    logits at position i (float32 log-softmax); the last token has no next token: NaN."""
    import torch
    import torch.nn.functional as F

    out = []
    for k, n in enumerate(lengths):
        loss = np.full(n, np.nan, dtype=np.float32)
        if n > 1:
            nll = F.cross_entropy(logits[k, : n - 1].float(), input_ids[k, 1:n].to(torch.long), reduction="none")
            loss[: n - 1] = nll.cpu().numpy()
        out.append(loss)
    return out


# Tokens whose logits exist at once: 128 x SmolLM2's 49,152-token vocabulary = 24 MiB of float32, which the allocator
# hands to the next chunk; 512 tokens' 96 MiB came from fresh pages each time (2,048 tokens' loss: 2.0 CPU s with 0.8 of
# them in the kernel, against 1.3 s: docs/PERFORMANCE.md, 2026-11-30 (late)).
LOSS_CHUNK = 128


def token_loss_by_chunks(lm, hidden, input_ids, lengths: list[int]) -> list[np.ndarray]:
    """`token_loss` from the decoder's last hidden states through the causal LM's output layer (and its final logit
    soft-capping, Gemma 2/3), LOSS_CHUNK tokens at a time: the logits of a whole 8,192-token example (1.5 GiB for
    SmolLM2) never exist at once."""
    import torch
    import torch.nn.functional as F

    head = lm.get_output_embeddings()
    cap = getattr(lm.config, "final_logit_softcapping", None)
    out = []
    for k, n in enumerate(lengths):
        loss = np.full(n, np.nan, dtype=np.float32)
        for s in range(0, n - 1, LOSS_CHUNK):
            e = min(n - 1, s + LOSS_CHUNK)
            logits = head(hidden[k, s:e]).float()
            if cap is not None:
                logits = torch.tanh(logits / cap) * cap
            nll = F.cross_entropy(logits, input_ids[k, s + 1 : e + 1].to(torch.long), reduction="none")
            loss[s:e] = nll.cpu().numpy()
        out.append(loss)
    return out


def to_blocks(attentions, lengths: list[int], dtype: str, batch: list[Encoded], sink_logits: bool = False) -> list:
    """Per example, its unpadded (layer, head, L, L) maps in `dtype`, checked: real rows sum to 1 over real keys (with
    learned `sink_logits`, to at most 1: the sink holds the rest).

    One conversion pass into a preallocated (batch, layer, head, T, T) array; the
    blocks are views of it. The check runs on the stored values (float16 rounding
    moves a row sum by at most 2**-11).
    """
    import torch

    if isinstance(attentions, torch.Tensor):  # the streaming capture's maps, already (batch, layer, head, T, T)
        out = attentions.to(getattr(torch, dtype))
    else:
        first = attentions[0]
        out = torch.empty((first.shape[0], len(attentions), *first.shape[1:]), dtype=getattr(torch, dtype))
        for layer, attn in enumerate(attentions):
            out[:, layer].copy_(attn)
    blocks = []
    for k, n in enumerate(lengths):
        block = out[k, :, :, :n, :n]
        over = block.sum(-1, dtype=torch.float32) - 1
        err = (over.clamp(min=0) if sink_logits else over.abs()).max().item()
        if err > ROW_SUM_TOLERANCE:
            raise IngestError(
                f"attention rows of example {batch[k].position} do not sum to 1 over its real tokens "
                f"(max error {err:.2e}); the model must use eager softmax attention"
            )
        blocks.append(block.numpy())
    return blocks


# (example, maps (or a Q/K run's (queries, keys, log-sum-exps)) or None: skipped, value norms or None, per-token loss or None,
# hidden-state peaks or None, row statistics (stats, top keys) or None)
Item = tuple[Encoded, np.ndarray | tuple | None, np.ndarray | None, np.ndarray | None, np.ndarray | None, tuple | None]


def batch_items(
    loaded: LoadedModel,
    dtype: str,
    batch: list[Encoded],
    done: Set[int],
    with_norms: bool = False,
    with_loss: bool = False,
    qk_dtype: str | None = None,
    with_peaks: bool = False,
    with_rows: bool = False,
) -> list[Item]:
    """One planned batch's examples to store, in storage order, with their maps (None: skipped, no tokens; with
    `qk_dtype`, a Q/K run's, their queries, keys and log-sum-exps: store/qk.py) and, with `with_norms`, their value
    norms (token, layer, head), with `with_loss` their per-token loss (token,), both from the same pass
    (ingest/norms.py, `token_loss`), with `with_peaks` (a whole pass: `with_loss` too) their hidden-state peaks (token,
    layer, 3: ingest/activations.py), with `with_rows` their row statistics (store/row_stats.py), reduced as the streaming
    capture's blocks pass."""
    runnable = [e for e in batch if e.input_ids]
    if qk_dtype is None:
        _refuse_oversized(loaded, runnable, dtype)
    items: list[Item] = [(e, None, None, None, None, None) for e in batch if not e.input_ids and e.example_id not in done]
    if any(e.example_id not in done for e in runnable):
        projections = loaded.value_projections if with_norms else None
        if with_norms and projections is None:
            raise IngestError(f"model {loaded.name!r}: its value and output projections were not found, so no value norms")
        if with_loss and loaded.lm is None:
            raise IngestError(f"model {loaded.name!r} has no causal-LM head, so no per-token loss")
        layers = activations.decoder_layers(loaded.model, loaded.n_layers) if with_peaks else None
        if with_peaks and (layers is None or not with_loss):
            raise IngestError(f"model {loaded.name!r}: hidden-state peaks need a whole pass of its {loaded.n_layers} decoder layers")
        if with_rows and (loaded.capture != "streaming" or not loaded.causal):
            raise IngestError(f"model {loaded.name!r}: row statistics need a causal model's streaming capture")
        rows = RowStats([e.length for e in runnable], loaded.n_layers, [e.input_ids for e in runnable]) if with_rows else None
        with norms.collecting(projections) as values, activations.collecting(layers) as caught:
            if with_loss:
                attentions, lengths, losses = forward_with_loss(loaded, runnable, dtype, qk_dtype, rows)
            else:
                (attentions, lengths), losses = forward_attention(loaded, runnable, dtype=dtype, qk_dtype=qk_dtype, rows=rows), None
        if qk_dtype is not None:
            q, k, lse = attentions
            blocks = [(q[b, :n].copy(), k[b, :n].copy(), lse[b, :n].copy()) for b, n in enumerate(lengths)]
        else:
            blocks = to_blocks(attentions, lengths, dtype, runnable, loaded.sink_logits)
        per_example = norms.value_norms(projections, values, lengths) if projections is not None else [None] * len(blocks)
        per_loss = losses if losses is not None else [None] * len(blocks)
        per_peaks = activations.hidden_peaks(caught, loaded.n_layers, lengths) if layers is not None else [None] * len(blocks)
        per_rows = rows.results() if rows is not None else [None] * len(blocks)
        items += [
            (e, maps, n, lo, pk, rs)
            for e, maps, n, lo, pk, rs in zip(runnable, blocks, per_example, per_loss, per_peaks, per_rows)
            if e.example_id not in done
        ]
    return items


DENSE_LIMIT_ENV = "ATTNSTORE_DENSE_MB"
DENSE_LIMIT_MB = 8192  # one example's dense maps in the stored dtype (SmolLM2 at 2,048 tokens: 2.3 GiB float16)


def _refuse_oversized(loaded: LoadedModel, batch: list[Encoded], dtype: str) -> None:
    """One line, before the pass, for an example whose dense maps would not fit in memory (the Q/K tier keeps them)."""
    limit = float(os.environ.get(DENSE_LIMIT_ENV) or DENSE_LIMIT_MB) * 2**20
    width = np.dtype(dtype).itemsize
    for e in batch:
        need = loaded.n_layers * loaded.n_heads * e.length**2 * width
        if need > limit:
            raise IngestError(
                f"example {e.position} has {e.length} tokens: its dense maps need {need / 2**30:.1f} GiB, over the "
                f"{limit / 2**30:.1f} GiB limit ({DENSE_LIMIT_ENV}); ingest it under a new --name with --tier qk"
                f"{'' if loaded.qk else ' (not possible for this model)'} or a smaller --max-length"
            )


def store_items(writer, items: list, overlap: bool = False) -> None:
    """Hand a batch's examples ((example, maps), (example, maps, value norms) or (example, maps, value norms, per-token
    loss)) to a run writer and commit what is on disk. `overlap`: the batch's chunks are written in the background while
    the writer goes on (`storage_overlaps`)."""
    for enc, maps, *rest in items:
        if maps is None:
            writer.add_skipped(enc.example_id, enc.full_length)
        else:
            norms_ = rest[0] if rest else None
            loss = rest[1] if len(rest) > 1 else None
            peaks = rest[2] if len(rest) > 2 else None
            rows = rest[3] if len(rest) > 3 else None
            qk = maps if isinstance(maps, tuple) else None
            writer.add(
                enc.example_id,
                None if qk else maps,
                enc.tokens,
                truncated=enc.truncated,
                norms=norms_,
                loss=loss,
                qk=qk,
                peaks=peaks,
                rows=rows,
            )
    writer.commit(wait=not overlap)


def storage_overlaps() -> bool:
    """Whether a batch's chunks are written in the background while the writer commits the rows of the batch
    before (`RunWriter.commit(wait=False)`): only where cores are left beside the forward passes' torch threads.
    Where the passes use every core, the overlapped storage work takes CPU from them: on MRPC dev (2 cores)
    ingest / bare was 0.80-0.81 overlapped against 0.85-0.86 waiting with 2 torch threads, and 0.91 against
    0.87 with 1 (docs/PERFORMANCE.md, 2026-11-24 "chunk writes beside the commits")."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores > torch.get_num_threads()


def forward_passes() -> tuple[int, int]:
    """How many forward passes run at once on the CPU, and torch's threads for each.

    Two passes of half the threads each, rather than one pass on all of them: the writer thread's
    work then delays one pass, where it stalled all of a pass's OpenMP threads at their next
    barrier (docs/PERFORMANCE.md, 2026-11-24 "two forward passes at once"). An odd number of threads cannot be halved without
    leaving a core idle or oversubscribed, so it keeps one pass."""
    import torch

    threads = torch.get_num_threads()
    passes = 2 if threads % 2 == 0 else 1
    return passes, threads // passes


@contextmanager
def _torch_threads(n: int):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_batches(
    writer,
    loaded: LoadedModel,
    dtype: str,
    info,
    done: Set[int],
    batches: Iterable[list[Encoded]],
    total,
    progress,
    overlap: bool | None = None,
) -> int:
    """Run and store `batches`; returns examples stored. `overlap`: chunk writes beside the next commit (default:
    `storage_overlaps()`)."""
    # Batches are planned over the whole dataset, already-stored examples included, so a resumed
    # run forms exactly the batches of an uninterrupted one (same padding, same arithmetic):
    # its maps are bit-identical. Batches with nothing new are not run.
    import torch

    passes, threads = forward_passes()
    with_norms = getattr(writer, "norms", None) is not None  # the run keeps value norms (a distributed part never)
    with_loss = getattr(writer, "loss", None) is not None  # the run keeps per-token loss (a distributed part never)
    with_peaks = getattr(writer, "peaks", None) is not None  # and hidden-state peaks (likewise)
    with_rows = getattr(writer, "rows", None) is not None  # and row statistics (likewise)
    qk_dtype = writer.info.qk["dtype"] if writer.info.qk else None  # a Q/K run (store/qk.py)
    overlap = storage_overlaps() if overlap is None else overlap
    running: deque = deque()  # forward passes, in batch order
    storing: deque = deque()  # store steps, in batch order
    n_new = 0

    def store_batch(items):
        store_items(writer, items, overlap)
        bar.update(len(items))

    def hand_over() -> int:
        """The oldest forward pass's examples to the writer thread, in batch order (storage order)."""
        items = running.popleft().result()
        while len(storing) > 1:
            storing.popleft().result()
        storing.append(store.submit(store_batch, items))
        return len(items)

    # `passes` forward passes run at once, each on `threads` of torch's threads, while this thread
    # plans the next batch (reads its examples, tokenizes, aligns) and one writer thread compresses,
    # writes chunks and inserts rows.
    with (
        _torch_threads(threads),
        ThreadPoolExecutor(passes, "attnstore-forward", initializer=torch.set_num_threads, initargs=(threads,)) as forward,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnstore-store") as store,
        progress_bar(total, f"ingesting {info.name}", progress) as bar,
    ):
        try:
            for batch in batches:
                if all(e.example_id in done for e in batch):
                    continue
                extras = (with_norms, with_loss, qk_dtype, with_peaks, with_rows)
                running.append(forward.submit(batch_items, loaded, dtype, batch, done, *extras))
                while len(running) > passes:
                    n_new += hand_over()
            while running:
                n_new += hand_over()
            while storing:
                storing.popleft().result()
        except BaseException:
            # Keep what is safely on disk (the caller marks the run interrupted, so `ingest` resumes it).
            for f in (*running, *storing):
                f.cancel()
            for f in (*running, *storing):
                if not f.cancelled():
                    try:
                        f.result()
                    except Exception:
                        pass
            try:
                writer.commit()
            except Exception:
                pass
            raise
    return n_new
