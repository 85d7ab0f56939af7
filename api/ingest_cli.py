"""`attnstore ingest`: run a model once over a corpus and store every attention map.

A module of its own so that other commands (and `attnstore --help`) do not import the ingest
machinery's option values (formats, codecs, the default model), which load numpy and zarr.
"""

from __future__ import annotations

import sys

import click

from ..ingest.align import TOKENIZATIONS, TRUNCATION_POLICIES
from ..ingest.annotate import ANNOTATORS
from ..ingest.corpus import FORMATS as CORPUS_FORMATS
from ..ingest.model import DEFAULT_MODEL
from ..ingest.settings import RunSettings
from ..store.arrays import CODECS, DEFAULT_CHUNK_CELLS, DTYPES
from .common import friendly_errors, open_store, require_extra, scheduler_option, store_options


@click.command(short_help="Run a model over a corpus and store every attention map.")
@click.option("--corpus", default=None, type=click.Path(dir_okay=False), help="Corpus file to ingest (or use --dataset).")
@click.option(
    "--format",
    "fmt",
    default=None,
    type=click.Choice(CORPUS_FORMATS),
    help="text: one example per line; tsv / pairs-tsv: TSV with a header and one / two text columns; conllu: CoNLL-U with gold annotation.",
)
@click.option("--dataset", default=None, metavar="NAME:SPLIT", help="A built-in dataset, e.g. glue/MRPC:dev (see `attnstore datasets`).")
@click.option(
    "--data-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Folder holding the built-in datasets' files (env ATTNSTORE_DATA; default ../shared/data).",
)
@click.option("--model", default=DEFAULT_MODEL, show_default=True, help="Hugging Face model name or local directory.")
@click.option("--name", default=None, help="Run name (default DATASET-SPLIT-MODEL). Re-running a name resumes it.")
@click.option(
    "--dataset-name",
    default=None,
    help="Dataset name (default: the file's folder name, e.g. MRPC for .../glue/MRPC/dev.tsv, where the built-in "
    "--dataset glue/MRPC:dev is named glue/MRPC; give --dataset-name glue/MRPC for one name: docs/SQL.md).",
)
@click.option("--split", default=None, help="Split name (default: the file's stem).")
@click.option(
    "--annotate",
    "annotator",
    default="spacy",
    show_default=True,
    type=click.Choice(ANNOTATORS),
    help="Word annotation for corpora without gold annotation.",
)
@click.option("--batch-size", default=32, show_default=True, type=int)
@click.option("--max-length", default=None, type=int, help="Token limit (default: the model's).")
@click.option(
    "--truncation",
    default="truncate",
    show_default=True,
    type=click.Choice(TRUNCATION_POLICIES),
    help="What to do with inputs over the limit: truncate them (longest segment first) or skip them. Counted per run.",
)
@click.option("--dtype", default="float16", show_default=True, type=click.Choice(DTYPES))
@click.option(
    "--codec",
    "codec_name",
    default="lossless",
    show_default=True,
    type=click.Choice(sorted(CODECS)),
    help="lossless: blosc zstd (~1.66 bytes/cell); u8: each value stored as one byte round(255 v) "
    "(~0.40 bytes/cell, at most 0.0025 off per value; its effect on every query is in docs/PERFORMANCE.md).",
)
@click.option("--limit", default=None, type=int, help="Only the first N examples.")
@click.option("--sample", default=None, type=int, help="A random sample of N examples (reproducible with --seed).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed for --sample.")
@click.option("--window-words", default=None, type=int, help="gum/ontogum: words per document window (default 128).")
@click.option("--text-a-column", default=None, help="pairs-tsv: first text column (default: found from the header).")
@click.option("--text-b-column", default=None, help="pairs-tsv: second text column.")
@click.option("--label-column", default=None, help="pairs-tsv: label column.")
@click.option(
    "--quoting",
    default="none",
    show_default=True,
    type=click.Choice(["none", "csv"]),
    help="pairs-tsv: 'none' treats quotes as text (GLUE); 'csv' reads quoted fields (HF exports).",
)
@click.option(
    "--tokenize",
    "tokenization",
    default=None,
    type=click.Choice(TOKENIZATIONS),
    help="Feed the model the raw text (default for GLUE and plain text) or the corpus's words (default for CoNLL-U).",
)
@click.option(
    "--chunk-cells",
    default=DEFAULT_CHUNK_CELLS,
    show_default=True,
    type=int,
    help=(
        "Zarr chunk length in cells (advanced; the default was chosen by benchmarks/choose_codec.py). Where a chunk holds "
        "several 256 KiB blosc blocks, each example is placed in the fewest of them (docs/ARCHITECTURE.md)."
    ),
)
@click.option(
    "--norms/--no-norms",
    "value_norms",
    default=True,
    show_default=True,
    help="Keep each token's value norm per (layer, head) beside the maps, for queries' weights=norm (Kobayashi et al. "
    "2020; ~1/L of the maps' size; its cost is in docs/PERFORMANCE.md).",
)
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show progress bars.")
@scheduler_option("the forward passes and the writes of their maps (this process tokenizes and finishes the run)")
@store_options
@friendly_errors
def ingest(locations, codec_name, text_a_column, text_b_column, label_column, quoting, progress, scheduler, **options):
    """Run a model once over a corpus and store every attention map.

    Interrupted runs resume when the same command is run again: no example is
    stored twice or lost.
    """
    # Every option not named above is named after the RunSettings field it sets (ingest/settings.py).
    from ..ingest import ingest as run_ingest

    read_options = {}
    if options["fmt"] == "pairs-tsv":
        read_options = dict(text_a=text_a_column, text_b=text_b_column, label=label_column, quoting=quoting)
    elif options["fmt"] == "tsv":
        read_options = dict(text_a=text_a_column, label=label_column, quoting=quoting)
    require_extra("ingest")
    store = open_store(locations, create=True)
    settings = RunSettings(**options, codec=dict(CODECS[codec_name]), read_options=read_options)
    try:
        result = run_ingest(store, settings, progress=progress, scheduler=scheduler)
    except KeyboardInterrupt:
        click.echo("interrupted: stored examples are kept; run the same command again to resume", err=True)
        sys.exit(130)
    run = result.run
    if result.already_complete:
        click.echo(f"run {run.name!r} is already complete ({run.n_stored} examples); nothing to do")
        return
    click.echo(
        # n_new: the examples this command took (stored or skipped); the counts in brackets are the whole run's
        f"run {run.name!r}: {result.n_new} new examples in {result.seconds:.1f}s "
        f"(the run: {run.n_stored} stored, {run.n_truncated} truncated, {run.n_skipped} skipped; max length {run.max_length}, "
        f"truncation={run.truncation})"
    )
