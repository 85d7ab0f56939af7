"""`attnstore patterns`: attention-pattern classes (Kovaleva et al. K1) — label maps, train and run classifiers, Fig 2.

Thin: sampling, rendering and label files are in api/pattern_labels.py, the rules in
queries/patterns.py, the CNN (torch, imported only by the commands that need it) in
queries/pattern_cnn.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from .common import FORMATS, emit, friendly_errors, open_store, store_options, write_output


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.ClickException("figures need matplotlib: pip install 'attnstore[report]'") from None


@click.group(short_help="Attention-pattern classes: label, train, classify, plot.")
def patterns():
    """Attention-pattern classes (Kovaleva et al. Sec 4.1): label maps, train and run classifiers, Fig 2."""


@patterns.command("render", short_help="Draw a sample of maps as PNG pages to label.")
@click.option("--run", "runs", required=True, multiple=True, help="Run to sample from (repeatable: the sample is spread over runs).")
@click.option("--n", "n", default=100, show_default=True, type=int, help="Number of maps.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output folder (PNG pages + sample.jsonl).")
@click.option("--rows", default=4, show_default=True, type=int, help="Panels per page, vertically.")
@click.option("--cols", default=5, show_default=True, type=int, help="Panels per page, horizontally.")
@click.option("--gamma", default=1.0, show_default=True, type=float, help="Colour scale (a / max) ** GAMMA; 1 is linear.")
@store_options
@friendly_errors
def render(locations, runs, n, seed, out, rows, cols, gamma):
    """Draw a seeded sample of maps spread over runs, layers and heads; write PNG pages and sample.jsonl to label."""
    _need_matplotlib()
    from .pattern_labels import draw_sample, render_sample

    store = open_store(locations)
    names = render_sample(store, draw_sample(store, list(runs), n, seed), out, rows=rows, cols=cols, gamma=gamma)
    click.echo(f"wrote {len(names) - 1} page(s) and sample.jsonl ({n} maps) to {out}")


@patterns.command("import", short_help="Load a JSON Lines label file into pattern_labels.")
@click.argument("labels", type=click.Path(dir_okay=False))
@click.option(
    "--source",
    default="human",
    show_default=True,
    help="pattern_labels source to write: human, human:NAME (a person's labels), model:NAME (labels a model gave).",
)
@store_options
@friendly_errors
def import_(locations, labels, source):
    """Load a JSON Lines label file into pattern_labels (all lines or none; a bad line is named)."""
    from .pattern_labels import import_labels

    rows = import_labels(open_store(locations, write=True), labels, source=source)
    click.echo(
        f"imported {rows['line'].nunique()} label(s) as {len(rows)} pattern_labels row(s) over "
        f"{rows['run'].nunique()} run(s) (source {source!r})"
    )


@patterns.command("export", short_help="Write stored pattern labels as JSON Lines.")
@click.option("--source", default="human", show_default=True, help="Which labels: human, human:NAME, model:NAME, rules, cnn, ...")
@click.option("--run", default=None, help="Only this run's labels.")
@click.option("--labeller", default=None, help="Name written as labeller (the store keeps none; default unknown / the source).")
@click.option("--output", default=None, type=click.Path(dir_okay=False), help="Write to a file instead of stdout.")
@store_options
@friendly_errors
def export(locations, source, run, labeller, output):
    """Write stored pattern labels as a JSON Lines label file (the format `patterns import` reads)."""
    from .pattern_labels import export_labels

    records = export_labels(open_store(locations), source=source, labeller=labeller, run=run)
    text = "".join(json.dumps(r) + "\n" for r in records)
    if output:
        write_output(output, text)
        click.echo(f"wrote {len(records)} label(s) to {output}", err=True)
    else:
        click.echo(text, nl=False)


@patterns.command("calibrate", short_help="Tune the rule thresholds on stored labels.")
@click.option("--source", default="human", show_default=True, help="Labels to calibrate on.")
@click.option("--test-fraction", default=0.25, show_default=True, type=float)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the stratified split (the CNN's too).")
@store_options
@friendly_errors
def calibrate(locations, source, test_fraction, seed):
    """Grid-search the rule thresholds on the training part of stored labels; report both parts."""
    from ..queries.patterns import THRESHOLDS, calibrate, evaluate, labelled_scores, labels_from_scores, stratified_split

    data = labelled_scores(open_store(locations), source)
    held_out = stratified_split(data["label"], test_fraction, seed)
    train = data[~held_out]
    best, train_f1 = calibrate(train, train["label"])
    for name, thresholds in (("module constants", THRESHOLDS), ("grid optimum", best)):
        predicted = labels_from_scores(data, thresholds)
        tr = evaluate(data["label"][~held_out], predicted[~held_out])
        te = evaluate(data["label"][held_out], predicted[held_out])
        shown = ", ".join(f"{k}={v:g}" for k, v in thresholds.items())
        click.echo(
            f"{name}: {shown}\n  train macro-F1 {tr['macro_f1']:.3f} (n={tr['n']}), "
            f"held-out macro-F1 {te['macro_f1']:.3f} accuracy {te['accuracy']:.3f} (n={te['n']})"
        )


@patterns.command("train-cnn", short_help="Train the pattern CNN on stored labels.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Weights file to write (.pt); a .json report beside it.")
@click.option(
    "--source",
    "sources",
    multiple=True,
    default=("human",),
    show_default=True,
    help="Labels to train on: human, human:NAME, model:NAME (repeatable: several labellers' labels together).",
)
@click.option("--test-fraction", default=0.25, show_default=True, type=float)
@click.option("--seed", default=0, show_default=True, type=int, help="Seeds the split, the initialisation and the batches.")
@click.option("--epochs", default=60, show_default=True, type=int)
@click.option("--size", default=32, show_default=True, type=int, help="Maps are pooled to SIZE x SIZE (a multiple of 8).")
@click.option("--masks/--no-masks", default=False, show_default=True, help="Also give the network special-token and own-segment channels.")
@click.option(
    "--scalars/--no-scalars", default=True, show_default=True, help="Also give the network each map's rule scores, length and peak."
)
@click.option(
    "--members",
    default=5,
    show_default=True,
    type=click.IntRange(1, 50),
    help="Networks trained (seeds SEED, SEED+1, ...) and averaged.",
)
@store_options
@friendly_errors
def train_cnn(locations, out, sources, test_fraction, seed, epochs, size, masks, scalars, members):
    """Train the pattern CNN on stored labels (CPU); report held-out F1 of the CNN and of the rules on the same maps."""
    import time

    from ..queries.pattern_cnn_store import format_report, train_from_store

    started = time.perf_counter()
    report = train_from_store(
        open_store(locations),
        out,
        sources=sources,
        test_fraction=test_fraction,
        seed=seed,
        epochs=epochs,
        size=size,
        masks=masks,
        scalars=scalars,
        members=members,
    )
    click.echo(format_report(report))
    click.echo(f"({time.perf_counter() - started:.0f} s; weights {out}, report {Path(out).with_suffix('.json')})", err=True)


@patterns.command("classify", short_help="Classify maps into pattern classes per run.")
@click.option("--run", "runs", required=True, multiple=True, help="Run to classify (repeatable).")
@click.option("--classifier", default="rules", show_default=True, type=click.Choice(["rules", "cnn"]))
@click.option("--model-file", default=None, type=click.Path(dir_okay=False), help="CNN weights from `patterns train-cnn`.")
@click.option("--max-examples", default=1000, show_default=True, type=int)
@click.option("--seed", default=0, show_default=True, type=int, help="Sample of examples when a run has more.")
@click.option("--save", is_flag=True, help="Store one label per (example, layer, head) in pattern_labels (source rules / cnn).")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@store_options
@friendly_errors
def classify(locations, runs, classifier, model_file, max_examples, seed, save, fmt):
    """Classify every map of up to MAX_EXAMPLES examples of each run; print the class shares per run."""
    import pandas as pd

    from ..queries.patterns import CLASSES, pattern_classes
    from ..store.errors import InvalidArgumentError

    store = open_store(locations, write=save)  # --save on a read-only store fails before classifying
    if classifier == "cnn" and not model_file:
        raise InvalidArgumentError("--classifier cnn needs --model-file (from `attnstore patterns train-cnn`)")
    rows = []
    for run in runs:
        if save and store.run_state(store.run_info(run).id)[0] != "complete":
            raise InvalidArgumentError(f"not saved: run {run!r} is incomplete; classify it with --save once its ingest completes")
        if classifier == "rules":
            labels = pattern_classes(store, run=run, max_examples=max_examples, seed=seed, save=save)
        else:
            from ..queries.pattern_cnn_store import classify_run

            labels = classify_run(store, run, model_file, max_examples=max_examples, seed=seed, save=save)
        shares = labels["label"].value_counts(normalize=True).reindex(list(CLASSES), fill_value=0.0)
        rows.append(dict(run=run, n_examples=labels["example"].nunique(), n_maps=len(labels), **shares.to_dict()))
        if save:
            click.echo(f"saved {len(labels)} labels of run {run!r} (source {classifier!r})", err=True)
    emit(pd.DataFrame(rows), fmt)


@patterns.command("figure", short_help="Draw the pattern classes per task (Fig. 2).")
@click.option("--run", "runs", required=True, multiple=True, help="Run (one bar each, in the order given).")
@click.option("--source", default="rules", show_default=True, help="rules (classified now) or stored labels: cnn, human, ...")
@click.option("--max-examples", default=1000, show_default=True, type=int)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option(
    "--report",
    default=None,
    type=click.Path(dir_okay=False),
    help="A train-cnn report (.json): also draw the shares with per-class 95% intervals from the held-out confusion matrix "
    "of the source (cnn or rules).",
)
@click.option("--stem", default=None, help="File name stem (default fig2_pattern_classes; _rules for source rules with --report).")
@store_options
@friendly_errors
def figure(locations, runs, source, max_examples, seed, out, report, stem):
    """Fig 2 of Kovaleva et al (2019): stacked bars of the pattern classes per task, as PNG, SVG and CSV; with --report,
    also per class the shares corrected by the classifier's held-out confusion matrix with bootstrap intervals."""
    _need_matplotlib()
    from .pattern_labels import figure_proportions, proportions_table

    table = proportions_table(open_store(locations), list(runs), source, max_examples=max_examples, seed=seed)
    stem = stem or ("fig2_pattern_classes_rules" if source == "rules" and report else "fig2_pattern_classes")
    names = figure_proportions(table, out, source, max_examples, stem=stem)
    if report:
        from .pattern_report import figure_uncertainty, held_out_confusion, uncertainty_table

        matrix = held_out_confusion(report, source)
        models = ", ".join(sorted(set(table["model"])))
        long = uncertainty_table(table, matrix, seed=seed)
        names += figure_uncertainty(long, out, source, max_examples, int(matrix.sum()), models, stem=f"{stem}_uncertainty")
    click.echo(f"wrote {', '.join(names)} to {out}")


@patterns.command("evaluate", short_help="Score the classifiers per labeller; agreement between labellers.")
@click.option("--model-file", default=None, type=click.Path(dir_okay=False), help="CNN weights (`patterns train-cnn`): score it too.")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--output", default=None, type=click.Path(dir_okay=False), help="Also write everything as JSON to this file.")
@store_options
@friendly_errors
def evaluate(locations, model_file, fmt, output):
    """Score the rules (and the CNN) against every labeller's labels (sources human, human:NAME, model:NAME), leaving out
    the maps the CNN was trained on; then the agreement between each pair of labellers on the maps both labelled (Cohen's
    kappa)."""
    from .pattern_report import evaluate_labellers

    result = evaluate_labellers(open_store(locations), model_file)
    shown = result["per_labeller"].drop(columns=["confusion"]) if not result["per_labeller"].empty else result["per_labeller"]
    click.echo("# per labeller (maps the CNN was not trained on)")
    emit(shown, fmt)
    click.echo("# agreement between labellers (maps both labelled)")
    emit(result["agreement"], fmt)
    if output:
        payload = dict(
            per_labeller=result["per_labeller"].to_dict("records"),
            agreement=result["agreement"].to_dict("records"),
            cnn_trained_on=result["cnn_trained_on"],
        )
        write_output(output, json.dumps(payload, indent=1) + "\n")
        click.echo(f"wrote {output}", err=True)
