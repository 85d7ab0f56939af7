"""Head importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?"; the Primer, Sec. 7).

Each head's output is multiplied by a gate xi_h = 1 (a forward hook on the layer's self-attention, whose heads'
outputs are concatenated on the last axis: the BERT family, as `HeadDisabler` checks); the importance of head h is
the expected absolute gradient of the loss with respect to its gate, I_h = E_x |dL(x)/dxi_h|, taken example by
example on the task's dev set as the paper defines it (the transformers bertology example sums the gradient over a
batch before the absolute value and divides by tokens; per example is the definition), then normalised by layer with
the l2 norm, as the paper does for pruning ("normalizing the importance scores by layer ... was necessary"). The
raw expectation is kept beside it.

`prune` removes heads by importance, a share of all heads at a time (10 %), re-estimating the importance of the heads
left with the pruned ones disabled at each step (the paper's iterative pruning), and scores the model after each step
into `ablation_results` (config `prune:N`, N heads pruned, with the mask mode it used: zero as Michel et al., uniform as
Kovaleva et al., or mean); a step already stored is read back, so an interrupted sweep resumes where it stopped. The
config names the sweep's parameters when they are not the defaults (`prune[fraction=0.25,max_examples=100]:N`,
`prune_config`), so sweeps with another share per step or another importance sample are kept apart, never mixed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .classifier import accepted, collate, self_attentions
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .evaluate import Evaluator


def head_importance(
    ev: Evaluator, max_examples: int | None = None, progress: bool = False, disabled=(), mode: str = "zero"
) -> pd.DataFrame:
    """Per head: layer, head, importance (normalised by layer, l2), importance_raw (E|dL/dxi_h|), n_examples; with the
    heads `disabled` ((layer, head) pairs) disabled in `mode` meanwhile (pruning re-estimates the heads left so)."""
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

    items = ev.items[:max_examples] if max_examples else ev.items
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


def prune_config(fraction: float = PRUNE_FRACTION, max_examples: int | None = None) -> str:
    """The config prefix of a pruning sweep's steps (`prune:` + N heads pruned): `prune:` for the defaults (10 % of
    the heads a step, the importance over every dev example), else the parameters that differ, e.g.
    `prune[fraction=0.25,max_examples=3]:`. `max_examples` None: every example."""
    parts = ([f"fraction={fraction!r}"] if fraction != PRUNE_FRACTION else []) + (
        [f"max_examples={max_examples}"] if max_examples is not None else []
    )
    return f"prune[{','.join(parts)}]:" if parts else "prune:"


def prune(
    store, ev: Evaluator, mode: str = "zero", fraction: float = PRUNE_FRACTION, max_examples: int | None = None, progress: bool = True
) -> pd.DataFrame:
    """Prune heads by importance, `fraction` of all heads per step, until fewer than a step's worth are left; score the
    model after each step (ablation_results, config `prune_config(fraction, max_examples)` + N: `prune:N` for the
    defaults). Steps already stored under that config are read back, so it resumes; other parameters are another
    sweep. Returns the sequence's rows (the baseline first) with `n_pruned`."""
    import math

    from .classifier import MODES
    from .evaluate import SPLIT, _rows, evaluate

    if mode not in MODES:
        raise InvalidArgumentError(f"mode={mode!r}: use one of {', '.join(MODES)}")
    if not 0 < fraction < 1:
        raise InvalidArgumentError(f"fraction={fraction!r}: give a share of the heads between 0 and 1, e.g. 0.1")
    if max_examples is not None and max_examples < 1:
        raise InvalidArgumentError(f"max_examples must be at least 1, not {max_examples}")
    if max_examples is not None and max_examples >= len(ev.items):
        max_examples = None  # every dev example: the default sweep's importance
    total = ev.n_layers * ev.n_heads
    step = max(1, math.ceil(fraction * total))
    name = str(store.sql("SELECT name FROM models WHERE id = :i", {"i": int(ev.model_id)}).iloc[0, 0])  # as stored
    prefix = prune_config(fraction, max_examples)

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
    while len(pruned) + step < total:
        importance = head_importance(ev, max_examples=max_examples, progress=progress, disabled=pruned, mode=mode)
        left = importance[[(int(a), int(b)) not in set(pruned) for a, b in zip(importance["layer"], importance["head"])]]
        order = left.sort_values(["importance", "layer", "head"], kind="stable")  # least important first, ties by position
        pruned = pruned + [(int(a), int(b)) for a, b in zip(order["layer"][:step], order["head"][:step])]
        store.writer.add_ablation_results(_rows(ev, f"{prefix}{len(pruned)}", pruned, mode, ev.scores(pruned, mode), baseline))
    rows = sequence()
    base = store.ablation_results(model=name, task=ev.task.name)
    base = base[(base["config"] == "none") & (base["split"] == SPLIT)].assign(n_pruned=0)
    return pd.concat([base, rows], ignore_index=True)
