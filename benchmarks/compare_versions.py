"""Compare every registered query's frames between two versions of attnstore, on the same real runs.

    python benchmarks/compare_versions.py OLD_CHECKOUT WORK_DIR [--new CHECKOUT] [--data-dir ../shared/data]
                                          [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres] [--old-read-only]

OLD_CHECKOUT: a checkout of the version to compare with (e.g. `git worktree add /tmp/old <commit>`); --new: the
version under test (default: this checkout). Each version runs in its own process with `attnstore` imported from
that checkout (a folder holding an `attnstore` link to it, first on PYTHONPATH, ahead of the editable install),
with this interpreter. WORK_DIR (created; must not exist yet) gets the stores, the pickled frames and the logs.

1. The OLD version creates a SQLite store and ingests small real runs with the default model (RUNS: samples of
   UD EWT dev, GUM/OntoGUM dev windows, FrameNet exemplars, MRPC dev, and the same MRPC examples again as
   float32 for run_similarity); with --pg a second store on a new PostgreSQL database (PG_RUNS). Then it runs every
   (query, params) of `cases` on its writable store, keeping whatever it keeps (old.pkl).
2. The NEW version runs the same cases (a) on a copy of that store, kept summaries included (they must be read),
   (b) on a copy whose kept summaries (runs/*/summary of the array roots) are deleted (it builds its own),
   (c) on (b)'s state opened read-only (computed for the call alone) and (c_kept) on the old store opened read-only.
   --old-read-only also runs the OLD version on (c)'s store read-only (its own other path, where it had one).
3. Each frame is compared with the old one: columns, index, dtypes, attrs, NaN pattern, max absolute and relative
   difference; IDENTICAL means `frame.equals` and equal attrs. Exit status 1 when some case differs by more
   than 1e-12 (relative) or its error changed.

A query or parameter only one version has is not run: `cases` uses parameters both versions take. The
PostgreSQL databases this creates are dropped at the end. Takes a few minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-12

# (key, dataset, ingest options); the default model (6 layers x 12 heads)
RUNS = [
    ("ewt", "ud/en_ewt:dev", dict(sample=300, seed=0, name="ewt-dev-s300")),
    ("gum", "gum/ontogum:dev", dict(sample=40, seed=0, window_words=60, name="gum-dev-w60-s40")),
    ("fn", "framenet/1.5:exemplars", dict(sample=400, seed=0, name="fn-exemplars-s400")),
    ("mrpc", "glue/MRPC:dev", dict(sample=200, seed=0, name="mrpc-dev-s200")),
    ("mrpc32", "glue/MRPC:dev", dict(sample=200, seed=0, name="mrpc-dev-s200-float32", dtype="float32")),
]
PG_RUNS = [("ewt_pg", "ud/en_ewt:dev", dict(sample=150, seed=1, name="ewt-dev-s150-pg"))]


def cases(key: str, runs: dict) -> list[tuple[str, dict]]:
    """(query, params) to run on run `key`: defaults and a few other settings of each query that applies (and a
    few that do not, whose error messages are compared)."""
    ex = runs[key]["examples"]
    sub = sorted(ex[::3])[:20]  # a fixed subset of the stored example positions
    out: list[tuple[str, dict]] = []

    def add(query: str, **params) -> None:
        out.append((query, params))

    for average in ("example", "token"):
        chosen = {} if average == "example" else {"average": average}
        add("relative_position", **chosen)
        add("entropy", **chosen)
        add("special_tokens", **chosen)
        add("special_tokens", punct=",;", average=average)
    add("relative_position", examples=sub)
    add("entropy", examples=sub, average="token")
    add("special_tokens", examples=sub)
    add("special_tokens", examples=sub, punct=",;")
    add("feature_attention")
    add("feature_attention", features="noun,verb,cls")
    add("feature_attention", examples=sub)
    add("cls_feature_attention")
    add("cls_feature_attention", layer=2, features="noun,sep")
    add("cls_feature_attention", examples=sub)
    add("token_to_token")
    add("token_to_token", examples=sub)
    add("head_distances")
    add("head_distances", examples=sub)
    add("head_clusters")
    add("head_clusters", examples=sub)
    add("pattern_classes")
    add("pattern_classes", max_examples=20, seed=3)
    add("pattern_classes", examples=sub)
    add("pattern_proportions")
    add("pattern_proportions", max_examples=20, seed=3)
    add("pattern_heads")
    add("pattern_heads", max_examples=20, seed=3, examples=sub)
    add("word_maps", example=ex[0])
    add("word_maps", example=ex[-1], layer=3, head=5)
    add("rollout")
    add("rollout", examples=sub, punct=",;")
    add("rollout", weights="norm")
    add("rollout_map", example=ex[0])
    add("rollout_map", example=ex[-1], layer=2)
    add("attention_flow", example=ex[0], max_tokens=12)
    add("head_roles")
    add("head_roles", examples=sub)
    add("head_roles", weights="norm")
    add("norm_attention")
    add("norm_attention", examples=sub, punct=",;")
    add("entropy", weights="norm")
    add("special_tokens", weights="norm", examples=sub)
    if key.startswith("ewt") or key == "gum":
        add("dependency")
        add("dependency", min_count=10)
        add("dependency", min_count=10, head2dep="direct")
        add("dependency", min_count=10, poss_apostrophe=False, examples=sub)
        add("dependency_summary")
        add("dependency_summary", min_count=10, direction="each", head2dep="direct")
        add("dependency_summary", min_count=5, root_in_all=False, direction="dep2head")
        add("dependency", min_count=10, weights="norm")
        add("head_trees", min_count=10)
        add("head_trees", min_count=10, specials="keep", examples=sub)
        add("head_trees_summary", min_count=10)
    if key == "gum":
        add("coreference")
        add("coreference", examples=sub)
        add("coreference_summary")
        add("coreference_summary", examples=sub)
    if key == "fn":
        add("frame_heads")
        add("frame_heads", min_distance=1, core="set")
        add("frame_heads", percentile=95.0, max_words=10, max_fe_words=2)
        add("frame_heads", examples=sub)
        add("frame_heads_top")
        add("frame_heads_top", min_distance=1, core="set")
    if key == "mrpc":
        add("dependency", min_count=5)  # spaCy's trees
        add("coreference")  # no mentions: NaN accuracies
        add("frame_heads")  # refused: no frames
        add("run_similarity")  # refused: no other run
        for other in ("mrpc32",):
            add("run_similarity", other=runs[other]["name"])
            add("run_similarity", other=runs[other]["name"], max_examples=20, seed=2)
            add("run_similarity", other=runs[other]["name"], examples=sub)
            add("head_match", other=runs[other]["name"])
            add("head_match", other=runs[other]["name"], metric="cosine", examples=sub)
            add("head_match_matrix", other=runs[other]["name"])
    if key == "mrpc32":
        add("run_similarity", other=runs["mrpc"]["name"])
        add("run_similarity", other=runs["mrpc"]["name"], max_examples=20, seed=2)
    return out


# ---------------------------------------------------------------- in the process of one version


def worker_ingest(work: Path, data_dir: str, pg_url: str | None) -> None:
    from attnstore.ingest import ingest
    from attnstore.ingest.model import load_model
    from attnstore.store import migrate, open_store

    loaded = load_model()
    info = {}
    targets = [(f"sqlite:///{work}/old/meta.sqlite", "attention.zarr", RUNS)]
    if pg_url:
        targets.append((pg_url, "attention_pg.zarr", PG_RUNS))
    for url, root, runs in targets:
        migrate.upgrade(url)
        store = open_store(db=url, root=str(work / "old" / root))
        for key, dataset, options in runs:
            start = time.time()
            run = ingest(store, dataset=dataset, data_dir=data_dir, loaded=loaded, progress=False, **options).run
            info[key] = dict(
                backend=url.split(":", 1)[0].split("+")[0],
                root=root,
                name=run.name,
                dataset=dataset,
                options=options,
                n_stored=int(run.n_stored),
                examples=[int(x) for x in store.storage_order(run.name)],
            )
            print(f"{key}: {run.name} ({dataset} {options}): {run.n_stored} examples, {time.time() - start:.1f} s", flush=True)
        store.close()
    (work / "runs.json").write_text(json.dumps(info, indent=1))


def worker_query(work: Path, store_dir: Path, pg_url: str | None, read_only: bool, out: Path) -> None:
    import attnstore
    from attnstore.queries import QUERIES, load_all, run_query
    from attnstore.store import open_store

    load_all()
    print(f"attnstore from {attnstore.__file__}, {store_dir.name}, {'read-only' if read_only else 'writable'}", flush=True)
    runs = json.loads((work / "runs.json").read_text())
    frames, stores, covered = {}, {}, set()
    for key, run in runs.items():
        db = f"sqlite:///{store_dir}/meta.sqlite" if run["backend"] == "sqlite" else pg_url
        where = (db, str(store_dir / run["root"]))
        if where not in stores:
            stores[where] = open_store(db=where[0], root=where[1], read_only=read_only)
        start = time.time()
        for query, params in cases(key, runs):
            covered.add(query)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    frames[(key, query, json.dumps(params, sort_keys=True))] = (
                        "ok",
                        run_query(stores[where], query, run=run["name"], **params),
                    )
            except Exception as e:  # noqa: BLE001 -- the message is what is compared
                frames[(key, query, json.dumps(params, sort_keys=True))] = ("error", f"{type(e).__name__}: {e}")
        print(f"  {key}: {time.time() - start:.1f} s", flush=True)
    for store in stores.values():
        store.close()
    missing = sorted(set(QUERIES) - covered)
    if missing:
        print(f"  registered queries without a case (not compared): {missing}", flush=True)
    out.write_bytes(pickle.dumps(frames))


# ---------------------------------------------------------------- comparing


def diff(a, b) -> tuple[str, float, float, str]:
    """(status, max abs, max rel, notes) of frame `b` against `a`: IDENTICAL, WITHIN (<= TOLERANCE relative) or DIFFERS."""
    import numpy as np
    import pandas as pd

    if list(a.columns) != list(b.columns) or a.shape != b.shape or not a.index.equals(b.index):
        return "DIFFERS", np.nan, np.nan, f"columns/shape/index: {list(a.columns)} {a.shape} vs {list(b.columns)} {b.shape}"
    notes = []
    if set(a.attrs) != set(b.attrs):
        notes.append(f"attrs {sorted(a.attrs)} vs {sorted(b.attrs)}")
    else:
        notes += [f"attrs[{k}]" for k in a.attrs if repr(a.attrs[k]) != repr(b.attrs[k])]
    max_abs = max_rel = 0.0
    for col in a.columns:
        x, y = a[col], b[col]
        if x.dtype != y.dtype:
            notes.append(f"dtype of {col}: {x.dtype} vs {y.dtype}")
        if pd.api.types.is_numeric_dtype(x) and pd.api.types.is_numeric_dtype(y) and not pd.api.types.is_bool_dtype(x):
            xv, yv = x.to_numpy(np.float64), y.to_numpy(np.float64)
            if not np.array_equal(np.isnan(xv), np.isnan(yv)):
                notes.append(f"NaNs of {col}")
            both = ~(np.isnan(xv) | np.isnan(yv))
            d = np.abs(xv[both] - yv[both])
            if d.size:
                scale = np.maximum(np.abs(xv[both]), np.abs(yv[both]))
                max_abs = max(max_abs, float(d.max()))
                max_rel = max(max_rel, float((d / np.where(scale > 0, scale, 1)).max()))
        elif not x.equals(y):
            notes.append(f"values of {col}")
    if a.equals(b) and not notes:
        return "IDENTICAL", max_abs, max_rel, ""
    return ("WITHIN" if max_rel <= TOLERANCE and not notes else "DIFFERS"), max_abs, max_rel, "; ".join(notes)


def compare(old: dict, news: dict[str, dict]) -> bool:
    """Print a line per case and a line per (query, case); True when every case is within TOLERANCE."""
    ok = True
    worst: dict[tuple[str, str], list] = {}
    for k in sorted(old):
        key, query, params = k
        shown = json.loads(params)
        if "examples" in shown:
            shown["examples"] = f"<{len(shown['examples'])} ids>"
        cells = []
        for label, new in news.items():
            w = worst.setdefault((query, label), [0.0, 0.0, set(), 0])
            w[3] += 1
            (s_old, f_old), (s_new, f_new) = old[k], new.get(k, ("error", "missing"))
            if "error" in (s_old, s_new):
                same = s_old == s_new and f_old == f_new
                status = (
                    "same error"
                    if same
                    else f"ERROR old={f_old if s_old == 'error' else 'ok'!r} new={f_new if s_new == 'error' else 'ok'!r}"
                )
                w[2].add("same error" if same else "ERROR")
                ok &= same
                cells.append(f"{label}: {status}")
                continue
            status, max_abs, max_rel, notes = diff(f_old, f_new)
            ok &= status != "DIFFERS"
            w[0], w[1] = max(w[0], max_abs), max(w[1], max_rel)
            w[2].add(status)
            extra = f" abs={max_abs:.3g} rel={max_rel:.3g}" if status != "IDENTICAL" else ""
            cells.append(f"{label}: {status}{extra}" + (f" [{notes}]" if notes else ""))
        print(f"{key:7s} {query:22s} {json.dumps(shown):62s} | " + " | ".join(cells))
    print("\nper query, worst over its runs and parameters (cases = runs x parameter sets):")
    for (query, label), (max_abs, max_rel, statuses, n) in sorted(worst.items()):
        print(f"  {query:22s} {label:8s} {n:3d} cases  {'/'.join(sorted(statuses)):22s} max_abs={max_abs:.3g} max_rel={max_rel:.3g}")
    return ok


# ---------------------------------------------------------------- driving


def run_version(checkout: Path, work: Path, *args: str) -> None:
    """This script's worker, in a process whose `attnstore` is `checkout`."""
    link_dir = Path(tempfile.mkdtemp(prefix="attnstore-version-", dir=work))
    (link_dir / "attnstore").symlink_to(checkout.resolve(), target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=str(link_dir), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "_worker", *args], env=env, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        what, work, *rest = sys.argv[2:]
        pg = os.environ.get("COMPARE_PG") or None
        if what == "ingest":
            worker_ingest(Path(work), rest[0], pg)
        else:
            store_dir, read_only, out = rest
            worker_query(Path(work), Path(store_dir), pg, read_only == "ro", Path(out))
        return 0
    ap.add_argument("old", type=Path, help="checkout of the version to compare with")
    ap.add_argument("work", type=Path, help="work folder (created; must not exist)")
    ap.add_argument("--new", type=Path, default=HERE, help="checkout of the version under test (default: this one)")
    ap.add_argument("--data-dir", default=str(HERE.parent / "shared" / "data"))
    ap.add_argument("--pg", help="an admin URL of a PostgreSQL server: one run is also stored there (databases dropped at the end)")
    ap.add_argument("--old-read-only", action="store_true", help="also the old version on the store without summaries, read-only")
    args = ap.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True)
    databases: list[str] = []
    admin = None
    if args.pg:
        import sqlalchemy as sa

        admin = sa.create_engine(args.pg, isolation_level="AUTOCOMMIT")
    prefix = f"compare_versions_{uuid.uuid4().hex[:8]}"

    def url(name: str) -> str | None:
        return None if admin is None else admin.url.set(database=f"{prefix}_{name}").render_as_string(hide_password=False)

    def database(name: str, template: str | None = None) -> str | None:
        """A new PostgreSQL database (a copy of `template`'s), or None without --pg."""
        if admin is None:
            return None
        import sqlalchemy as sa

        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{prefix}_{name}"' + (f' TEMPLATE "{prefix}_{template}"' if template else "")))
        databases.append(f"{prefix}_{name}")
        return url(name)

    def version(checkout: Path, pg: str | None, *rest: str) -> None:
        os.environ["COMPARE_PG"] = pg or ""
        run_version(checkout, work, *rest)

    try:
        (work / "old").mkdir()
        version(args.old, database("old"), "ingest", str(work), args.data_dir)
        version(args.old, url("old"), "query", str(work), str(work / "old"), "rw", str(work / "old.pkl"))
        for name in ("a", "b", "c"):
            shutil.copytree(work / "old", work / name, symlinks=True)
        for name in ("b", "c"):
            for summary in (work / name).glob("*.zarr/runs/*/summary"):
                shutil.rmtree(summary)
        plan = [("a", "a", "rw"), ("b", "b", "rw"), ("c", "c", "ro"), ("c_kept", "old", "ro")]
        if args.old_read_only:
            plan.append(("old_ro", "c", "ro"))
        pickles = {}
        for label, store_dir, mode in plan:
            pg = database(label, template="old") if mode == "rw" else url("old")  # read-only: the old database itself
            checkout = args.old if label == "old_ro" else args.new
            version(checkout, pg, "query", str(work), str(work / store_dir), mode, str(work / f"{label}.pkl"))
            pickles[label] = pickle.loads((work / f"{label}.pkl").read_bytes())
        runs = json.loads((work / "runs.json").read_text())
        print(
            "\nruns:",
            "; ".join(f"{k}: {r['dataset']} {r['options']} -> {r['n_stored']} examples ({r['backend']})" for k, r in runs.items()),
        )
        ok = compare(pickle.loads((work / "old.pkl").read_bytes()), pickles)
        print(f"\n{'every case identical or within' if ok else 'some case differs by more than'} {TOLERANCE:g} relative")
        return 0 if ok else 1
    finally:
        if admin is not None:
            import sqlalchemy as sa

            with admin.connect() as conn:
                for name in databases:
                    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


if __name__ == "__main__":
    sys.exit(main())
