"""The labelling workflow of Kovaleva et al. K1: draw a sample of maps, render it, import and export labels, Fig 2.

A label file is JSON Lines, one map per line, keyed independently of any store's ids:

    {"model": "all-MiniLM-L6-v2", "dataset": "glue/MRPC", "split": "dev", "source_row": 17,
     "layer": 3, "head": 7, "label": "vertical", "labeller": "..."}

`source_row` is the example's row in the original corpus (examples.source_index where the corpus
numbers its rows, else the example's position). Importing writes pattern_labels rows with
source "human" (or the source given) for every run of the store over that model, dataset and split.

Who labelled is kept in the source, whose kind says what labelled: `human:NAME` holds the labels of a
person NAME (`labeller_source`; the web viewer's labelling page, `attnstore serve --allow-save`, /label,
writes its labellers' that way), `human` a person's labels imported without a name, and `model:NAME`
labels a model gave when shown the maps (the labels shipped in docs/results/pattern_labels/ are
`model:llm-1` to `model:llm-4`: four runs of a language model, see the README there). Several
labellers can label the same map. Every labeller's label, imported or given on the labelling page,
is written by `save_labels`. `next_map` picks the map a labeller should label next.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..queries.patterns import CLASSES, labels_of
from ..store.errors import InvalidArgumentError, NotFoundError

if TYPE_CHECKING:
    from ..store import Store

KEY = ("model", "dataset", "split", "source_row", "layer", "head")
FIELDS = (*KEY, "label", "labeller")
HUMAN = "human"
MODEL = "model"  # labels a model gave (a language model shown the rendered maps), not a person
LABELLER_KINDS = (HUMAN, MODEL)
LABELLER_MAX = 64 - len(HUMAN) - 1  # pattern_labels.source is 64 characters


# ---------------------------------------------------------------- who labelled, and writing labels


def labeller_source(labeller: str) -> str:
    """The pattern_labels source of a labeller's labels: "human:NAME" (NAME stripped; 1 to 58 printable characters)."""
    name = (labeller or "").strip()
    if not name or len(name) > LABELLER_MAX or not name.isprintable():
        raise InvalidArgumentError(f"a labeller's name is 1 to {LABELLER_MAX} printable characters, not {labeller!r}")
    return f"{HUMAN}:{name}"


def labeller_of(source: str) -> str | None:
    """NAME for a source "human:NAME" or "model:NAME", else None."""
    kind, _, name = source.partition(":")
    return name if kind in LABELLER_KINDS and name else None


def is_labeller_source(source: str, kinds=LABELLER_KINDS) -> bool:
    """Whether `source` holds a labeller's labels of one of `kinds`: "human", "human:NAME" or "model:NAME"
    (not a classifier's, such as "rules" or "cnn")."""
    kind, colon, name = source.partition(":")
    if kind not in kinds:
        return False
    return bool(name) if colon else kind == HUMAN


def save_labels(store: Store, rows: pd.DataFrame, source: str = HUMAN) -> int:
    """Write pattern labels (columns run, example, layer, head, label) given by a labeller: each label must be one of
    CLASSES; then all rows or none (Store.save_pattern_labels checks every row first). Returns the rows written."""
    unknown = sorted(set(rows["label"]) - set(CLASSES))
    if unknown:
        raise InvalidArgumentError(f"unknown label(s) {unknown}; expected one of {', '.join(CLASSES)}")
    return store.save_pattern_labels(rows[["run", "example", "layer", "head", "label"]], source=source)


# ---------------------------------------------------------------- sample and render


def draw_sample(store: Store, runs: list[str], n: int, seed: int = 0) -> pd.DataFrame:
    """A seeded sample of n (run, example, layer, head) maps, spread evenly over runs, layers and heads.

    The n maps are shared out over the runs as evenly as possible; within a run, (layer, head)
    slots follow successive random permutations of all the model's heads (so every head appears
    once before any appears twice), each with an example drawn at random (numpy default_rng(seed)),
    never the same map twice. Columns: id, run, model, dataset, split, source_row, example, layer, head.
    """
    if n < 1:
        raise InvalidArgumentError(f"--n must be at least 1, not {n}")
    if not runs:
        raise InvalidArgumentError("give at least one --run")
    rng = np.random.default_rng(seed)
    rows = []
    shares = [n // len(runs) + (i < n % len(runs)) for i in range(len(runs))]
    for run, share in zip(runs, shares):
        info = store.run_info(run)
        stored = store.example_rows(info.id)
        stored = stored[~stored["skipped"]].reset_index(drop=True)
        if stored.empty:
            raise NotFoundError(f"run {info.name!r} has no stored examples to sample")
        n_heads = info.n_layers * info.n_heads
        if share > len(stored) * n_heads:
            raise InvalidArgumentError(f"run {info.name!r} has only {len(stored) * n_heads} maps; ask for fewer")
        slots = np.concatenate([rng.permutation(n_heads) for _ in range(-(-share // n_heads))])[:share]
        seen: set[tuple[int, int]] = set()
        for slot in slots:
            while True:
                i = int(rng.integers(len(stored)))
                if (i, int(slot)) not in seen:
                    break
            seen.add((i, int(slot)))
            row = stored.iloc[i]
            rows.append(
                dict(
                    run=info.name,
                    model=info.model,
                    dataset=info.dataset,
                    split=info.split,
                    source_row=int(row["source_row"]),
                    example=int(row["example"]),
                    layer=int(slot) // info.n_heads,
                    head=int(slot) % info.n_heads,
                )
            )
    order = rng.permutation(len(rows))  # mix runs and heads over the pages
    frame = pd.DataFrame([rows[i] for i in order])
    frame.insert(0, "id", [f"s{seed}-{i:04d}" for i in range(len(frame))])
    return frame


def render_sample(store: Store, sample: pd.DataFrame, out: str | Path, rows: int = 4, cols: int = 5, gamma: float = 1.0) -> list[str]:
    """Write the sample as PNG pages of rows x cols maps and a sample.jsonl manifest; returns the file names.

    Each panel is titled with the map's id and its length L; axes are "key" (columns) and
    "query" (rows); special tokens ([CLS]-, [SEP]-like, from the tokenizer's roles) are marked
    by red ticks on both axes. Darker is more attention, on a linear scale from 0 to the map's
    maximum (printed in the title): linear as in the paper's Fig 1 (gamma 1), or (a / max) ** gamma
    for gamma < 1 to bring out weaker structure.
    """
    if not 0 < gamma <= 1:
        raise InvalidArgumentError(f"gamma must be in (0, 1], not {gamma}")
    from matplotlib.colors import PowerNorm

    from ..store.plot import new_figure

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    per_page = rows * cols
    sample = sample.reset_index(drop=True).copy()
    sample["page"] = sample.index // per_page + 1
    sample["panel"] = sample.index % per_page + 1
    names = []
    for page, part in sample.groupby("page"):
        fig = new_figure(figsize=(cols * 2.6, rows * 2.75))
        axes = fig.subplots(rows, cols, squeeze=False)
        for ax in np.ravel(axes):
            ax.set_axis_off()
        for ax, item in zip(np.ravel(axes), part.itertuples()):
            attn = store.attention(item.run, item.example, layer=item.layer, head=item.head)[0, 0].astype(np.float64)
            special = store.tokens(item.run, item.example)["is_special"].to_numpy(bool)
            ax.set_axis_on()
            ax.imshow(attn, cmap="Greys", norm=PowerNorm(gamma, vmin=0.0, vmax=max(float(attn.max()), 1e-9)), interpolation="nearest")
            pad = max(1.0, 0.02 * len(attn))  # a margin, so the first and last columns are not hidden under the frame
            ax.set_xlim(-0.5 - pad, len(attn) - 0.5 + pad)
            ax.set_ylim(len(attn) - 0.5 + pad, -0.5 - pad)
            for spine in ax.spines.values():
                spine.set_color("0.75")
            marks = np.flatnonzero(special)
            ax.set_xticks(marks, labels=[""] * len(marks))
            ax.set_yticks(marks, labels=[""] * len(marks))
            ax.tick_params(colors="red", length=7, width=2)
            ax.set_xlabel("key", fontsize=7, labelpad=1)
            ax.set_ylabel("query", fontsize=7, labelpad=1)
            ax.set_title(f"{item.id}  L={attn.shape[0]}  max {attn.max():.2f}", fontsize=8)
        scale = "linear" if gamma == 1 else f"(a / max) ** {gamma:g}"
        fig.suptitle(
            f"attention maps, page {page} (darker = more attention; {scale} from 0 to the map's max; red ticks: special tokens)", fontsize=9
        )
        name = f"page_{page:03d}.png"
        fig.savefig(out / name, dpi=90)
        names.append(name)
    with open(out / "sample.jsonl", "w", encoding="utf-8") as fh:
        for item in sample.to_dict("records"):
            fh.write(json.dumps({k: (int(v) if isinstance(v, np.integer) else v) for k, v in item.items()}) + "\n")
    return [*names, "sample.jsonl"]


# ---------------------------------------------------------------- import and export


def read_label_file(path: str | Path) -> list[dict]:
    """Parse and check a label file; a bad line raises InvalidArgumentError naming PATH:LINE."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotFoundError(f"no label file {path}") from None
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(f"{path}: not valid UTF-8 ({exc.reason})") from None
    items: list[dict] = []
    seen: dict[tuple, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path.name}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"{where}: not a JSON object ({exc.msg})") from None
        if not isinstance(item, dict):
            raise InvalidArgumentError(f"{where}: not a JSON object")
        missing = [f for f in FIELDS if f not in item]
        if missing:
            raise InvalidArgumentError(f"{where}: missing {', '.join(missing)}")
        for f in ("model", "dataset", "split", "labeller"):
            if not isinstance(item[f], str) or not item[f]:
                raise InvalidArgumentError(f"{where}: {f} must be a non-empty string, not {item[f]!r}")
        for f in ("source_row", "layer", "head"):
            if isinstance(item[f], bool) or not isinstance(item[f], int) or item[f] < 0:
                raise InvalidArgumentError(f"{where}: {f} must be a non-negative integer, not {item[f]!r}")
        if item["label"] not in CLASSES:
            raise InvalidArgumentError(f"{where}: unknown label {item['label']!r}; expected one of {', '.join(CLASSES)}")
        key = tuple(item[f] for f in KEY)
        if key in seen:
            raise InvalidArgumentError(f"{where}: the same map as line {seen[key]}")
        seen[key] = number
        items.append(dict(item, line=number))
    if not items:
        raise InvalidArgumentError(f"{path.name}: no labels")
    return items


def match_labels(store: Store, items: list[dict], path_name: str = "labels") -> pd.DataFrame:
    """Rows (run, example, layer, head, label, line) for every run of the store over each label's model, dataset
    and split that stores its source row; a label that matches nothing raises InvalidArgumentError naming its line."""
    runs = store.runs()
    index: dict[tuple, list] = {}
    for run in runs.itertuples():
        index.setdefault((run.model, run.dataset, run.split), []).append(run)
    rows_of: dict[str, dict[int, int]] = {}
    out = []
    for item in items:
        where = f"{path_name}:{item['line']}"
        candidates = index.get((item["model"], item["dataset"], item["split"]), [])
        if not candidates:
            raise InvalidArgumentError(f"{where}: no run of model {item['model']!r} over {item['dataset']}:{item['split']} in this store")
        matched = False
        for run in candidates:
            if item["layer"] >= run.n_layers or item["head"] >= run.n_heads:
                raise InvalidArgumentError(
                    f"{where}: layer {item['layer']}, head {item['head']} is out of range for run "
                    f"{run.run!r} ({run.n_layers} layers x {run.n_heads} heads)"
                )
            if run.run not in rows_of:
                stored = store.example_rows(run.run)
                stored = stored[~stored["skipped"]]
                rows_of[run.run] = dict(zip(stored["source_row"].astype(int), stored["example"].astype(int)))
            example = rows_of[run.run].get(item["source_row"])
            if example is not None:
                matched = True
                out.append(
                    dict(run=run.run, example=example, layer=item["layer"], head=item["head"], label=item["label"], line=item["line"])
                )
        if not matched:
            names = ", ".join(r.run for r in candidates)
            raise InvalidArgumentError(f"{where}: source row {item['source_row']} is not a stored example of run(s) {names}")
    return pd.DataFrame(out, columns=["run", "example", "layer", "head", "label", "line"])


def import_labels(store: Store, path: str | Path, source: str = "human") -> pd.DataFrame:
    """Check every line of a label file, then save all of it (or nothing) to pattern_labels; returns the rows saved."""
    items = read_label_file(path)
    rows = match_labels(store, items, Path(path).name)
    save_labels(store, rows, source=source)
    return rows


def export_labels(store: Store, source: str = "human", labeller: str | None = None, run: str | None = None) -> list[dict]:
    """Stored labels of `source` as label-file records (one per map: a map stored by several runs of the same
    model, dataset and split is written once), sorted by model, dataset, split, source_row, layer, head.

    `labeller` names who labelled (default: NAME for a source "human:NAME" or "model:NAME", "unknown" for "human",
    else the source)."""
    frame = store.pattern_labels(run, source=source)
    if frame.empty:
        return []
    who = labeller or labeller_of(source) or ("unknown" if source == HUMAN else source)
    frame = frame.drop_duplicates(subset=list(KEY)).sort_values(list(KEY))
    return [
        dict(
            model=r.model,
            dataset=r.dataset,
            split=r.split,
            source_row=int(r.source_row),
            layer=int(r.layer),
            head=int(r.head),
            label=r.label,
            labeller=who,
        )
        for r in frame.itertuples()
    ]


# ---------------------------------------------------------------- the next map to label


def labellers(store: Store, kinds=(HUMAN,)) -> pd.DataFrame:
    """Every label source of a labeller of `kinds` (default: people's, "human" and "human:NAME"; with MODEL too,
    "model:NAME") with its labeller and count: columns source, labeller, n_labels."""
    frame = store.pattern_labels()
    frame = frame[np.array([is_labeller_source(s, kinds) for s in frame["source"]], dtype=bool)]
    counts = frame.groupby("source").size()
    return pd.DataFrame(
        dict(source=counts.index, labeller=[labeller_of(s) or "(unnamed)" for s in counts.index], n_labels=counts.to_numpy())
    )


def next_map(
    store: Store,
    labeller: str,
    *,
    run: str | None = None,
    skip: set[tuple[str, int, int, int]] | frozenset = frozenset(),
    max_length: int = 512,
    max_examples: int = 200,
    seed: int = 0,
) -> dict | None:
    """The next map for `labeller`: one they have not labelled (nor `skip`: (run, example, layer, head)), of `run` or
    of any complete run, no longer than `max_length` tokens; None when there is none.

    Where a run has CNN labels (source "cnn", from `attnstore patterns classify --classifier cnn --save`), maps
    whose CNN label differs from the rules' come first: the labels most worth having. Order: runs by id, examples
    in a default_rng(seed) permutation (the same for every labeller, so that their labels overlap), heads in
    layer-head order; at most `max_examples` examples are read per run looking for a disagreement.
    Returns run, example, layer, head, length, tokens, special, attention (L x L float64), rules, cnn (None
    where the run has no CNN label), cnn_confidence, disagree and why ("rules and CNN disagree" or "unlabelled").
    """
    from ..queries.patterns import classify_maps, token_layout

    source = labeller_source(labeller)
    runs = store.runs()
    if run is not None:
        runs = runs[runs["run_id"] == store.run_info(run).id]
    else:
        runs = runs[runs["status"] == "complete"]
    for row in runs.sort_values("run_id").itertuples():
        info = store.run_info(int(row.run_id))
        stored = store.example_rows(info.id)
        stored = stored[~stored["skipped"] & (stored["length"] <= max_length)]
        if stored.empty:
            continue
        done = store.pattern_labels(info.id, source=source)
        taken = set(zip(done["example"].astype(int), done["layer"].astype(int), done["head"].astype(int)))
        taken |= {(e, la, h) for r, e, la, h in skip if r == info.name}
        order = stored["example"].to_numpy(np.int64)[np.random.default_rng(seed).permutation(len(stored))]
        cnn = store.pattern_labels(info.id, source="cnn")
        heads = [(la, h) for la in range(info.n_layers) for h in range(info.n_heads)]
        if not cnn.empty:
            by_example = {int(e): part for e, part in cnn.groupby("example")}
            layouts = None
            for example in [int(e) for e in order if int(e) in by_example][:max_examples]:
                if all((example, la, h) in taken for la, h in heads):
                    continue
                layouts = layouts or token_layout(store, info)
                maps = store.attention(info.id, example)
                rules = classify_maps(maps, *layouts[example])
                for item in by_example[example].itertuples():
                    key = (example, int(item.layer), int(item.head))
                    if key not in taken and item.label != rules[key[1], key[2]]:
                        rule = str(rules[key[1], key[2]])
                        return _map_item(store, info, example, key[1], key[2], maps[key[1], key[2]], rule, item, "rules and CNN disagree")
        for example in (int(e) for e in order):
            for la, h in heads:
                if (example, la, h) not in taken:
                    maps = store.attention(info.id, example, layer=la, head=h)
                    special, segment = token_layout(store, info, [example])[example]
                    rules = classify_maps(maps, special, segment)[0, 0]
                    item = None
                    if not cnn.empty:
                        match = cnn[(cnn["example"] == example) & (cnn["layer"] == la) & (cnn["head"] == h)]
                        item = next(match.itertuples(), None)
                    return _map_item(store, info, example, la, h, maps[0, 0], str(rules), item, "unlabelled")
    return None


def _map_item(store: Store, info, example: int, layer: int, head: int, attn: np.ndarray, rules: str, cnn_row, why: str) -> dict:
    tokens = store.tokens(info.id, example)
    cnn = None if cnn_row is None else str(cnn_row.label)
    return dict(
        run=info.name,
        run_id=info.id,
        example=int(example),
        layer=int(layer),
        head=int(head),
        length=int(attn.shape[-1]),
        tokens=[str(t) for t in tokens["token"]],
        special=[bool(x) for x in tokens["is_special"]],
        attention=np.asarray(attn, dtype=np.float64),
        rules=rules,
        cnn=cnn,
        cnn_confidence=None if cnn_row is None or pd.isna(cnn_row.confidence) else float(cnn_row.confidence),
        disagree=cnn is not None and cnn != rules,
        why=why,
    )


# ---------------------------------------------------------------- Fig 2


def task_name(dataset: str) -> str:
    """'glue/MRPC' -> 'MRPC'."""
    return dataset.rsplit("/", 1)[-1]


def proportions_table(store: Store, runs: list[str], source: str, max_examples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per run: task, run, n_examples, n_maps and the fraction of maps in each class."""
    rows = []
    for run in runs:
        info = store.run_info(run)
        labels = labels_of(store, info, source, max_examples=max_examples, seed=seed)
        counts = labels["label"].value_counts().reindex(list(CLASSES), fill_value=0)
        rows.append(
            dict(
                task=task_name(info.dataset),
                run=info.name,
                model=info.model,
                split=info.split,
                n_examples=int(labels["example"].nunique()),
                n_maps=int(counts.sum()),
                **{c: float(counts[c] / counts.sum()) for c in CLASSES},
            )
        )
    return pd.DataFrame(rows)


COLOURS = {
    "vertical": "tab:blue",
    "diagonal": "tab:orange",
    "vertical+diagonal": "tab:green",
    "block": "tab:red",
    "heterogeneous": "tab:grey",
}


def figure_proportions(
    table: pd.DataFrame,
    out: str | Path,
    source: str,
    max_examples: int,
    stem: str = "fig2_pattern_classes",
) -> list[str]:
    """Fig 2: stacked bars of class shares per task (PNG and SVG) and the table as CSV; returns the file names."""
    from ..store.plot import new_figure

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fig = new_figure(figsize=(1.3 * len(table) + 3.5, 4.5))
    ax = fig.subplots()
    bottom = np.zeros(len(table))
    x = np.arange(len(table))
    for cls in CLASSES:
        values = table[cls].to_numpy() * 100
        ax.bar(x, values, bottom=bottom, color=COLOURS[cls], label=cls, width=0.7)
        for xi, b, v in zip(x, bottom, values):
            if v >= 4:
                ax.text(float(xi), b + v / 2, f"{v:.0f}", ha="center", va="center", fontsize=8, color="white")
        bottom += values
    ax.set_xticks(x, labels=table["task"])
    ax.set(xlabel="task (dev set)", ylabel="% of (example, layer, head) maps", ylim=(0, 100))
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    models = ", ".join(sorted(set(table["model"])))
    ax.set_title(
        f"Attention pattern classes per task — {models} on GLUE dev\n(≤ {max_examples} examples per task; classifier: {source})",
        fontsize=10,
    )
    names = []
    for ext in ("png", "svg"):
        fig.savefig(out / f"{stem}.{ext}", dpi=150, bbox_inches="tight")
        names.append(f"{stem}.{ext}")
    table.to_csv(out / f"{stem}.csv", index=False, float_format="%.4f")
    return [*names, f"{stem}.csv"]
