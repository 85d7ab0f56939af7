"""`attnstore export` and `attnstore import`: move runs between stores as one bundle (see docs/SHARING.md).

Thin: the work is in attnstore.store.bundle.
"""

from __future__ import annotations

import click

from .common import friendly_errors, open_store, require_extra, store_exists, store_options


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _needs_s3(location: str) -> None:
    """An s3:// location needs the `s3` extra: say so in one line before anything is done."""
    if location.startswith(("s3://", "s3a://")):
        require_extra("s3")


def _renames(ctx, _param, values) -> dict[str, str]:
    out = {}
    for item in values:
        old, sep, new = item.partition("=")
        if not sep or not old.strip() or not new.strip():
            raise click.BadParameter(f"{item!r} is not OLD=NEW (a run name of the bundle, then the name to give it)", ctx=ctx)
        out[old.strip()] = new.strip()
    return out


@click.command("export")
@click.option("--run", "runs_", multiple=True, metavar="RUN", help="Run to export, by name or id (repeatable); only complete runs.")
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="NAME",
    help="Also export this model without a run (repeatable): a fine-tuned model with its checkpoint and ablation results.",
)
@click.option(
    "--to",
    "target",
    required=True,
    metavar="FILE.zip|DIR|URL",
    help="Where to write the bundle: FILE.zip, a new folder, or an fsspec URL (s3://bucket/prefix, s3://bucket/FILE.zip).",
)
@click.option(
    "--checkpoints/--no-checkpoints",
    default=True,
    show_default=True,
    help="Put fine-tuned models' checkpoint folders (from the store's models folder) in the bundle.",
)
@store_options
@friendly_errors
def export_cmd(locations, runs_, models, target, checkpoints):
    """Write runs (rows, arrays, fine-tuned checkpoints) to one portable bundle, checksummed.

    The bundle holds the runs with their models (and parents), datasets, examples, words, tokens,
    saved results and every Zarr key of their arrays; `attnstore import` loads it into any store.
    A bundle is complete only once written whole: a failed export leaves nothing that looks like one.
    """
    from ..store.bundle import export_runs

    _needs_s3(target)
    report = export_runs(open_store(locations), runs_, target, models=models, checkpoints=checkpoints)
    runs = ", ".join(repr(r) for r in report.runs) or "no runs"
    extra = f", checkpoints of {', '.join(report.checkpoints)}" if report.checkpoints else ""
    click.echo(
        f"exported {len(report.runs)} run(s) ({runs}) with {len(report.models)} model(s){extra} to {report.target}: "
        f"{report.n_rows} rows, {report.n_files} files, {_size(report.n_bytes)} in {report.seconds:.1f}s"
    )


@click.command("import")
@click.argument("bundle")
@click.option(
    "--rename",
    multiple=True,
    callback=_renames,
    metavar="OLD=NEW",
    help="Import the bundle's run OLD under the name NEW (repeatable), e.g. when the store has another run called OLD.",
)
@store_options
@friendly_errors
def import_cmd(locations, bundle, rename):
    """Load a bundle written by `attnstore export` (FILE.zip, folder or URL) into this store.

    Every checksum is checked before anything is written; ids are new, every reference is kept.
    A run name the store uses for another run is refused (rename it with --rename OLD=NEW);
    importing a bundle a second time does nothing.
    """
    from ..store.bundle import import_bundle, open_bundle

    _needs_s3(bundle)
    if "://" in locations.array_root and locations.array_root.startswith(("s3://", "s3a://")):
        require_extra("s3")
    # An existing store that this user cannot write fails first, in one line, before the bundle is read;
    # a new (embedded) store is created only once the bundle is verified: a bad bundle writes nothing.
    store = open_store(locations, write=True) if store_exists(locations) else None
    opened = open_bundle(bundle)
    try:
        report = import_bundle(store or open_store(locations, create=True), opened, rename=rename)
    finally:
        opened.close()
    already = f"already imported: {', '.join(report.already)}" if report.already else ""
    if not report.changed:
        click.echo(f"{already or 'nothing to import'}; nothing to do")
        return
    parts = []
    if report.imported:
        parts.append(f"run(s) {', '.join(repr(r) for r in report.imported)}")
    if report.models:
        parts.append(f"model(s) {', '.join(report.models)}")
    if report.checkpoints:
        parts.append(f"checkpoint(s) {', '.join(report.checkpoints)}")
    reused = f"; reused dataset(s) {', '.join(report.datasets_reused)}" if report.datasets_reused else ""
    click.echo(
        f"imported {', '.join(parts) or 'saved results'} from {report.source}: {report.n_rows} rows, "
        f"{_size(report.n_bytes)} of files in {report.seconds:.1f}s{reused}" + (f"; {already}" if already else "")
    )
