"""Export: `export_runs(store, runs, target)` writes complete runs, with their rows, arrays and checkpoints, to one bundle.

The source is read in one snapshot (a REPEATABLE READ transaction on PostgreSQL) and never written; the bundle
is made whole by its manifest, last (container.py), and a failed export removes what it wrote.
"""

from __future__ import annotations

import gzip
import json
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from .. import arrays
from ..errors import InvalidArgumentError, NotFoundError, StorageIOError
from ..records import RunInfo
from .container import _io_error, _open_sink, _Sink, _storage_errors
from .manifest import BATCH_KEYS, BATCH_ROWS, FORMAT, FORMAT_VERSION, TABLES, _attnstore_version, _safe_name, _schema_revision
from .store_files import _ancestors, _checkpoint_files, _node, _open_checkpoint_file, _zarr_get, _zarr_keys, run_uid

if TYPE_CHECKING:
    from ..store import Store


@dataclass(frozen=True)
class ExportReport:
    """What `export_runs` wrote: the target, runs and models exported, files and bytes, seconds taken."""

    target: str
    runs: tuple[str, ...]
    models: tuple[str, ...]
    checkpoints: tuple[str, ...]
    n_rows: int
    n_files: int
    n_bytes: int
    seconds: float


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)  # SQLite keeps UTC without a zone
        return aware.astimezone(UTC).isoformat()
    raise TypeError(f"cannot write {type(value).__name__} to a bundle")


def _selects(run_ids: list[int], model_ids: list[int], dataset_ids: list[int]) -> dict[str, sa.Select]:
    t = TABLES
    ex, fr = t["examples"], t["frames"]

    def of_datasets(table: sa.Table) -> sa.Select:
        return sa.select(table).join(ex, ex.c.id == table.c.example_id).where(ex.c.dataset_id.in_(dataset_ids)).order_by(table.c.id)

    def of_runs(table: sa.Table, *order) -> sa.Select:
        return sa.select(table).where(table.c.run_id.in_(run_ids)).order_by(*order)

    return {
        "models": sa.select(t["models"]).where(t["models"].c.id.in_(model_ids)).order_by(t["models"].c.id),
        "datasets": sa.select(t["datasets"]).where(t["datasets"].c.id.in_(dataset_ids)).order_by(t["datasets"].c.id),
        "examples": sa.select(ex).where(ex.c.dataset_id.in_(dataset_ids)).order_by(ex.c.id),
        "words": of_datasets(t["words"]),
        "mentions": of_datasets(t["mentions"]),
        "frames": of_datasets(fr),
        "frame_elements": sa.select(t["frame_elements"])
        .join(fr, fr.c.id == t["frame_elements"].c.frame_row_id)
        .join(ex, ex.c.id == fr.c.example_id)
        .where(ex.c.dataset_id.in_(dataset_ids))
        .order_by(t["frame_elements"].c.id),
        "runs": sa.select(t["runs"]).where(t["runs"].c.id.in_(run_ids)).order_by(t["runs"].c.id),
        "sequences": of_runs(t["sequences"], t["sequences"].c.run_id, t["sequences"].c.example_id),
        "tokens": of_runs(t["tokens"], t["tokens"].c.run_id, t["tokens"].c.example_id, t["tokens"].c.position),
        "head_metrics": of_runs(t["head_metrics"], t["head_metrics"].c.id),
        "head_matches": sa.select(t["head_matches"])
        .where(t["head_matches"].c.run_id.in_(run_ids), t["head_matches"].c.other_run_id.in_(run_ids))
        .order_by(t["head_matches"].c.id),
        "probe_results": sa.select(t["probe_results"])
        .where(t["probe_results"].c.run_id.in_(run_ids), t["probe_results"].c.eval_run_id.in_(run_ids))
        .order_by(t["probe_results"].c.id),
        "pattern_labels": of_runs(t["pattern_labels"], t["pattern_labels"].c.id),
        "ablation_results": sa.select(t["ablation_results"])
        .where(t["ablation_results"].c.model_id.in_(model_ids))
        .order_by(t["ablation_results"].c.id),
    }


def _write_table(conn: sa.Connection, sink: _Sink, name: str, query: sa.Select) -> int:
    """Stream a table's rows into tables/NAME.jsonl.gz (through a spooled temporary file: memory stays bounded)."""
    n = 0
    with tempfile.SpooledTemporaryFile(max_size=64 << 20) as tmp:
        with gzip.GzipFile(fileobj=tmp, mode="wb", compresslevel=6, mtime=0) as gz:
            result = conn.execution_options(yield_per=BATCH_ROWS).execute(query)
            for row in result.mappings():
                gz.write((json.dumps(dict(row), default=_json_default, ensure_ascii=False, separators=(",", ":")) + "\n").encode())
                n += 1
        tmp.seek(0)
        sink.put_stream(f"tables/{name}.jsonl.gz", tmp)
    return n


def export_runs(
    store: Store,
    runs: Iterable[str | int],
    target: str,
    *,
    models: Iterable[str] = (),
    checkpoints: bool = True,
) -> ExportReport:
    """Write `runs` (names or ids; complete runs only) and `models` (names; the most recent of each) to a bundle.

    The bundle holds their rows (models with their parents, datasets with examples, words, mentions and
    frames, runs with sequences and tokens, head_metrics, pattern_labels, head_matches and probe_results between two exported
    runs, ablation_results of exported models), every array key under each run's array path, and the
    checkpoint folder of each fine-tuned model (unless `checkpoints=False`). `target`: FILE.zip, a new or
    empty folder, or an fsspec URL (s3://bucket/prefix, s3://bucket/FILE.zip). Only reads the store.
    """
    started = time.perf_counter()
    infos: list[RunInfo] = []
    for ref in runs:
        info = store.run_info(ref)
        if info.status != "complete":
            raise InvalidArgumentError(
                f"run {info.name!r} is {info.status}, not complete: only complete runs can be exported "
                "(resume it with its ingest command first)"
            )
        if info.id not in {i.id for i in infos}:
            infos.append(info)
    named_models = []
    for name in models:
        row = store.model_row(name)
        if row is None:
            raise NotFoundError(f"no model {name!r} in {store.locations.describe()}; see `attnstore models`")
        named_models.append(row["id"])
    if not infos and not named_models:
        raise InvalidArgumentError("nothing to export: name at least one --run (or --model)")

    m = TABLES["models"]
    engine = store.engine
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":  # one consistent snapshot of every table
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            model_ids = {i.model_id for i in infos} | set(named_models)
            frontier = set(model_ids)
            while frontier:  # fine-tuned models bring their parents
                parents = set(conn.scalars(sa.select(m.c.parent_id).where(m.c.id.in_(frontier), m.c.parent_id.is_not(None))))
                frontier = parents - model_ids
                model_ids |= parents
            model_rows = [dict(r) for r in conn.execute(sa.select(m).where(m.c.id.in_(model_ids)).order_by(m.c.id)).mappings()]
            ckpts: dict[str, list[tuple[str, str]]] = {}
            for row in model_rows:
                checkpoint = (row.get("training") or {}).get("checkpoint")
                if checkpoint and checkpoints:
                    _safe_name(str(checkpoint), f"model {row['name']!r}")
                    files = _checkpoint_files(store, str(checkpoint))
                    if not files:
                        raise NotFoundError(
                            f"the checkpoint of model {row['name']!r} is not at {store.locations.models_root}/{checkpoint}; "
                            "copy the store's models folder (or set ATTNSTORE_MODELS), or export with --no-checkpoints"
                        )
                    ckpts[str(checkpoint)] = files
            run_ids = sorted(i.id for i in infos)
            dataset_ids = sorted({i.dataset_id for i in infos})
            source_root = arrays.open_root(store.locations.array_root, read_only=True)
            array_keys = {}
            for info in infos:
                # Not the temporary files of writers that were killed (`<key>.<hex>.partial`): never data of the run.
                keys = [k for k in _zarr_keys(source_root, _node(info.array_path) + "/") if not arrays.PARTIAL_FILE.search(k)]
                if f"{info.array_path.rstrip('/')}/zarr.json" not in keys:
                    raise NotFoundError(
                        f"the attention array of run {info.name!r} ({info.array_path}) is not under {store.locations.array_root}; "
                        "is --root the store's array root?"
                    )
                array_keys[info.id] = keys

            with _storage_errors(target, "write"):
                sink = _open_sink(target)
                try:
                    tables, n_rows = {}, 0
                    for name, query in _selects(run_ids, sorted(model_ids), dataset_ids).items():
                        n = _write_table(conn, sink, name, query)
                        tables[name] = {"file": f"tables/{name}.jsonl.gz", "rows": n, "columns": [c.name for c in TABLES[name].columns]}
                        n_rows += n
                    run_entries = []
                    groups: set[str] = set()
                    for info in infos:
                        keys = array_keys[info.id]
                        n_bytes = 0
                        for i in range(0, len(keys), BATCH_KEYS):
                            batch = keys[i : i + BATCH_KEYS]
                            items = []
                            for key, data in zip(batch, _zarr_get(source_root, batch)):
                                if data is None:
                                    raise StorageIOError(f"key {key} of run {info.name!r} vanished while it was exported; export again")
                                items.append((f"arrays/{key}", data))
                                n_bytes += len(data)
                            sink.put_many(items)
                        for key in _ancestors(_node(info.array_path)):
                            if key not in groups and f"arrays/{key}" not in sink.files:
                                groups.add(key)
                                (data,) = _zarr_get(source_root, [key])
                                if data is not None:
                                    sink.put(f"arrays/{key}", data)
                        model = next(r for r in model_rows if r["id"] == info.model_id)
                        run_entries.append(
                            dict(
                                name=info.name,
                                uid=run_uid(info.manifest, info.array_path),
                                model=info.model,
                                model_sha256=model["weights_sha256"],
                                dataset=info.dataset,
                                split=info.split,
                                array_path=info.array_path,
                                array_prefix=_node(info.array_path),
                                n_stored=info.n_stored,
                                array_keys=len(keys),
                                array_bytes=n_bytes,
                            )
                        )
                    for checkpoint, files in ckpts.items():
                        for rel, path in files:
                            with _open_checkpoint_file(store, path) as fh:
                                sink.put_stream(f"models/{checkpoint}/{rel}", fh)
                    manifest = dict(
                        format=FORMAT,
                        format_version=FORMAT_VERSION,
                        attnstore_version=_attnstore_version(),
                        created_at=datetime.now(UTC).isoformat(),
                        source=store.locations.describe(),
                        schema_revision=_schema_revision(engine),
                        runs=run_entries,
                        models=[
                            dict(
                                name=r["name"],
                                weights_sha256=r["weights_sha256"],
                                init=r.get("init"),
                                task=r.get("task"),
                                checkpoint=(r.get("training") or {}).get("checkpoint") if checkpoints else None,
                            )
                            for r in model_rows
                        ],
                        tables=tables,
                        files=sink.files,
                    )
                    sink.commit(json.dumps(manifest, indent=1, ensure_ascii=False, default=_json_default).encode())
                except OSError as exc:
                    sink.abort()
                    raise _io_error(exc, f"write the bundle {target}") from None
                except BaseException:
                    sink.abort()
                    raise
    n_bytes = sum(f["size"] for f in sink.files.values())
    return ExportReport(
        target=target,
        runs=tuple(i.name for i in infos),
        models=tuple(r["name"] for r in model_rows),
        checkpoints=tuple(ckpts),
        n_rows=n_rows,
        n_files=len(sink.files) + 1,
        n_bytes=n_bytes,
        seconds=time.perf_counter() - started,
    )
