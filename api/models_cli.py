"""Commands for fine-tuned models: finetune, evaluate, ablate, models, report table1 / ablation.

Thin: the work is in attnstore.ingest.finetune / .evaluate; results are rows of `models`
and `ablation_results`, laid out by api/ablation_report.py.
"""

from __future__ import annotations

import click

from ..ingest.classifier import MODES
from ..ingest.finetune import INITS
from ..ingest.glue import TASKS
from ..ingest.model import DEFAULT_MODEL
from .common import FORMATS, columns_option, emit, friendly_errors, open_store, require_extra, store_options

TASK_NAMES = tuple(TASKS)


@click.command(short_help="Fine-tune a model on a GLUE task and keep it in the store.")
@click.option("--task", required=True, type=click.Choice(TASK_NAMES, case_sensitive=False), help="GLUE task (train split).")
@click.option("--model", default=DEFAULT_MODEL, show_default=True, help="Base model: name or local directory.")
@click.option(
    "--init",
    default="pretrained",
    show_default=True,
    type=click.Choice(INITS),
    help="Start from the pre-trained weights, or from a normal initialisation (Table 1's middle column).",
)
@click.option("--epochs", default=3, show_default=True, type=int)
@click.option("--batch-size", default=32, show_default=True, type=int)
@click.option("--lr", default=2e-5, show_default=True, type=float, help="Peak learning rate (AdamW, linear warmup and decay).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seeds the classifier head, shuffling and dropout.")
@click.option("--train-limit", default=None, type=int, help="Train on a seeded sample of N examples (e.g. for SST-2's 67k).")
@click.option("--max-length", default=128, show_default=True, type=int, help="Token limit per example.")
@click.option("--name", default=None, help="Model name (default BASE-TASK-INIT-seedSEED[-nLIMIT]).")
@click.option("--data-dir", default=None, type=click.Path(file_okay=False), help="Folder holding glue/ (env ATTNSTORE_DATA).")
@click.option("--progress/--no-progress", default=True, show_default=True)
@store_options
@friendly_errors
def finetune(locations, task, model, init, epochs, batch_size, lr, seed, train_limit, max_length, name, data_dir, progress):
    """Fine-tune MODEL on TASK's train split (CPU) and register it with its checkpoint in the store.

    Interrupted, the same command resumes at the last finished epoch.
    """
    from ..ingest.finetune import finetune as run_finetune

    require_extra("ingest")
    result = run_finetune(
        open_store(locations, create=True),
        task=task,
        model=model,
        init=init,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        train_limit=train_limit,
        max_length=max_length,
        name=name,
        data_dir=data_dir,
        progress=progress,
    )
    if result.already_done:
        click.echo(f"model {result.name!r} is already fine-tuned ({result.path})")
    else:
        click.echo(f"fine-tuned {result.name!r}: {result.epochs_run} epoch(s) in {result.seconds:.0f}s, saved to {result.path}")


@click.command(short_help="Score a model on a GLUE task's dev set; stored once.")
@click.option("--model", required=True, help="A fine-tuned model of the store, or a base model (evaluated without fine-tuning).")
@click.option("--task", required=True, type=click.Choice(TASK_NAMES, case_sensitive=False))
@click.option("--data-dir", default=None, type=click.Path(file_okay=False), help="Folder holding glue/ (env ATTNSTORE_DATA).")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--progress/--no-progress", default=True, show_default=True)
@store_options
@friendly_errors
def evaluate(locations, model, task, data_dir, fmt, progress):
    """GLUE dev metrics of MODEL on TASK (MRPC F1/accuracy, STS-B Pearson/Spearman, others accuracy), stored once."""
    import pandas as pd

    from ..ingest.evaluate import evaluate as run_evaluate
    from ..ingest.evaluate import open_evaluator

    store = open_store(locations, write=True)  # stores its scores: a read-only store fails before the model loads
    ev = open_evaluator(store, model=model, task=task, data_dir=data_dir)
    scores = run_evaluate(store, ev, progress=progress)
    emit(pd.DataFrame([dict(model=model, task=ev.task.name, metric=m, score=v, n_examples=len(ev.items)) for m, v in scores.items()]), fmt)
    click.echo(ev.description, err=True)


@click.command(short_help="Score a fine-tuned model with attention heads disabled.")
@click.option("--model", required=True, help="A fine-tuned model of the store.")
@click.option("--task", required=True, type=click.Choice(TASK_NAMES, case_sensitive=False))
@click.option(
    "--heads",
    default="each",
    show_default=True,
    help="each (every head alone), layers (every layer's heads together) or LAYER:HEAD,... (0-based, one set).",
)
@click.option(
    "--mode",
    default="uniform",
    show_default=True,
    type=click.Choice(MODES),
    help="uniform: attention 1/L over the real tokens (the paper); zero: no attention at all; "
    "mean: the head's output replaced by its mean over the dev set's real tokens.",
)
@click.option("--data-dir", default=None, type=click.Path(file_okay=False), help="Folder holding glue/ (env ATTNSTORE_DATA).")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--progress/--no-progress", default=True, show_default=True)
@store_options
@friendly_errors
def ablate(locations, model, task, heads, mode, data_dir, fmt, progress):
    """Evaluate MODEL on TASK with heads disabled; one ablation_results row per configuration and metric.

    Configurations already stored are skipped, so an interrupted sweep resumes and two
    processes can share one sweep.
    """
    from ..ingest.evaluate import ablate as run_ablate
    from ..ingest.evaluate import open_evaluator

    store = open_store(locations, write=True)  # a read-only store fails before the model loads
    frame = run_ablate(store, open_evaluator(store, model=model, task=task, data_dir=data_dir), heads=heads, mode=mode, progress=progress)
    emit(frame[["config", "metric", "score", "baseline_score", "delta", "n_examples"]] if fmt == "table" else frame, fmt)


@click.command("importance", short_help="Head importance of a fine-tuned model (Michel et al. 2019).")
@click.option("--model", required=True, help="A fine-tuned model of the store (or a base model, scored with an untrained head).")
@click.option("--task", required=True, help="GLUE task whose dev set gives the loss (MRPC, RTE, SST-2, ...).")
@click.option("--max-examples", default=None, type=int, help="Use the first N dev examples only (default: all).")
@click.option("--save-to-run", default=None, help="Also save the values to head_metrics (metric importance.*) of this run.")
@click.option("--data-dir", default=None, type=click.Path(file_okay=False), help="Folder holding glue/ (env ATTNSTORE_DATA).")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--progress/--no-progress", default=True, show_default=True)
@store_options
@friendly_errors
def importance(locations, model, task, max_examples, save_to_run, data_dir, fmt, progress):
    """Head importance I_h = E|dL/dxi_h| of MODEL on TASK's dev set, per example, normalised by layer (l2).

    Michel et al. 2019 (docs/QUERIES.md, head importance): each head's output gated by xi_h = 1, the absolute
    gradient of the loss averaged over the dev examples; `importance` is normalised by layer, `importance_raw` not.
    --save-to-run RUN puts both into head_metrics beside RUN's other per-head values (RUN must be a run of MODEL).
    """
    from ..ingest.evaluate import open_evaluator
    from ..ingest.importance import head_importance

    store = open_store(locations, write=bool(save_to_run))  # saving on a read-only store fails before the model loads
    run = store.run_info(save_to_run) if save_to_run is not None else None  # an unknown run: one line before the model loads
    ev = open_evaluator(store, model=model, task=task, data_dir=data_dir)
    if run is not None and run.model_id != ev.model_id:
        raise click.ClickException(f"run {run.name!r} is a run of {run.model!r}, not of {ev.model_name!r}: save beside a run of that model")
    frame = head_importance(ev, max_examples=max_examples, progress=progress)
    emit(frame, fmt)
    if save_to_run is not None:
        n = store.save_head_metrics(
            save_to_run, frame.drop(columns="n_examples"), prefix="importance", params=dict(task=task, max_examples=max_examples)
        )
        click.echo(f"saved {n} values to head_metrics of run {save_to_run!r} (metric 'importance.*')", err=True)


@click.command("saliency", short_help="Gradient x input saliency per token of a fine-tuned model's run (Jain & Wallace 2019).")
@click.option("--run", "run_name", required=True, help="A run of a classifier fine-tuned in this store (ingest --model <its name>).")
@click.option("--batch-size", default=16, show_default=True, type=int)
@click.option("--progress/--no-progress", default=True, show_default=True)
@store_options
@friendly_errors
def saliency(locations, run_name, batch_size, progress):
    """Keep, per stored token of RUN, gradient x input (signed) of its classifier's predicted-class probability.

    Per token, sum over the embedding's dimensions of the gradient of the predicted class's softmax
    probability (a regression model's output) times the word embedding, signed; `attention_attribution`
    ranks it by its absolute value by default, as Jain & Wallace did (docs/QUERIES.md). The gradient is
    taken at the word embeddings of the run's own token ids and segments; the values go beside the
    run's maps (the `saliency` array of its group) for the `attention_attribution` query. Interrupted, the same
    command resumes; run again on a finished run, it does nothing.
    """
    require_extra("ingest")
    from ..ingest.saliency import compute_saliency

    store = open_store(locations, write=True)
    if batch_size < 1:
        raise click.BadParameter("must be at least 1", param_hint="--batch-size")
    meta = compute_saliency(store, run_name, batch_size=batch_size, progress=progress)
    click.echo(f"run {run_name!r}: saliency of {meta['n_examples']} examples ({meta['n_tokens']} tokens), model {meta['model']!r}")


@click.command("prune", short_help="Prune heads by importance, 10 % at a time (Michel et al. 2019).")
@click.option("--model", required=True, help="A fine-tuned model of the store.")
@click.option("--task", required=True, help="GLUE task whose dev set scores each step.")
@click.option(
    "--mode",
    default="zero",
    show_default=True,
    type=click.Choice(MODES),
    help="How a pruned head is disabled: zero (its output removed, as Michel et al.), uniform (Kovaleva et al.), mean.",
)
@click.option("--fraction", default=0.1, show_default=True, type=float, help="Share of all heads pruned per step.")
@click.option(
    "--importance-data",
    default="train",
    show_default=True,
    type=click.Choice(("train", "dev")),  # ingest.importance.IMPORTANCE_DATA, not imported at startup
    help="Where the importance is estimated: train (the model's training data, as the authors' script) or dev "
    "(the dev set that also scores the curve).",
)
@click.option(
    "--importance-examples",
    "--max-examples",
    "max_examples",
    default=None,
    type=int,
    help="Examples for the importance (default: all): a seeded sample of the training data, or the first N dev examples.",
)
@click.option(
    "--reestimate/--estimate-once",
    default=False,
    show_default=True,
    help="Re-estimate the importance before each step with the pruned heads disabled, or estimate it once (the authors' default).",
)
@click.option("--figure", "figure_path", default=None, type=click.Path(dir_okay=False), help="Also draw the pruning curve (.png/.svg).")
@click.option("--data-dir", default=None, type=click.Path(file_okay=False), help="Folder holding glue/ (env ATTNSTORE_DATA).")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--progress/--no-progress", default=True, show_default=True)
@store_options
@friendly_errors
def prune(locations, model, task, mode, fraction, importance_data, max_examples, reestimate, figure_path, data_dir, fmt, progress):
    """Prune MODEL's heads by importance, scoring each step on TASK's dev set; ablation_results rows per step.

    By default as the authors' script (Michel et al.): the importance is estimated once, on the model's
    training data (a model fine-tuned here: the examples it was trained on), and each step removes
    `--fraction` of all heads, the least important of those left, and scores the model (config
    prune:N). --importance-data dev, --reestimate, another --fraction or --importance-examples make a
    sweep of its own (prune[importance=dev,reestimate,fraction=F,max_examples=M]:N), and each row
    records its procedure (importance_split, importance_examples, importance_schedule). Steps already
    stored under that config are read back, so an interrupted sweep resumes.
    """
    from ..ingest.evaluate import open_evaluator
    from ..ingest.importance import prune as run_prune

    if figure_path is not None:
        _need_matplotlib()
    store = open_store(locations, write=True)
    frame = run_prune(
        store,
        open_evaluator(store, model=model, task=task, data_dir=data_dir),
        mode=mode,
        fraction=fraction,
        max_examples=max_examples,
        progress=progress,
        importance_data=importance_data,
        reestimate=reestimate,
    )
    emit(frame[["n_pruned", "config", "mode", "metric", "score", "baseline_score"]] if fmt == "table" else frame, fmt)
    if figure_path is not None:
        from .ablation_report import draw_pruning

        fig = draw_pruning(frame, model, task, mode)
        fig.savefig(figure_path, dpi=150, bbox_inches="tight")
        click.echo(f"wrote {figure_path}", err=True)


@click.command("models", short_help="List the store's base and fine-tuned models.")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@columns_option
@store_options
@friendly_errors
def list_models(locations, fmt, columns):
    """List the store's models: base models and fine-tuned ones (parent, task, init, training)."""
    frame = open_store(locations).models()
    emit(frame.drop(columns=["training", "created_at"]) if fmt == "table" and not columns else frame, fmt, columns=columns)


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.ClickException("figures need matplotlib: pip install 'attnstore[report]'") from None


@click.command("table1", short_help="Write Kovaleva et al.'s Table 1: GLUE dev scores.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output folder.")
@store_options
@friendly_errors
def report_table1(locations, out):
    """Kovaleva et al. Table 1: dev scores without fine-tuning, fine-tuned from random init and from pre-trained."""
    from .ablation_report import table1_report

    path = table1_report(open_store(locations), out)
    click.echo(f"wrote {path}")


@click.command("ablation", short_help="Write Kovaleva et al.'s Figs. 8-9: heads disabled.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--mode", default="uniform", show_default=True, type=click.Choice(MODES))
@store_options
@friendly_errors
def report_ablation(locations, out, mode):
    """Kovaleva et al. Fig. 8 (single heads disabled), Fig. 9 (layers disabled), heads that help or hurt."""
    _need_matplotlib()
    from .ablation_report import ablation_report

    path = ablation_report(open_store(locations), out, mode=mode)
    click.echo(f"wrote {path} and its figures")
