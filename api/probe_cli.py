"""`attnstore probe`: attention probes for dependency parsing (Clark et al. 2019, Sec. 5).

A module of its own: the probe kinds come from attnstore.queries.probes (numpy, pandas), which
`attnstore --help` and the other commands need not import.
"""

from __future__ import annotations

import click

from ..queries.probes import KINDS as PROBE_KINDS
from .common import FORMATS, columns_option, emit, friendly_errors, open_store, reading_progress, store_options


@click.group(short_help="Attention probes for dependency parsing: train, list.")
def probe():
    """Attention probes for dependency parsing (Clark et al. 2019, Sec. 5): train, evaluate, list."""


@probe.command("train", short_help="Train a probe on one run; store its UAS on another.")
@click.option("--run", required=True, help="Training run (a treebank split, e.g. ud/en_ewt:train).")
@click.option("--eval-run", required=True, help="Held-out run for UAS (e.g. ud/en_ewt:dev).")
@click.option("--kind", required=True, type=click.Choice(PROBE_KINDS), help="The probe, or a baseline.")
@click.option("--max-train", default=2000, show_default=True, type=int, help="Training sentences used (memory grows with them).")
@click.option("--epochs", default=100, show_default=True, type=int, help="Full-batch Adam steps.")
@click.option("--lr", default=0.05, show_default=True, type=float, help="Adam learning rate.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--model-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="attn+words / distance+words: folder holding the run's model as MODEL_NAME/ (env ATTNSTORE_MODEL_DIR).",
)
@store_options
@friendly_errors
def probe_train(locations, run, eval_run, kind, max_train, epochs, lr, seed, model_dir):
    """Train a probe on stored word-level maps of RUN and store its UAS on EVAL-RUN.

    RUN and EVAL-RUN must differ; evaluation sentences that are also training sentences (same text) are
    counted in a warning.
    """
    import warnings

    from ..queries.probes import ProbeOverlapWarning, train_and_evaluate

    store = open_store(locations, write=True)  # saves to probe_results: a read-only store fails before training
    with warnings.catch_warnings(record=True) as caught, reading_progress(f"probe {kind}: reading word-level maps"):
        warnings.simplefilter("always", ProbeOverlapWarning)
        result = train_and_evaluate(
            store, run=run, eval_run=eval_run, kind=kind, max_train=max_train, epochs=epochs, lr=lr, seed=seed, model_dir=model_dir
        )
    for w in caught:
        if issubclass(w.category, ProbeOverlapWarning):
            click.echo(f"warning: {w.message}", err=True)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    store.save_probe_result(run, eval_run, result, params=dict(max_train=max_train, lr=lr, seed=seed))
    train = "" if result["train_uas"] is None else f", train UAS {result['train_uas']:.3f} on {result['n_train']} words"
    click.echo(f"{kind}: UAS {result['uas']:.3f} on {result['n_eval']} words of {eval_run}{train} (saved to probe_results)")


@probe.command("results", short_help="List saved probe results.")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@columns_option
@store_options
@friendly_errors
def probe_results(locations, fmt, columns):
    """List saved probe results (the probe_results table)."""
    frame = open_store(locations).probe_results()
    emit(frame.drop(columns=["params", "created_at"]) if fmt == "table" and not columns else frame, fmt, columns=columns)
