"""K1 (Kovaleva et al. 2019, Sec 4.1): a small CNN that sorts attention maps into the five pattern classes.

The paper trained "a convolutional neural network with 8 convolutional layers and ReLU activation
functions" on ~400 hand-labelled maps (F1 0.86); neither the network nor the labels were released.
Here, on CPU in seconds to minutes:

- input: each (L, L) map pooled to SIZE x SIZE by adaptive average pooling and divided by its
  maximum: a picture, as the paper's network saw. With masks=True two more channels give the
  share of each pooled cell lying on special tokens' columns (the tokenizer's [CLS]/[SEP]-like
  roles) and in the query's own segment (zeros for one-segment inputs), what the rules are told.
  With scalars=True (the default) the network also gets the map's SCALARS: the rules' scores
  (normalised against a uniform map of the same length, and raw), the length, the map's maximum,
  its rows' entropy and its first column's mass. Pooling to 32 x 32 loses what people see at
  once: how long the input is, a one-pixel [CLS] column beside a diagonal, how faint the map is;
- network: six 3x3 convolutions with ReLU in three blocks (16, 32, 64 channels), each block
  ending in 2x2 max pooling, then (with the standardised scalars beside the flattened picture
  features) a 64-unit ReLU layer and a linear layer to the five classes;
- training: Adam (lr 1e-3, weight decay 1e-4), cross-entropy weighted by inverse class
  frequency, EPOCHS passes over the training part in seeded random batches of 32; the held-out
  part is never seen. MEMBERS networks (seeds seed, seed + 1, ...) are trained and their softmax
  probabilities averaged: one network's held-out macro-F1 moves by ±0.1 with the seed on a few
  hundred labels, the average of five much less (docs/results/all-MiniLM-L6-v2/pattern_classifiers.md).

Labels of several labellers can be trained on together (sources); a map labelled by more than one
is held out, or trained on, with all its labels.

Training on the labels kept in a store and classifying a run's maps: queries/pattern_cnn_store.py.

torch is imported lazily (only these functions need it); the store and the queries do not.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..store.errors import InvalidArgumentError, NotFoundError
from .patterns import CLASSES, pattern_scores

SIZE = 32
WIDTH = 16
EPOCHS = 60  # chosen by 4-fold cross-validation on the training part (30, 60, 120 tried)
MEMBERS = 5  # networks averaged
FORMAT = 2  # of the saved file: 1 (no "format" key) held one network without scalars
# The map's numbers given to the network beside its picture (map_scalars).
SCALARS = (
    "vertical_norm",
    "diagonal_norm",
    "vertical",
    "diagonal",
    "self",
    "stripe",
    "block_norm",
    "two_segments",
    "log_length",
    "peak",
    "row_entropy",
    "first_column",
)
MAP_KEY = ["model", "dataset", "split", "source_row", "layer", "head"]  # one map, whichever store holds it


@contextmanager
def one_thread():
    """Run torch on one thread inside the block: a network this small is many times faster so (no thread
    hand-offs per tiny convolution; 30x on a busy 2-core machine), and it leaves other cores to other work.

    Denormal floats are flushed to zero inside it (torch.set_flush_denormal; off again after, torch's default):
    weight decay drives some weights below 1e-38, and the CPU's slow path for them made every convolution 8x
    slower (0.49 s against 0.06 s for one network on one example's 72 maps), in training and in classify."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
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
    """Maps (N, L, L) of one example -> the network's picture input (N, 1 or 3, size, size) float32 (module docstring)."""
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


def map_scalars(maps: np.ndarray, special: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Maps (N, L, L) of one example -> (N, len(SCALARS)) float32: the rule scores (patterns.pattern_scores; block_norm
    0 for one segment, with two_segments 0/1 beside it), log(L) / log(512), the map's maximum, the mean entropy of
    its rows over log(L), and the mean attention to the first token (the [CLS]-like one)."""
    maps = np.asarray(maps, dtype=np.float64)
    n, length = maps.shape[0], maps.shape[-1]
    scores = pattern_scores(maps, special, segment)
    block = np.asarray(scores["block_norm"], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.where(maps > 0, maps * np.log(np.where(maps > 0, maps, 1.0)), 0.0).sum(-1).mean(-1)
    columns = dict(
        scores,
        block_norm=np.nan_to_num(block, nan=0.0),
        two_segments=(~np.isnan(block)).astype(np.float64),
        log_length=np.full(n, np.log(length) / np.log(512)),
        peak=maps.max(axis=(-2, -1)),
        row_entropy=entropy / np.log(max(length, 2)),
        first_column=maps[..., 0].mean(-1),
    )
    return np.stack([np.broadcast_to(np.asarray(columns[name], dtype=np.float64), (n,)) for name in SCALARS], axis=1).astype(np.float32)


def map_inputs(
    maps: np.ndarray, special: np.ndarray, segment: np.ndarray, size: int = SIZE, masks: bool = False, scalars: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Maps (N, L, L) of one example -> (pictures (N, C, size, size), scalars (N, len(SCALARS) or 0)), both float32."""
    pictures = map_features(maps, special, segment, size, masks)
    numbers = map_scalars(maps, special, segment) if scalars else np.zeros((len(pictures), 0), dtype=np.float32)
    return pictures, numbers


def stack_inputs(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate map_inputs results."""
    return np.concatenate([p for p, _ in parts]), np.concatenate([s for _, s in parts])


def build_model(n_classes: int = len(CLASSES), size: int = SIZE, width: int = WIDTH, channels: int = 1, n_scalars: int = 0):
    """The network (see the module docstring); size must be divisible by 8. Called as model(pictures, scalars);
    the scalars are standardised inside by the buffers scalar_mean and scalar_scale that training sets."""
    import torch
    import torch.nn as nn

    if size % 8:
        raise InvalidArgumentError(f"size must be a multiple of 8, not {size}")

    class PatternNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: list = []
            c_in = channels
            for c_out in (width, 2 * width, 4 * width):
                layers += [
                    nn.Conv2d(c_in, c_out, 3, padding=1),
                    nn.ReLU(),
                    nn.Conv2d(c_out, c_out, 3, padding=1),
                    nn.ReLU(),
                    nn.MaxPool2d(2),
                ]
                c_in = c_out
            self.conv = nn.Sequential(*layers, nn.Flatten())
            self.register_buffer("scalar_mean", torch.zeros(n_scalars))
            self.register_buffer("scalar_scale", torch.ones(n_scalars))
            cells = (size // 8) ** 2
            self.head = nn.Sequential(nn.Linear(4 * width * cells + n_scalars, 64), nn.ReLU(), nn.Linear(64, n_classes))

        def forward(self, pictures, scalars):
            features = self.conv(pictures)
            if n_scalars:
                features = torch.cat([features, (scalars - self.scalar_mean) / self.scalar_scale], dim=1)
            return self.head(features)

    return PatternNet()


def train_model(
    pictures: np.ndarray,
    scalars: np.ndarray,
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
    """Train a fresh network on pictures (N, C, size, size), scalars (N, K; K may be 0) and integer labels (N,)
    (indices into CLASSES). Deterministic for a seed (`deterministic`): the same inputs and seed give bit-identical weights."""
    import torch
    import torch.nn.functional as F

    if len(pictures) == 0:
        raise InvalidArgumentError("no training maps")
    with deterministic(seed):
        generator = torch.Generator().manual_seed(seed)  # the batches' order: a generator of its own
        model = build_model(size=size, width=width, channels=pictures.shape[1], n_scalars=scalars.shape[1])  # seeded init
        x = torch.from_numpy(np.ascontiguousarray(pictures, dtype=np.float32))
        s = torch.from_numpy(np.ascontiguousarray(scalars, dtype=np.float32))
        if s.shape[1]:
            model.scalar_mean.copy_(s.mean(0))
            model.scalar_scale.copy_(s.std(0, unbiased=False).clamp_min(1e-6))
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
                loss = F.cross_entropy(model(x[batch], s[batch]), y[batch], weight=weights)
                loss.backward()
                optimiser.step()
    model.eval()
    return model


def train_ensemble(
    pictures: np.ndarray, scalars: np.ndarray, labels: np.ndarray, *, seed: int = 0, members: int = MEMBERS, **options
) -> list:
    """`members` networks trained by train_model with seeds seed, seed + 1, ...; predict averages them."""
    if members < 1:
        raise InvalidArgumentError(f"members must be at least 1, not {members}")
    return [train_model(pictures, scalars, labels, seed=seed + i, **options) for i in range(members)]


def predict_proba(models, pictures: np.ndarray, scalars: np.ndarray, batch_size: int = 4096) -> np.ndarray:
    """Class probabilities (N, len(CLASSES)): the softmax of each network (one, or a list) averaged."""
    import torch

    members = models if isinstance(models, (list, tuple)) else [models]
    out = []
    with torch.no_grad(), one_thread():
        for start in range(0, len(pictures), batch_size):
            x = torch.from_numpy(np.ascontiguousarray(pictures[start : start + batch_size], dtype=np.float32))
            s = torch.from_numpy(np.ascontiguousarray(scalars[start : start + batch_size], dtype=np.float32))
            out.append(torch.stack([torch.softmax(m(x, s), dim=1) for m in members]).mean(0).numpy())
    return np.concatenate(out).astype(np.float64) if out else np.zeros((0, len(CLASSES)))


def predict(models, pictures: np.ndarray, scalars: np.ndarray, batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """(class indices, probability of the chosen class) for the inputs (see predict_proba)."""
    p = predict_proba(models, pictures, scalars, batch_size)
    best = p.argmax(1) if len(p) else np.zeros(0, dtype=np.int64)
    return best, p[np.arange(len(p)), best]


def save_model(models, path: str | Path, *, size: int, width: int, masks: bool, scalars: bool, extra: dict) -> None:
    import torch

    torch.save(
        dict(
            format=FORMAT,
            state_dicts=[m.state_dict() for m in models],
            size=size,
            width=width,
            masks=masks,
            channels=3 if masks else 1,
            scalars=list(SCALARS) if scalars else [],
            classes=list(CLASSES),
            **extra,
        ),
        str(path),
    )


def _format_1(state_dict: dict) -> dict:
    """A format-1 file's one nn.Sequential state dict under PatternNet's names (its conv layers 0-14, linear 16 and 18)."""
    renamed = {}
    for key, value in state_dict.items():
        index, rest = key.split(".", 1)
        i = int(index)
        renamed[f"conv.{i}.{rest}" if i < 15 else f"head.{i - 16}.{rest}"] = value
    return renamed


def load_model(path: str | Path):
    """(list of networks, saved dict) from a file written by train_from_store (saved["scalars"]: the SCALARS it takes)."""
    import torch

    try:
        saved = torch.load(str(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise NotFoundError(f"no CNN weights at {path}; train them with `attnstore patterns train-cnn --out {path}`") from None
    except Exception as exc:  # not a torch file, or a damaged one
        raise InvalidArgumentError(f"{path} is not a pattern CNN file ({type(exc).__name__}: {exc})") from None
    if not isinstance(saved, dict) or list(saved.get("classes", [])) != list(CLASSES):
        raise InvalidArgumentError(f"{path} is not a pattern CNN file written by `attnstore patterns train-cnn`")
    if "format" not in saved and "state_dict" in saved:  # format 1: one network, the picture only
        saved = dict(saved, format=1, state_dicts=[_format_1(saved["state_dict"])], scalars=[])
    if saved.get("format") not in (1, FORMAT) or "state_dicts" not in saved:
        raise InvalidArgumentError(f"{path} is not a pattern CNN file this attnstore reads (format {saved.get('format')!r})")
    names = list(saved.get("scalars", []))
    if names and names != list(SCALARS):
        raise InvalidArgumentError(f"{path} takes other map scalars ({names}); retrain it with `attnstore patterns train-cnn`")
    models = []
    for state in saved["state_dicts"]:
        model = build_model(size=saved["size"], width=saved["width"], channels=saved["channels"], n_scalars=len(names))
        if "scalar_mean" not in state:
            state = dict(state, scalar_mean=torch.zeros(0), scalar_scale=torch.ones(0))
        model.load_state_dict(state)
        model.eval()
        models.append(model)
    return models, saved


def inputs_for(saved: dict, maps: np.ndarray, special: np.ndarray, segment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """map_inputs as the saved networks were trained on them."""
    return map_inputs(maps, special, segment, saved["size"], saved["masks"], scalars=bool(saved.get("scalars")))
