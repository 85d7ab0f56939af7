"""The `attnstore` command line: thin wrappers over attnstore.store, .ingest and .queries.

Starting it imports click and api/common.py only: every command imports what it needs when it
runs, and the commands of other modules (LAZY_COMMANDS) are imported only when they are run, so
`attnstore --help` and `--version` take a fraction of a second (tests/test_cli_startup.py).

Longer than ~500 lines on purpose: the core commands' click declarations (each a thin wrapper); the other commands
live in their own modules (ingest_cli.py, models_cli.py, patterns_cli.py, probe_cli.py, bundle_cli.py).
"""

from __future__ import annotations

import click

from .. import __version__
from ..store.config import redact
from .common import (
    FORMATS,
    LazyGroup,
    columns_option,
    create_store,
    emit,
    friendly_errors,
    open_store,
    prepare_output,
    reading_progress,
    require_extra,
    scheduler_option,
    store_options,
)

# Commands defined in other modules: name -> ("module:attribute" under attnstore.api, the short help listed by --help).
LAZY_COMMANDS = {
    "ingest": (".ingest_cli:ingest", "Run a model over a corpus and store every attention map."),
    "work": (".ingest_cli:work", "Be one worker of a run planned with `ingest --for-workers N`."),
    "probe": (".probe_cli:probe", "Attention probes for dependency parsing: train, list."),
    "finetune": (".models_cli:finetune", "Fine-tune a model on a GLUE task and keep it in the store."),
    "evaluate": (".models_cli:evaluate", "Score a model on a GLUE task's dev set; stored once."),
    "ablate": (".models_cli:ablate", "Score a fine-tuned model with attention heads disabled."),
    "importance": (".models_cli:importance", "Head importance of a fine-tuned model (Michel et al. 2019)."),
    "prune": (".models_cli:prune", "Prune heads by importance, 10 % at a time (Michel et al. 2019)."),
    "saliency": (".models_cli:saliency", "Gradient x input saliency per token of a fine-tuned model's run."),
    "models": (".models_cli:list_models", "List the store's base and fine-tuned models."),
    "export": (".bundle_cli:export_cmd", "Write runs to one checksummed bundle (zip, folder, s3)."),
    "import": (".bundle_cli:import_cmd", "Load a bundle written by `attnstore export`."),
    "patterns": (".patterns_cli:patterns", "Attention-pattern classes: label, train, classify, plot."),
    "serve": (".serve:serve", "Serve the store over HTTP: a JSON API and a web viewer."),
}
REPORT_LAZY_COMMANDS = {
    "table1": (".models_cli:report_table1", "Write Kovaleva et al.'s Table 1: GLUE dev scores."),
    "ablation": (".models_cli:report_ablation", "Write Kovaleva et al.'s Figs. 8-9: heads disabled."),
}


def bound_heap_growth() -> None:
    """Freed slabs of maps go back to the OS (store/heap.py); commands that run a model change this when they load it."""
    from ..store import heap

    heap.for_reading()


@click.group(cls=LazyGroup, lazy=LAZY_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="attnstore")  # not package_name: reading the metadata costs 0.1 s
def main():
    """attnstore: store a corpus's attention maps once (Zarr + SQL), query them many times."""
    bound_heap_growth()


# ---------------------------------------------------------------- db


@main.group(short_help="Create, upgrade or inspect the metadata database.")
def db():
    """Create or upgrade the metadata database (Alembic migrations)."""


@db.command("upgrade", short_help="Create the schema or upgrade it to this version's.")
@store_options
@friendly_errors
def db_upgrade(locations):
    """Create the schema, or upgrade it to this version's head."""
    click.echo(create_store(locations))


@db.command("upgrade-arrays", short_help="Convert layout-1 runs to the layout-2 arrays.")
@store_options
@click.option("--run", "runs", multiple=True, help="Only these runs (name or id; repeatable). Default: every run.")
@click.option("--rebuild-index", is_flag=True, help="Also rewrite layout-2 runs' index arrays from SQL (when `check` says they differ).")
@friendly_errors
def db_upgrade_arrays(locations, runs, rebuild_index):
    """Convert runs stored in Zarr layout 1 (runs/<uuid>, no index; before 2026-11-23) to the self-describing layout 2.

    Chunks are copied byte for byte; SQL switches to the new arrays only once they are complete.
    Safe to run again after an interruption. Every other read or write of a layout-1 run's arrays
    is refused until it is converted.
    """
    from ..store.layout import upgrade_arrays

    with open_store(locations) as store:
        emit(upgrade_arrays(store, list(runs) or None, rebuild_index=rebuild_index), "table")


@db.command("current", short_help="Print the schema revision and whether it is current.")
@store_options
@friendly_errors
def db_current(locations):
    """Print the database's schema revision and this version's head."""
    from ..store import migrate
    from ..store.db import check_connection, create_engine

    engine = create_engine(locations.db_url)
    check_connection(engine)
    current, head = migrate.current_revision(engine), migrate.head_revision()
    migrate.refuse_newer(locations.db_url, current)
    status = "up to date" if current == head else f"out of date: run {migrate.upgrade_command(locations.db_url)}"
    click.echo(f"{redact(locations.db_url)}: revision {current or 'none'} (head {head}, {status})")


@main.command(short_help="List the built-in datasets and whether their files exist.")
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Folder holding the datasets' files (env ATTNSTORE_DATA; default ../shared/data).",
)
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@columns_option
@friendly_errors
def datasets(data_dir, fmt, columns):
    """List the built-in datasets: size, license, source, and whether their files are present (a generated dataset is
    made from the model's tokenizer at ingest)."""
    import pandas as pd

    from ..ingest.datasets import BUILTIN, find_dataset, resolve_data_dir
    from ..ingest.generated import DEPTHS, HAYSTACK, NEEDLE, PER_LENGTH, REPEATED_TOKENS

    root = resolve_data_dir(data_dir)
    rows = [
        dict(
            dataset=s.key,
            size=f"{s.n_examples:,} {s.unit}",
            annotation=s.annotation,
            license=s.license,
            source=s.source,
            present=(root / s.path).exists(),
        )
        for s in BUILTIN
    ]
    rows.append(
        dict(
            dataset=f"{REPEATED_TOKENS}:T20,50,200",
            size=f"{PER_LENGTH} examples per length T (any lengths; --seed)",
            annotation="spacy",
            license="generated",
            source="random tokens of the model's own tokenizer, repeated once (Olsson et al. 2022)",
            present=True,
        )
    )
    rows.append(
        dict(
            dataset=f"{NEEDLE}:L1000,2000",
            size=f"{len(DEPTHS)} depths per context length L (any lengths)",
            annotation="spacy",
            license=f"the haystack's ({HAYSTACK})",
            source=f"a needle in {HAYSTACK}'s documents, then the question (Wu et al. 2024); ingest with --generate 50",
            present=(root / find_dataset(HAYSTACK).path).exists(),
        )
    )
    emit(pd.DataFrame(rows), fmt, columns=columns)
    if fmt == "table":
        click.echo(f"data directory: {root}", err=True)


# ---------------------------------------------------------------- browsing


RUNS_TABLE_COLUMNS = [
    "run_id",
    "run",
    "model",
    "dataset",
    "split",
    "status",
    "n_stored",
    "n_truncated",
    "n_skipped",
    "tokenization",
    "ingest_seconds",
]


@main.command(short_help="List the runs in the store.")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@columns_option
@store_options
@friendly_errors
def runs(locations, fmt, columns):
    """List the runs in the store."""
    frame = open_store(locations).runs()
    emit(frame[RUNS_TABLE_COLUMNS] if fmt == "table" and not columns else frame, fmt, columns=columns)
    if fmt == "table" and not frame.empty:
        click.echo("(settings of each run: attnstore show RUN; every column: --format csv or json)", err=True)


@main.command(short_help="Print a run's settings and provenance as JSON.")
@click.argument("run")
@store_options
@friendly_errors
def show(locations, run):
    """Print a run's settings and provenance manifest as JSON."""
    import json

    info = open_store(locations).run_info(run)
    click.echo(json.dumps(info.as_dict(), indent=2, default=str))


@main.command(short_help="List a run's examples with their length and flags.")
@click.option("--run", required=True, help="Run name or id (see `attnstore runs`).")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@columns_option
@store_options
@friendly_errors
def examples(locations, run, fmt, columns):
    """List a run's examples with their stored length and flags."""
    emit(open_store(locations).examples(run), fmt, columns=columns)


# `tokens`' table: what a reader looks for first, so a narrow terminal keeps it (csv / json: every column, in order)
TOKENS_TABLE_FIRST = ("position", "token", "word_position", "word", "upos", "head", "deprel", "lemma", "xpos", "segment", "is_special")


@main.command(short_help="Show one example's tokens with words, POS and dependencies.")
@click.option("--run", required=True, help="Run name or id (see `attnstore runs`).")
@click.option("--example", required=True, type=int, help="Example position in the corpus (0-based).")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@columns_option
@store_options
@friendly_errors
def tokens(locations, run, example, fmt, columns):
    """Show one example's tokens with word alignment, POS and dependencies.

    The table leaves out the annotator column when every word has the same one (a note names it).
    """
    frame = open_store(locations).tokens(run, example)
    if fmt == "table" and not columns:
        first = [c for c in TOKENS_TABLE_FIRST if c in frame.columns]
        frame = frame[first + [c for c in frame.columns if c not in first]]
    emit(frame, fmt, columns=columns, constant=("annotator",))


@main.command(short_help="Draw one example's attention maps as heatmaps (or a typed sentence's: --text).")
@click.option("--run", default=None, help="Run name or id (see `attnstore runs`); with --text, the run whose model and settings are used.")
@click.option("--example", default=None, type=int, help="Example position in the corpus (0-based).")
@click.option("--text", default=None, help="Draw this sentence's maps instead of a stored example: the model is run on it (not stored).")
@click.option("--text-b", default=None, help="With --text: the pair's second segment.")
@click.option("--model", default=None, help="With --text and no --run: the model (name or directory; default all-MiniLM-L6-v2).")
@click.option("--layer", default=None, type=int, help="Only this layer (0-based); default: every layer.")
@click.option("--head", default=None, type=int, help="Only this head of --layer (0-based).")
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False),
    help="Picture to write (.png or .svg), or bertviz input (.json) with --bertviz.",
)
@click.option("--bertviz", is_flag=True, help="Write bertviz head_view/model_view input (JSON) instead of a picture.")
@click.option("--rollout", is_flag=True, help="Draw the attention rollout through the layers (Abnar & Zuidema 2020) instead.")
@store_options
@friendly_errors
def view(locations, run, example, text, text_b, model, layer, head, out, bertviz, rollout):
    """Draw one example's attention as token x token heatmaps: one head, a layer's heads, or every head (or its rollout).

    With --text "..." (and --text-b for a pair) the model is run on that sentence instead, exactly as ingest would
    (tokenizer, forward pass, stored dtype), and nothing is stored: the model of --run with its settings, or --model.
    """
    for option, value in (("--layer", layer), ("--head", head)):
        if value is not None and value < 0:
            raise click.ClickException(f"{option} {value}: {option[2:]}s are numbered from 0; give 0 or more (-1 is not the last)")
    if text is not None:
        if example is not None or bertviz or rollout:
            raise click.ClickException("--text draws a typed sentence: leave out --example, --bertviz and --rollout")
        if run is not None and model is not None:
            raise click.ClickException("--text uses the model of --run, or --model: give one of them")
        require_extra("report")
        from ..ingest.scratch import attention_for_run, attention_for_text
        from .view import save_scratch_view

        if run is not None:
            maps = attention_for_run(open_store(locations), run, text, text_b)
        else:
            from ..ingest.model import DEFAULT_MODEL

            maps = attention_for_text(model or DEFAULT_MODEL, text, text_b)
        path = save_scratch_view(maps, out, layer=layer, head=head)
        click.echo(f"wrote {path} ({maps.model}, {len(maps.tokens)} tokens{', truncated' if maps.truncated else ''})")
        return
    if text_b is not None or model is not None:
        raise click.ClickException("--text-b and --model go with --text")
    if run is None or example is None:
        raise click.ClickException("give --run and --example (a stored example), or --text (a typed sentence)")
    store = open_store(locations)
    if bertviz:
        from .view import save_bertviz

        click.echo(f"wrote {save_bertviz(store, run, example, out)}")
        return
    require_extra("report")
    if rollout:
        if head is not None:
            raise click.ClickException("--rollout averages every head of a layer: leave out --head")
        from .view import save_rollout

        click.echo(f"wrote {save_rollout(store, run, example, out, layer=layer)}")
        return
    from .view import save_view

    click.echo(f"wrote {save_view(store, run, example, out, layer=layer, head=head)}")


@main.command(
    short_help="Run one read-only SQL query over the store's tables and views.",
    # SQL that starts with a `--` comment is the statement, not an unknown option (see _sql_text)
    context_settings={"ignore_unknown_options": True},
)
@click.argument("query", nargs=-1, metavar="[QUERY]")
@click.option(
    "-f",
    "--file",
    "sql_file",
    default=None,
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
    help="Read the statement from this file ('-': standard input) instead of QUERY.",
)
@click.option("--max-rows", default=1000, show_default=True, type=click.IntRange(min=1), help="Print at most this many rows.")
@click.option(
    "--max-bytes",
    default=16_000_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Print the rows that fit in this many bytes of values, then say where it cut.",
)
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@store_options
@friendly_errors
def sql(locations, query, sql_file, max_rows, max_bytes, fmt):
    """Run one read-only SQL QUERY (SELECT, WITH, VALUES, EXPLAIN) over the store's own tables and views
    (docs/SQL.md), calling ordinary functions only; anything else is refused (docs/CLI.md#attnstore-sql).

    The statement is QUERY, or the file of --file/-f, or standard input (QUERY '-', or no QUERY with
    input piped in): `attnstore sql -f query.sql`, `attnstore sql - < query.sql`. A QUERY that starts
    with a `--` comment may follow `--`: attnstore sql -- "-- comment ..."."""
    import pandas as pd

    from ..store.errors import TooLargeError

    text = _sql_text(click.get_current_context(), query, sql_file)
    try:
        frame = open_store(locations).sql(text, max_rows=max_rows + 1, max_bytes=max_bytes)
    except TooLargeError as exc:
        if not hasattr(exc, "partial"):
            raise  # one value over the limit: nothing to print
        columns, rows = exc.partial
        emit(pd.DataFrame(rows, columns=columns), fmt)
        click.echo(f"(cut after {len(rows)} rows: the result passed --max-bytes {max_bytes:,}; raise it or select less)", err=True)
        return
    emit(frame.head(max_rows), fmt)
    if len(frame) > max_rows:
        click.echo(f"(truncated to {max_rows} rows; raise --max-rows)", err=True)


def _sql_text(ctx: click.Context, query: tuple[str, ...], sql_file: str | None) -> str:
    """The statement of `attnstore sql`: QUERY, --file's text or standard input. Unknown options reach QUERY (the
    command ignores them, so that SQL starting with `--` is read as SQL): a word starting with '-' without a blank in
    it is refused as the option it looks like."""
    import difflib
    import sys

    from ..store.errors import InvalidArgumentError

    for word in query:
        if word.startswith("-") and word != "-" and not any(c.isspace() for c in word):
            name = word.split("=", 1)[0]
            options = [o for param in ctx.command.params for o in getattr(param, "opts", [])]
            raise click.NoSuchOption(name, possibilities=difflib.get_close_matches(name, options), ctx=ctx)
    if len(query) > 1:
        raise click.UsageError(f'give one QUERY (quote it), not {len(query)} words: attnstore sql "SELECT ..."', ctx=ctx)
    if query and sql_file is not None:
        raise click.UsageError("give QUERY or --file, not both", ctx=ctx)
    source = sql_file if sql_file is not None else query[0] if query else None
    stdin = sys.stdin
    if source is None:
        if stdin.isatty():
            raise click.UsageError("give the statement as QUERY, with --file PATH, or on standard input", ctx=ctx)
        source = "-"
    if source == "-":
        text, where = stdin.read(), "standard input"
    elif sql_file is not None:
        with open(sql_file, encoding="utf-8-sig") as fh:
            text, where = fh.read(), sql_file
    else:
        text, where = source, "QUERY"
    if not text.strip():
        raise InvalidArgumentError(f"SQL error: no statement in {where}")
    return text


@main.command(short_help="Verify stored runs: chunks, checksums, row sums, counts.")
@click.option("--run", "runs_", multiple=True, help="Run to check (repeatable; default: every run).")
@click.option(
    "--repair",
    is_flag=True,
    help="Remove the temporary (.partial) files killed writers left (under each run's write lease) and kept summaries "
    "found incomplete (the next query rebuilds them), instead of reporting them.",
)
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@store_options
@friendly_errors
def check(locations, runs_, repair, fmt):
    """Verify stored runs: chunks present and checksums valid, block offsets, row sums, SQL counts,
    array metadata (zarr.json), kept summaries (every field holds the rows written) and leftovers of killed writers.

    Prints one line per run and one per problem found; exits 1 if anything is damaged.
    """
    from ..store.check import check_store

    summary, problems = check_store(open_store(locations, write=repair), runs_ or None, repair=repair)
    emit(summary, fmt)
    repaired = problems.attrs.get("repaired") or []
    if repaired:
        click.echo(
            f"removed {len(repaired)} leftover temporary file(s) or incomplete summaries: {', '.join(repaired[:5])}"
            + (" ..." if len(repaired) > 5 else ""),
            err=True,
        )
    if not problems.empty:
        click.echo(f"\n{len(problems)} problem(s):", err=True)
        emit(problems, fmt)
        raise SystemExit(1)
    click.echo("store OK" if not summary.empty else "no runs to check", err=True)


# ---------------------------------------------------------------- queries


@main.command("queries", short_help="List the stored queries and their parameters.")
def list_queries():
    """List the stored queries and their parameters."""
    from ..queries import QUERIES, load_all

    load_all()
    for spec in sorted(QUERIES.values(), key=lambda s: s.name):
        params = ", ".join(f"{n}={p.default!r}" for n, p in spec.parameters().items() if n != "examples")
        source = "" if spec.source == "attnstore" else f" (from {spec.source})"
        click.echo(f"{spec.name:20s} {spec.summary}{source}" + (f" [params: {params}]" if params else ""))


def parse_params(ctx, _param, values):
    out = {}
    for item in values:
        if "=" not in item:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", ctx=ctx)
        key, value = item.split("=", 1)
        out[key.strip()] = value
    return out


@main.command(short_help="Run a stored query over a run's maps (no model needed).")
@click.argument("name")
@click.option("--run", required=True, help="Run name or id (see `attnstore runs`).")
@click.option(
    "--param",
    "params",
    multiple=True,
    callback=parse_params,
    metavar="KEY=VALUE",
    help="Query parameter (repeatable); see `attnstore queries`.",
)
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@click.option("--output", default=None, type=click.Path(dir_okay=False), help="Write to a file instead of stdout.")
@click.option("--save", is_flag=True, help="Also save the per-head values to the head_metrics table (head_match: head_matches).")
@columns_option
@scheduler_option("the pass over the maps, when the query needs one")
@store_options
@friendly_errors
def query(locations, name, run, params, fmt, output, save, scheduler, columns):
    """Run stored query NAME over a run's maps (no model needed)."""
    import warnings

    from ..queries import run_query
    from ..queries.engine import get_query, use_scheduler
    from ..queries.engine.registry import coerce_params
    from ..store.errors import IncompleteRunWarning

    spec = get_query(name)
    kwargs = coerce_params(spec, params)
    if save and not spec.per_head and spec.save is None:
        raise click.ClickException(
            f"query {name!r} is not per head (one row per layer and head), so it cannot be saved "
            "to head_metrics; write it to a file with --output instead"
        )
    # --save (or a query's own save=true) on a read-only store, and an --output that cannot be written, fail before
    # the query runs
    prepare_output(output)
    store = open_store(locations, write=save or bool(kwargs.get("save")))
    with warnings.catch_warnings(record=True) as caught, reading_progress(f"{name} over {run}"), use_scheduler(scheduler):
        warnings.simplefilter("always", IncompleteRunWarning)
        frame = run_query(store, name, run=run, **kwargs)
    for w in caught:
        click.echo(f"warning: {w.message}", err=True)
    if frame.attrs.get("note"):
        click.echo(f"note: {frame.attrs['note']}", err=True)
    emit(frame, fmt, output, columns=columns)
    if save and frame.attrs.get("run_state") != "complete":
        raise click.ClickException(f"not saved: run {run!r} is incomplete; save its results once its ingest completes")
    if save and spec.save is not None:
        click.echo(spec.save(store, run, frame, kwargs), err=True)
    elif save:
        n = store.save_head_metrics(run, frame, prefix=name, params=kwargs)
        click.echo(f"saved {n} values to head_metrics (metric '{name}.*')", err=True)


@main.command(short_help="Build the per-example summaries that queries read.")
@click.option("--run", "runs_", multiple=True, required=True, help="Run name or id (repeatable).")
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    help="Summary to build (repeatable; default: every kind; an unknown name is answered with the list).",
)
@scheduler_option("the pass over the maps")
@store_options
@friendly_errors
def summarize(locations, runs_, kinds, scheduler):
    """Build the per-example summaries that queries read instead of decoding every map, and keep them with the run.

    Queries build a summary themselves the first time they need it; this does it ahead of
    time (after an ingest, or on a Dask cluster with --scheduler). Kinds: clark (relative_position,
    special_tokens, entropy) and the others registered by query modules (docs/QUERIES.md).
    Already-current summaries are left as they are.
    """
    import time

    from ..queries.engine import keep, run_kinds, use_scheduler

    available = run_kinds()
    unknown = [k for k in kinds if k not in available]
    if unknown:
        raise click.ClickException(f"no summary kind {', '.join(map(repr, unknown))}; kinds: {', '.join(sorted(available))}")
    store = open_store(locations, write=True)
    for run in runs_:
        info = store.run_info(run)
        for name in kinds or sorted(available):
            t = time.perf_counter()
            with use_scheduler(scheduler), reading_progress(f"summary {name} of {info.name}"):
                saved = keep(store, info, available[name])
            n = 0 if saved is None else saved.n
            click.echo(f"{info.name}: summary {name} covers {n} examples ({time.perf_counter() - t:.2f} s)", err=True)


@main.command(short_help="Gradient importance of attention to special tokens.")
@click.option("--run", required=True, help="Run whose model has a masked-LM head.")
@click.option("--max-examples", default=200, show_default=True, type=int)
@click.option("--mask-rate", default=0.15, show_default=True, type=float)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--model-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Folder holding the run's model as MODEL_NAME/ (env ATTNSTORE_MODEL_DIR), for a store copied here.",
)
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(FORMATS))
@store_options
@friendly_errors
def gradients(locations, run, max_examples, mask_rate, seed, model_dir, fmt):
    """Gradient importance of attention to special tokens (Clark et al. Fig. 3); saved to head_metrics."""
    from ..queries.gradients import gradient_importance

    store = open_store(locations, write=True)  # saves to head_metrics: a read-only store fails before the model loads
    frame = gradient_importance(store, run, max_examples=max_examples, mask_rate=mask_rate, seed=seed, model_dir=model_dir)
    emit(frame, fmt)
    n = store.save_head_metrics(run, frame, prefix="gradient", params=dict(max_examples=max_examples, mask_rate=mask_rate, seed=seed))
    click.echo(f"saved {n} values to head_metrics (metric 'gradient.*')", err=True)


@main.group(cls=LazyGroup, lazy=REPORT_LAZY_COMMANDS, short_help="Write a paper's tables and figures for stored runs.")
def report():
    """Write a paper's tables (Markdown + CSV) and figures (PNG + SVG) for stored runs."""


@report.command("clark", short_help="Write Clark et al.'s figures and tables for a run.")
@click.option("--run", required=True, help="Run over a dependency treebank (e.g. ingested with --dataset ud/en_ewt:dev).")
@click.option("--coref-run", default=None, help="Run over gum/ontogum windows for Table 2.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--mds-examples", default=500, show_default=True, type=int, help="Examples used for the head clustering (0 = all).")
@click.option("--min-count", default=100, show_default=True, type=int, help="Table 1: least edges per relation.")
@store_options
@friendly_errors
def report_clark(locations, run, coref_run, out, mds_examples, min_count):
    """Clark et al. 2019: Fig. 2, Fig. 4, Fig. 6, Tables 1-2 and relative-position heads for RUN."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.ClickException("figures need matplotlib: pip install 'attnstore[report]'") from None
    from .report import clark_report

    with reading_progress("report clark: examples read"):
        path = clark_report(open_store(locations), run, out, coref_run=coref_run, mds_examples=mds_examples, min_count=min_count)
    click.echo(f"wrote {path} and its tables and figures")


def _task_runs(ctx, _param, values) -> dict[str, str]:
    out = {}
    for item in values:
        if "=" not in item:
            raise click.BadParameter(f"{item!r} is not TASK=RUN", ctx=ctx)
        task, run = item.split("=", 1)
        out[task.strip()] = run.strip()
    return out


@report.command("kovaleva", short_help="Write Kovaleva et al.'s figures for stored runs.")
@click.option(
    "--run",
    "runs_",
    multiple=True,
    required=True,
    callback=_task_runs,
    metavar="TASK=RUN",
    help="A pre-trained model's run over a task's dev set (repeatable), e.g. MRPC=MRPC-dev.",
)
@click.option(
    "--finetuned-run",
    "finetuned",
    multiple=True,
    callback=_task_runs,
    metavar="TASK=RUN",
    help="A fine-tuned model's run over the same examples (repeatable): Fig. 5 and the fine-tuned Fig. 6.",
)
@click.option("--frame-run", default=None, help="A run over FrameNet exemplars (framenet/1.5:exemplars) for Fig. 3.")
@click.option("--max-examples", default=1000, show_default=True, type=int, help="Examples per task for Fig. 2 and Fig. 5.")
@click.option(
    "--pattern-model",
    default=None,
    type=click.Path(dir_okay=False),
    help="CNN weights from `patterns train-cnn`: draw Fig. 2 with the CNN (the rules' figure beside it).",
)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output folder.")
@store_options
@friendly_errors
def report_kovaleva(locations, runs_, finetuned, frame_run, max_examples, pattern_model, out):
    """Kovaleva et al. 2019: Fig. 2, 3, 5, 6, 7 and the token-to-token table from stored runs."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.ClickException("figures need matplotlib: pip install 'attnstore[report]'") from None
    from .kovaleva_report import kovaleva_report

    if pattern_model is not None:  # a wrong file fails now, in one line, not as a missing section after the report
        from ..queries.pattern_cnn import load_model

        load_model(pattern_model)
    with reading_progress("report kovaleva: examples read"):
        path = kovaleva_report(open_store(locations), out, runs_, finetuned, frame_run, max_examples, pattern_model)
    click.echo(f"wrote {path} and its tables and figures")


@report.command("head-match", short_help="Write the cross-model head matching of two runs.")
@click.option("--run", required=True, help="Run A (its heads are matched).")
@click.option("--other", required=True, help="Run B over the same examples (any model and tokenizer).")
@click.option("--metric", default="js", show_default=True, type=click.Choice(["js", "cosine", "frobenius"]), help="Head distance.")
@click.option("--specials", default="keep", show_default=True, type=click.Choice(["keep", "drop"]), help="Start/separator units.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output folder.")
@store_options
@friendly_errors
def report_head_match(locations, run, other, metric, specials, out):
    """Cross-model head matching (docs/QUERIES.md, head_match): a table per head of RUN, the distance matrix with the
    one-to-one assignment marked, and where each layer's matches lie in OTHER."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.ClickException("figures need matplotlib: pip install 'attnstore[report]'") from None
    from .head_match_report import head_match_report

    with reading_progress("report head-match: examples read"):
        path = head_match_report(open_store(locations), run, other, out, metric=metric, specials=specials)
    click.echo(f"wrote {path} and its tables and figures")


@report.command("llm", short_help="Write a decoder's sinks, head types, induction curve and massive activations.")
@click.option("--run", required=True, help="A causal LM's run over real text (e.g. gum/ontogum:dev).")
@click.option("--repeated-run", default=None, help="The same model's run over generated/repeated_tokens:T20,50,200 (induction).")
@click.option("--needle-run", default=None, help="The same model's run over generated/needle:L... with --generate (retrieval heads).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output folder.")
@store_options
@friendly_errors
def report_llm(locations, run, repeated_run, needle_run, out):
    """Attention sinks by layer beside massive activations, a map of head types (layers x heads), the induction curve
    over T and the best induction heads, retrieval heads, heavy hitters: tables (CSV, llm.md) and PNG/SVG figures
    (docs/QUERIES.md)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.ClickException("figures need matplotlib: pip install 'attnstore[report]'") from None
    from .llm_report import llm_report

    with reading_progress("report llm: examples read"):
        path = llm_report(open_store(locations), run, out, repeated_run=repeated_run, needle_run=needle_run)
    click.echo(f"wrote {path} and its tables and figures")


@report.command("primer", short_help="Write the Primer's analyses: norms, rollout, roles, trees, attribution, pruning.")
@click.option("--run", required=True, help="The run for norm-based attention, rollout and head roles.")
@click.option("--tree-run", default=None, help="A run over a corpus with gold trees (e.g. ud/en_ewt:dev) for trees from heads.")
@click.option("--random-tree-run", default=None, help="The same corpus through a randomly initialised model (the trees' baseline).")
@click.option("--attribution-run", default=None, help="A fine-tuned model's run with saliency (attnstore saliency).")
@click.option("--seed-run", default=None, help="The same task fine-tuned with another seed, over the same examples, with saliency.")
@click.option(
    "--prune",
    "prune_spec",
    default=None,
    metavar="MODEL:TASK",
    help="Draw the stored pruning steps of MODEL on TASK (a curve per importance procedure).",
)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output folder.")
@store_options
@friendly_errors
def report_primer(locations, run, tree_run, random_tree_run, attribution_run, seed_run, prune_spec, out):
    """The analyses "A Primer in BERTology" weighs Clark's and Kovaleva's findings against (docs/QUERIES.md): value
    norms (Kobayashi et al.), rollout (Abnar & Zuidema), head roles (Voita et al.), trees from heads (Htut et al.),
    attention vs gradient attribution (Jain & Wallace) and pruning by importance (Michel et al.), as tables and
    figures naming model and data. Sections whose input is not given are left out; one whose data is not stored says
    so in its place."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.ClickException("figures need matplotlib: pip install 'attnstore[report]'") from None
    from .primer_report import primer_report

    prune = None
    if prune_spec is not None:
        model, sep, task = prune_spec.rpartition(":")
        if not sep or not model or not task:
            raise click.BadParameter(
                f"{prune_spec!r}: give MODEL:TASK, e.g. all-MiniLM-L6-v2-MRPC-pretrained-seed0:MRPC", param_hint="--prune"
            )
        prune = (model, task)
    with reading_progress("report primer: examples read"):
        path = primer_report(
            open_store(locations),
            run,
            out,
            tree_run=tree_run,
            random_tree_run=random_tree_run,
            attribution_run=attribution_run,
            seed_run=seed_run,
            prune=prune,
        )
    click.echo(f"wrote {path} and its tables and figures")


if __name__ == "__main__":
    main()
