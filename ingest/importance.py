"""Head importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?"; the Primer, Sec. 7).

Each head's output is multiplied by a gate xi_h = 1 (a forward hook on the layer's self-attention, whose heads'
outputs are concatenated on the last axis: the BERT family, as `HeadDisabler` checks); the importance of head h is
the expected absolute gradient of the loss with respect to its gate, I_h = E_x |dL(x)/dxi_h|, taken example by
example as the paper defines it (the transformers bertology example sums the gradient over a batch before the
absolute value and divides by tokens; per example is the definition), then normalised by layer with the l2 norm, as
the paper does for pruning ("normalizing the importance scores by layer ... was necessary"). The raw expectation is
kept beside it. `head_importance` takes the examples it is given (`attnstore importance`: the task's dev set).

`prune` removes heads by importance, a share of all heads at a time (10 %), and scores the model on the dev set after
each step into `ablation_results` (config `prune:N`, N heads pruned, with the mask mode it used: zero as Michel et al.,
uniform as Kovaleva et al., or mean). By default it follows the authors' script (pmichel31415/are-16-heads-really-
better-than-1, its pytorch-pretrained-BERT run_classifier.py): the importance is estimated on the training data
(`--compute_head_importance_on_subset`, default all of it) and once, before the first step, one ordering serving every
step (their `--exact_pruning` re-estimates before each step). The alternatives are options: `importance_data="dev"`
(the dev set that also scores the curve, so the early steps are optimistic) and `reestimate=True` (re-estimated with
the pruned heads disabled before each step, the paper's text's iterative reading); each step's rows record the
procedure (importance_split, importance_examples, importance_schedule). The training data is the model's own: a model
fine-tuned in this store is estimated on the examples it was trained on (its `--train-limit` sample, drawn again with
its seed), a base model on the task's train split; `max_examples` takes a seeded sample of them
(numpy default_rng(0), in the data's order), of the dev set its first examples. A step already stored is read back, so
an interrupted sweep resumes where it stopped. The config names the sweep's parameters when they are not the defaults
(`prune[importance=dev,reestimate,fraction=0.25,max_examples=100]:N`, `prune_config`), so sweeps of other procedures
are kept apart, never mixed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .classifier import Encoded, accepted, collate, encode, self_attentions
from .errors import InvalidArgumentError
from .glue import read_split

if TYPE_CHECKING:
    from .evaluate import Evaluator

IMPORTANCE_DATA = ("train", "dev")  # the first is the default: the authors' script estimates on the training data
IMPORTANCE_SAMPLE_SEED = 0  # max_examples of the training data: numpy default_rng(0) draws them


def head_importance(
    ev: Evaluator, max_examples: int | None = None, progress: bool = False, disabled=(), mode: str = "zero", items=None
) -> pd.DataFrame:
    """Per head: layer, head, importance (normalised by layer, l2), importance_raw (E|dL/dxi_h|), n_examples; over
    `items` (default: the evaluator's dev examples), the first `max_examples` of them; with the heads `disabled`
    ((layer, head) pairs) disabled in `mode` meanwhile (pruning with re-estimation measures the heads left so)."""
    from contextlib import nullcontext

    import torch
    from tqdm.auto import tqdm

    model = ev.classifier
    model.eval()  # no dropout: the gradient of the model as it predicts
    modules = self_attentions(model)
    if len(modules) != ev.n_layers:
        raise InvalidArgumentError(
            f"cannot gate the heads of {ev.model_name!r}: found {len(modules)} self-attention modules for {ev.n_layers} layers "
            "(eager BERT-family self-attention is supported)"
        )
    if max_examples is not None and max_examples < 1:
        raise InvalidArgumentError(f"max_examples must be at least 1, not {max_examples}")
    gates = torch.ones(ev.n_layers, ev.n_heads, requires_grad=True)

    def gate(layer: int):
        def hook(_module, _args, output):
            context = output[0] if isinstance(output, tuple) else output
            b, length, hidden = context.shape
            gated = (context.view(b, length, ev.n_heads, hidden // ev.n_heads) * gates[layer].view(1, 1, -1, 1)).view(b, length, hidden)
            return (gated, *output[1:]) if isinstance(output, tuple) else gated

        return hook

    items = list(ev.items if items is None else items)
    items = items[:max_examples] if max_examples else items
    total = torch.zeros(ev.n_layers, ev.n_heads, dtype=torch.float64)
    handles = [m.register_forward_hook(gate(layer)) for layer, m in enumerate(modules)]
    scope = ev.disabler.disabled(list(disabled), mode) if disabled else nullcontext()
    try:
        with scope:
            for item in tqdm(items, desc=f"{ev.task.name}: head importance", unit="ex", disable=not progress, leave=False):
                inputs, labels = collate([item], ev.pad_id, ev.task.is_regression)
                loss = model(**accepted(model, inputs), labels=labels).loss
                (grad,) = torch.autograd.grad(loss, gates)
                total += grad.abs().double()
    finally:
        for h in handles:
            h.remove()
    raw = (total / len(items)).numpy()
    norms = np.linalg.norm(raw, axis=1, keepdims=True)
    normalised = np.divide(raw, norms, out=np.zeros_like(raw), where=norms > 0)
    layer, head = np.meshgrid(np.arange(ev.n_layers), np.arange(ev.n_heads), indexing="ij")
    return pd.DataFrame(
        {
            "layer": layer.ravel(),
            "head": head.ravel(),
            "importance": normalised.ravel(),
            "importance_raw": raw.ravel(),
            "n_examples": len(items),
        }
    )


PRUNE_FRACTION = 0.1  # of all heads, per step (the paper's Fig. 2 steps)


def importance_items(store, ev: Evaluator, data: str = "train", max_examples: int | None = None) -> tuple[list[Encoded], int]:
    """The examples pruning estimates the importance on, and how many the data holds. "train": the model's training
    data (see the module's docstring), all of it or a seeded sample of `max_examples`; "dev": the first `max_examples`
    dev examples (default all), the set that also scores the curve."""
    if data not in IMPORTANCE_DATA:
        raise InvalidArgumentError(f"importance data {data!r}: use 'train' (the authors' choice) or 'dev'")
    if max_examples is not None and max_examples < 1:
        raise InvalidArgumentError(f"max_examples must be at least 1, not {max_examples}")
    if data == "dev":
        return (list(ev.items[:max_examples]) if max_examples else list(ev.items)), len(ev.items)
    if ev.task.train is None:
        raise InvalidArgumentError(
            f"{ev.task.name} has no train split in the data directory to estimate head importance on: give one, or "
            f"estimate on the dev set that also scores the curve (--importance-data dev)"
        )
    row = store.model_row(ev.model_name)
    hparams = ((row or {}).get("training") or {}).get("hparams") if row is not None and row.get("task") else None
    if hparams:  # fine-tuned here: the examples it was trained on, the same seeded sample as `finetune` drew
        pairs = read_split(ev.task, ev.task.train, ev.data_dir, hparams.get("train_limit"), int(hparams.get("seed", 0)))
    else:
        pairs = read_split(ev.task, ev.task.train, ev.data_dir)
    available = len(pairs)
    if max_examples is not None and max_examples < available:
        rng = np.random.default_rng(IMPORTANCE_SAMPLE_SEED)
        pairs = [pairs[i] for i in sorted(rng.choice(available, size=max_examples, replace=False))]
    if ev.tokenizer is None:
        raise InvalidArgumentError(f"the evaluator of {ev.model_name!r} has no tokenizer to encode its training data")
    return encode(ev.tokenizer, pairs, ev.max_length), available


def prune_config(
    fraction: float = PRUNE_FRACTION, max_examples: int | None = None, importance_data: str = "train", reestimate: bool = False
) -> str:
    """The config prefix of a pruning sweep's steps (`prune:` + N heads pruned): `prune:` for the defaults (10 % of
    the heads a step, the importance estimated once over all the training data), else the parameters that differ,
    e.g. `prune[importance=dev,reestimate,fraction=0.25,max_examples=3]:`. `max_examples` None: every example."""
    parts = (
        ([f"importance={importance_data}"] if importance_data != IMPORTANCE_DATA[0] else [])
        + (["reestimate"] if reestimate else [])
        + ([f"fraction={fraction!r}"] if fraction != PRUNE_FRACTION else [])
        + ([f"max_examples={max_examples}"] if max_examples is not None else [])
    )
    return f"prune[{','.join(parts)}]:" if parts else "prune:"


def prune(
    store,
    ev: Evaluator,
    mode: str = "zero",
    fraction: float = PRUNE_FRACTION,
    max_examples: int | None = None,
    progress: bool = True,
    importance_data: str = "train",
    reestimate: bool = False,
) -> pd.DataFrame:
    """Prune heads by importance, `fraction` of all heads per step, until fewer than a step's worth are left; score the
    model on the dev set after each step (ablation_results, config `prune_config(...)` + N: `prune:N` for the
    defaults). The importance: on `importance_data` ("train", the authors' choice, or "dev"), `max_examples` of them
    (None: all), estimated once (the authors' default) or, with `reestimate`, again before each step with the pruned
    heads disabled. Steps already stored under that config are read back, so it resumes; other parameters are another
    sweep. Returns the sequence's rows (the baseline first) with `n_pruned`."""
    import math

    from .classifier import MODES
    from .evaluate import SPLIT, _rows, evaluate

    if mode not in MODES:
        raise InvalidArgumentError(f"mode={mode!r}: use one of {', '.join(MODES)}")
    if not 0 < fraction < 1:
        raise InvalidArgumentError(f"fraction={fraction!r}: give a share of the heads between 0 and 1, e.g. 0.1")
    items, available = importance_items(store, ev, importance_data, max_examples)
    if max_examples is not None and max_examples >= available:
        max_examples = None  # every example: the default sweep's importance
    total = ev.n_layers * ev.n_heads
    step = max(1, math.ceil(fraction * total))
    name = str(store.sql("SELECT name FROM models WHERE id = :i", {"i": int(ev.model_id)}).iloc[0, 0])  # as stored
    prefix = prune_config(fraction, max_examples, importance_data, reestimate)
    schedule = "iterative" if reestimate else "once"
    procedure = dict(importance_split=importance_data, importance_examples=len(items), importance_schedule=schedule)

    def sequence() -> pd.DataFrame:
        frame = store.ablation_results(model=name, task=ev.task.name)
        frame = frame[frame["config"].str.startswith(prefix) & (frame["mode"] == mode) & (frame["split"] == SPLIT)]
        return frame.assign(n_pruned=frame["config"].str.slice(len(prefix)).astype(int)).sort_values(["n_pruned", "metric"])

    done = sequence()
    stored = sorted(set(done["n_pruned"]))
    if stored != [step * (i + 1) for i in range(len(stored))]:  # a sweep of another share per step under this config
        raise InvalidArgumentError(
            f"the stored pruning steps {prefix}N of {name!r} on {ev.task.name} (mask {mode}) prune {stored} heads, not "
            f"{step} more a step as --fraction {fraction!r} does: they were made with another --fraction by an attnstore "
            f"that did not name it in the config; delete them (DELETE FROM ablation_results WHERE config LIKE '{prefix}%'"
            f" AND mode = '{mode}', with sqlite3 or psql) to prune again"
        )
    baseline = evaluate(store, ev, progress=progress)
    pruned: list[tuple[int, int]] = []
    if not done.empty:  # resume from the largest mask stored
        last = done[done["n_pruned"] == done["n_pruned"].max()].iloc[0]
        pruned = [tuple(h) for h in last["disabled_heads"]]
    importance = None
    while len(pruned) + step < total:
        if importance is None or reestimate:  # once: one estimate of the whole model orders every step
            disabled = pruned if reestimate else []
            importance = head_importance(ev, progress=progress, disabled=disabled, mode=mode, items=items)
        left = importance[[(int(a), int(b)) not in set(pruned) for a, b in zip(importance["layer"], importance["head"])]]
        order = left.sort_values(["importance", "layer", "head"], kind="stable")  # least important first, ties by position
        pruned = pruned + [(int(a), int(b)) for a, b in zip(order["layer"][:step], order["head"][:step])]
        rows = _rows(ev, f"{prefix}{len(pruned)}", pruned, mode, ev.scores(pruned, mode), baseline)
        store.writer.add_ablation_results([dict(r, **procedure) for r in rows])
    rows = sequence()
    base = store.ablation_results(model=name, task=ev.task.name)
    base = base[(base["config"] == "none") & (base["split"] == SPLIT)].assign(n_pruned=0)
    return pd.concat([base, rows], ignore_index=True)
