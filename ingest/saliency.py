"""Gradient x input saliency per token (for attention vs attribution, Jain & Wallace 2019; the Primer, Sec. 5.1).

`compute_saliency(store, run)` runs the run's model, a classifier fine-tuned in this store, over the run's stored
tokens (the same ids and segments its maps were made from) and keeps, per token, sum_d g_jd e_jd: the gradient of
the predicted class's probability (softmax; the output, for regression) with respect to token j's word embedding e_j,
times e_j, summed over the embedding's dimensions, signed. That is Jain & Wallace's "gradient x input" (their code,
successar/AttentionExplanation, model/Binary_Classification.py `gradient`: grads['XxE[X]'] = (g * em).sum(-1) of
sigmoid(predict), read), with their sigmoid output as a softmax class probability here. The values are kept signed;
the query ranks them by absolute value by default, as the authors' plotting code (Trainers/PlottingBC.py
`process_grads`) does before Kendall's tau, and signed as an option (queries/attribution.py). For two classes the
absolute values do not depend on which class's probability is differentiated (p_1 = 1 - p_0). Examples are
independent in a padded batch (the mask keeps them apart), so one backward pass serves a batch.

The values go to the run group's `saliency` array (float32, tokens in storage order, like `value_norm`); the group's
attribute `saliency` says what it holds (model, method, target, n_tokens, complete) and is updated after every batch,
so an interrupted computation resumes where it stopped. It runs under the run's write lease.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..store import arrays
from ..store.writer import run_lease_name
from .classifier import accepted
from .errors import InvalidArgumentError, NotFoundError

if TYPE_CHECKING:
    from ..store import Store

METHOD = "grad_x_input"
TARGET = "predicted class probability (softmax; regression: the output)"


def _classifier(store: Store, model: str):
    from transformers import AutoModelForSequenceClassification

    from .evaluate import checkpoint_path

    folder = checkpoint_path(store, model)
    if folder is None:
        raise InvalidArgumentError(
            f"model {model!r} is not a classifier fine-tuned in this store, so it has no prediction to attribute: "
            f"fine-tune one (attnstore finetune --task T), ingest with --model <its name>, then run saliency on that run"
        )
    if not folder.is_dir():
        raise NotFoundError(f"checkpoint of model {model!r} not found at {folder}; copy the store's models folder with it")
    classifier = AutoModelForSequenceClassification.from_pretrained(folder, attn_implementation="eager")
    classifier.eval()  # no dropout: the gradient of the model as it predicts
    return classifier


def compute_saliency(store: Store, run, batch_size: int = 16, progress: bool = False) -> dict:
    """Compute (or finish) the run's saliency; returns its `saliency` attribute."""
    import torch
    from tqdm.auto import tqdm

    store.writer.require_writable()
    info = store.run_info(run)
    if info.status != "complete":
        raise InvalidArgumentError(f"run {info.name!r} is {info.status}: finish its ingest first (run the same ingest command)")
    root = store.locations.array_root
    meta = arrays.run_group_attribute(root, info.array_path, arrays.SALIENCY)
    wanted = {"model": info.model, "method": METHOD, "target": TARGET}
    if meta and meta.get("complete") and {k: meta.get(k) for k in wanted} == wanted:
        return meta
    classifier = _classifier(store, info.model)
    order = store.storage_order(info.id)
    with store.writer.lease(run_lease_name(info.name), f"saliency of run {info.name!r}") as lease:
        if not meta or {k: meta.get(k) for k in wanted} != wanted:
            arrays.create_token_array(root, info.array_path, arrays.SALIENCY, (), "float32", arrays.SALIENCY_CHUNK_TOKENS, {})
            meta = {**wanted, "n_tokens": 0, "n_examples": 0, "complete": False}
            arrays.set_run_group_attribute(root, info.array_path, arrays.SALIENCY, meta)
        values = arrays.TokenArray(root, info.array_path, arrays.SALIENCY, read_only=False)
        done, n_tokens = int(meta["n_examples"]), int(meta["n_tokens"])
        embeddings = classifier.get_input_embeddings()
        caught: list = []

        def keep(_module, _args, output):
            output.retain_grad()
            caught.append(output)

        handle = embeddings.register_forward_hook(keep)
        bar = tqdm(total=len(order), initial=done, desc=f"saliency of {info.name}", unit="ex", disable=not progress, leave=False)
        try:
            for start in range(done, len(order), batch_size):
                part = order[start : start + batch_size]
                table = store.token_table(info.id, part)
                groups = [table[table["example"] == e] for e in part]
                length = max(len(g) for g in groups)
                ids = torch.zeros((len(part), length), dtype=torch.long)
                segments = torch.zeros_like(ids)
                mask = torch.zeros_like(ids)
                for k, g in enumerate(groups):
                    n = len(g)
                    ids[k, :n] = torch.tensor(g["token_id"].to_numpy(np.int64))
                    segments[k, :n] = torch.tensor(g["segment"].to_numpy(np.int64))
                    mask[k, :n] = 1
                caught.clear()
                logits = classifier(**accepted(classifier, {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments})).logits
                probability = logits.softmax(-1)
                target = logits[:, 0] if logits.shape[-1] == 1 else probability.gather(1, logits.argmax(-1, keepdim=True))[:, 0]
                classifier.zero_grad(set_to_none=True)
                target.sum().backward()
                (embedded,) = caught
                scores = (embedded.grad * embedded).sum(-1).detach().numpy()
                batch_values = np.concatenate([scores[k, : len(g)] for k, g in enumerate(groups)])
                lease.check()
                values.write(n_tokens, batch_values)
                n_tokens += len(batch_values)
                done += len(part)
                meta = {**meta, "n_tokens": n_tokens, "n_examples": done}
                arrays.set_run_group_attribute(root, info.array_path, arrays.SALIENCY, meta)
                bar.update(len(part))
        finally:
            handle.remove()
            bar.close()
        meta = {**meta, "complete": True}
        arrays.set_run_group_attribute(root, info.array_path, arrays.SALIENCY, meta)
    return meta
