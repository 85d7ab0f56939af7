"""K1 (issue 26): does the pattern CNN hold on held-out maps of a labeller whose labels did not train it?

Two labellers (PAIR, e.g. model:llm-3 and model:llm-4) labelled the same random maps independently. The
maps are cut in two halves (stratified by the test labeller's labels, seeded). For each direction (train on one
of the pair, test on the other) and each half: the CNN (as `attnstore patterns train-cnn` builds it: picture +
map scalars, MEMBERS networks averaged) is trained on every label of the --source labellers (maps of the pair
excluded) plus the training labeller's labels of the other half, and scored on the test labeller's labels of
this half: maps no label of which was trained on, labelled by a labeller whose labels did not train it. Scores are
pooled over the two halves of each direction; the rules (module thresholds) and the other labeller are scored on
the same maps for comparison.

    .venv/bin/python scripts/pattern_crossfit.py --home STORE --source model:llm-1 --source model:llm-2 \\
        --pair model:llm-3 model:llm-4 [--seed 0] [--members 5] [--output crossfit.json]

Deterministic for a seed (the networks are trained as train-cnn trains them). Needs the ingest extra (torch).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from attnstore.api.common import open_store, resolve_locations
from attnstore.api.pattern_report import labeller_scores
from attnstore.queries import pattern_cnn as cnn
from attnstore.queries.patterns import CLASSES, labelled_maps, labels_from_scores, stratified_split
from attnstore.store.errors import AttnStoreError


def load(store, source: str):
    frame, maps = labelled_maps(store, source)
    pictures, scalars = cnn.stack_inputs([cnn.map_inputs(a[None], s, g) for a, s, g in maps])
    keys = [tuple(k) for k in frame[cnn.MAP_KEY].itertuples(index=False)]
    return dict(frame=frame, pictures=pictures, scalars=scalars, keys=keys, labels=frame["label"].to_numpy(object))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home")
    parser.add_argument("--db")
    parser.add_argument("--root")
    parser.add_argument("--source", action="append", default=[], help="Labels always trained on (repeatable).")
    parser.add_argument("--pair", nargs=2, required=True, metavar=("A", "B"), help="Two labellers of the same maps.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--members", type=int, default=cnn.MEMBERS)
    parser.add_argument("--epochs", type=int, default=cnn.EPOCHS)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    a, b = args.pair
    if a == b or {a, b} & set(args.source):
        raise SystemExit(f"--pair needs two labellers other than each other and the --source ones, not {a} and {b}")
    store = open_store(resolve_locations(db=args.db, root=args.root, home=args.home))
    try:
        data = {s: load(store, s) for s in [*args.source, *args.pair]}
    except AttnStoreError as exc:  # e.g. a source with no labels: one line, not a traceback
        raise SystemExit(f"error: {exc}") from None
    shared = set(data[a]["keys"]) & set(data[b]["keys"])
    if not shared:
        raise SystemExit(f"{a} and {b} labelled no map in common")
    base = [s for s in args.source]
    out: dict = dict(sources=base, pair=[a, b], seed=args.seed, members=args.members, n_shared_maps=len(shared), directions=[])
    names = np.array(CLASSES, dtype=object)
    for train, test in ((a, b), (b, a)):
        t = data[test]
        in_pair = np.array([k in shared for k in t["keys"]])
        fold = np.zeros(len(t["keys"]), dtype=bool)  # True: the first half
        fold[np.flatnonzero(in_pair)[stratified_split(t["labels"][in_pair], 0.5, args.seed)]] = True
        half_of = {k: bool(f) for k, f, p in zip(t["keys"], fold, in_pair) if p}
        true, cnn_pred, rules_pred, other = [], [], [], []
        for half in (True, False):
            parts = []
            for source in base:
                d = data[source]
                keep = np.array([k not in shared for k in d["keys"]])
                parts.append((d["pictures"][keep], d["scalars"][keep], d["labels"][keep]))
            d = data[train]
            keep = np.array([half_of.get(k) is (not half) for k in d["keys"]])
            parts.append((d["pictures"][keep], d["scalars"][keep], d["labels"][keep]))
            y = np.array([CLASSES.index(label) for label in np.concatenate([p[2] for p in parts])])
            models = cnn.train_ensemble(
                np.concatenate([p[0] for p in parts]),
                np.concatenate([p[1] for p in parts]),
                y,
                seed=args.seed,
                members=args.members,
                epochs=args.epochs,
            )
            test_rows = np.array([half_of.get(k) is half for k in t["keys"]])
            true.append(t["labels"][test_rows])
            cnn_pred.append(names[cnn.predict(models, t["pictures"][test_rows], t["scalars"][test_rows])[0]])
            rules_pred.append(labels_from_scores(t["frame"][test_rows]))
            by_key = dict(zip(data[train]["keys"], data[train]["labels"]))
            other.append(np.array([by_key[k] for k, r in zip(t["keys"], test_rows) if r], dtype=object))
            print(
                f"trained on {'+'.join(base)} + {train} (other half): {len(y)} labels; tested on {test}: {test_rows.sum()} maps", flush=True
            )
        true_all = np.concatenate(true)
        row = dict(train=train, test=test, n=len(true_all))
        for name, predicted in (("cnn", cnn_pred), ("rules", rules_pred), (f"labeller {train}", other)):
            scores = labeller_scores(true_all, np.concatenate(predicted))
            row[name] = {k: v for k, v in scores.items() if k != "confusion"} | dict(confusion=np.asarray(scores["confusion"]).tolist())
            print(
                f"  {test} labels, {name}: macro-F1 (4 classes) {scores['macro_f1_four']:.3f}, accuracy {scores['accuracy']:.3f}",
                flush=True,
            )
        out["directions"].append(row)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1, default=float)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
