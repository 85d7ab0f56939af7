"""Portable bundles: export runs (rows, arrays, fine-tuned checkpoints) from one store and import them into another.

`export_runs(store, runs, target)` writes one bundle to a `.zip` file, a new folder, or an fsspec URL
(`s3://bucket/prefix` or `s3://bucket/file.zip`); `import_bundle(store, source)` loads it into any store
(SQLite or PostgreSQL, local or object-storage array root). Layout (docs/SHARING.md, "Export and import"):

    manifest.json                 format "attnstore-bundle" version 1, attnstore version, created_at, source store
                                  (password hidden), schema revision, runs, models, tables (columns, rows), and the
                                  sha256 + size of every other file
    tables/<table>.jsonl.gz       the exported rows of each table, one JSON object per line, with the source's ids
    arrays/<store key>            every Zarr store key under each run's group (runs/<slug>/: `cells`, the index
                                  arrays, value norms, saliency, kept summaries), byte for byte (and the `zarr.json`
                                  of the groups above it)
    models/<checkpoint>/...       fine-tuned checkpoints, relative to the models folder (`models.training.checkpoint`)

A bundle is complete only once `manifest.json` exists: a zip is written as FILE.zip.partial and renamed at
the end; a folder gets its manifest last. Importing checks the format version and every checksum before it
writes anything, refuses a run name that the target uses for another run (ConflictError), copies the arrays
and checkpoints, and then inserts every row in one SQL transaction with new ids (every foreign key remapped).
Importing the same bundle twice changes nothing. Only complete runs are exported.

The package, along its seams (every name below is importable from `attnstore.store.bundle`, as it was when this
was one module):

    manifest.py      the format: FORMAT, FORMAT_VERSION, the tables carried (TABLE_ORDER, TABLES), reading and
                     checking manifest.json (`_read_manifest`, a newer schema revision refused), `_verify`
    container.py     where a bundle lives: sinks that write a zip, a folder or an object-storage prefix, and the
                     `Bundle` readers of each; `open_bundle`
    store_files.py   the store's side: Zarr keys under a run's node (`run_uid`), checkpoint folders
    export.py        `export_runs`, `ExportReport`
    plan.py          what an import would do, every conflict raised before anything is written (`_Plan`, `_plan`)
    importing.py     `import_bundle`, `ImportReport`: copy arrays and checkpoints, insert every row in one transaction
"""

from __future__ import annotations

# Every name the one module had stays importable from here (`X as X`: a re-export), private ones and the error
# classes included. To replace one for a test, patch the module that calls it (`bundle.export._zarr_get`,
# `bundle.importing._insert_rows`): a name rebound on this package is not the one its modules use.
from ..errors import ConflictError as ConflictError
from ..errors import CorruptInputError as CorruptInputError
from ..errors import InvalidArgumentError as InvalidArgumentError
from ..errors import NotFoundError as NotFoundError
from ..errors import SchemaOutOfDateError as SchemaOutOfDateError
from ..errors import StorageIOError as StorageIOError
from .container import Bundle as Bundle
from .container import _DirBundle as _DirBundle
from .container import _DirSink as _DirSink
from .container import _FsDirBundle as _FsDirBundle
from .container import _FsDirSink as _FsDirSink
from .container import _fsync as _fsync
from .container import _hash as _hash
from .container import _io_error as _io_error
from .container import _is_url as _is_url
from .container import _local as _local
from .container import _locate as _locate
from .container import _open_sink as _open_sink
from .container import _Sink as _Sink
from .container import _storage_errors as _storage_errors
from .container import _url_fs as _url_fs
from .container import _ZipBundle as _ZipBundle
from .container import _ZipSink as _ZipSink
from .container import open_bundle as open_bundle
from .export import ExportReport as ExportReport
from .export import _json_default as _json_default
from .export import _selects as _selects
from .export import _write_table as _write_table
from .export import export_runs as export_runs
from .importing import ImportReport as ImportReport
from .importing import _batches as _batches
from .importing import _columns as _columns
from .importing import _copy_arrays as _copy_arrays
from .importing import _copy_checkpoints as _copy_checkpoints
from .importing import _has_work as _has_work
from .importing import _insert_rows as _insert_rows
from .importing import _remove_written as _remove_written
from .importing import _without_id as _without_id
from .importing import import_bundle as import_bundle
from .manifest import BATCH_KEYS as BATCH_KEYS
from .manifest import BATCH_ROWS as BATCH_ROWS
from .manifest import BLOCK as BLOCK
from .manifest import FORMAT as FORMAT
from .manifest import FORMAT_VERSION as FORMAT_VERSION
from .manifest import MANIFEST as MANIFEST
from .manifest import MAX_LINE_CHARS as MAX_LINE_CHARS
from .manifest import MAX_TEXT_BYTES as MAX_TEXT_BYTES
from .manifest import TABLE_ORDER as TABLE_ORDER
from .manifest import TABLES as TABLES
from .manifest import _attnstore_version as _attnstore_version
from .manifest import _check_row as _check_row
from .manifest import _read_manifest as _read_manifest
from .manifest import _refuse_newer_schema as _refuse_newer_schema
from .manifest import _safe_name as _safe_name
from .manifest import _schema_revision as _schema_revision
from .manifest import _verify as _verify
from .plan import _dataset_identity as _dataset_identity
from .plan import _find_dataset as _find_dataset
from .plan import _parents_first as _parents_first
from .plan import _Plan as _Plan
from .plan import _plan as _plan
from .plan import _target_checkpoint_state as _target_checkpoint_state
from .store_files import _ancestors as _ancestors
from .store_files import _checkpoint_files as _checkpoint_files
from .store_files import _models_location as _models_location
from .store_files import _node as _node
from .store_files import _open_checkpoint_file as _open_checkpoint_file
from .store_files import _zarr_delete as _zarr_delete
from .store_files import _zarr_delete_dir as _zarr_delete_dir
from .store_files import _zarr_get as _zarr_get
from .store_files import _zarr_keys as _zarr_keys
from .store_files import _zarr_set as _zarr_set
from .store_files import run_uid as run_uid

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Bundle",
    "ExportReport",
    "ImportReport",
    "export_runs",
    "import_bundle",
    "open_bundle",
    "run_uid",
]
