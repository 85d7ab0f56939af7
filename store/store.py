"""The `Store` callers get from `open_store`: the reads of `StoreReader`, the user's writes, `run()` and `writer`.

Reading lives in store/reader.py; the user's writes (saved results, summaries, probe results,
pattern labels) here; the writer side that ingest, checks and bundles use (`store.writer`: models,
datasets, runs and their `RunWriter`s, write leases) in store/writer.py; the run handle in
store/handle.py.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import sqlalchemy as sa

from . import leases
from .config import resolve_locations
from .errors import InvalidArgumentError, NotFoundError
from .handle import RunHandle
from .lazy import LazyModule
from .reader import RunRef, StoreReader
from .schema import HeadMatch, HeadMetric, ProbeResult, utcnow
from .writer import StoreWriter, run_lease_name, validate_run_name

if TYPE_CHECKING:
    from . import arrays
else:  # these import zarr: each is imported at its first use, so commands that read SQL only never import zarr (store/lazy.py)
    arrays = LazyModule(f"{__package__}.arrays")

__all__ = ["Store", "open_store", "run_lease_name", "validate_run_name"]


def open_store(db: str | None = None, root: str | None = None, home: str | None = None, read_only: bool | None = None) -> Store:
    """Open the store: `db` URL and array `root`, each from argument > environment > default.

    Connects and checks the schema; never creates or migrates anything
    (`attnstore db upgrade` does that). `read_only=True` (or ATTNSTORE_READ_ONLY=1) opens it
    for reading only: every write raises ReadOnlyStoreError before it starts.
    """
    return Store(resolve_locations(db=db, root=root, home=home, read_only=read_only))


class Store(StoreReader):
    """A store: SQL metadata at `locations.db_url` plus Zarr arrays under `locations.array_root`.

    A store whose SQLite file, PostgreSQL tables or local array root this user cannot write,
    or one opened with `read_only`, is read-only: every read works, every write raises
    ReadOnlyStoreError.
    """

    def run(self, run: RunRef) -> RunHandle:
        """A handle bound to one run (name, or the id `attnstore runs` shows); NotFoundError as `run_info`.

        `store.run(name).tokens(0)` is `store.tokens(name, 0)`; `.query("entropy")` runs a registered query.
        """
        return RunHandle(self, self.run_info(run))

    @cached_property
    def writer(self) -> StoreWriter:
        """The writer side (store/writer.py): what ingest, fine-tuning, evaluation, checks and bundles write and
        read with (models, datasets, runs and their writers, write leases). Not needed to read or to save results."""
        return StoreWriter(self)

    # ------------------------------------------------------------------ the user's writes: results, summaries, labels

    def save_head_metrics(self, run: RunRef, frame: pd.DataFrame, prefix: str, params: dict | None = None) -> int:
        """Save every numeric column of a per-head frame as metric `prefix.column`; replaces earlier values."""
        self.writer.require_writable()
        info = self.run_info(run)
        if not {"layer", "head"} <= set(frame.columns):
            raise InvalidArgumentError("only per-head results (with layer and head columns) can be saved to head_metrics")
        params_json = json.dumps(params or {}, sort_keys=True, default=str)
        value_cols = [
            c
            for c in frame.columns
            if c not in ("layer", "head") and pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c])
        ]
        rows = []
        for col in value_cols:
            for layer, head, value in zip(frame["layer"], frame["head"], frame[col]):
                v = None if pd.isna(value) else float(value)
                rows.append(
                    dict(
                        run_id=info.id,
                        metric=f"{prefix}.{col}",
                        params=params_json,
                        layer=int(layer),
                        head=int(head),
                        value=v,
                        created_at=utcnow(),
                    )
                )
        with self.session() as s:
            s.execute(
                sa.delete(HeadMetric).where(
                    HeadMetric.run_id == info.id,
                    HeadMetric.params == params_json,
                    HeadMetric.metric.in_([f"{prefix}.{c}" for c in value_cols]),
                )
            )
            if rows:
                s.execute(sa.insert(HeadMetric), rows)
        return len(rows)

    def save_head_matches(self, run: RunRef, other: RunRef, frame: pd.DataFrame, params: dict | None = None) -> int:
        """Save a `head_match` frame (one row per head of `run`) to head_matches, keyed by both runs and the parameters
        that made it (metric, specials, examples); replaces the rows saved with the same key."""
        self.writer.require_writable()
        a, b = self.run_info(run), self.run_info(other)
        params_json = json.dumps({k: v for k, v in (params or {}).items() if k != "other"}, sort_keys=True, default=str)
        columns = [c.name for c in HeadMatch.__table__.columns if c.name not in ("id", "run_id", "other_run_id", "params", "created_at")]
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise InvalidArgumentError(f"not a head_match frame: it lacks {', '.join(missing)}")

        def value(v, kind):
            return None if pd.isna(v) else kind(v)

        kinds = {c.name: (float if isinstance(c.type, sa.Float) else int) for c in HeadMatch.__table__.columns}
        rows = [
            dict(
                run_id=a.id,
                other_run_id=b.id,
                params=params_json,
                created_at=utcnow(),
                **{c: value(v, kinds[c]) for c, v in zip(columns, row)},
            )
            for row in frame[columns].itertuples(index=False)
        ]
        with self.session() as s:
            s.execute(sa.delete(HeadMatch).where(HeadMatch.run_id == a.id, HeadMatch.other_run_id == b.id, HeadMatch.params == params_json))
            if rows:
                s.execute(sa.insert(HeadMatch), rows)
        return len(rows)

    def save_probe_result(self, run: RunRef, eval_run: RunRef, result: dict, params: dict) -> int:
        self.writer.require_writable()
        train, held_out = self.run_info(run), self.run_info(eval_run)
        with self.session() as s:
            row = ProbeResult(run_id=train.id, eval_run_id=held_out.id, params=params, **result)
            s.add(row)
            s.flush()
            return row.id

    def save_pattern_labels(self, rows: pd.DataFrame, source: str) -> int:
        """Save attention-pattern labels in one transaction; a map already labelled by `source` is relabelled.

        `rows`: columns run (name or id), example (position), layer, head, label and optionally
        confidence. Every row is checked (the run exists, the example is stored and not skipped,
        layer and head are in range) before anything is written; a bad row raises NotFoundError or
        InvalidArgumentError naming it, and nothing is saved.
        """
        from sqlalchemy.dialects import postgresql, sqlite

        from .schema import PatternLabel  # imported here so this block stays self-contained

        self.writer.require_writable()
        missing = {"run", "example", "layer", "head", "label"} - set(rows.columns)
        if missing:
            raise InvalidArgumentError(f"pattern labels need the columns run, example, layer, head, label; missing {sorted(missing)}")
        if not source or len(source) > 64:
            raise InvalidArgumentError(f"a label source is 1 to 64 characters, not {source!r}")
        now = utcnow()
        records = []
        confidence = rows["confidence"] if "confidence" in rows.columns else pd.Series([None] * len(rows), index=rows.index)
        for run, part in rows.groupby("run", sort=False):
            info = self.run_info(int(run) if isinstance(run, (int, np.integer)) else str(run))
            stored = self.example_rows(info.id)
            stored = stored[~stored["skipped"]].set_index("example")["example_id"]
            for i, example, layer, head, label in zip(part.index, part["example"], part["layer"], part["head"], part["label"]):
                if int(example) not in stored.index:
                    raise NotFoundError(f"run {info.name!r} has no stored example {int(example)} (label row {i})")
                if not (0 <= int(layer) < info.n_layers and 0 <= int(head) < info.n_heads):
                    raise InvalidArgumentError(
                        f"layer {int(layer)}, head {int(head)} is out of range for run {info.name!r} "
                        f"({info.n_layers} layers x {info.n_heads} heads; label row {i})"
                    )
                if not isinstance(label, str) or not label or len(label) > 32:
                    raise InvalidArgumentError(f"label {label!r} is not 1 to 32 characters (label row {i})")
                c = confidence.loc[i]
                records.append(
                    dict(
                        run_id=info.id,
                        example_id=int(stored.loc[int(example)]),
                        layer=int(layer),
                        head=int(head),
                        label=label,
                        source=source,
                        confidence=None if pd.isna(c) else float(c),
                        created_at=now,
                    )
                )
        dialect = {"sqlite": sqlite, "postgresql": postgresql}.get(self.engine.dialect.name)
        if dialect is None:
            raise InvalidArgumentError(f"saving pattern labels needs SQLite or PostgreSQL, not {self.engine.dialect.name}")
        stmt = dialect.insert(PatternLabel)
        stmt = stmt.on_conflict_do_update(
            index_elements=["run_id", "example_id", "layer", "head", "source"],
            set_=dict(label=stmt.excluded.label, confidence=stmt.excluded.confidence, created_at=stmt.excluded.created_at),
        )
        if records:
            with self.session() as s:
                s.execute(stmt, records)
        return len(records)

    def run_state(self, run: RunRef) -> tuple[str, leases.Holder | None]:
        """("complete" | "writing" | "interrupted", live writer or None) of a run."""
        info = self.run_info(run)
        if info.status == "complete":
            return "complete", None
        holder = leases.live_holder(self.engine, run_lease_name(info.name))
        return ("writing", holder) if holder else ("interrupted", None)
