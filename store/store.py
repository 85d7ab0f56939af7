"""The `Store`: connect to SQL + Zarr, read runs/examples/tokens/maps, and the write API used by ingest."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Iterator, Set
from collections.abc import Sequence as Seq
from contextlib import contextmanager

import numpy as np
import pandas as pd
import sqlalchemy as sa
import sqlalchemy.orm
from sqlalchemy.orm import sessionmaker

from . import arrays, leases
from .config import Locations, resolve_locations
from .db import check_connection, create_engine, session_scope, sqlite_path, sqlite_writable
from .errors import ConflictError, InvalidArgumentError, NotFoundError, ReadOnlyStoreError, StorageIOError
from .migrate import upgrade_command, verify_schema
from .records import ExampleInput, RunInfo, StoredExample
from .schema import (
    AblationResult,
    Dataset,
    Example,
    Frame,
    FrameElement,
    HeadMetric,
    Mention,
    Model,
    ProbeResult,
    Run,
    Sequence,
    Token,
    Word,
    utcnow,
)

WORD_FIELDS = ("position", "segment", "sentence", "form", "lemma", "upos", "xpos", "feats", "head", "deprel",
               "char_start", "char_end")

RunRef = str | int


def open_store(db: str | None = None, root: str | None = None, home: str | None = None) -> Store:
    """Open the store: `db` URL and array `root`, each from argument > environment > default.

    Connects and checks the schema; never creates or migrates anything
    (`attnstore db upgrade` does that).
    """
    return Store(resolve_locations(db=db, root=root, home=home))


class Store:
    """A store: SQL metadata at `locations.db_url` plus Zarr arrays under `locations.array_root`.

    A store whose SQLite file or local array root this process cannot write is opened
    read-only: every read works, every write raises ReadOnlyStoreError.
    """

    def __init__(self, locations: Locations):
        self.locations = locations
        url = locations.db_url
        path = sqlite_path(url)
        if path and not os.path.exists(path):
            raise NotFoundError(f"no store database at {path}; create it with: {upgrade_command(url)}")
        self.read_only = bool(path and not sqlite_writable(path)) or not arrays.root_writable(locations.array_root)
        self.engine = create_engine(locations.db_url, read_only=bool(path and not sqlite_writable(path)))
        check_connection(self.engine)
        verify_schema(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._pins: dict[int, int] = {}  # run id -> largest block offset visible (see `pinned`)

    def require_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(f"store {self.locations.describe()} is read-only for this user (no write permission "
                                     "on its database or array root); it can be queried but not written")

    def __repr__(self) -> str:
        return f"Store({self.locations.describe()})"

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def session(self):
        return session_scope(self._sessions)

    # ------------------------------------------------------------------ reading

    def sql(self, query: str, params: dict | None = None, max_rows: int | None = None) -> pd.DataFrame:
        """Run a SQL query over the metadata and return a DataFrame (at most `max_rows` rows).

        One read-only statement (SELECT, WITH, VALUES, EXPLAIN; introspection PRAGMAs on SQLite)
        on its own read-only connection, under a time limit; anything that would write, and
        several statements at once, raise InvalidArgumentError("SQL error: ..."). See store/readonly.py.
        """
        from .readonly import run_readonly_sql

        # SQLite: by file (a read-only store's engine has no path in its URL); PostgreSQL: via the engine.
        target = self.locations.db_url if self.engine.dialect.name == "sqlite" else self.engine
        columns, rows = run_readonly_sql(target, query, params, max_rows)
        if columns is None:
            return pd.DataFrame()
        return pd.DataFrame(rows, columns=columns)

    def _frame(self, query) -> pd.DataFrame:
        with self.engine.connect() as conn:
            return pd.read_sql_query(query, conn)

    def runs(self) -> pd.DataFrame:
        """One row per run: run, run_id, model, dataset, split, status, counts, settings, times."""
        q = (
            sa.select(
                Run.name.label("run"), Run.id.label("run_id"), Model.name.label("model"),
                Dataset.name.label("dataset"), Dataset.split, Run.status, Run.n_stored, Run.n_truncated,
                Run.n_skipped, Model.n_layers, Model.n_heads, Run.max_length, Run.truncation, Run.tokenization, Run.dtype,
                Run.attn_implementation, Run.started_at, Run.finished_at, Run.ingest_seconds,
            )
            .join(Model, Model.id == Run.model_id)
            .join(Dataset, Dataset.id == Run.dataset_id)
            .order_by(Run.id)
        )
        return self._frame(q)

    def run_info(self, run: RunRef) -> RunInfo:
        with self.session() as s:
            where = Run.id == run if isinstance(run, int) else Run.name == str(run)
            joined = sa.select(Run, Model, Dataset).join(Model, Model.id == Run.model_id).join(Dataset, Dataset.id == Run.dataset_id)
            row = s.execute(joined.where(where)).first()
            if row is None and isinstance(run, str) and run.strip().isdigit():
                row = s.execute(joined.where(Run.id == int(run))).first()  # the run id `attnstore runs` shows
            if row is None:
                known = s.scalars(sa.select(Run.name).order_by(Run.id).limit(10)).all()
                hint = f"known runs: {', '.join(known)}" if known else "the store has no runs yet; create one with `attnstore ingest`"
                raise NotFoundError(f"no run {run!r} in {self.locations.describe()}; {hint}")
            r, m, d = row
            return RunInfo(
                id=r.id, name=r.name, status=r.status, model=m.name, model_id=m.id, dataset=d.name, split=d.split,
                dataset_id=d.id, n_layers=m.n_layers, n_heads=m.n_heads, max_length=r.max_length,
                truncation=r.truncation, dtype=r.dtype, codec=r.codec, chunk_cells=r.chunk_cells,
                array_path=r.array_path, attn_implementation=r.attn_implementation,
                special_tokens=m.special_tokens, n_stored=r.n_stored, n_truncated=r.n_truncated,
                n_skipped=r.n_skipped, manifest=r.manifest, tokenization=r.tokenization,
            )

    def examples(self, run: RunRef) -> pd.DataFrame:
        """Examples of a run: example (position in the corpus), example_id, texts, label, length, offset, flags."""
        info = self.run_info(run)
        q = (
            sa.select(
                Example.position.label("example"), Example.id.label("example_id"), Example.text_a, Example.text_b,
                Example.label, Example.doc_id, Example.sent_id, Sequence.length, Sequence.offset,
                Sequence.truncated, Sequence.skipped,
            )
            .join(Sequence, Sequence.example_id == Example.id)
            .where(self._visible(info))
            .order_by(Example.position)
        )
        return self._frame(q)

    def _visible(self, info: RunInfo):
        """SQL condition: sequences of the run, up to its pinned snapshot if one is pinned.

        Blocks are appended at increasing offsets by the run's single writer, so "offset at
        most the largest committed when pinned" is exactly the examples committed by then
        (skipped examples have no offset and no maps; they are always visible).
        """
        cond = Sequence.run_id == info.id
        pin = self._pins.get(info.id)
        return cond if pin is None else sa.and_(cond, sa.or_(Sequence.offset.is_(None), Sequence.offset <= pin))

    @contextmanager
    def pinned(self, run: RunRef):
        """Read the run as of now: inside this block, every read sees only examples committed before it began.

        Queries use it so a run being written is read as one consistent snapshot.
        """
        info = self.run_info(run)
        if info.id in self._pins:
            yield info
            return
        with self.engine.connect() as conn:
            last = conn.scalar(sa.select(sa.func.max(Sequence.offset)).where(Sequence.run_id == info.id))
        self._pins[info.id] = -1 if last is None else int(last)
        try:
            yield info
        finally:
            self._pins.pop(info.id, None)

    def _sequence(self, info: RunInfo, example: int) -> tuple[int, int, int | None]:
        if isinstance(example, bool) or not isinstance(example, (int, np.integer)):
            raise InvalidArgumentError(f"example must be an integer position in the corpus, not {example!r}")
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(Example.id, Sequence.length, Sequence.offset)
                .join(Sequence, Sequence.example_id == Example.id)
                .where(self._visible(info), Example.position == int(example))
            ).first()
        if row is None:
            raise NotFoundError(
                f"run {info.name!r} has no example {example} (it stores {info.n_stored} examples; see store.examples(run))"
            )
        if row.offset is None:
            raise NotFoundError(f"example {example} of run {info.name!r} was skipped (longer than {info.max_length} tokens)")
        return row.id, row.length, row.offset

    def tokens(self, run: RunRef, example: int) -> pd.DataFrame:
        """Tokens of one example with their word alignment and annotation.

        Columns: position, token, token_id, is_special, segment, word_position (NULL for
        special tokens), word, lemma, upos, xpos, head (word position), deprel, annotator,
        char_start, char_end (characters of the segment's text).
        """
        info = self.run_info(run)
        example_id, _, _ = self._sequence(info, example)
        q = (
            sa.select(
                Token.position, Token.token, Token.token_id, Token.is_special, Token.segment, Token.word_position,
                Word.form.label("word"), Word.lemma, Word.upos, Word.xpos, Word.head, Word.deprel, Word.annotator,
                Token.char_start, Token.char_end,
            )
            .outerjoin(Word, sa.and_(Word.example_id == Token.example_id, Word.position == Token.word_position))
            .where(Token.run_id == info.id, Token.example_id == example_id)
            .order_by(Token.position)
        )
        df = self._frame(q)
        for col in ("word_position", "head", "char_start", "char_end"):
            df[col] = df[col].astype("Int64")
        return df

    def words(self, run: RunRef, example: int) -> pd.DataFrame:
        """Words of one example: position, segment, form, lemma, upos, xpos, head, deprel, annotator, chars."""
        info = self.run_info(run)
        example_id, _, _ = self._sequence(info, example)
        q = sa.select(
            Word.position, Word.segment, Word.form, Word.lemma, Word.upos, Word.xpos, Word.head, Word.deprel,
            Word.annotator, Word.char_start, Word.char_end,
        ).where(Word.example_id == example_id).order_by(Word.position)
        df = self._frame(q)
        df["head"] = df["head"].astype("Int64")
        return df

    def token_table(self, run: RunRef) -> pd.DataFrame:
        """All tokens of a run (example, position, token, token_id, word_position, segment, is_special)."""
        info = self.run_info(run)
        q = (
            sa.select(
                Example.position.label("example"), Token.position, Token.token, Token.token_id,
                Token.word_position, Token.segment, Token.is_special,
            )
            .join(Example, Example.id == Token.example_id)
            .join(Sequence, sa.and_(Sequence.example_id == Token.example_id, Sequence.run_id == Token.run_id))
            .where(Token.run_id == info.id, self._visible(info))
            .order_by(Example.position, Token.position)
        )
        return self._frame(q)

    def word_table(self, run: RunRef) -> pd.DataFrame:
        """All words of a run's stored examples: example, position, segment, form, lemma, upos, feats, head, deprel."""
        info = self.run_info(run)
        q = (
            sa.select(Example.position.label("example"), Word.position, Word.segment, Word.sentence, Word.form, Word.lemma,
                      Word.upos, Word.feats, Word.head, Word.deprel)
            .join(Example, Example.id == Word.example_id)
            .join(Sequence, sa.and_(Sequence.example_id == Example.id, self._visible(info)))
            .order_by(Example.position, Word.position)
        )
        frame = self._frame(q)
        frame["head"] = frame["head"].astype("Int64")
        return frame

    def mention_table(self, run: RunRef) -> pd.DataFrame:
        """Coreference mentions of a run's stored examples: example, word_start, word_end, head, entity, kind, doc_order."""
        info = self.run_info(run)
        q = (
            sa.select(Example.position.label("example"), Mention.word_start, Mention.word_end, Mention.head, Mention.entity,
                      Mention.kind, Mention.doc_order)
            .join(Example, Example.id == Mention.example_id)
            .join(Sequence, sa.and_(Sequence.example_id == Example.id, self._visible(info)))
            .order_by(Example.position, Mention.doc_order)
        )
        return self._frame(q)

    def _array(self, info: RunInfo, read_only: bool = True):
        return arrays.open_run_array(self.locations.array_root, info.array_path, read_only=read_only)

    @staticmethod
    def _select(name: str, value, size: int):
        if value is None:
            return slice(None)
        values = [value] if isinstance(value, (int, np.integer)) else list(value)
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not -size <= v < size:
                raise InvalidArgumentError(f"{name} {v!r} is out of range: the model has {size} {name}s (0..{size - 1})")
        return values

    def attention(self, run: RunRef, example: int, layer=None, head=None) -> np.ndarray:
        """One example's maps as a (layer, head, query, key) array, never padded.

        `layer` / `head` are None (all), an int or a list of ints; the result keeps
        all four axes either way. Rows sum to 1 over the example's L tokens.
        Damaged or missing chunks raise DamagedDataError naming run, example and chunk.
        """
        info = self.run_info(run)
        layers = self._select("layer", layer, info.n_layers)
        heads = self._select("head", head, info.n_heads)
        _, length, offset = self._sequence(info, example)
        assert offset is not None  # _sequence refuses skipped examples
        block = arrays.read_block(self._array(info), offset, arrays.block_shape(info.n_layers, info.n_heads, length),
                                  describe=lambda a, b: f"run {info.name!r}, example {example}")
        return block[layers][:, heads]

    def iter_attention(self, run: RunRef, examples: Iterable[int] | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Stream (example, maps) over a run in storage order with bounded memory."""
        info = self.run_info(run)
        seqs = self.examples(info.id)
        seqs = seqs[~seqs["skipped"]]
        if examples is not None:
            wanted = set(int(e) for e in examples)
            missing = wanted - set(seqs["example"])
            if missing:
                raise NotFoundError(f"run {info.name!r} has no stored example(s) {sorted(missing)[:10]}")
            seqs = seqs[seqs["example"].isin(wanted)]
        refs = [arrays.BlockRef(int(e), int(o), int(n)) for e, o, n in zip(seqs["example"], seqs["offset"], seqs["length"])]

        def describe(keys: list) -> str:
            shown = ", ".join(str(k) for k in keys[:5]) + (", ..." if len(keys) > 5 else "")
            return f"run {info.name!r}, example{'s' if len(keys) > 1 else ''} {shown}"

        for key, maps in arrays.iter_blocks(self._array(info), refs, info.n_layers, info.n_heads, describe=describe):
            yield int(key), maps  # type: ignore[call-overload]  # keys are the example positions given above

    def head_metrics(self, run: RunRef | None = None, metric: str | None = None) -> pd.DataFrame:
        """Saved per-head values: run, metric, params, layer, head, value (optionally one run / metric)."""
        q = sa.select(Run.name.label("run"), HeadMetric.metric, HeadMetric.params, HeadMetric.layer, HeadMetric.head,
                      HeadMetric.value).join(Run, Run.id == HeadMetric.run_id)
        if run is not None:
            q = q.where(HeadMetric.run_id == self.run_info(run).id)
        if metric is not None:
            q = q.where(HeadMetric.metric == metric)
        return self._frame(q.order_by(HeadMetric.metric, HeadMetric.layer, HeadMetric.head))

    # ------------------------------------------------------------------ writing

    def save_head_metrics(self, run: RunRef, frame: pd.DataFrame, prefix: str, params: dict | None = None) -> int:
        """Save every numeric column of a per-head frame as metric `prefix.column`; replaces earlier values."""
        info = self.run_info(run)
        if not {"layer", "head"} <= set(frame.columns):
            raise InvalidArgumentError("only per-head results (with layer and head columns) can be saved to head_metrics")
        params_json = json.dumps(params or {}, sort_keys=True, default=str)
        value_cols = [c for c in frame.columns if c not in ("layer", "head")
                      and pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c])]
        rows = []
        for col in value_cols:
            for layer, head, value in zip(frame["layer"], frame["head"], frame[col]):
                v = None if pd.isna(value) else float(value)
                rows.append(dict(run_id=info.id, metric=f"{prefix}.{col}", params=params_json, layer=int(layer),
                                 head=int(head), value=v, created_at=utcnow()))
        with self.session() as s:
            s.execute(sa.delete(HeadMetric).where(HeadMetric.run_id == info.id, HeadMetric.params == params_json,
                                                  HeadMetric.metric.in_([f"{prefix}.{c}" for c in value_cols])))
            if rows:
                s.execute(sa.insert(HeadMetric), rows)
        return len(rows)

    def save_probe_result(self, run: RunRef, eval_run: RunRef, result: dict, params: dict) -> int:
        train, held_out = self.run_info(run), self.run_info(eval_run)
        with self.session() as s:
            row = ProbeResult(run_id=train.id, eval_run_id=held_out.id, params=params, **result)
            s.add(row)
            s.flush()
            return row.id

    def probe_results(self) -> pd.DataFrame:
        """Saved probe results: run, eval_run, kind, uas, train_uas, n_train, n_eval, epochs, final_loss, params."""
        train, held_out = sa.orm.aliased(Run), sa.orm.aliased(Run)
        q = (sa.select(train.name.label("run"), held_out.name.label("eval_run"), ProbeResult.kind, ProbeResult.uas,
                       ProbeResult.train_uas, ProbeResult.n_train, ProbeResult.n_eval, ProbeResult.epochs,
                       ProbeResult.final_loss, ProbeResult.params, ProbeResult.created_at)
             .join(train, train.id == ProbeResult.run_id).join(held_out, held_out.id == ProbeResult.eval_run_id)
             .order_by(ProbeResult.id))
        return self._frame(q)

    def model_row(self, name: str) -> dict | None:
        """The most recent model registered under `name` (id, name, source, init, task, parent_id, training, ...)."""
        with self.session() as s:
            m = s.scalars(sa.select(Model).where(Model.name == name).order_by(Model.id.desc())).first()
            return None if m is None else {c.name: getattr(m, c.name) for c in Model.__table__.columns}

    def models(self) -> pd.DataFrame:
        """Registered models: id, name, architecture, n_layers, n_heads, init, task, parent, training, created_at."""
        parent = sa.orm.aliased(Model)
        q = (sa.select(Model.id, Model.name, Model.architecture, Model.n_layers, Model.n_heads, Model.init, Model.task,
                       parent.name.label("parent"), Model.training, Model.created_at)
             .outerjoin(parent, parent.id == Model.parent_id).order_by(Model.id))
        return self._frame(q)

    def register_finetuned_model(self, **fields) -> int:
        """Register a fine-tuned model (fields of `models`, with parent_id, init, task, training); idempotent."""
        self.require_writable()
        with self.session() as s:
            existing = s.scalars(sa.select(Model).where(Model.name == fields["name"],
                                                        Model.weights_sha256 == fields["weights_sha256"])).first()
            if existing is not None:
                existing.training = fields.get("training")
                return existing.id
            model = Model(**fields)
            s.add(model)
            s.flush()
            return model.id

    def add_ablation_results(self, rows: list[dict]) -> bool:
        """Insert the rows of one configuration in one transaction; False if it was already stored (by anyone)."""
        self.require_writable()
        now = utcnow()
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.insert(AblationResult), [dict(created_at=now, **r) for r in rows])
        except sa.exc.IntegrityError:
            return False
        return True

    def ablation_configs(self, model_id: int, task: str, split: str, mode: str) -> set[str]:
        """Configurations already stored for (model, task, split, mode)."""
        with self.engine.connect() as conn:
            return set(conn.scalars(sa.select(AblationResult.config).where(
                AblationResult.model_id == model_id, AblationResult.task == task, AblationResult.split == split,
                AblationResult.mode == mode).distinct()))

    def ablation_results(self, model: str | None = None, task: str | None = None) -> pd.DataFrame:
        """Stored evaluations and ablations: model, init, task, split, mode, config, disabled_heads, metric, score,
        baseline_score, delta (score - baseline), n_examples. Config "none" is the model's plain evaluation."""
        q = (sa.select(Model.name.label("model"), Model.init, AblationResult.task, AblationResult.split, AblationResult.mode,
                       AblationResult.config, AblationResult.disabled_heads, AblationResult.metric, AblationResult.score,
                       AblationResult.baseline_score, AblationResult.n_examples, AblationResult.created_at)
             .join(Model, Model.id == AblationResult.model_id).order_by(AblationResult.id))
        if model is not None:
            q = q.where(Model.name == model)
        if task is not None:
            q = q.where(AblationResult.task == task)
        frame = self._frame(q)
        frame["delta"] = frame["score"] - frame["baseline_score"]
        return frame

    # ------------------------------------------------------------------ attention-pattern labels (Kovaleva et al. K1)

    def example_rows(self, run: RunRef) -> pd.DataFrame:
        """A run's examples with their row in the original corpus.

        Columns: example (position), example_id, source_row (examples.source_index where the
        corpus numbers its rows, e.g. a sampled GLUE set, else the position), length, skipped.
        """
        info = self.run_info(run)
        q = (sa.select(Example.position.label("example"), Example.id.label("example_id"), Example.source_index,
                       Sequence.length, Sequence.skipped)
             .join(Sequence, Sequence.example_id == Example.id).where(self._visible(info)).order_by(Example.position))
        frame = self._frame(q)
        index = pd.to_numeric(frame["source_index"], errors="coerce")
        frame["source_row"] = index.where(index.notna(), frame["example"]).astype("int64")
        return frame[["example", "example_id", "source_row", "length", "skipped"]]

    def pattern_labels(self, run: RunRef | None = None, source: str | None = None) -> pd.DataFrame:
        """Saved attention-pattern labels (Kovaleva et al. K1), one row per (run, example, layer, head, source).

        Columns: run, model, dataset, split, example (position), example_id, source_row, layer,
        head, label, source ("human", "rules", "cnn", ...), confidence, created_at.
        """
        from .schema import PatternLabel  # imported here so this block stays self-contained

        q = (sa.select(Run.name.label("run"), Model.name.label("model"), Dataset.name.label("dataset"), Dataset.split,
                       Example.position.label("example"), PatternLabel.example_id, Example.source_index, PatternLabel.layer,
                       PatternLabel.head, PatternLabel.label, PatternLabel.source, PatternLabel.confidence,
                       PatternLabel.created_at)
             .join(Run, Run.id == PatternLabel.run_id).join(Model, Model.id == Run.model_id)
             .join(Dataset, Dataset.id == Run.dataset_id).join(Example, Example.id == PatternLabel.example_id)
             .order_by(Run.id, Example.position, PatternLabel.layer, PatternLabel.head, PatternLabel.source))
        if run is not None:
            q = q.where(PatternLabel.run_id == self.run_info(run).id)
        if source is not None:
            q = q.where(PatternLabel.source == source)
        frame = self._frame(q)
        index = pd.to_numeric(frame["source_index"], errors="coerce")
        frame.insert(6, "source_row", index.where(index.notna(), frame["example"]).astype("int64"))
        return frame.drop(columns="source_index")

    def save_pattern_labels(self, rows: pd.DataFrame, source: str) -> int:
        """Save attention-pattern labels in one transaction; a map already labelled by `source` is relabelled.

        `rows`: columns run (name or id), example (position), layer, head, label and optionally
        confidence. Every row is checked (the run exists, the example is stored and not skipped,
        layer and head are in range) before anything is written; a bad row raises NotFoundError or
        InvalidArgumentError naming it, and nothing is saved.
        """
        from sqlalchemy.dialects import postgresql, sqlite

        from .schema import PatternLabel  # imported here so this block stays self-contained

        self.require_writable()
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
                    raise InvalidArgumentError(f"layer {int(layer)}, head {int(head)} is out of range for run {info.name!r} "
                                               f"({info.n_layers} layers x {info.n_heads} heads; label row {i})")
                if not isinstance(label, str) or not label or len(label) > 32:
                    raise InvalidArgumentError(f"label {label!r} is not 1 to 32 characters (label row {i})")
                c = confidence.loc[i]
                records.append(dict(run_id=info.id, example_id=int(stored.loc[int(example)]), layer=int(layer), head=int(head),
                                    label=label, source=source, confidence=None if pd.isna(c) else float(c), created_at=now))
        dialect = {"sqlite": sqlite, "postgresql": postgresql}.get(self.engine.dialect.name)
        if dialect is None:
            raise InvalidArgumentError(f"saving pattern labels needs SQLite or PostgreSQL, not {self.engine.dialect.name}")
        stmt = dialect.insert(PatternLabel)
        stmt = stmt.on_conflict_do_update(
            index_elements=["run_id", "example_id", "layer", "head", "source"],
            set_=dict(label=stmt.excluded.label, confidence=stmt.excluded.confidence, created_at=stmt.excluded.created_at))
        if records:
            with self.session() as s:
                s.execute(stmt, records)
        return len(records)

    def find_or_create_model(self, **fields) -> int:
        self.require_writable()
        with self.session() as s:
            existing = s.scalars(sa.select(Model).where(Model.name == fields["name"],
                                                        Model.weights_sha256 == fields["weights_sha256"])).first()
            if existing:
                if existing.causal is None and fields.get("causal") is not None:
                    existing.causal = fields["causal"]  # registered before migration 0008 probed it
                return existing.id
            model = Model(**fields)
            s.add(model)
            s.flush()
            return model.id

    def find_dataset(self, *, name: str, split: str, checksum: str) -> dict | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(Dataset.id, Dataset.status, Dataset.annotator).where(
                Dataset.name == name, Dataset.split == split, Dataset.checksum == checksum)).first()
        return None if row is None else dict(row._mapping)

    def find_or_create_dataset(self, *, name: str, split: str, checksum: str, **fields) -> tuple[int, str]:
        """Return (dataset id, status); a dataset is identified by name, split and file checksum."""
        with self.session() as s:
            ds = s.scalars(sa.select(Dataset).where(Dataset.name == name, Dataset.split == split, Dataset.checksum == checksum)).first()
            if ds is None:
                ds = Dataset(name=name, split=split, checksum=checksum, status="loading", **fields)
                s.add(ds)
                s.flush()
            return ds.id, ds.status

    def stored_positions(self, dataset_id: int) -> set[int]:
        with self.engine.connect() as conn:
            return set(conn.scalars(sa.select(Example.position).where(Example.dataset_id == dataset_id)))

    def add_examples(self, dataset_id: int, batch: Seq[ExampleInput], annotator: str) -> None:
        """Insert examples with their words, mentions and frames in one transaction (all of the batch or nothing)."""
        with self.session() as s:
            ids = s.execute(
                sa.insert(Example).returning(Example.id, Example.position),
                [dict(dataset_id=dataset_id, position=e.position, text_a=e.text_a, text_b=e.text_b, label=e.label,
                      doc_id=e.doc_id, sent_id=e.sent_id, source_line=e.source_line, source_index=e.source_index)
                 for e in batch],
            ).all()
            by_pos = {pos: eid for eid, pos in ids}
            words = [dict(example_id=by_pos[e.position], annotator=w.get("annotator", annotator),
                          **{k: w.get(k, 0 if k == "sentence" else None) for k in WORD_FIELDS})
                     for e in batch for w in e.words]
            if words:
                s.execute(sa.insert(Word), words)
            mentions = [dict(example_id=by_pos[e.position], **m) for e in batch for m in e.mentions]
            if mentions:
                s.execute(sa.insert(Mention), mentions)
            for e in batch:
                for f in e.frames:
                    fields = {k: v for k, v in f.items() if k != "elements"}
                    frame_row_id = s.execute(sa.insert(Frame).returning(Frame.id),
                                             dict(example_id=by_pos[e.position], **fields)).scalar_one()
                    if f["elements"]:
                        s.execute(sa.insert(FrameElement), [dict(frame_row_id=frame_row_id, **fe) for fe in f["elements"]])

    def complete_dataset(self, dataset_id: int) -> int:
        with self.session() as s:
            n = s.scalar(sa.select(sa.func.count()).select_from(Example).where(Example.dataset_id == dataset_id))
            s.execute(sa.update(Dataset).where(Dataset.id == dataset_id).values(status="complete", n_examples=n))
            return n

    def dataset_examples(self, dataset_id: int, exclude_ids: Set[int] = frozenset(), batch_size: int = 512) -> Iterator[StoredExample]:
        """Stream a dataset's examples (with words) in corpus order, skipping `exclude_ids`."""
        last = -1
        while True:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    sa.select(Example.id, Example.position, Example.text_a, Example.text_b)
                    .where(Example.dataset_id == dataset_id, Example.position > last)
                    .order_by(Example.position).limit(batch_size)
                ).all()
                if not rows:
                    return
                last = rows[-1].position
                ids = [r.id for r in rows if r.id not in exclude_ids]
                words: dict[int, list[dict]] = {i: [] for i in ids}
                if ids:
                    for w in conn.execute(
                        sa.select(Word.example_id, Word.position, Word.segment, Word.form, Word.char_start, Word.char_end)
                        .where(Word.example_id.in_(ids)).order_by(Word.example_id, Word.position)
                    ):
                        words[w.example_id].append(dict(position=w.position, segment=w.segment, form=w.form,
                                                        char_start=w.char_start, char_end=w.char_end))
            for r in rows:
                if r.id in words:
                    yield StoredExample(r.id, r.position, r.text_a, r.text_b, tuple(words[r.id]))

    def start_run(self, *, name: str, model_id: int, dataset_id: int, dtype: str, codec: dict, chunk_cells: int,
                  max_length: int, truncation: str, **fields) -> RunInfo:
        """Create a run (and its array), or return the existing one if its settings match.

        The row is inserted before the array is created, in one transaction: if the array
        cannot be created, no run is left behind (and no array without a row).
        """
        validate_run_name(name)
        if isinstance(chunk_cells, bool) or not isinstance(chunk_cells, int) or chunk_cells < 1:
            raise InvalidArgumentError(f"chunk size must be a positive number of cells, not {chunk_cells!r}")
        self.require_writable()
        with self.session() as s:
            run = s.scalars(sa.select(Run).where(Run.name == name)).first()
            if run is not None:
                wanted = dict(model_id=model_id, dataset_id=dataset_id, dtype=dtype, max_length=max_length, truncation=truncation)
                if "tokenization" in fields:
                    wanted["tokenization"] = fields["tokenization"]
                differs = {k: (getattr(run, k), v) for k, v in wanted.items() if getattr(run, k) != v}
                if differs:
                    what = ", ".join(f"{k} stored={a!r} asked={b!r}" for k, (a, b) in differs.items())
                    raise ConflictError(f"run {name!r} already exists with other settings ({what}); pick another --name")
                return self.run_info(run.id)
            array_path = f"runs/{uuid.uuid4().hex}"
            run = Run(name=name, model_id=model_id, dataset_id=dataset_id, dtype=dtype, codec=codec, chunk_cells=chunk_cells,
                      max_length=max_length, truncation=truncation, array_path=array_path, status="running", **fields)
            s.add(run)
            s.flush()
            run_id = run.id
            try:
                arrays.create_run_array(self.locations.array_root, array_path, dtype=dtype, chunk_cells=chunk_cells,
                                        codec=codec, attributes={"run": name})
            except OSError as exc:
                raise StorageIOError(f"cannot create the attention array of run {name!r} under {self.locations.array_root}: "
                                     f"{exc.strerror or exc}; give a writable --root") from None
        return self.run_info(run_id)

    def done_example_ids(self, run: RunRef) -> set[int]:
        info = self.run_info(run)
        with self.engine.connect() as conn:
            return set(conn.scalars(sa.select(Sequence.example_id).where(Sequence.run_id == info.id)))

    def run_writer(self, run: RunRef, lease: leases.WriteLease | None = None) -> RunWriter:
        """A writer for a run; takes the run's write lease unless the caller holds it (`lease`)."""
        return RunWriter(self, self.run_info(run), lease)

    def lease(self, resource: str, what: str, *, wait: bool = False, on_wait=None) -> leases.WriteLease:
        """Take the write lease on `resource` ("run:NAME", "dataset:KEY"); BusyError if a live process holds it."""
        self.require_writable()
        return leases.acquire(self.engine, resource, what, wait=wait, on_wait=on_wait)

    def run_state(self, run: RunRef) -> tuple[str, leases.Holder | None]:
        """("complete" | "writing" | "interrupted", live writer or None) of a run."""
        info = self.run_info(run)
        if info.status == "complete":
            return "complete", None
        holder = leases.live_holder(self.engine, run_lease_name(info.name))
        return ("writing", holder) if holder else ("interrupted", None)

    def fail_run(self, run: RunRef, status: str = "interrupted") -> None:
        info = self.run_info(run)
        with self.session() as s:
            s.execute(sa.update(Run).where(Run.id == info.id, Run.status != "complete").values(status=status))


MAX_RUN_NAME = 200


def validate_run_name(name: str) -> None:
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_RUN_NAME or any(ord(c) < 32 or c == "\x7f" for c in name):
        shown = name if not isinstance(name, str) or len(name) <= 40 else name[:40] + "..."
        raise InvalidArgumentError(f"run name {shown!r} is not usable: give --name with 1 to {MAX_RUN_NAME} printable characters")


def run_lease_name(run_name: str) -> str:
    return f"run:{run_name}"


TOKEN_FIELDS = ("token", "token_id", "word_position", "segment", "is_special", "char_start", "char_end")


def bulk_insert(conn, table: str, columns: tuple[str, ...], rows: list[tuple]) -> None:
    """executemany straight on the driver: ~3x faster than Core for the tokens of a batch (SQLite and psycopg)."""
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join([mark] * len(columns))})"
    conn.exec_driver_sql(sql, rows)


class RunWriter:
    """Append examples' maps and tokens to a run; SQL rows are committed only once their maps are on disk.

    Holds the run's write lease: it is checked before every chunk write and again inside
    the transaction that commits the rows, so a writer that lost it writes nothing more.
    """

    def __init__(self, store: Store, info: RunInfo, lease: leases.WriteLease | None = None):
        self.store = store
        self.info = info
        self._own_lease = lease is None
        self.lease = lease or store.lease(run_lease_name(info.name), f"run {info.name!r}")
        try:
            array = store._array(info, read_only=False)
            with store.engine.connect() as conn:
                end = conn.scalar(
                    sa.select(sa.func.max(Sequence.offset + info.n_layers * info.n_heads * Sequence.length * Sequence.length))
                    .where(Sequence.run_id == info.id)
                )
            self.blocks = arrays.BlockWriter(array, arrays.resume_offset(int(end or 0), info.chunk_cells))
        except BaseException:
            self.close()
            raise
        self._pending: list[tuple[int, dict, list[tuple]]] = []  # (end offset, sequence row, token rows)

    def add(self, example_id: int, maps: np.ndarray, tokens: list[dict], truncated: bool = False) -> None:
        expected = (self.info.n_layers, self.info.n_heads)
        if maps.ndim != 4 or maps.shape[:2] != expected or maps.shape[2] != maps.shape[3] or maps.shape[2] != len(tokens):
            raise InvalidArgumentError(f"maps of shape {maps.shape} do not fit {len(tokens)} tokens and {expected} (layer, head)")
        offset = self.blocks.append(maps)
        length = maps.shape[-1]
        seq = dict(run_id=self.info.id, example_id=example_id, length=length, offset=offset, truncated=truncated, skipped=False)
        toks = [(self.info.id, example_id, i, *(t[c] for c in TOKEN_FIELDS)) for i, t in enumerate(tokens)]
        self._pending.append((offset + maps.size, seq, toks))

    def add_skipped(self, example_id: int, length: int) -> None:
        seq = dict(run_id=self.info.id, example_id=example_id, length=length, offset=None, truncated=False, skipped=True)
        self._pending.append((0, seq, []))

    def _flush_blocks(self, final: bool) -> int:
        self.lease.check()
        try:
            return self.blocks.flush(final=final)
        except OSError as exc:
            raise StorageIOError(f"cannot write the maps of run {self.info.name!r} under {self.store.locations.array_root}: "
                                 f"{exc.strerror or exc}; the run is kept as interrupted: free space or fix permissions, "
                                 f"then run the same ingest command to resume") from None

    def commit(self, final: bool = False) -> int:
        """Write whole chunks, then commit rows of the examples now fully on disk; returns rows committed."""
        durable = self._flush_blocks(final)
        ready = [p for p in self._pending if p[0] <= durable]
        self._pending = [p for p in self._pending if p[0] > durable]
        if not ready:
            return 0
        seqs = [p[1] for p in ready]
        toks = [t for p in ready for t in p[2]]
        n_stored = sum(1 for q in seqs if not q["skipped"])
        with self.store.session() as s:
            self.lease.check(s.connection())
            s.execute(sa.insert(Sequence), seqs)
            if toks:
                bulk_insert(s.connection(), "tokens", ("run_id", "example_id", "position", *TOKEN_FIELDS), toks)
            s.execute(sa.update(Run).where(Run.id == self.info.id).values(
                n_stored=Run.n_stored + n_stored,
                n_skipped=Run.n_skipped + (len(seqs) - n_stored),
                n_truncated=Run.n_truncated + sum(1 for q in seqs if q["truncated"]),
            ))
        return len(ready)

    def finish(self, seconds: float, manifest_update: dict | None = None) -> RunInfo:
        try:
            self.commit(final=True)
            with self.store.session() as s:
                self.lease.check(s.connection())
                run = s.get(Run, self.info.id)
                run.status = "complete"
                run.finished_at = utcnow()
                run.ingest_seconds = (run.ingest_seconds or 0.0) + seconds
                if manifest_update:
                    run.manifest = {**(run.manifest or {}), **manifest_update}
        finally:
            self.close()
        return self.store.run_info(self.info.id)

    def close(self) -> None:
        """Release the lease if this writer took it."""
        if self._own_lease:
            self.lease.release()
