"""K1 (Kovaleva et al. 2019, Sec 4.1): the pattern CNN (queries/pattern_cnn.py) trained on the labels kept in a store
(`attnstore patterns train-cnn`) and run over a run's maps (`attnstore patterns classify --classifier cnn`).

Labels of several labellers can be trained on together (sources); a map labelled by more than one is held out, or
trained on, with all its labels (`split_by_map`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..store.errors import InvalidArgumentError
from .pattern_cnn import (
    EPOCHS,
    MAP_KEY,
    MEMBERS,
    SCALARS,
    SIZE,
    WIDTH,
    inputs_for,
    load_model,
    map_inputs,
    predict,
    save_model,
    stack_inputs,
    train_ensemble,
)
from .patterns import CLASSES, THRESHOLDS, evaluate, labelled_maps, labels_from_scores, sample_examples, stratified_split, token_layout

if TYPE_CHECKING:
    from ..store import Store


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


def labelled_sources(store: Store, sources) -> tuple[pd.DataFrame, list]:
    """labelled_maps of every source, in the order given, with a `source` column; a map may appear once per source."""
    frames, maps = [], []
    for source in sources:
        frame, these = labelled_maps(store, source)
        frames.append(frame.assign(source=source))
        maps += these
    return pd.concat(frames, ignore_index=True), maps


def split_by_map(frame: pd.DataFrame, test_fraction: float, seed: int) -> np.ndarray:
    """Held-out mask over the rows: stratified_split over the distinct maps (by MAP_KEY, each with its first
    label), so a map labelled by several labellers is wholly held out or wholly trained on. With one label per
    map it is stratified_split over the rows."""
    keys = list(map(tuple, frame[MAP_KEY].itertuples(index=False)))
    first: dict[tuple, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    distinct = list(first)
    held = stratified_split(frame["label"].to_numpy(object)[[first[k] for k in distinct]], test_fraction, seed)
    held_keys = {k for k, h in zip(distinct, held) if h}
    return np.array([k in held_keys for k in keys], dtype=bool)


def train_from_store(
    store: Store,
    out: str | Path,
    *,
    sources=("human",),
    test_fraction: float = 0.25,
    seed: int = 0,
    epochs: int = EPOCHS,
    size: int = SIZE,
    width: int = WIDTH,
    masks: bool = False,
    scalars: bool = True,
    members: int = MEMBERS,
) -> dict:
    """Train on the stored labels of `sources` (one or more) with a seeded stratified held-out part (split_by_map);
    evaluate the CNN and the rules (module thresholds) on the same held-out maps. Writes the networks + split to
    `out` and the report to `out` with suffix .json; returns the report. Deterministic: the same labels, store and
    seed give the same weights, bit for bit, and the same report (it holds no timing)."""
    import torch

    sources = [sources] if isinstance(sources, str) else list(dict.fromkeys(sources))
    if not sources:
        raise InvalidArgumentError("give at least one label source")
    frame, maps = labelled_sources(store, sources)
    held_out = split_by_map(frame, test_fraction, seed)
    pictures, numbers = stack_inputs([map_inputs(attn[None], special, segment, size, masks, scalars) for attn, special, segment in maps])
    y = np.array([CLASSES.index(label) for label in frame["label"]])
    models = train_ensemble(
        pictures[~held_out], numbers[~held_out], y[~held_out], seed=seed, members=members, epochs=epochs, size=size, width=width
    )
    cnn_test, _ = predict(models, pictures[held_out], numbers[held_out])
    cnn_train, _ = predict(models, pictures[~held_out], numbers[~held_out])
    rules = labels_from_scores(frame)
    true = frame["label"].to_numpy(object)
    names = np.array(CLASSES, dtype=object)
    report = dict(
        source="+".join(sources),
        sources=sources,
        seed=seed,
        test_fraction=test_fraction,
        epochs=epochs,
        size=size,
        width=width,
        masks=masks,
        scalars=list(SCALARS) if scalars else [],
        members=members,
        n_labels=len(frame),
        n_maps=int(frame[MAP_KEY].drop_duplicates().shape[0]),
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
    split = frame[["source", "run", "model", "dataset", "split", "example", "source_row", "layer", "head", "label"]].assign(
        part=np.where(held_out, "test", "train")
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_model(
        models,
        out,
        size=size,
        width=width,
        masks=masks,
        scalars=scalars,
        extra=dict(
            split=split.astype({"example": int, "source_row": int, "layer": int, "head": int}).to_dict("list"),
            report=json.loads(json.dumps(report)),
        ),
    )
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def format_report(report: dict) -> str:
    """The held-out comparison as plain text: macro-F1, per-class F1 and confusion matrices."""
    members = report.get("members", 1)
    inputs = "picture" + (" + masks" if report.get("masks") else "") + (" + map scalars" if report.get("scalars") else "")
    lines = [
        f"{report['n_labels']} labels ({report['source']}): {report['n_train']} train, {report['n_test']} held out "
        f"(seed {report['seed']}); CNN: {members} network(s) averaged, {inputs}, trained {report['epochs']} epochs"
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

    Columns: example, layer, head, label, confidence (the averaged softmax probability of the label).
    save=True stores them in pattern_labels with source "cnn".
    """
    models, saved = load_model(model_file)
    info = store.run_info(run)
    chosen = sample_examples(store, info, examples, max_examples, seed)
    layout = token_layout(store, info)
    layer, head = np.meshgrid(np.arange(info.n_layers), np.arange(info.n_heads), indexing="ij")
    parts = []
    for example, maps in store.iter_attention(info.id, chosen):
        special, segment = layout[example]
        flat = maps.reshape(-1, *maps.shape[-2:])
        idx, p = predict(models, *inputs_for(saved, flat, special, segment))
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
