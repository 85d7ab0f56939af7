"""Import: `import_bundle(store, source)` loads a verified bundle into a store (named importing.py: `import` is a keyword).

Under the leases ingest takes, it plans again (plan.py), copies the arrays (every sha256 rechecked) and the
checkpoints, then inserts every row in one SQL transaction with new ids, every foreign key remapped. An import
that fails after it began to copy (a row refused by container.py's checks, a database error, a full disk) removes
the array keys and checkpoint folders it wrote, and only those (`_remove_written`); one killed on the way leaves
arrays that the next import of the bundle replaces.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from .. import arrays
from ..errors import CorruptInputError
from .container import Bundle, _hash, _io_error, _storage_errors, open_bundle
from .manifest import BATCH_KEYS, BATCH_ROWS, BLOCK, TABLES, _verify
from .plan import _Plan, _plan
from .store_files import _ancestors, _models_location, _node, _zarr_delete, _zarr_delete_dir, _zarr_get, _zarr_keys, _zarr_set

if TYPE_CHECKING:
    from ..store import Store


@dataclass(frozen=True)
class ImportReport:
    """What `import_bundle` did: runs imported (names in the target), runs already there, models, rows, bytes copied."""

    source: str
    imported: tuple[str, ...]
    already: tuple[str, ...]  # "NAME" or "NAME (as OTHER)": present in the target before, left as they were
    models: tuple[str, ...]  # models added to the target
    checkpoints: tuple[str, ...]  # checkpoint folders copied into the target's models folder
    datasets_reused: tuple[str, ...]  # datasets the target already held (their examples are shared)
    n_rows: int
    n_bytes: int  # bytes of arrays and checkpoints copied
    seconds: float

    @property
    def changed(self) -> bool:
        return bool(self.imported or self.models or self.checkpoints or self.n_rows)


def _copy_arrays(store: Store, bundle: Bundle, plan: _Plan, rename: Mapping[str, str], written: list[str] | None = None) -> int:
    """Copy every key of the runs' nodes into the target root (rechecking each sha256), and missing group metadata.
    `written` gets each key of a run's node before it is written (not the group metadata above the nodes)."""
    written = [] if written is None else written
    root = arrays.open_root(store.locations.array_root, read_only=False)
    copied = 0
    for run in plan.runs:
        source, target = _node(run["array_path"]) + "/", _node(plan.array_paths[run["id"]]) + "/"
        names = [n for n in bundle.names_under(f"arrays/{source}") if not arrays.PARTIAL_FILE.search(n)]  # older exports had them
        keys = {target + n[len(f"arrays/{source}") :] for n in names}
        stale = [k for k in _zarr_keys(root, target) if k not in keys]  # left by an import that failed before its rows
        if stale:
            _zarr_delete(root, stale)
        renamed = rename.get(run["name"], run["name"]) if source != target else None
        for i in range(0, len(names), BATCH_KEYS):
            batch = names[i : i + BATCH_KEYS]
            items = []
            for name, data in zip(batch, bundle.read_many(batch)):
                if _hash(data) != bundle.files[name]["sha256"]:
                    raise CorruptInputError(f"damaged bundle {bundle.location}: {name} changed while it was imported; import again")
                key = target + name[len(f"arrays/{source}") :]
                if renamed and key == f"{target}zarr.json":  # the renamed run's group says its new name
                    meta = json.loads(data)
                    if isinstance(meta.get("attributes"), dict) and "run" in meta["attributes"]:
                        meta["attributes"]["run"] = renamed
                        data = json.dumps(meta, indent=2).encode()
                items.append((key, data))
                copied += len(data)
            written.extend(key for key, _ in items)
            _zarr_set(root, items)
        for key in _ancestors(target):
            name = f"arrays/{key}"
            if name in bundle.files and _zarr_get(root, [key]) == [None]:
                _zarr_set(root, [(key, bundle.read(name))])
    return copied


def _copy_checkpoints(store: Store, bundle: Bundle, checkpoints: list[str], written: list[str] | None = None) -> int:
    """Copy checkpoint folders into the target's models folder (a local folder appears whole, by rename). `written`
    gets each folder before it is written (the plan copies only folders the target lacks)."""
    written = [] if written is None else written
    fs, root = _models_location(store)
    copied = 0
    for checkpoint in checkpoints:
        written.append(checkpoint)
        names = bundle.names_under(f"models/{checkpoint}/")
        if fs is None:
            final = Path(root) / checkpoint
            partial = final.with_name(final.name + ".partial-import")
            shutil.rmtree(partial, ignore_errors=True)
            for name in names:
                path = partial / name[len(f"models/{checkpoint}/") :]
                path.parent.mkdir(parents=True, exist_ok=True)
                with bundle.open(name) as src, open(path, "wb") as out:
                    shutil.copyfileobj(src, out, BLOCK)
                copied += bundle.files[name]["size"]
            if final.exists():  # an empty or partly copied folder left by an interrupted import
                shutil.rmtree(final)
            os.replace(partial, final)
        else:
            for name in names:
                with bundle.open(name) as src, fs.open(f"{root}/{checkpoint}/{name[len(f'models/{checkpoint}/') :]}", "wb") as out:
                    shutil.copyfileobj(src, out, BLOCK)
                copied += bundle.files[name]["size"]
    return copied


def _without_id(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "id"}


def _batches(rows: Iterable[dict], size: int = BATCH_ROWS) -> Iterator[list[dict]]:
    batch: list[dict] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _columns(table: str, row: dict) -> dict:
    """Only the columns the target's table has (a bundle from an older schema lacks some: their defaults apply)."""
    names = TABLES[table].columns.keys()
    return {k: v for k, v in row.items() if k in names}


def _insert_rows(conn: sa.Connection, plan: _Plan, bundle: Bundle, rename: Mapping[str, str]) -> tuple[list[str], int]:
    """Every row of the plan, in one transaction (the caller's), with new ids; returns (new model names, rows)."""
    t = TABLES
    n = 0
    model_map = dict(plan.model_map)
    added_models = []
    for row in plan.new_models:
        values = _columns("models", _without_id(row))
        if row.get("parent_id") is not None:
            values["parent_id"] = model_map[row["parent_id"]]
        model_map[row["id"]] = conn.execute(sa.insert(t["models"]).values(**values).returning(t["models"].c.id)).scalar_one()
        added_models.append(row["name"])
        n += 1
    dataset_map = dict(plan.dataset_map)
    for row in plan.new_datasets:
        values = _columns("datasets", _without_id(row))
        dataset_map[row["id"]] = conn.execute(sa.insert(t["datasets"]).values(**values).returning(t["datasets"].c.id)).scalar_one()
        n += 1
    new_ds = {row["id"] for row in plan.new_datasets}
    example_map: dict[int, int] = {}  # bundle example id -> target example id
    fresh_ids: set[int] = set()  # bundle example ids inserted now (their words, mentions and frames come too)
    if plan.runs:
        for batch in _batches(r for r in bundle.rows("examples") if r["dataset_id"] in dataset_map):
            fresh = [r for r in batch if r["dataset_id"] in new_ds]
            for r in batch:
                if r["dataset_id"] not in new_ds:
                    example_map[r["id"]] = plan.reused_positions[r["dataset_id"]][r["position"]]
            if fresh:
                rows = [dict(_columns("examples", _without_id(r)), dataset_id=dataset_map[r["dataset_id"]]) for r in fresh]
                ids = conn.execute(sa.insert(t["examples"]).returning(t["examples"].c.id, sort_by_parameter_order=True), rows).scalars()
                example_map.update(zip((r["id"] for r in fresh), ids))
                fresh_ids.update(r["id"] for r in fresh)
                n += len(fresh)

    def example_rows(table: str) -> Iterator[dict]:
        for r in bundle.rows(table):
            if r["example_id"] in fresh_ids:
                yield dict(_columns(table, _without_id(r)), example_id=example_map[r["example_id"]])

    for table in ("words", "mentions"):
        for batch in _batches(example_rows(table)):
            conn.execute(sa.insert(t[table]), batch)
            n += len(batch)
    frame_map: dict[int, int] = {}
    for batch in _batches(r for r in bundle.rows("frames") if r["example_id"] in fresh_ids):
        frame_values = [dict(_columns("frames", _without_id(r)), example_id=example_map[r["example_id"]]) for r in batch]
        ids = conn.execute(sa.insert(t["frames"]).returning(t["frames"].c.id, sort_by_parameter_order=True), frame_values).scalars()
        frame_map.update(zip((r["id"] for r in batch), ids))
        n += len(batch)
    elements = (
        dict(_columns("frame_elements", _without_id(r)), frame_row_id=frame_map[r["frame_row_id"]])
        for r in bundle.rows("frame_elements")
        if r["frame_row_id"] in frame_map
    )
    for batch in _batches(elements):
        conn.execute(sa.insert(t["frame_elements"]), batch)
        n += len(batch)

    run_map = dict(plan.run_map)
    todo = {r["id"] for r in plan.runs}
    for row in plan.runs:
        values = _columns("runs", _without_id(row))
        values.update(
            name=rename.get(row["name"], row["name"]),
            model_id=model_map[row["model_id"]],
            dataset_id=dataset_map[row["dataset_id"]],
            array_path=plan.array_paths[row["id"]],
        )
        run_map[row["id"]] = conn.execute(sa.insert(t["runs"]).values(**values).returning(t["runs"].c.id)).scalar_one()
        n += 1

    def run_rows(table: str, has_example: bool) -> Iterator[dict]:
        for r in bundle.rows(table):
            if r["run_id"] in todo:
                values = dict(_columns(table, _without_id(r)), run_id=run_map[r["run_id"]])
                if has_example:
                    if r["example_id"] not in example_map:
                        raise CorruptInputError(
                            f"bundle {bundle.location}: {table} refers to example id {r['example_id']}, not in the bundle"
                        )
                    values["example_id"] = example_map[r["example_id"]]
                yield values

    for table, has_example in (("sequences", True), ("tokens", True), ("head_metrics", False), ("pattern_labels", True)):
        for batch in _batches(run_rows(table, has_example)):
            conn.execute(sa.insert(t[table]), batch)
            n += len(batch)
    probes = [
        dict(_columns("probe_results", _without_id(r)), run_id=run_map[r["run_id"]], eval_run_id=run_map[r["eval_run_id"]])
        for r in bundle.rows("probe_results")
        if (r["run_id"] in todo or r["eval_run_id"] in todo) and r["run_id"] in run_map and r["eval_run_id"] in run_map
    ]
    if probes:
        conn.execute(sa.insert(t["probe_results"]), probes)
        n += len(probes)
    matches = [  # between two runs of the bundle, as exported (a bundle made before revision 0010 has none)
        dict(_columns("head_matches", _without_id(r)), run_id=run_map[r["run_id"]], other_run_id=run_map[r["other_run_id"]])
        for r in bundle.rows("head_matches")
        if (r["run_id"] in todo or r["other_run_id"] in todo) and r["run_id"] in run_map and r["other_run_id"] in run_map
    ]
    for batch in _batches(matches):
        conn.execute(sa.insert(t["head_matches"]), batch)
        n += len(batch)
    ablation = [dict(_columns("ablation_results", _without_id(r)), model_id=model_map[r["model_id"]]) for r in plan.ablation]
    for batch in _batches(ablation):
        conn.execute(sa.insert(t["ablation_results"]), batch)
        n += len(batch)
    return added_models, n


def _remove_written(store: Store, nodes: list[str], keys: list[str], checkpoints: list[str]) -> None:
    """Undo the copies of an import that failed: delete the array keys it wrote (then each of the runs' `nodes` left
    empty, with its folders on a local root) and the checkpoint folders it copied. The group metadata above the runs' nodes
    (zarr.json of the root and of runs/, a few hundred bytes) stays: another writer may have begun to use it.
    Best effort: a failure here does not hide the import's own error."""
    with contextlib.suppress(Exception):
        root = arrays.open_root(store.locations.array_root, read_only=False)
        for i in range(0, len(keys), BATCH_KEYS):
            _zarr_delete(root, keys[i : i + BATCH_KEYS])
        for node in nodes:
            if not _zarr_keys(root, node + "/"):
                _zarr_delete_dir(root, node)
    for checkpoint in checkpoints:
        with contextlib.suppress(Exception):
            fs, models = _models_location(store)
            if fs is None:
                final = Path(models) / checkpoint
                shutil.rmtree(final.with_name(final.name + ".partial-import"), ignore_errors=True)
                shutil.rmtree(final, ignore_errors=True)
            elif fs.exists(f"{models}/{checkpoint}"):
                fs.rm(f"{models}/{checkpoint}", recursive=True)


def _has_work(plan: _Plan) -> bool:
    return bool(plan.runs or plan.new_models or plan.checkpoints or plan.ablation)


def import_bundle(store: Store, source: str | Bundle, *, rename: Mapping[str, str] | None = None) -> ImportReport:
    """Load a bundle into `store`: verify it whole, then copy arrays and checkpoints, then insert every row in one transaction.

    `source`: a path or URL (opened and verified here) or a `Bundle` from `open_bundle`. Runs already in
    the store (same uid) are left as they are, so importing twice is a no-op. A run whose name the store
    uses for another run raises ConflictError before anything is written; `rename` ({old: new}) imports
    it under another name. Datasets the store already holds (name, split, checksum) are reused: the
    runs' examples map onto the stored ones by position. Models are matched by (name, weights sha256).
    """
    from ..identity import dataset_lease_name
    from ..writer import run_lease_name

    started = time.perf_counter()
    rename = dict(rename or {})
    bundle = source if isinstance(source, Bundle) else open_bundle(source)
    try:
        if not bundle.verified:
            _verify(bundle)
        store.writer.require_writable()
        plan = _plan(store, bundle, rename)
        if not _has_work(plan):
            return ImportReport(bundle.location, (), tuple(plan.already), (), (), (), 0, 0, time.perf_counter() - started)
        with contextlib.ExitStack() as leases:
            # The leases ingest takes too: no ingest (or other import) creates these runs or loads these datasets now.
            for name in sorted(rename.get(r["name"], r["name"]) for r in plan.runs):
                leases.enter_context(store.writer.lease(run_lease_name(name), f"run {name!r}"))
            for row in sorted(plan.new_datasets, key=lambda r: str(r.get("identity"))):
                if row.get("identity"):
                    what = f"dataset {row['name']}:{row['split']}"
                    leases.enter_context(store.writer.lease(dataset_lease_name(row["identity"]), what, wait=True))
            plan = _plan(store, bundle, rename)  # again, under the leases: what another process did meanwhile counts
            if not _has_work(plan):
                return ImportReport(bundle.location, (), tuple(plan.already), (), (), (), 0, 0, time.perf_counter() - started)
            keys: list[str] = []
            folders: list[str] = []
            try:
                try:
                    with _storage_errors(bundle.location, "read"):
                        copied = _copy_arrays(store, bundle, plan, rename, keys)
                        copied += _copy_checkpoints(store, bundle, plan.checkpoints, folders)
                except OSError as exc:
                    raise _io_error(exc, f"copy the bundle's files into {store.locations.array_root}") from None
                with store.session() as session:
                    added, n_rows = _insert_rows(session.connection(), plan, bundle, rename)
            except BaseException:
                nodes = [_node(plan.array_paths[r["id"]]) for r in plan.runs]
                _remove_written(store, nodes, keys, folders)  # a refused row, a database error, Ctrl-C: no orphan arrays
                raise
    finally:
        if not isinstance(source, Bundle):
            bundle.close()
    return ImportReport(
        source=bundle.location,
        imported=tuple(rename.get(r["name"], r["name"]) for r in plan.runs),
        already=tuple(plan.already),
        models=tuple(added),
        checkpoints=tuple(plan.checkpoints),
        datasets_reused=tuple(plan.reused_names),
        n_rows=n_rows,
        n_bytes=copied,
        seconds=time.perf_counter() - started,
    )
