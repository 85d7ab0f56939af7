"""C8 (Clark et al. 2019, Sec. 5, Table 3): attention-based probing classifiers for dependency parsing.

The probes read stored word-level maps (C5) and nothing is back-propagated into the
model. For each word j they score every candidate head i (the other words and a ROOT
candidate, the [CLS]-like unit) and pick the most probable:

- `attn`: p(i|j) ∝ exp(Σ_k w_k α^k_ji + u_k α^k_ij) over all heads k (α^k_ji: attention
  from word j to word i in head k, on word-level maps);
- `attn+words`: the weights are functions of the two words' vectors,
  p(i|j) ∝ exp(Σ_k (W_k·(v_i ⊕ v_j)) α^k_ji + (U_k·(v_i ⊕ v_j)) α^k_ij);
- baselines `right-branching` (each word's head is the next word; the last is the root)
  and `distance+words`: p(i|j) ∝ exp(w·(v_i ⊕ v_j) + b[i − j]) with offsets clipped to ±5.

Word vectors are the model's own input embeddings (mean over a word's pieces), read with
numpy from its safetensors file (GloVe, used by the paper, is not available); ROOT uses
the embedding of the [CLS]-like token (a run whose tokenizer adds no special token, such
as GPT-2's, is refused: it has no ROOT unit). Training is full-batch Adam (torch.optim.Adam, gradients by
torch autograd; torch is imported only when a probe is trained) on the log-likelihood of the gold heads of a
training run; UAS is measured on a held-out run.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .common import model_source
from .engine import ranged_maps
from .errors import InvalidArgumentError, NotFoundError
from .word_level import units_of, word_level

if TYPE_CHECKING:
    import torch

    from ..store import Store

KINDS = ("attn", "attn+words", "right-branching", "distance+words")
# Input-embedding tables in safetensors: BERT-like encoders, Llama-like and GPT-2-like decoders.
EMBEDDING_KEYS = ("word_embeddings.weight", "embed_tokens.weight", "wte.weight")
MAX_OFFSET = 5


@dataclass
class ProbeData:
    """All (dependent, candidate) pairs of a set of sentences, grouped by dependent."""

    attn: np.ndarray  # (pairs, 2K): α^k_{dep->cand} then α^k_{cand->dep}
    cand: np.ndarray  # (pairs,) candidate word id into `vectors` (ROOT: its own id)
    dep: np.ndarray  # (pairs,) dependent word id
    offset: np.ndarray  # (pairs,) bucket of cand - dep in [0, 2*MAX_OFFSET], ROOT -> 2*MAX_OFFSET + 1
    gold: np.ndarray  # (pairs,) 1 where the candidate is the gold head
    starts: np.ndarray  # (dependents,) first pair of each dependent's group
    right_branching: np.ndarray  # (dependents,) 1 where "next word / root if last" is the gold head
    token_ids: list  # per word id: its wordpiece ids (ROOT: the [CLS]-like id)
    examples: list[int] = field(default_factory=list)  # the example positions used, in order


class ProbeOverlapWarning(UserWarning):
    """The evaluation run's sentences include some the probe was trained on (its UAS is not held-out)."""


def _probe_tables(store: Store, info, examples: np.ndarray) -> tuple[dict[int, pd.DataFrame], dict[int, pd.DataFrame]]:
    """The words and tokens of one range of examples, per example."""
    table = store.token_table(info.id, examples)
    if len(table) and not table["is_special"].any():
        raise InvalidArgumentError(
            f"run {info.name!r} has no [CLS]-like token: its tokenizer ({info.model}) adds no special token to the "
            f"inputs, and attention probes use one as the ROOT candidate; probe a run of a model whose tokenizer adds one"
        )
    words = {int(k): g.reset_index(drop=True) for k, g in store.word_table(info.id, examples).groupby("example")}
    return words, {int(k): g for k, g in table.groupby("example")}


def collect(store: Store, run, examples=None, max_examples: int | None = None) -> ProbeData:
    """Build probe inputs from a run's stored maps and its gold trees (sentences must be whole)."""
    info = store.run_info(run)
    cls_id = int((info.special_tokens.get("cls") or info.special_tokens.get("bos") or {"id": 0})["id"])
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("attn", "cand", "dep", "offset", "gold")}
    starts: list[int] = []
    right: list[float] = []
    token_ids: list[list[int]] = []
    n_pairs = used = 0
    used_examples: list[int] = []
    for example, maps, (words, tokens) in ranged_maps(store, info, examples, lambda part: _probe_tables(store, info, part)):
        if max_examples is not None and used >= max_examples:
            break
        w, t = words.get(example), tokens[example]
        if w is None or w["head"].isna().all() and not (w["deprel"] == "root").any():
            continue
        units = units_of(t["word_position"])
        unit_of = units.index_of_words(w["position"])
        specials = np.flatnonzero(~units.is_word)
        if (unit_of < 0).any() or len(specials) == 0:
            continue  # truncated sentence or no [CLS]-like unit: skip it whole
        used += 1
        used_examples.append(example)
        wmap = word_level(maps, units)  # (L, H, U, U)
        wmap = wmap.reshape(-1, *wmap.shape[2:])  # (K, U, U)
        n = len(w)
        cand_units = np.r_[specials[0], unit_of]  # candidate 0 = ROOT
        base = len(token_ids)
        root_id = base + n
        for p in range(n):
            pieces = t[t["word_position"] == w["position"].iloc[p]]["token_id"].tolist()
            token_ids.append(pieces)
        token_ids.append([cls_id])
        heads = w["head"].to_numpy()
        for j in range(n):
            cands = [c for c in range(n + 1) if c != j + 1]
            cu = cand_units[cands]
            fwd = wmap[:, unit_of[j], cu].T  # attention from the dependent to each candidate
            bwd = wmap[:, cu, unit_of[j]].T
            parts["attn"].append(np.concatenate([fwd, bwd], axis=1).astype(np.float32))
            parts["cand"].append(np.array([root_id if c == 0 else base + c - 1 for c in cands]))
            parts["dep"].append(np.full(len(cands), base + j))
            parts["offset"].append(
                np.array([2 * MAX_OFFSET + 1 if c == 0 else np.clip(c - 1 - j, -MAX_OFFSET, MAX_OFFSET) + MAX_OFFSET for c in cands])
            )
            gold_c = 0 if pd.isna(heads[j]) else int(heads[j]) + 1
            parts["gold"].append(np.array([c == gold_c for c in cands], dtype=np.float32))
            starts.append(n_pairs)
            n_pairs += len(cands)
            right.append(float(gold_c == (j + 2 if j + 1 < n else 0)))
    if not starts:
        raise NotFoundError(f"run {info.name!r} has no whole sentences with dependency trees to probe")
    attn, cand, dep, offset, gold = (np.concatenate(parts[k]) for k in ("attn", "cand", "dep", "offset", "gold"))
    return ProbeData(attn, cand, dep, offset, gold, np.array(starts), np.array(right), token_ids, used_examples)


def check_held_out(store: Store, run, eval_run) -> None:
    """Refuse to evaluate a probe on the run it is trained on (its UAS would be training accuracy)."""
    train, held_out = store.run_info(run), store.run_info(eval_run)
    if train.id == held_out.id:
        raise InvalidArgumentError(
            f"the training run and the evaluation run are both {train.name!r}: UAS on the sentences a probe was "
            f"trained on is not held-out; evaluate on a run over another split (e.g. ud/en_ewt:dev when training on ud/en_ewt:train)"
        )


def shared_sentences(store: Store, run, train_examples, eval_run, eval_examples) -> int:
    """How many of `eval_examples` (positions in `eval_run`) have the text of one of `train_examples` of `run`."""

    def texts(which, positions) -> set[tuple[str, str]]:
        frame = store.examples(which)
        frame = frame[frame["example"].isin(list(positions))]
        return set(zip(frame["text_a"].fillna(""), frame["text_b"].fillna("")))

    trained = texts(run, train_examples)
    frame = store.examples(eval_run)
    frame = frame[frame["example"].isin(list(eval_examples))]
    return sum((a, b) in trained for a, b in zip(frame["text_a"].fillna(""), frame["text_b"].fillna("")))


def word_vectors(store: Store, run, data: ProbeData, model_dir: str | None = None) -> np.ndarray:
    """Each probe word's vector: the mean of the model's input embeddings of its pieces."""
    info = store.run_info(run)
    source = Path(model_source(store, info, model_dir))
    files = sorted(source.glob("*.safetensors")) if source.is_dir() else []
    if not files:
        raise NotFoundError(f"word vectors need the model's safetensors weights; none found at {source or '(no source)'}")
    from safetensors import safe_open

    table = None
    for file in files:
        with safe_open(str(file), "np") as fh:
            key = next((k for k in fh.keys() if k.endswith(EMBEDDING_KEYS)), None)
            if key:
                table = fh.get_tensor(key).astype(np.float32)
                break
    if table is None:
        raise NotFoundError(f"no input-embedding tensor ({', '.join(EMBEDDING_KEYS)}) in {files[0].parent}")
    return np.stack([table[ids].mean(axis=0) for ids in data.token_ids])


def _needs_vectors(vectors: np.ndarray | None, kind: str) -> np.ndarray:
    if vectors is None:
        raise InvalidArgumentError(f"a {kind!r} probe needs word vectors (see word_vectors)")
    return vectors


class Probe:
    """A log-linear head selector with parameters `params` (dict of float32 arrays), trained with torch.optim.Adam."""

    def __init__(self, kind: str, n_features: int, dim: int, seed: int = 0):
        if kind not in KINDS or kind == "right-branching":
            raise InvalidArgumentError(f"cannot train a {kind!r} probe; kinds: attn, attn+words, distance+words")
        self.kind = kind
        rng = np.random.default_rng(seed)
        if kind == "attn":
            self.params = {"w": np.zeros(n_features, dtype=np.float32)}
        elif kind == "attn+words":
            self.params = {
                "top": (rng.standard_normal((dim, n_features)) * 0.01).astype(np.float32),
                "bottom": (rng.standard_normal((dim, n_features)) * 0.01).astype(np.float32),
                "w": np.zeros(n_features, dtype=np.float32),
            }
        else:
            self.params = {"v": np.zeros(2 * dim, dtype=np.float32), "b": np.zeros(2 * MAX_OFFSET + 2, dtype=np.float32)}

    def _scores(self, params: dict[str, torch.Tensor], data: ProbeData, vectors: np.ndarray | None) -> torch.Tensor:
        """Each (dependent, candidate) pair's score, differentiable in `params` (torch autograd)."""
        import torch

        attn = torch.as_tensor(data.attn, dtype=torch.float32)  # no copy for collect's float32 arrays
        if self.kind == "attn":
            return attn @ params["w"]
        vec = torch.as_tensor(_needs_vectors(vectors, self.kind), dtype=torch.float32)
        cand, dep = torch.as_tensor(data.cand, dtype=torch.long), torch.as_tensor(data.dep, dtype=torch.long)
        if self.kind == "attn+words":
            # weights as functions of the candidate's and the dependent's vectors: per word first, then gathered, added
            # in place (index_select keeps no output for its gradient) and dotted with the attention: one (pairs x 2K)
            # temporary, not four
            weights = (vec @ params["top"]).index_select(0, cand)
            weights.add_((vec @ params["bottom"]).index_select(0, dep)).add_(params["w"])
            return torch.linalg.vecdot(attn, weights)
        dim = vec.shape[1]
        # per-word scalars first, then gathered: no (pairs x dim) temporaries
        offset = torch.as_tensor(data.offset, dtype=torch.long)
        return (
            (vec @ params["v"][:dim]).index_select(0, cand)
            + (vec @ params["v"][dim:]).index_select(0, dep)
            + params["b"].index_select(0, offset)
        )

    def fit(self, data: ProbeData, vectors=None, epochs: int = 100, lr: float = 0.05) -> list[float]:
        """Full-batch torch.optim.Adam on the mean negative log-likelihood of the gold heads; returns the loss curve.

        Adam as before the move to torch (issue 25): betas (0.9, 0.999), eps 1e-8, no weight decay; one step per epoch.
        """
        import torch

        params = {k: torch.tensor(v, requires_grad=True) for k, v in self.params.items()}
        optimiser = torch.optim.Adam(params.values(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        counts = torch.from_numpy(np.diff(np.r_[data.starts, len(data.gold)]))
        group = torch.repeat_interleave(torch.arange(len(data.starts)), counts)  # each pair's dependent
        gold = torch.as_tensor(data.gold, dtype=torch.float32)
        losses = []
        for _ in range(epochs):
            optimiser.zero_grad()
            loss = -(gold * _group_log_softmax(self._scores(params, data, vectors), group, len(data.starts))).sum() / len(data.starts)
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
        self.params = {k: v.detach().numpy() for k, v in params.items()}
        return losses

    def scores(self, data: ProbeData, vectors=None) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self._scores({k: torch.from_numpy(v) for k, v in self.params.items()}, data, vectors).numpy()

    def uas(self, data: ProbeData, vectors=None) -> float:
        return attachment_score(self.scores(data, vectors), data)


def _group_log_softmax(scores: torch.Tensor, group: torch.Tensor, n_groups: int) -> torch.Tensor:
    """log p of each pair within its group (`group`: each pair's group id), stable via the group maximum."""
    import torch

    top = torch.full((n_groups,), -torch.inf, dtype=scores.dtype).scatter_reduce(0, group, scores.detach(), "amax")
    shifted = scores - top.index_select(0, group)
    total = torch.zeros(n_groups, dtype=scores.dtype).index_add(0, group, shifted.exp())
    return shifted - total.log().index_select(0, group)


def attachment_score(scores: np.ndarray, data: ProbeData) -> float:
    """Fraction of dependents whose highest-scoring candidate is the gold head."""
    best = np.maximum.reduceat(scores, data.starts)
    counts = np.diff(np.r_[data.starts, len(scores)])
    top = scores == np.repeat(best, counts)
    first_top = np.maximum.reduceat(np.where(top, np.arange(len(scores)), -1), data.starts)
    return float(data.gold[first_top].mean())


def train_and_evaluate(
    store: Store,
    *,
    run,
    eval_run,
    kind: str,
    max_train: int | None = 2000,
    max_eval: int | None = None,
    epochs: int = 100,
    lr: float = 0.05,
    seed: int = 0,
    model_dir: str | None = None,
) -> dict:
    """Train a probe on `run`, measure UAS on `eval_run`; returns a result record.

    The same run for both is refused (InvalidArgumentError); evaluation sentences whose text is among the
    training sentences used are counted in a ProbeOverlapWarning.
    """
    if kind not in KINDS:
        raise InvalidArgumentError(f"unknown probe kind {kind!r}; choose one of {', '.join(KINDS)}")
    if kind != "right-branching":  # a baseline that learns nothing may be scored on any run
        check_held_out(store, run, eval_run)
    test = collect(store, eval_run, max_examples=max_eval)
    if kind == "right-branching":
        return dict(
            kind=kind, uas=float(test.right_branching.mean()), train_uas=None, n_train=0, n_eval=len(test.starts), epochs=0, final_loss=None
        )
    train = collect(store, run, max_examples=max_train)
    shared = shared_sentences(store, run, train.examples, eval_run, test.examples)
    if shared:
        warnings.warn(
            ProbeOverlapWarning(
                f"{shared} of the {len(test.examples)} evaluation sentences of {store.run_info(eval_run).name!r} are also among "
                f"the {len(train.examples)} training sentences of {store.run_info(run).name!r} (same text): its UAS is not fully held-out"
            ),
            stacklevel=2,
        )
    needs_words = kind in ("attn+words", "distance+words")
    train_vec = word_vectors(store, run, train, model_dir) if needs_words else None
    test_vec = word_vectors(store, eval_run, test, model_dir) if needs_words else None
    dim = 0 if train_vec is None else train_vec.shape[1]
    probe = Probe(kind, train.attn.shape[1], dim, seed)
    losses = probe.fit(train, train_vec, epochs=epochs, lr=lr)
    return dict(
        kind=kind,
        uas=probe.uas(test, test_vec),
        train_uas=probe.uas(train, train_vec),
        n_train=len(train.starts),
        n_eval=len(test.starts),
        epochs=epochs,
        final_loss=losses[-1],
    )
