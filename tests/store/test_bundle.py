"""Export runs to a bundle and import them elsewhere (store/bundle/): round trip PostgreSQL -> SQLite with every
query identical, zip / folder / S3 targets, checkpoints, idempotence, conflicts, damaged bundles, partial exports."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

from attnstore.queries import run_query
from attnstore.store import bundle as bundle_mod
from attnstore.store import migrate, open_store
from attnstore.store.bundle import FORMAT, export_runs, import_bundle, open_bundle, run_uid
from attnstore.store.bundle import export as bundle_export
from attnstore.store.bundle import importing as bundle_importing
from attnstore.store.check import check_store
from attnstore.store.errors import ConflictError, CorruptInputError, InvalidArgumentError, NotFoundError, OldLayoutError
from attnstore.store.schema import Frame, FrameElement

TOKENS = [["[CLS]", "the", "dog", "bar", "##ks", "[SEP]"], ["[CLS]", "a", "cat", "[SEP]"]]
TOKEN_WORDS = [[None, 0, 1, 2, 2, None], [None, 0, 1, None]]
WORDS = [
    [
        dict(form="the", head=1, deprel="det", upos="DET", lemma="the"),
        dict(form="dog", head=2, deprel="nsubj", upos="NOUN", lemma="dog"),
        dict(form="barks", head=None, deprel="root", upos="VERB", lemma="bark"),
    ],
    [dict(form="a", head=1, deprel="det", upos="DET"), dict(form="cat", head=None, deprel="root", upos="NOUN")],
]
MENTIONS = [[dict(word_start=0, word_end=2, head=1, entity="e1", kind="nominal", doc_order=0)], []]
TABLE_NAMES = bundle_mod.TABLE_ORDER
QUERIES = [
    ("relative_position", {}),
    ("special_tokens", {}),
    ("entropy", {}),
    ("dependency", {"min_count": 1}),
    ("dependency_summary", {"min_count": 1}),
    ("word_maps", {"example": 0, "layer": 1, "head": 1}),
]


def maps_for(length: int, seed: int) -> np.ndarray:
    """(2 layers, 2 heads, L, L) rows summing to 1, different per seed."""
    rng = np.random.default_rng(seed)
    maps = rng.random((2, 2, length, length)).astype(np.float32) + 0.01
    return maps / maps.sum(-1, keepdims=True)


def fresh_store(url: str, folder: Path, root: str | None = None):
    migrate.upgrade(url)
    return open_store(db=url, root=root or str(folder / "attention.zarr"))


def sqlite_store(folder: Path, root: str | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    return fresh_store(f"sqlite:///{folder / 'meta.sqlite'}", folder, root)


def add_run_over(store, base_run: str, name: str, model_id: int, seed: int) -> str:
    """A second run over the dataset of `base_run` (with another model), as ingest would write it."""
    base = store.run_info(base_run)
    info = store.writer.start_run(
        name=name,
        model_id=model_id,
        dataset_id=base.dataset_id,
        dtype="float16",
        codec=dict(base.codec),
        chunk_cells=48,
        max_length=512,
        truncation="truncate",
        attn_implementation="eager",
        batch_size=1,
        code_version="test",
        corpus_checksum="x",
        manifest={"note": name},
    )
    ids = dict(store.sql("SELECT position, id FROM examples WHERE dataset_id = :d", {"d": base.dataset_id}).values.tolist())
    writer = store.writer.run_writer(info.id)
    for position, toks in enumerate(TOKENS):
        rows = [
            dict(
                token=t,
                token_id=7 + i,
                word_position=TOKEN_WORDS[position][i],
                segment=0,
                is_special=t.startswith("["),
                char_start=None,
                char_end=None,
            )
            for i, t in enumerate(toks)
        ]
        writer.add(ids[position], maps_for(len(toks), seed + position).astype(np.float16), rows)
        writer.commit()
    writer.finish(1.5)
    return name


def build_source(store, make_run) -> dict:
    """Two runs over one dataset (a base model and a fine-tuned child with its checkpoint), words, mentions, frames,
    head_metrics, pattern labels, a probe result between the runs and ablation results of the fine-tuned model."""
    base = make_run(
        store,
        [maps_for(len(t), i) for i, t in enumerate(TOKENS)],
        TOKENS,
        name="dep",
        token_words=TOKEN_WORDS,
        words_list=WORDS,
        mentions_list=MENTIONS,
    )
    info = store.run_info(base)
    checkpoint = "hand-dep-MRPC-seed0"
    folder = Path(store.locations.models_root) / checkpoint
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    (folder / "model.safetensors").write_bytes(os.urandom(5000))
    (folder / "sub" / "vocab.txt").write_text("[CLS]\n[SEP]\n", encoding="utf-8")
    ft = store.writer.register_finetuned_model(
        name=checkpoint,
        source=f"models/{checkpoint}",
        weights_sha256="f" * 64,
        architecture="BertForSequenceClassification",
        n_layers=2,
        n_heads=2,
        max_length=128,
        tokenizer="BertTokenizerFast",
        special_tokens=info.special_tokens,
        parent_id=info.model_id,
        init="finetuned",
        task="MRPC",
        training={"checkpoint": checkpoint, "complete": True, "hparams": {"seed": 0}},
    )
    other = add_run_over(store, base, "dep-ft", ft, seed=10)
    for run in (base, other):
        for name in ("relative_position", "entropy"):
            store.save_head_metrics(run, run_query(store, name, run=run), prefix=name, params={"average": "example"})
    store.save_pattern_labels(
        pd.DataFrame(
            dict(run=[base, base, other], example=[0, 1, 0], layer=[0, 1, 1], head=[1, 0, 1], label=["vertical", "diagonal", "block"])
        ),
        source="human",
    )
    store.save_probe_result(
        base, other, dict(kind="attn", uas=0.5, train_uas=0.75, n_train=3, n_eval=2, epochs=4, final_loss=0.125), {"lr": 0.05}
    )
    store.writer.add_ablation_results(
        [
            dict(
                model_id=ft,
                task="MRPC",
                split="dev",
                mode="uniform",
                config="none",
                disabled_heads=[],
                metric="f1",
                score=0.8,
                baseline_score=0.8,
                n_examples=2,
            ),
            dict(
                model_id=ft,
                task="MRPC",
                split="dev",
                mode="uniform",
                config="layer:0",
                disabled_heads=[[0, 0], [0, 1]],
                metric="f1",
                score=0.7,
                baseline_score=0.8,
                n_examples=2,
            ),
        ]
    )
    example0 = int(store.examples(base)["example_id"][0])
    with store.engine.begin() as conn:
        frame_id = conn.execute(
            sa.insert(Frame).returning(Frame.id),
            dict(
                example_id=example0,
                annoset_id=9,
                frame_id=7,
                frame="Animal",
                lu_id=3,
                lu="dog.n",
                target_start=1,
                target_end=2,
                char_start=4,
                char_end=7,
            ),
        ).scalar_one()
        conn.execute(
            sa.insert(FrameElement),
            [
                dict(
                    frame_row_id=frame_id,
                    name="Animal",
                    core_type="Core",
                    in_core_set=False,
                    word_start=1,
                    word_end=2,
                    char_start=4,
                    char_end=7,
                )
            ],
        )
    return dict(runs=[base, other], checkpoint=checkpoint, model=store.run_info(base).model)


def counts(store) -> dict[str, int]:
    return {t: int(store.sql(f"SELECT count(*) AS n FROM {t}")["n"][0]) for t in (*TABLE_NAMES, "leases")}


def tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()} if folder.exists() else {}


def utc(frame: pd.DataFrame) -> pd.DataFrame:
    """Timestamps as UTC without a zone (PostgreSQL returns them with one, SQLite without)."""
    out = frame.copy()
    for col in out.columns:
        if pd.api.types.is_datetime64_any_dtype(out[col]) or out[col].map(lambda v: hasattr(v, "tzinfo")).any():
            out[col] = pd.to_datetime(out[col], utc=True).dt.tz_localize(None)
    return out


def assert_same_runs(src, dst, runs, names=None) -> None:
    names = names or runs
    for run, name in zip(runs, names):
        for example in src.examples(run)["example"]:
            a, b = src.attention(run, int(example)), dst.attention(name, int(example))
            assert a.dtype == b.dtype and np.array_equal(a, b)
            pd.testing.assert_frame_equal(src.tokens(run, int(example)), dst.tokens(name, int(example)))
            pd.testing.assert_frame_equal(src.words(run, int(example)), dst.words(name, int(example)))
        ex_src, ex_dst = src.examples(run).drop(columns="example_id"), dst.examples(name).drop(columns="example_id")
        pd.testing.assert_frame_equal(ex_src, ex_dst)
        pd.testing.assert_frame_equal(src.token_table(run), dst.token_table(name))
        pd.testing.assert_frame_equal(src.word_table(run), dst.word_table(name))
        pd.testing.assert_frame_equal(src.mention_table(run), dst.mention_table(name))
        hm_src, hm_dst = src.head_metrics(run), dst.head_metrics(name)
        pd.testing.assert_frame_equal(hm_src.drop(columns="run"), hm_dst.drop(columns="run"))
        for query, params in QUERIES:
            pd.testing.assert_frame_equal(run_query(src, query, run=run, **params), run_query(dst, query, run=name, **params))
        ignored = dict(id=0, model_id=0, dataset_id=0, name="", array_path="" if run != name else None)
        assert {**src.run_info(run).as_dict(), **ignored} == {**dst.run_info(name).as_dict(), **ignored}


def test_round_trip_postgresql_to_sqlite_is_identical(pg_databases, tmp_path, make_run):
    src = fresh_store(pg_databases(), tmp_path / "src")
    built = build_source(src, make_run)
    report = export_runs(src, built["runs"], str(tmp_path / "b.zip"))
    assert report.runs == ("dep", "dep-ft") and report.checkpoints == (built["checkpoint"],)
    assert (tmp_path / "b.zip").is_file() and not (tmp_path / "b.zip.partial").exists()

    dst = sqlite_store(tmp_path / "dst")
    done = import_bundle(dst, str(tmp_path / "b.zip"))
    assert done.imported == ("dep", "dep-ft") and done.already == () and done.checkpoints == (built["checkpoint"],)
    assert set(done.models) == {built["model"], built["checkpoint"]}

    assert_same_runs(src, dst, built["runs"])
    drop_ids = ["run_id"]
    pd.testing.assert_frame_equal(utc(src.runs()).drop(columns=drop_ids), utc(dst.runs()).drop(columns=drop_ids))
    pd.testing.assert_frame_equal(utc(src.models()).drop(columns=["id"]), utc(dst.models()).drop(columns=["id"]), check_dtype=False)
    pd.testing.assert_frame_equal(utc(src.probe_results()), utc(dst.probe_results()))
    pd.testing.assert_frame_equal(utc(src.ablation_results()), utc(dst.ablation_results()))
    pd.testing.assert_frame_equal(
        utc(src.pattern_labels()).drop(columns="example_id"), utc(dst.pattern_labels()).drop(columns="example_id")
    )
    frames = (
        "SELECT f.frame, f.lu, f.target_start, fe.name, fe.core_type, fe.in_core_set "
        "FROM frames f JOIN frame_elements fe ON fe.frame_row_id = f.id"
    )
    assert src.sql(frames).values.tolist() == dst.sql(frames).values.tolist() and len(dst.sql(frames)) == 1
    assert {k: v for k, v in counts(src).items()} == counts(dst)

    # every foreign key points at the right rows: tokens of a run belong to its dataset, the parent survived
    wrong = dst.sql(
        "SELECT count(*) AS n FROM tokens t JOIN runs r ON r.id = t.run_id JOIN examples e ON e.id = t.example_id "
        "WHERE e.dataset_id <> r.dataset_id"
    )
    assert wrong["n"][0] == 0
    assert dst.model_row(built["checkpoint"])["parent_id"] == dst.model_row(built["model"])["id"]
    summary, problems = check_store(dst)
    assert problems.empty and len(summary) == 2

    # the checkpoint landed in the target's models folder, byte for byte
    src_ckpt, dst_ckpt = Path(src.locations.models_root) / built["checkpoint"], Path(dst.locations.models_root) / built["checkpoint"]
    assert tree(src_ckpt) == tree(dst_ckpt)
    assert (src_ckpt / "model.safetensors").read_bytes() == (dst_ckpt / "model.safetensors").read_bytes()
    # and the array path (and so the run's uid) is kept
    assert dst.run_info("dep").array_path == src.run_info("dep").array_path
    assert run_uid(dst.run_info("dep").manifest, dst.run_info("dep").array_path) == run_uid(
        src.run_info("dep").manifest, src.run_info("dep").array_path
    )


def test_bundle_layout_and_manifest(tmp_path, make_run):
    src = sqlite_store(tmp_path / "src")
    built = build_source(src, make_run)
    export_runs(src, ["dep"], str(tmp_path / "dir"))
    manifest = json.loads((tmp_path / "dir" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["format"] == FORMAT and manifest["format_version"] == 1
    assert manifest["attnstore_version"] and manifest["created_at"] and "meta.sqlite" in manifest["source"]
    info = src.run_info("dep")
    (entry,) = manifest["runs"]
    assert entry["name"] == "dep" and entry["model"] == info.model and entry["dataset"] == info.dataset and entry["split"] == info.split
    assert entry["uid"] == info.manifest["uid"] and entry["array_path"] == info.array_path
    on_disk = {p.relative_to(tmp_path / "dir").as_posix() for p in (tmp_path / "dir").rglob("*") if p.is_file()}
    assert on_disk == set(manifest["files"]) | {"manifest.json"}
    assert {f"tables/{t}.jsonl.gz" for t in TABLE_NAMES} <= on_disk
    assert f"arrays/{info.array_path}/zarr.json" in on_disk and f"arrays/{info.array_path}/c/0" in on_disk
    # every key of the run's group travels: its own metadata, the index arrays, and the groups above it
    node = entry["array_prefix"]
    assert info.array_path.startswith(node + "/") and f"arrays/{node}/zarr.json" in on_disk
    assert {"arrays/zarr.json", "arrays/runs/zarr.json"} <= on_disk
    assert {n.split("/")[3] for n in on_disk if n.startswith(f"arrays/{node}/") and n.count("/") > 3} >= {"cells", "offset", "token_id"}
    # only the exported run's rows: dep-ft's tokens and the probe result (whose eval run is not exported) stay behind
    assert manifest["tables"]["runs"]["rows"] == 1 and manifest["tables"]["probe_results"]["rows"] == 0
    assert manifest["tables"]["tokens"]["rows"] == sum(len(t) for t in TOKENS)
    # a base model has no checkpoint; the fine-tuned one is exported only with its run (or --model)
    assert [m["name"] for m in manifest["models"]] == [built["model"]] and not any(n.startswith("models/") for n in on_disk)


def test_run_identity():
    assert run_uid({"uid": "u1"}, "runs/dep/cells") == "u1"
    assert run_uid(None, "runs/dep/cells") == "dep"  # without a uid: the group's name


def test_export_a_model_without_runs_carries_its_checkpoint_and_ablations(tmp_path, make_run):
    src = sqlite_store(tmp_path / "src")
    built = build_source(src, make_run)
    report = export_runs(src, [], str(tmp_path / "m.zip"), models=[built["checkpoint"]])
    assert report.runs == () and report.models == (built["model"], built["checkpoint"])
    dst = sqlite_store(tmp_path / "dst")
    done = import_bundle(dst, str(tmp_path / "m.zip"))
    assert done.imported == () and set(done.models) == {built["model"], built["checkpoint"]}
    pd.testing.assert_frame_equal(utc(src.ablation_results()), utc(dst.ablation_results()))
    assert (Path(dst.locations.models_root) / built["checkpoint"] / "config.json").is_file()
    again = import_bundle(dst, str(tmp_path / "m.zip"))
    assert not again.changed


@pytest.mark.parametrize("kind", ["zip", "dir"])
def test_targets_zip_and_folder(tmp_path, make_run, kind):
    src = sqlite_store(tmp_path / "src")
    build_source(src, make_run)
    target = str(tmp_path / ("b.zip" if kind == "zip" else "bundle"))
    export_runs(src, ["dep-ft", "dep"], target)
    if kind == "zip":
        with zipfile.ZipFile(target) as zf:
            assert zf.namelist()[-1] == "manifest.json"
            assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
    dst = sqlite_store(tmp_path / "dst")
    import_bundle(dst, target)
    assert_same_runs(src, dst, ["dep", "dep-ft"])


def test_s3_targets_and_an_s3_rooted_store(tmp_path, make_run, s3_root):
    bucket = s3_root.split("/")[2]
    src = sqlite_store(tmp_path / "src")
    build_source(src, make_run)
    for target in (f"s3://{bucket}/bundle", f"s3://{bucket}/bundles/b.zip"):
        export_runs(src, ["dep", "dep-ft"], target)
        dst = sqlite_store(tmp_path / f"dst-{target.rsplit('/', 1)[1]}")
        assert import_bundle(dst, target).imported == ("dep", "dep-ft")
        assert_same_runs(src, dst, ["dep", "dep-ft"])
    with pytest.raises(ConflictError, match="already exists"):
        export_runs(src, ["dep"], f"s3://{bucket}/bundle")
    # a store whose arrays (and so models folder) live on S3
    remote = sqlite_store(tmp_path / "remote", root=s3_root)
    done = import_bundle(remote, f"s3://{bucket}/bundle")
    assert done.imported == ("dep", "dep-ft") and done.checkpoints
    assert_same_runs(src, remote, ["dep", "dep-ft"])
    fs, path = bundle_mod._url_fs(remote.locations.models_root)
    assert fs.cat(f"{path}/{done.checkpoints[0]}/config.json") == b'{"model_type": "bert"}'


def test_importing_twice_is_a_no_op_on_sqlite_and_postgresql(tmp_path, make_run, store):
    src = sqlite_store(tmp_path / "src")
    built = build_source(src, make_run)
    export_runs(src, ["dep", "dep-ft"], str(tmp_path / "b.zip"))
    first = import_bundle(store, str(tmp_path / "b.zip"))
    assert first.changed and first.imported == ("dep", "dep-ft")
    assert_same_runs(src, store, ["dep", "dep-ft"])
    assert (Path(store.locations.models_root) / built["checkpoint"] / "config.json").is_file()
    before = counts(store)
    files = tree(tmp_path / "attention.zarr"), tree(Path(store.locations.models_root))
    again = import_bundle(store, str(tmp_path / "b.zip"))
    assert not again.changed and again.already == ("dep", "dep-ft") and again.imported == ()
    assert counts(store) == before and (tree(tmp_path / "attention.zarr"), tree(Path(store.locations.models_root))) == files
    # importing into the store the runs came from is a no-op too
    assert not import_bundle(src, str(tmp_path / "b.zip")).changed


def test_a_second_bundle_reuses_the_dataset_already_imported(tmp_path, make_run):
    src = sqlite_store(tmp_path / "src")
    build_source(src, make_run)
    export_runs(src, ["dep"], str(tmp_path / "a.zip"))
    export_runs(src, ["dep-ft"], str(tmp_path / "b.zip"))
    dst = sqlite_store(tmp_path / "dst")
    import_bundle(dst, str(tmp_path / "a.zip"))
    with dst.engine.begin() as conn:  # a dataset is found by its content (identity), not by its name
        conn.execute(sa.text("UPDATE datasets SET name = 'renamed-here'"))
    n = counts(dst)
    second = import_bundle(dst, str(tmp_path / "b.zip"))
    assert second.imported == ("dep-ft",) and second.datasets_reused == (f"{src.run_info('dep').dataset}:test",)
    after = counts(dst)
    assert after["datasets"] == n["datasets"] and after["examples"] == n["examples"] and after["words"] == n["words"]
    assert after["frames"] == n["frames"] and after["runs"] == n["runs"] + 1
    assert dst.run_info("dep-ft").dataset == "renamed-here"
    with dst.engine.begin() as conn:
        conn.execute(sa.text("UPDATE datasets SET name = :n"), {"n": src.run_info("dep").dataset})
    assert_same_runs(src, dst, ["dep", "dep-ft"])
    assert dst.run_info("dep").dataset_id == dst.run_info("dep-ft").dataset_id


def test_a_run_name_used_by_another_run_is_refused_then_renamed(tmp_path, make_run):
    src = sqlite_store(tmp_path / "src")
    build_source(src, make_run)
    export_runs(src, ["dep"], str(tmp_path / "b.zip"))
    dst = sqlite_store(tmp_path / "dst")
    make_run(dst, [maps_for(3, 99)], [["[CLS]", "x", "[SEP]"]], name="dep")
    before, files = counts(dst), tree(tmp_path / "dst")
    with pytest.raises(ConflictError) as err:
        import_bundle(dst, str(tmp_path / "b.zip"))
    message = str(err.value)
    assert "'dep'" in message and "--rename dep=" in message and "\n" not in message
    assert counts(dst) == before and tree(tmp_path / "dst") == files
    with pytest.raises(InvalidArgumentError, match="no run 'nope'"):
        import_bundle(dst, str(tmp_path / "b.zip"), rename={"nope": "x"})
    done = import_bundle(dst, str(tmp_path / "b.zip"), rename={"dep": "dep-from-src"})
    assert done.imported == ("dep-from-src",)
    assert_same_runs(src, dst, ["dep"], names=["dep-from-src"])
    # a layout-2 run's group is named after it: the renamed run moved to its own group, which says its new name
    moved = dst.run_info("dep-from-src").array_path
    assert moved == "runs/dep-from-src/cells" and dst.run_info("dep").array_path == "runs/dep/cells"
    group = json.loads((tmp_path / "dst" / "attention.zarr" / "runs" / "dep-from-src" / "zarr.json").read_text(encoding="utf-8"))
    assert group["attributes"]["run"] == "dep-from-src"
    assert check_store(dst)[1].empty
    again = import_bundle(dst, str(tmp_path / "b.zip"))  # the same run, already there under its new name
    assert not again.changed and again.already == ("dep (as dep-from-src)",)


def test_only_complete_runs_and_known_names_are_exported(tmp_path, make_run):
    src = sqlite_store(tmp_path / "src")
    name, writer = make_run(src, [maps_for(3, 1)], [["[CLS]", "x", "[SEP]"]], name="busy", finish=False)
    try:
        with pytest.raises(InvalidArgumentError, match="'busy' is running, not complete"):
            export_runs(src, ["busy"], str(tmp_path / "b.zip"))
    finally:
        writer.close()
    with pytest.raises(NotFoundError, match="no run 'nope'"):
        export_runs(src, ["nope"], str(tmp_path / "b.zip"))
    with pytest.raises(InvalidArgumentError, match="nothing to export"):
        export_runs(src, [], str(tmp_path / "b.zip"))
    assert not any(tmp_path.glob("b.zip*"))


@pytest.mark.parametrize("kind", ["zip", "dir"])
def test_a_failed_export_leaves_nothing_that_looks_like_a_bundle(tmp_path, make_run, monkeypatch, kind):
    src = sqlite_store(tmp_path / "src")
    build_source(src, make_run)

    def broken(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bundle_export, "_zarr_get", broken)  # export.py calls it
    target = tmp_path / ("b.zip" if kind == "zip" else "bundle")
    with pytest.raises(bundle_mod.StorageIOError, match="No space left"):
        export_runs(src, ["dep"], str(target))
    assert not target.exists() and not Path(f"{target}.partial").exists()


def test_damaged_or_foreign_bundles_are_refused_before_anything_is_written(tmp_path, make_run):
    src = sqlite_store(tmp_path / "src")
    build_source(src, make_run)
    export_runs(src, ["dep"], str(tmp_path / "good"))
    dst = sqlite_store(tmp_path / "dst")
    before, files = counts(dst), tree(tmp_path / "dst")
    import shutil

    chunk = f"arrays/{src.run_info('dep').array_path}/c/0"
    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path / "good", damaged)
    data = bytearray((damaged / chunk).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (damaged / chunk).write_bytes(bytes(data))
    with pytest.raises(CorruptInputError, match=f"{chunk} fails its checksum"):
        import_bundle(dst, str(damaged))

    missing = tmp_path / "missing"
    shutil.copytree(tmp_path / "good", missing)
    (missing / "tables" / "tokens.jsonl.gz").unlink()
    with pytest.raises(CorruptInputError, match="tables/tokens.jsonl.gz is missing"):
        import_bundle(dst, str(missing))

    newer = tmp_path / "newer"
    shutil.copytree(tmp_path / "good", newer)
    manifest = json.loads((newer / "manifest.json").read_text(encoding="utf-8"))
    (newer / "manifest.json").write_text(json.dumps({**manifest, "format_version": 2}), encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match="format version 2"):
        import_bundle(dst, str(newer))

    unfinished = tmp_path / "unfinished"
    shutil.copytree(tmp_path / "good", unfinished)
    (unfinished / "manifest.json").unlink()
    with pytest.raises(CorruptInputError, match="no manifest.json"):
        import_bundle(dst, str(unfinished))

    (tmp_path / "not.zip").write_bytes(b"PK\x03\x04 but not really a zip")
    with pytest.raises(CorruptInputError):
        import_bundle(dst, str(tmp_path / "not.zip"))
    with pytest.raises(NotFoundError, match="no bundle at"):
        import_bundle(dst, str(tmp_path / "nowhere.zip"))
    assert counts(dst) == before and tree(tmp_path / "dst") == files
    with open_bundle(str(tmp_path / "good")) as ok:
        assert ok.verified and [r["name"] for r in ok.manifest["runs"]] == ["dep"]


def test_a_bundle_from_a_newer_schema_revision_is_refused_naming_both(tmp_path, make_run):
    """Issue 24 item 11: a bundle exported by an attnstore whose database is at a revision this one does not know
    (a newer schema) is refused before anything is written, naming both revisions and the fix."""
    from attnstore.store.errors import SchemaOutOfDateError
    from attnstore.store.migrate import head_revision

    src = sqlite_store(tmp_path / "src")
    build_source(src, make_run)
    export_runs(src, ["dep"], str(tmp_path / "good"))
    manifest = json.loads((tmp_path / "good" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["schema_revision"] == head_revision()
    newer = tmp_path / "newer"
    import shutil

    shutil.copytree(tmp_path / "good", newer)
    (newer / "manifest.json").write_text(json.dumps({**manifest, "schema_revision": "0042_from_the_future"}), encoding="utf-8")
    dst = sqlite_store(tmp_path / "dst")
    before, files = counts(dst), tree(tmp_path / "dst")
    with pytest.raises(SchemaOutOfDateError) as err:
        import_bundle(dst, str(newer))
    message = str(err.value)
    assert "'0042_from_the_future'" in message and repr(head_revision()) in message and "upgrade attnstore" in message
    assert "\n" not in message
    with pytest.raises(SchemaOutOfDateError):
        open_bundle(str(newer))
    assert counts(dst) == before and tree(tmp_path / "dst") == files
    older = tmp_path / "older"  # an older revision (or none, before bundles said) is imported as before
    shutil.copytree(tmp_path / "good", older)
    (older / "manifest.json").write_text(json.dumps({**manifest, "schema_revision": None}), encoding="utf-8")
    assert import_bundle(dst, str(older)).imported == ("dep",)


def test_an_import_failing_in_sql_leaves_no_rows_and_is_redone(tmp_path, make_run, monkeypatch):
    src = sqlite_store(tmp_path / "src")
    build_source(src, make_run)
    export_runs(src, ["dep"], str(tmp_path / "b.zip"))
    dst = sqlite_store(tmp_path / "dst")
    before = counts(dst)
    real = bundle_mod._insert_rows

    def fail_midway(conn, plan, bundle, rename):
        real(conn, plan, bundle, rename)
        raise RuntimeError("power cut")

    monkeypatch.setattr(bundle_importing, "_insert_rows", fail_midway)
    with pytest.raises(RuntimeError, match="power cut"):
        import_bundle(dst, str(tmp_path / "b.zip"))
    assert counts(dst) == before  # one transaction: no row at all, and the leases are released
    assert not (tmp_path / "dst" / "attention.zarr" / "runs" / "dep").exists()  # nor the arrays it had copied
    monkeypatch.setattr(bundle_importing, "_insert_rows", real)
    assert import_bundle(dst, str(tmp_path / "b.zip")).imported == ("dep",)
    assert_same_runs(src, dst, ["dep"])
    assert check_store(dst)[1].empty


def test_a_missing_checkpoint_is_named_unless_checkpoints_are_left_out(tmp_path, make_run):
    import shutil

    src = sqlite_store(tmp_path / "src")
    built = build_source(src, make_run)
    shutil.rmtree(Path(src.locations.models_root) / built["checkpoint"])
    with pytest.raises(NotFoundError, match="--no-checkpoints"):
        export_runs(src, ["dep-ft"], str(tmp_path / "b.zip"))
    report = export_runs(src, ["dep-ft"], str(tmp_path / "b.zip"), checkpoints=False)
    assert report.checkpoints == ()
    dst = sqlite_store(tmp_path / "dst")
    done = import_bundle(dst, str(tmp_path / "b.zip"))
    assert done.imported == ("dep-ft",) and done.checkpoints == () and not (Path(dst.locations.models_root)).exists()


def test_a_run_being_written_in_the_target_is_busy(tmp_path, make_run):
    from attnstore.store.errors import BusyError

    src = sqlite_store(tmp_path / "src")
    build_source(src, make_run)
    export_runs(src, ["dep"], str(tmp_path / "b.zip"))
    dst = sqlite_store(tmp_path / "dst")
    before = counts(dst)
    with dst.writer.lease("run:dep", "run 'dep'"):  # an ingest of a run named dep has just started
        with pytest.raises(BusyError, match="run 'dep' is being written"):
            import_bundle(dst, str(tmp_path / "b.zip"))
        assert {k: v for k, v in counts(dst).items() if k != "leases"} == {k: v for k, v in before.items() if k != "leases"}
    assert not (tmp_path / "dst" / "attention.zarr" / "runs" / "dep").exists()


def rewrite_table(folder: Path, table: str, change) -> None:
    """Rewrite tables/TABLE.jsonl.gz of a folder bundle with `change(rows)` applied, its checksum in the manifest
    updated (so only attnstore's checks of the rows themselves can refuse it)."""
    import gzip
    import hashlib

    name = f"tables/{table}.jsonl.gz"
    with gzip.open(folder / name, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    with gzip.open(folder / name, "wt", encoding="utf-8") as fh:
        for row in change(rows):
            fh.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    data = (folder / name).read_bytes()
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def test_rows_over_their_bounds_or_with_unknown_columns_are_refused_and_leave_nothing(tmp_path, make_run, store):
    """Issue 49 item 7: a bundle planted a 200 MB example text that the HTTP server then served whole; a bundle refused at
    its tables left its array files (139 MB); a runs row with a column this attnstore lacks was imported without it. Each
    is refused in one line naming the bundle, the table, the row and the limit (or column), on both backends, and the
    arrays and checkpoint folder the import had copied are removed -- only those: a run already in the store is kept."""
    import shutil

    src = sqlite_store(tmp_path / "src")
    built = build_source(src, make_run)
    export_runs(src, ["dep", "dep-ft"], str(tmp_path / "good"))
    make_run(store, [maps_for(4, 99)], [["[CLS]", "x", "y", "[SEP]"]], name="kept")
    zroot, models = Path(store.locations.array_root), Path(store.locations.models_root)
    before, kept_files = counts(store), tree(zroot / "runs" / "kept")

    def planted(name: str, table: str, change) -> str:
        folder = tmp_path / name
        shutil.copytree(tmp_path / "good", folder)
        rewrite_table(folder, table, change)
        return str(folder)

    def first(**values):
        return lambda rows: [{**rows[0], **values}, *rows[1:]]

    limit = bundle_mod.MAX_TEXT_BYTES
    cases = [
        # refused while the rows are inserted, after the arrays and the checkpoint were copied
        (
            "big-text",
            "examples",
            first(text_a="x" * (2 * limit)),
            r"table examples, row 1 \(id \d+\): text_a holds 2,000,000 bytes, over the 1,000,000",
        ),
        (
            "long-line",
            "examples",
            first(text_b="é" * (bundle_mod.MAX_LINE_CHARS + 1)),
            "table examples, row 1 is over 16,000,000 characters",
        ),
        (
            "long-label",
            "examples",
            first(label="y" * 65),
            r"table examples, row 1 \(id \d+\): label holds 65 characters, over the 64 of its column",
        ),
        (
            "big-token",
            "tokens",
            first(token="z" * (limit + 1)),
            r"table tokens, row 1 \(run_id \d+, example_id \d+, position 0\): token holds 1,000,001 bytes",
        ),
        # refused while the import is planned, before anything is written
        (
            "extra-column",
            "runs",
            first(extra_col=1),
            r"table runs, row 1 \(id \d+\) has column 'extra_col', which table runs of this attnstore",
        ),
    ]
    for name, table, change, message in cases:
        bundle = planted(name, table, change)
        with pytest.raises(InvalidArgumentError, match=message) as err:
            import_bundle(store, bundle)
        assert str(err.value).startswith(f"bundle {bundle}: ") and "\n" not in str(err.value), name
        assert counts(store) == before, name
        assert sorted(p.name for p in (zroot / "runs").iterdir() if p.name != "zarr.json") == ["kept"], name
        assert tree(zroot / "runs" / "kept") == kept_files and not (models / built["checkpoint"]).exists(), name
    assert check_store(store)[1].empty
    assert import_bundle(store, str(tmp_path / "good")).imported == ("dep", "dep-ft")  # the bundle as exported: whole
    assert_same_runs(src, store, ["dep", "dep-ft"])


def test_a_layout_1_run_is_neither_exported_nor_imported_nor_imported_into(tmp_path, make_run):
    """A run in Zarr layout 1 (before 2026-11-23): its export is refused with the line every read of it gets, before
    anything is written; a bundle holding one (exported by an older attnstore) is refused, and so is an import into a
    store holding one, naming `attnstore db upgrade-arrays` and writing nothing."""
    import shutil

    from .test_layout import make_legacy

    src = sqlite_store(tmp_path / "src")
    build_source(src, make_run)
    export_runs(src, ["dep"], str(tmp_path / "good"))
    make_legacy(src, "dep-ft")
    with pytest.raises(OldLayoutError) as caught:
        export_runs(src, ["dep", "dep-ft"], str(tmp_path / "b.zip"))
    assert str(caught.value) == (
        "run 'dep-ft' is stored in Zarr layout 1, which this version no longer reads: "
        "run `attnstore db upgrade-arrays` to convert it (a byte-for-byte chunk copy)"
    )
    assert not list(tmp_path.glob("b.zip*"))

    dst = sqlite_store(tmp_path / "dst")
    before = counts(dst)
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "good", old)
    rewrite_table(old, "runs", lambda rows: [dict(r, array_path="runs/0123abcd") for r in rows])
    with pytest.raises(OldLayoutError, match=r"holds run 'dep' in Zarr layout 1 .*`attnstore db upgrade-arrays` on the store it came"):
        import_bundle(dst, str(old))
    assert counts(dst) == before and tree(Path(dst.locations.array_root) / "runs") == {}

    with pytest.raises(OldLayoutError, match=r"^run 'dep-ft' is stored in Zarr layout 1.*`attnstore db upgrade-arrays`"):
        import_bundle(src, str(tmp_path / "good"))  # into the store whose dep-ft is in layout 1
