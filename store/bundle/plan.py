"""Planning an import: what a bundle would add to a store, decided before anything is written.

`_plan` reads the bundle's rows and the target's, and returns a `_Plan`: the runs to import (with their array
paths, moved for a renamed run) and those already there, the models and datasets to add or reuse, the
checkpoints to copy, the ablation rows not yet stored. Every conflict (a run name or array path the target uses
for another run, a dataset still being loaded or holding other examples, another checkpoint of the same name,
table data this attnstore does not know) is raised here, so a refused import writes nothing. So is a run in Zarr
layout 1 (before 2026-11-23), in the bundle or in the target: this version no longer reads that layout.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from .. import arrays
from ..errors import ConflictError, InvalidArgumentError, OldLayoutError
from ..records import in_layout_1, layout_1_error
from .container import Bundle
from .manifest import BLOCK, TABLES, _safe_name
from .store_files import _checkpoint_files, _node, _open_checkpoint_file, run_uid

if TYPE_CHECKING:
    from ..store import Store


@dataclass
class _Plan:
    runs: list[dict]  # bundle rows of the runs to import
    array_paths: dict[int, str]  # bundle run id -> its array path in the target (the same unless the run is renamed)
    already: list[str]
    run_map: dict[int, int]  # bundle run id -> target run id (runs already in the target)
    model_map: dict[int, int]  # bundle model id -> target model id (models already in the target)
    new_models: list[dict]  # parents first
    dataset_map: dict[int, int]  # bundle dataset id -> target dataset id (datasets reused)
    new_datasets: list[dict]
    reused_positions: dict[int, dict[int, int]]  # bundle dataset id -> {position: target example id}
    reused_names: list[str]  # NAME:SPLIT of the datasets reused
    checkpoints: list[str]  # checkpoint folders to copy
    ablation: list[dict]  # bundle ablation rows not yet in the target


def _parents_first(models: list[dict]) -> list[dict]:
    by_id = {m["id"]: m for m in models}
    ordered: list[dict] = []
    seen: set[int] = set()

    def visit(m: dict, depth: int = 0) -> None:
        if m["id"] in seen or depth > len(models):
            return
        parent = by_id.get(m.get("parent_id"))
        if parent is not None:
            visit(parent, depth + 1)
        seen.add(m["id"])
        ordered.append(m)

    for m in models:
        visit(m)
    return ordered


def _target_checkpoint_state(store: Store, bundle: Bundle, checkpoint: str) -> str:
    """ "absent", "same" (every bundle file present with equal bytes) or "different" in the target's models folder."""
    present = dict(_checkpoint_files(store, checkpoint))
    if not present:
        return "absent"
    for name in bundle.names_under(f"models/{checkpoint}/"):
        rel = name[len(f"models/{checkpoint}/") :]
        if rel not in present:
            return "different"
        digest = hashlib.sha256()
        with _open_checkpoint_file(store, present[rel]) as fh:
            while block := fh.read(BLOCK):
                digest.update(block)
        if digest.hexdigest() != bundle.files[name]["sha256"]:
            return "different"
    return "same"


def _plan(store: Store, bundle: Bundle, rename: Mapping[str, str]) -> _Plan:
    from ..writer import validate_run_name

    t = TABLES
    runs = list(bundle.rows("runs"))
    known = {r["name"] for r in runs}
    unknown = sorted(set(rename) - known)
    if unknown:
        raise InvalidArgumentError(f"--rename {unknown[0]}=...: the bundle has no run {unknown[0]!r} (it holds {', '.join(sorted(known))})")
    for table, meta in bundle.manifest["tables"].items():
        extra = set(meta.get("columns", [])) - {c.name for c in TABLES[table].columns} if table in TABLES else {"*"}
        if extra:
            raise InvalidArgumentError(
                f"bundle {bundle.location} was written by attnstore {bundle.manifest.get('attnstore_version')} "
                f"(schema {bundle.manifest.get('schema_revision')}) with table data this attnstore does not know "
                f"({table}: {', '.join(sorted(extra))}); upgrade attnstore to import it"
            )
    describe = store.locations.describe()
    with store.engine.connect() as conn:
        stored = conn.execute(sa.select(t["runs"].c.id, t["runs"].c.name, t["runs"].c.array_path, t["runs"].c.manifest)).all()
        layout_1 = next((r.name for r in stored if in_layout_1(r.array_path)), None)
        if layout_1 is not None:
            raise layout_1_error(layout_1)
        by_uid = {run_uid(r.manifest, r.array_path): r for r in stored}
        by_name = {r.name: r for r in stored}
        by_node = {_node(r.array_path): r for r in stored}
        todo, already, run_map, array_paths = [], [], {}, {}
        for r in runs:
            name = rename.get(r["name"], r["name"])
            if in_layout_1(r["array_path"]):
                raise OldLayoutError(
                    f"bundle {bundle.location} holds run {r['name']!r} in Zarr layout 1 (exported before 2026-11-23), which "
                    "this version no longer reads: run `attnstore db upgrade-arrays` on the store it came from, then export it again"
                )
            uid = run_uid(r["manifest"], r["array_path"])
            _safe_name(r["array_path"], f"run {r['name']!r}")
            hit = by_uid.get(uid)
            if hit is not None:
                already.append(r["name"] if hit.name == r["name"] else f"{r['name']} (as {hit.name})")
                run_map[r["id"]] = hit.id
                continue
            if name in by_name:
                other = by_name[name]
                raise ConflictError(
                    f"run {name!r} already exists in {describe} as another run (uid {run_uid(other.manifest, other.array_path)}, "
                    f"the bundle's is {uid}); import it under another name with --rename {r['name']}=NEW_NAME, or drop the stored run"
                )
            validate_run_name(name)
            # A run's group is named after the run (runs/<slug>): a renamed run moves to its new name's group.
            path = r["array_path"] if name == r["name"] else f"{arrays.run_group_path(name)}/{arrays.CELLS}"
            if _node(path) in by_node:
                raise ConflictError(
                    f"run {name!r}: its arrays would go to {_node(path)}, which run {by_node[_node(path)].name!r} uses "
                    f"in {describe}; import it under another name with --rename {r['name']}=NEW_NAME"
                )
            array_paths[r["id"]] = path
            todo.append(r)
        if len({rename.get(r["name"], r["name"]) for r in todo}) < len(todo) or len({_node(p) for p in array_paths.values()}) < len(todo):
            raise InvalidArgumentError("--rename gives two runs of the bundle the same name")

        m = t["models"]
        model_map, new_models = {}, []
        for row in _parents_first(list(bundle.rows("models"))):
            found = conn.scalar(sa.select(m.c.id).where(m.c.name == row["name"], m.c.weights_sha256 == row["weights_sha256"]))
            if found is not None:
                model_map[row["id"]] = found
            else:
                new_models.append(row)

        checkpoints = []
        for entry in bundle.manifest.get("models", []):
            checkpoint = entry.get("checkpoint")
            if not checkpoint or not bundle.names_under(f"models/{checkpoint}/"):
                continue
            _safe_name(checkpoint, f"model {entry['name']!r}")
            state = _target_checkpoint_state(store, bundle, checkpoint)
            is_new = any(r["name"] == entry["name"] and r["weights_sha256"] == entry["weights_sha256"] for r in new_models)
            if state == "absent":
                checkpoints.append(checkpoint)
            elif state == "different" and is_new:
                raise ConflictError(
                    f"model {entry['name']!r}: the models folder {store.locations.models_root} already holds another "
                    f"checkpoint named {checkpoint!r}; move it away (or set ATTNSTORE_MODELS) and import again"
                )

        ex = t["examples"]
        wanted = {r["dataset_id"] for r in todo}
        dataset_map, new_datasets, reused, reused_names = {}, [], {}, []
        bundle_positions: dict[int, set[int]] = {}
        for row in bundle.rows("datasets"):
            if row["id"] not in wanted:
                continue
            row["identity"] = _dataset_identity(row)
            found = _find_dataset(conn, row)
            if found is None:
                new_datasets.append(row)
                continue
            if found.status != "complete":
                raise ConflictError(
                    f"dataset {row['name']}:{row['split']} is still being loaded in {describe} (status {found.status}); "
                    "let that ingest finish (or resume it), then import again"
                )
            dataset_map[row["id"]] = found.id
            reused_names.append(f"{row['name']}:{row['split']}")
            reused[row["id"]] = {
                int(p): int(i) for i, p in conn.execute(sa.select(ex.c.id, ex.c.position).where(ex.c.dataset_id == found.id))
            }
            bundle_positions[row["id"]] = set()
        if reused:
            for row in bundle.rows("examples"):
                if row["dataset_id"] in bundle_positions:
                    bundle_positions[row["dataset_id"]].add(row["position"])
            for ds, positions in bundle_positions.items():
                if positions != set(reused[ds]):
                    name = next(r["name"] for r in bundle.rows("datasets") if r["id"] == ds)
                    raise ConflictError(
                        f"dataset {name!r} exists in {describe} with the same file checksum but other examples "
                        f"({len(reused[ds])} stored, {len(positions)} in the bundle); the bundle cannot be imported here"
                    )

        a = t["ablation_results"]
        ablation = []
        key_cols = ("task", "split", "mode", "config", "metric")
        existing_keys: dict[int, set[tuple]] = {}
        for row in bundle.rows("ablation_results"):
            target_model = model_map.get(row["model_id"])
            if target_model is not None:
                if target_model not in existing_keys:
                    existing_keys[target_model] = {
                        tuple(k) for k in conn.execute(sa.select(*(a.c[c] for c in key_cols)).where(a.c.model_id == target_model))
                    }
                if tuple(row[c] for c in key_cols) in existing_keys[target_model]:
                    continue
            ablation.append(row)
    return _Plan(
        runs=todo,
        array_paths=array_paths,
        already=already,
        run_map=run_map,
        model_map=model_map,
        new_models=new_models,
        dataset_map=dataset_map,
        new_datasets=new_datasets,
        reused_positions=reused,
        reused_names=reused_names,
        checkpoints=checkpoints,
        ablation=ablation,
    )


def _dataset_identity(row: dict) -> str | None:
    """A bundled dataset's identity (store/identity.py): as stored, or recomputed for a bundle made before revision 0009."""
    if row.get("identity") or "identity" not in TABLES["datasets"].columns:
        return row.get("identity")
    from ..identity import dataset_identity

    return dataset_identity(checksum=row["checksum"], format=row["format"], options=row.get("options"), annotator=row["annotator"])


def _find_dataset(conn: sa.Connection, row: dict) -> Any:
    """The target's dataset holding the same examples: same identity (content, format, options, selection, annotator
    kind; a complete one first), or for a schema without identities, the same name, split and checksum."""
    d = TABLES["datasets"]
    if "identity" in d.columns:
        where = d.c.identity == row["identity"]
    else:
        where = sa.and_(d.c.name == row["name"], d.c.split == row["split"], d.c.checksum == row["checksum"])
    order = (sa.case((d.c.status == "complete", 0), else_=1), d.c.id)
    return conn.execute(sa.select(d.c.id, d.c.status).where(where).order_by(*order).limit(1)).first()
