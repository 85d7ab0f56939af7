"""K1 (Kovaleva et al. 2019, Sec 4.1): a small CNN that sorts attention maps into the five pattern classes.

The paper trained "a convolutional neural network with 8 convolutional layers and ReLU activation
functions" on ~400 hand-labelled maps (F1 0.86); neither the network nor the labels were released.
Here, on CPU in seconds to minutes:

- input: each (L, L) map pooled to SIZE x SIZE by adaptive average pooling and divided by its
  maximum: a picture, as the paper's network saw. With masks=True two more channels give the
  share of each pooled cell lying on special tokens' columns (the tokenizer's [CLS]/[SEP]-like
  roles) and in the query's own segment (zeros for one-segment inputs), what the rules are told;
  4-fold cross-validation on the training part of the hand labels preferred the picture alone
  (macro-F1 0.70 vs 0.67 at 60 epochs; 0.69 / 0.66 at 30 / 120 epochs), so that is the default;
- network: six 3x3 convolutions with ReLU in three blocks (16, 32, 64 channels), each block
  ending in 2x2 max pooling, then a 64-unit ReLU layer and a linear layer to the five classes;
- training: Adam (lr 1e-3, weight decay 1e-4), cross-entropy weighted by inverse class
  frequency, EPOCHS passes over the training part in seeded random batches of 32; the held-out
  part is never seen.

torch is imported lazily (only these functions need it); the store and the queries do not.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.errors import InvalidArgumentError, NotFoundError
from .patterns import (
    CLASSES,
    THRESHOLDS,
    evaluate,
    labelled_maps,
    labels_from_scores,
    sample_examples,
    stratified_split,
    token_layout,
)

if TYPE_CHECKING:
    from ..store import Store

SIZE = 32
WIDTH = 16
EPOCHS = 60  # chosen by 4-fold cross-validation on the training part (30, 60, 120 tried)


@contextmanager
def one_thread():
    """Run torch on one thread inside the block: a network this small is many times faster so (no thread
    hand-offs per tiny convolution; 30x on a busy 2-core machine), and it leaves other cores to other work."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def deterministic(seed: int):
    """Inside the block torch is reproducible for `seed`: one thread, deterministic algorithms only, the global
    generator seeded (it initialises the network's weights); the caller's generator state, thread count and
    deterministic setting are restored after it."""
    import torch

    was_deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    with one_thread(), torch.random.fork_rng(devices=[]):
        torch.use_deterministic_algorithms(True)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(was_deterministic, warn_only=warn_only)


def map_features(maps: np.ndarray, special: np.ndarray, segment: np.ndarray, size: int = SIZE, masks: bool = False) -> np.ndarray:
    """Maps (N, L, L) of one example -> network input (N, 1 or 3, size, size) float32 (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    maps = np.asarray(maps, dtype=np.float32)
    n, length = maps.shape[0], maps.shape[-1]
    special = np.asarray(special, dtype=bool)
    segment = np.asarray(segment)
    plain = ~special
    two_segments = plain.any() and np.unique(segment[plain]).size >= 2
    special_cols = np.broadcast_to(special[None, :], (length, length)).astype(np.float32)
    own = ((segment[:, None] == segment[None, :]) & two_segments).astype(np.float32)
    with one_thread():  # the same bits whatever the machine's thread count
        pooled = F.adaptive_avg_pool2d(torch.from_numpy(maps)[:, None], size)[:, 0]  # (N, size, size)
        peak = pooled.amax(dim=(1, 2), keepdim=True).clamp_min(1e-12)
        picture = (pooled / peak)[:, None]
        if not masks:
            return picture.numpy().astype(np.float32)
        pooled_masks = F.adaptive_avg_pool2d(torch.from_numpy(np.stack([special_cols, own]))[None], size)[0]  # (2, size, size)
        return torch.cat([picture, pooled_masks[None].expand(n, -1, -1, -1)], dim=1).numpy().astype(np.float32)


def build_model(n_classes: int = len(CLASSES), size: int = SIZE, width: int = WIDTH, channels: int = 1):
    """The network (see the module docstring); size must be divisible by 8."""
    import torch.nn as nn

    if size % 8:
        raise InvalidArgumentError(f"size must be a multiple of 8, not {size}")
    layers: list = []
    c_in = channels
    for c_out in (width, 2 * width, 4 * width):
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.Conv2d(c_out, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        c_in = c_out
    cells = (size // 8) ** 2
    layers += [nn.Flatten(), nn.Linear(4 * width * cells, 64), nn.ReLU(), nn.Linear(64, n_classes)]
    return nn.Sequential(*layers)


def train_model(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    seed: int = 0,
    epochs: int = EPOCHS,
    lr: float = 1e-3,
    batch_size: int = 32,
    weight_decay: float = 1e-4,
    size: int = SIZE,
    width: int = WIDTH,
):
    """Train a fresh network on features (N, C, size, size) and integer labels (N,) (indices into CLASSES).

    Deterministic for a seed (`deterministic`): the same features, labels and seed give bit-identical weights."""
    import torch
    import torch.nn.functional as F

    if len(features) == 0:
        raise InvalidArgumentError("no training maps")
    with deterministic(seed):
        generator = torch.Generator().manual_seed(seed)  # the batches' order: a generator of its own
        model = build_model(size=size, width=width, channels=features.shape[1])  # initialised from the seeded global one
        x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
        y = torch.from_numpy(np.asarray(labels, dtype=np.int64))
        counts = torch.bincount(y, minlength=len(CLASSES)).float()
        weights = torch.where(counts > 0, counts.sum() / (len(CLASSES) * counts.clamp_min(1)), torch.zeros_like(counts))
        optimiser = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
        model.train()
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=generator)
            for start in range(0, len(x), batch_size):
                batch = order[start : start + batch_size]
                optimiser.zero_grad()
                loss = F.cross_entropy(model(x[batch]), y[batch], weight=weights)
                loss.backward()
                optimiser.step()
    model.eval()
    return model


def predict(model, features: np.ndarray, batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """(class indices, probability of the chosen class) for features (N, C, size, size)."""
    import torch

    out_idx, out_p = [], []
    with torch.no_grad(), one_thread():
        for start in range(0, len(features), batch_size):
            logits = model(torch.from_numpy(np.ascontiguousarray(features[start : start + batch_size], dtype=np.float32)))
            p = torch.softmax(logits, dim=1)
            best = p.argmax(1)
            out_idx.append(best.numpy())
            out_p.append(p.gather(1, best[:, None])[:, 0].numpy())
    if not out_idx:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    return np.concatenate(out_idx), np.concatenate(out_p).astype(np.float64)


def save_model(model, path: str | Path, *, size: int, width: int, masks: bool, extra: dict) -> None:
    import torch

    torch.save(
        dict(
            state_dict=model.state_dict(), size=size, width=width, masks=masks, channels=3 if masks else 1, classes=list(CLASSES), **extra
        ),
        str(path),
    )


def load_model(path: str | Path):
    """(model, saved dict) from a file written by train_from_store."""
    import torch

    try:
        saved = torch.load(str(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise NotFoundError(f"no CNN weights at {path}; train them with `attnstore patterns train-cnn --out {path}`") from None
    except Exception as exc:  # not a torch file, or a damaged one
        raise InvalidArgumentError(f"{path} is not a pattern CNN file ({type(exc).__name__}: {exc})") from None
    if not isinstance(saved, dict) or "state_dict" not in saved or list(saved.get("classes", [])) != list(CLASSES):
        raise InvalidArgumentError(f"{path} is not a pattern CNN file written by `attnstore patterns train-cnn`")
    model = build_model(size=saved["size"], width=saved["width"], channels=saved["channels"])
    model.load_state_dict(saved["state_dict"])
    model.eval()
    return model, saved


def _summary(result: dict) -> dict:
    return dict(
        macro_f1=result["macro_f1"],
        weighted_f1=result["weighted_f1"],
        accuracy=result["accuracy"],
        n=result["n"],
        f1={c: float(f) for c, f in zip(CLASSES, result["f1"])},
        precision={c: float(f) for c, f in zip(CLASSES, result["precision"])},
        recall={c: float(f) for c, f in zip(CLASSES, result["recall"])},
        support={c: int(s) for c, s in zip(CLASSES, result["support"])},
        confusion=result["confusion"].tolist(),
    )


def train_from_store(
    store: Store,
    out: str | Path,
    *,
    source: str = "human",
    test_fraction: float = 0.25,
    seed: int = 0,
    epochs: int = EPOCHS,
    size: int = SIZE,
    width: int = WIDTH,
    masks: bool = False,
) -> dict:
    """Train on the stored labels of `source` with a seeded stratified held-out part; evaluate the CNN and the
    rules (module thresholds) on the same held-out maps. Writes the weights + split to `out` and the report
    to `out` with suffix .json; returns the report. Deterministic: the same labels, store and seed give the
    same weights, bit for bit, and the same report (it holds no timing)."""
    import torch

    frame, maps = labelled_maps(store, source)
    held_out = stratified_split(frame["label"], test_fraction, seed)
    features = np.concatenate([map_features(attn[None], special, segment, size, masks) for attn, special, segment in maps])
    y = np.array([CLASSES.index(label) for label in frame["label"]])
    model = train_model(features[~held_out], y[~held_out], seed=seed, epochs=epochs, size=size, width=width)
    cnn_test, _ = predict(model, features[held_out])
    cnn_train, _ = predict(model, features[~held_out])
    rules = labels_from_scores(frame)
    true = frame["label"].to_numpy(object)
    names = np.array(CLASSES, dtype=object)
    report = dict(
        source=source,
        seed=seed,
        test_fraction=test_fraction,
        epochs=epochs,
        size=size,
        width=width,
        masks=masks,
        n_labels=len(frame),
        n_train=int((~held_out).sum()),
        n_test=int(held_out.sum()),
        torch=torch.__version__,
        label_counts={c: int((true == c).sum()) for c in CLASSES},
        classes=list(CLASSES),
        thresholds=dict(THRESHOLDS),
        cnn=_summary(evaluate(true[held_out], names[cnn_test])),
        cnn_train=_summary(evaluate(true[~held_out], names[cnn_train])),
        rules=_summary(evaluate(true[held_out], rules[held_out])),
        rules_train=_summary(evaluate(true[~held_out], rules[~held_out])),
    )
    split = frame[["run", "model", "dataset", "split", "example", "source_row", "layer", "head", "label"]].assign(
        part=np.where(held_out, "test", "train")
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_model(
        model,
        out,
        size=size,
        width=width,
        masks=masks,
        extra=dict(
            split=split.astype({"example": int, "source_row": int, "layer": int, "head": int}).to_dict("list"),
            report=json.loads(json.dumps(report)),
        ),
    )
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def format_report(report: dict) -> str:
    """The held-out comparison as plain text: macro-F1, per-class F1 and confusion matrices."""
    lines = [
        f"{report['n_labels']} labelled maps ({report['source']}): {report['n_train']} train, {report['n_test']} held out "
        f"(seed {report['seed']}); CNN trained {report['epochs']} epochs"
    ]
    for name in ("cnn", "rules"):
        r = report[name]
        lines.append(
            f"{name}: held-out macro-F1 {r['macro_f1']:.3f}, weighted F1 {r['weighted_f1']:.3f}, "
            f"accuracy {r['accuracy']:.3f} (train macro-F1 {report[name + '_train']['macro_f1']:.3f})"
        )
        lines.append("  per-class F1: " + ", ".join(f"{c} {r['f1'][c]:.2f} (n={r['support'][c]})" for c in CLASSES))
        lines.append("  confusion (rows true, columns predicted: " + ", ".join(CLASSES) + "):")
        lines += ["    " + " ".join(f"{v:4d}" for v in row) + f"   {c}" for c, row in zip(CLASSES, r["confusion"])]
    return "\n".join(lines)


def classify_run(
    store: Store, run, model_file: str | Path, *, examples=None, max_examples: int = 1000, seed: int = 0, save: bool = False
) -> pd.DataFrame:
    """CNN class of every (example, layer, head) map of up to max_examples examples (default_rng(seed) sample).

    Columns: example, layer, head, label, confidence (the softmax probability of the label).
    save=True stores them in pattern_labels with source "cnn".
    """
    model, saved = load_model(model_file)
    info = store.run_info(run)
    chosen = sample_examples(store, info, examples, max_examples, seed)
    layout = token_layout(store, info)
    layer, head = np.meshgrid(np.arange(info.n_layers), np.arange(info.n_heads), indexing="ij")
    parts = []
    for example, maps in store.iter_attention(info.id, chosen):
        special, segment = layout[example]
        flat = maps.reshape(-1, *maps.shape[-2:])
        idx, p = predict(model, map_features(flat, special, segment, saved["size"], saved["masks"]))
        parts.append(
            pd.DataFrame(
                dict(
                    example=example,
                    layer=layer.ravel(),
                    head=head.ravel(),
                    label=np.array(CLASSES, dtype=object)[idx].astype(str),
                    confidence=p,
                )
            )
        )
    columns = ["example", "layer", "head", "label", "confidence"]
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
    frame = frame[columns].sort_values(["example", "layer", "head"], ignore_index=True)
    if save:
        store.save_pattern_labels(frame.assign(run=info.name), source="cnn")
    return frame
