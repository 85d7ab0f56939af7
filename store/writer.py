"""The store's writer side, `store.writer`: what ingest, fine-tuning, evaluation, checks and bundles call.

A user reads through `Store` and saves results through its `save_*` methods (store/store.py).
`StoreWriter` (one per store, `store.writer`) holds the rest: it registers models, datasets and
examples, starts runs and hands out `RunWriter`s (which append one run's maps and tokens under
the run's write lease), takes write leases, and reads what ingest resumes from and what a run's
index is rebuilt from.

Longer than ~500 lines on purpose: `StoreWriter` and `RunWriter` share the lease, commit and index logic that keeps a
run's rows and chunks consistent (docs/RELIABILITY.md); they are read together.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Set
from collections.abc import Sequence as Seq
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import sqlalchemy as sa

from . import examples, leases, row_stats
from .errors import AttnStoreError, ConflictError, InvalidArgumentError, ReadOnlyStoreError, StorageIOError
from .identity import dataset_identity
from .lazy import LazyModule
from .reader import RunRef, StoreReader
from .records import HIDDEN_PEAKS_FLAG, QK_FLAG, ROW_STATS_FLAG, TOKEN_LOSS_FLAG, VALUE_NORMS_FLAG, ExampleInput, RunInfo, StoredExample
from .run_blocks import committed_end, run_attributes, write_index_from_sql
from .schema import (
    AblationResult,
    Dataset,
    Example,
    Frame,
    FrameElement,
    Mention,
    Model,
    Run,
    Sequence,
    Token,
    Word,
    utcnow,
)

if TYPE_CHECKING:
    from . import arrays, block_writer, qk, remote
else:  # these import zarr: each is imported at its first use, so commands that read SQL only never import zarr (store/lazy.py)
    arrays, block_writer, qk, remote = (LazyModule(f"{__package__}.{name}") for name in ("arrays", "block_writer", "qk", "remote"))

WORD_FIELDS = ("position", "segment", "sentence", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "char_start", "char_end")


class StoreWriter:
    """The writer side of a store (`store.writer`): models, datasets, examples, runs and their writers, write leases,
    and the reads ingest resumes from. Not a user's API: ingest, fine-tuning, evaluation, `check`, bundles and
    layout upgrades call it; a user saves results through `Store`'s `save_*` methods."""

    def __init__(self, store: StoreReader):
        self.store = store

    def __repr__(self) -> str:
        return f"StoreWriter({self.store.locations.describe()})"

    def require_writable(self) -> None:
        """ReadOnlyStoreError unless this process may write the store; every write (and every writing
        command, before it starts any work) calls it. A remote array root is tested once, by writing
        and deleting a test object (read-only credentials cannot be told apart otherwise)."""
        store = self.store
        root = store.locations.array_root
        if not store.read_only and not store._root_write_checked and remote.is_remote(root):
            try:
                remote.check_writable(root)
            except remote.WriteRefused as exc:
                store.read_only = True
                store.read_only_reason = f"the object store refused a test write to its array root with these credentials: {exc.reason}"
            store._root_write_checked = True
        if store.read_only:
            where, why = store.locations.describe(), store.read_only_reason
            raise ReadOnlyStoreError(f"store {where} is read-only for this user ({why}); it can be queried but not written")

    def lease(self, resource: str, what: str, *, wait: bool = False, on_wait=None) -> leases.WriteLease:
        """Take the write lease on `resource` ("run:NAME", "dataset:KEY"); BusyError if a live process holds it."""
        self.require_writable()
        return leases.acquire(self.store.engine, resource, what, wait=wait, on_wait=on_wait)

    # ------------------------------------------------------------------ models and evaluations

    def find_or_create_model(self, **fields) -> int:
        self.require_writable()
        with self.store.session() as s:
            existing = s.scalars(
                sa.select(Model).where(Model.name == fields["name"], Model.weights_sha256 == fields["weights_sha256"])
            ).first()
            if existing:
                if existing.causal is None and fields.get("causal") is not None:
                    existing.causal = fields["causal"]  # registered before migration 0008 probed it
                return existing.id
            model = Model(**fields)
            s.add(model)
            s.flush()
            return model.id

    def register_finetuned_model(self, **fields) -> int:
        """Register a fine-tuned model (fields of `models`, with parent_id, init, task, training); idempotent."""
        self.require_writable()
        with self.store.session() as s:
            existing = s.scalars(
                sa.select(Model).where(Model.name == fields["name"], Model.weights_sha256 == fields["weights_sha256"])
            ).first()
            if existing is not None:
                existing.training = fields.get("training")
                return existing.id
            model = Model(**fields)
            s.add(model)
            s.flush()
            return model.id

    def ablation_configs(self, model_id: int, task: str, split: str, mode: str) -> set[str]:
        """Configurations already stored for (model, task, split, mode)."""
        with self.store.engine.connect() as conn:
            return set(
                conn.scalars(
                    sa.select(AblationResult.config)
                    .where(
                        AblationResult.model_id == model_id,
                        AblationResult.task == task,
                        AblationResult.split == split,
                        AblationResult.mode == mode,
                    )
                    .distinct()
                )
            )

    def add_ablation_results(self, rows: list[dict]) -> bool:
        """Insert the rows of one configuration in one transaction; False if it was already stored (by anyone)."""
        self.require_writable()
        now = utcnow()
        try:
            with self.store.engine.begin() as conn:
                conn.execute(sa.insert(AblationResult), [dict(created_at=now, **r) for r in rows])
        except sa.exc.IntegrityError:
            return False
        return True

    # ------------------------------------------------------------------ datasets

    def find_dataset(self, identity: str) -> dict | None:
        """The dataset of this identity (store/identity.py), whatever its name: a complete one first, then
        the oldest (stores made before revision 0009 may hold the same content twice). None if there is none."""
        with self.store.engine.connect() as conn:
            row = conn.execute(
                sa.select(Dataset.id, Dataset.name, Dataset.split, Dataset.checksum, Dataset.status, Dataset.annotator)
                .where(Dataset.identity == identity)
                .order_by(sa.case((Dataset.status == "complete", 0), else_=1), Dataset.id)
                .limit(1)
            ).first()
        return None if row is None else dict(row._mapping)

    def find_or_create_dataset(
        self, *, name: str, split: str, checksum: str, format: str, annotator: str, options: dict | None = None, **fields
    ) -> tuple[int, str]:
        """Return (dataset id, status). A dataset is identified by content (store/identity.py: checksum, format,
        options, annotator kind): a dataset of the same identity is returned whatever its name and split."""
        identity = dataset_identity(checksum=checksum, format=format, options=options, annotator=annotator)
        found = self.find_dataset(identity)
        if found is not None:
            return found["id"], found["status"]
        with self.store.session() as s:
            ds = Dataset(
                name=name,
                split=split,
                checksum=checksum,
                format=format,
                annotator=annotator,
                options=options,
                identity=identity,
                status="loading",
                **fields,
            )
            s.add(ds)
            s.flush()
            return ds.id, ds.status

    def add_examples(self, dataset_id: int, batch: Seq[ExampleInput], annotator: str) -> None:
        """Insert examples with their words, mentions and frames in one transaction (all of the batch or nothing)."""
        with self.store.session() as s:
            ids = s.execute(
                sa.insert(Example).returning(Example.id, Example.position),
                [
                    dict(
                        dataset_id=dataset_id,
                        position=e.position,
                        text_a=e.text_a,
                        text_b=e.text_b,
                        label=e.label,
                        doc_id=e.doc_id,
                        sent_id=e.sent_id,
                        source_line=e.source_line,
                        source_index=e.source_index,
                    )
                    for e in batch
                ],
            ).all()
            by_pos = {pos: eid for eid, pos in ids}
            words = [
                dict(
                    example_id=by_pos[e.position],
                    annotator=w.get("annotator", annotator),
                    **{k: w.get(k, 0 if k == "sentence" else None) for k in WORD_FIELDS},
                )
                for e in batch
                for w in e.words
            ]
            if words:
                s.execute(sa.insert(Word), words)
            mentions = [dict(example_id=by_pos[e.position], **m) for e in batch for m in e.mentions]
            if mentions:
                s.execute(sa.insert(Mention), mentions)
            for e in batch:
                for f in e.frames:
                    fields = {k: v for k, v in f.items() if k != "elements"}
                    frame_row_id = s.execute(
                        sa.insert(Frame).returning(Frame.id), dict(example_id=by_pos[e.position], **fields)
                    ).scalar_one()
                    if f["elements"]:
                        s.execute(sa.insert(FrameElement), [dict(frame_row_id=frame_row_id, **fe) for fe in f["elements"]])

    def complete_dataset(self, dataset_id: int) -> int:
        with self.store.session() as s:
            n = s.scalar(sa.select(sa.func.count()).select_from(Example).where(Example.dataset_id == dataset_id))
            s.execute(sa.update(Dataset).where(Dataset.id == dataset_id).values(status="complete", n_examples=n))
            return n

    def stored_positions(self, dataset_id: int) -> set[int]:
        with self.store.engine.connect() as conn:
            return set(conn.scalars(sa.select(Example.position).where(Example.dataset_id == dataset_id)))

    def dataset_examples(
        self, dataset_id: int, exclude_ids: Set[int] = frozenset(), batch_size: int = 256, start: int = 0, stop: int | None = None
    ) -> Iterator[StoredExample]:
        """Stream a dataset's examples (with words) in corpus order (store/examples.py `dataset_examples`)."""
        return examples.dataset_examples(self.store.engine, dataset_id, exclude_ids, batch_size, start, stop)

    def examples_by_id(self, ids: list[int]) -> list[StoredExample]:
        """The examples (with words) of these ids, in the order given (store/examples.py `examples_by_id`)."""
        return examples.examples_by_id(self.store.engine, ids)

    # ------------------------------------------------------------------ runs

    def start_run(
        self,
        *,
        name: str,
        model_id: int,
        dataset_id: int,
        dtype: str,
        codec: dict,
        chunk_cells: int,
        max_length: int,
        truncation: str,
        **fields,
    ) -> RunInfo:
        """Create a run (and its array), or return the existing one if its settings match.

        The row is inserted before the array is created, in one transaction: if the array
        cannot be created, no run is left behind (and no array without a row).
        """
        validate_run_name(name)
        if isinstance(chunk_cells, bool) or not isinstance(chunk_cells, int) or chunk_cells < 1:
            raise InvalidArgumentError(f"chunk size must be a positive number of cells, not {chunk_cells!r}")
        self.require_writable()
        with self.store.session() as s:
            run = s.scalars(sa.select(Run).where(Run.name == name)).first()
            if run is not None:
                wanted = dict(model_id=model_id, dataset_id=dataset_id, dtype=dtype, max_length=max_length, truncation=truncation)
                if "tokenization" in fields:
                    wanted["tokenization"] = fields["tokenization"]
                differs = {k: (getattr(run, k), v) for k, v in wanted.items() if getattr(run, k) != v}
                if (run.codec or {}).get("quantize") != (codec or {}).get("quantize"):  # lossless vs --codec u8
                    differs["codec"] = (
                        "u8" if (run.codec or {}).get("quantize") else "lossless",
                        "u8" if codec.get("quantize") else "lossless",
                    )
                stored_tier, asked_tier = _tier_of(run.manifest), _tier_of(fields.get("manifest"))
                if stored_tier != asked_tier:
                    differs["tier"] = (stored_tier, asked_tier)
                if differs:
                    what = ", ".join(f"{k} stored={a!r} asked={b!r}" for k, (a, b) in differs.items())
                    raise ConflictError(f"run {name!r} already exists with other settings ({what}); pick another --name")
                return self.store.run_info(run.id)
            uid = uuid.uuid4().hex  # the run's identity across stores (bundles, imports)
            fields["manifest"] = {**(fields.get("manifest") or {}), "uid": uid}
            array_path = f"{arrays.run_group_path(name)}/{arrays.CELLS}"
            run = Run(
                name=name,
                model_id=model_id,
                dataset_id=dataset_id,
                dtype=dtype,
                codec=codec,
                chunk_cells=chunk_cells,
                max_length=max_length,
                truncation=truncation,
                array_path=array_path,
                status="running",
                **fields,
            )
            s.add(run)
            s.flush()  # holds the name: a concurrent start of the same run fails here, before any array is made
            run_id = run.id
            attributes = run_attributes(s, run)
            try:
                arrays.create_run_group(
                    self.store.locations.array_root,
                    name,
                    dtype=dtype,
                    chunk_cells=chunk_cells,
                    codec=codec,
                    attributes=attributes,
                    value_norms=bool(fields["manifest"].get(VALUE_NORMS_FLAG)),
                    token_loss=bool(fields["manifest"].get(TOKEN_LOSS_FLAG)),
                    hidden_peaks=bool(fields["manifest"].get(HIDDEN_PEAKS_FLAG)),
                    row_stats=bool(fields["manifest"].get(ROW_STATS_FLAG)),
                )
                if fields["manifest"].get(QK_FLAG):
                    qk.create_arrays(
                        self.store.locations.array_root,
                        array_path,
                        attributes["n_layers"],
                        attributes["n_heads"],
                        fields["manifest"][QK_FLAG],
                    )
            except OSError as exc:
                raise StorageIOError(
                    f"cannot create the attention array of run {name!r} under {self.store.locations.array_root}: "
                    f"{exc.strerror or exc}; give a writable --root"
                ) from None
        return self.store.run_info(run_id)

    def done_example_ids(self, run: RunRef) -> set[int]:
        info = self.store.run_info(run)
        with self.store.engine.connect() as conn:
            return set(conn.scalars(sa.select(Sequence.example_id).where(Sequence.run_id == info.id)))

    def run_writer(self, run: RunRef, lease: leases.LeaseCheck | None = None, part: tuple[int, int] | None = None) -> RunWriter:
        """A writer for a run; takes the run's write lease unless the caller holds it (`lease`). `part`: see RunWriter."""
        return RunWriter(self, self.store.run_info(run), lease, part)

    def fail_run(self, run: RunRef, status: str = "interrupted") -> None:
        info = self.store.run_info(run)
        with self.store.session() as s:
            s.execute(sa.update(Run).where(Run.id == info.id, Run.status != "complete").values(status=status))

    def block_steps(self, run: RunRef, step: int = 4096) -> Iterator[tuple[pd.DataFrame, list[np.ndarray]]]:
        """The run's committed blocks in storage (offset) order, `step` at a time, each with its token ids (what
        the run's Zarr index mirrors): (frame of example_id, example, offset, length; their token ids, int64).
        Memory is one step's rows, not the run's. Inside `pinned`, the snapshot's blocks; blocks that share an
        offset (damage `attnstore check` reports) all come, in example-id order."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise InvalidArgumentError(f"step must be a whole number of blocks, at least 1, not {step!r}")
        info = self.store.run_info(run)
        after = (-1, -1)  # (offset, example id) of the last block read: each step reads the blocks past it
        with self.store.engine.connect() as conn:
            while True:
                past = sa.or_(Sequence.offset > after[0], sa.and_(Sequence.offset == after[0], Sequence.example_id > after[1]))
                blocks = pd.DataFrame(
                    conn.execute(
                        sa.select(Sequence.example_id, Example.position, Sequence.offset, Sequence.length)
                        .join(Example, Example.id == Sequence.example_id)
                        .where(self.store._visible(info), Sequence.offset.is_not(None), past)
                        .order_by(Sequence.offset, Sequence.example_id)
                        .limit(step)
                    ).all(),
                    columns=["example_id", "example", "offset", "length"],
                )
                if blocks.empty:
                    return
                ids = blocks["example_id"].tolist()
                rows = conn.execute(
                    sa.select(Token.example_id, Token.token_id)
                    .where(Token.run_id == info.id, Token.example_id.in_(ids))
                    .order_by(Token.example_id, Token.position)
                ).all()
                owner = np.fromiter((r[0] for r in rows), np.int64, len(rows))
                token_ids = np.fromiter((r[1] for r in rows), np.int64, len(rows))
                found, first, count = np.unique(owner, return_index=True, return_counts=True)
                where = {int(e): slice(int(f), int(f + c)) for e, f, c in zip(found, first, count)}
                yield blocks, [token_ids[where.get(e, slice(0, 0))] for e in ids]
                after = (int(blocks["offset"].iloc[-1]), int(blocks["example_id"].iloc[-1]))


MAX_RUN_NAME = 200


def _tier_of(manifest: dict | None) -> str:
    """ "dense", or "qk/<dtype>" for a Q/K run (a resumed run keeps its tier and Q/K dtype)."""
    entry = (manifest or {}).get(QK_FLAG)
    return f"qk/{entry['dtype']}" if entry else "dense"


def validate_run_name(name: str) -> None:
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_RUN_NAME or any(ord(c) < 32 or c == "\x7f" for c in name):
        shown = name if not isinstance(name, str) or len(name) <= 40 else name[:40] + "..."
        raise InvalidArgumentError(f"run name {shown!r} is not usable: give --name with 1 to {MAX_RUN_NAME} printable characters")


def run_lease_name(run_name: str) -> str:
    return f"run:{run_name}"


def summary_lease_name(run_id: int, name: str) -> str:
    """The lease of building run `run_id`'s kept summary `name` (the run's id: a name may be 255 characters)."""
    return f"summary:{run_id}:{name}"


TOKEN_FIELDS = ("token", "token_id", "word_position", "segment", "is_special", "char_start", "char_end")
token_values = itemgetter(*TOKEN_FIELDS)  # a token dict's TOKEN_FIELDS, in C: ingest builds ~50 rows per example


def bulk_insert(conn, table: str, columns: tuple[str, ...], rows: list[tuple]) -> None:
    """executemany straight on the driver: ~3x faster than Core for the tokens of a batch (SQLite and psycopg)."""
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join([mark] * len(columns))})"
    conn.exec_driver_sql(sql, rows)


# Writing the five index arrays costs ~20 ms whatever the number of entries (benchmarks/storage_pipeline.py):
# once per batch that was ~5 % of an MRPC ingest. Entries are written every this many tokens and when the run
# completes; meanwhile the group says `index_pending`, and a resumed writer rebuilds the index from SQL.
INDEX_FLUSH_TOKENS = 1 << 16


class RunWriter:
    """Append examples' maps and tokens to a run; SQL rows are committed only once their maps are on disk.

    Holds the run's write lease: it is checked before every chunk write and again inside
    the transaction that commits the rows, so a writer that lost it writes nothing more.
    """

    def __init__(self, writer: StoreWriter, info: RunInfo, lease: leases.LeaseCheck | None = None, part: tuple[int, int] | None = None):
        """`part`: the (start, stop) cells a distributed ingest's coordinator allotted this writer (ingest/distributed.py);
        its blocks go there and nowhere else, and the index arrays are left to the coordinator."""
        self.store = store = writer.store
        self._writer = writer
        self.info = info
        self._own_lease = lease is None
        self.lease = lease or writer.lease(run_lease_name(info.name), f"run {info.name!r}")
        self.part = part
        try:
            array = store._array(info, read_only=False)
            if part is None:  # the run's only writer now (a distributed ingest's workers start after this)
                arrays.remove_partial_files(store.locations.array_root, arrays.group_path_of(info.array_path))
            with store.engine.connect() as conn:
                end, n_blocks, n_tokens = conn.execute(
                    sa.select(
                        sa.func.max(Sequence.offset + info.n_layers * info.n_heads * Sequence.length * Sequence.length),
                        sa.func.count(Sequence.offset),
                        sa.func.sum(sa.case((Sequence.offset.is_not(None), Sequence.length), else_=0)),
                    ).where(Sequence.run_id == info.id)
                ).one()
            if part is not None:
                start = part[0]
            else:
                # Past everything ever allotted too (the array's length): cells written but never committed are left
                # alone, so a writer that was cut off (a killed process, a distributed part) cannot overwrite new data.
                start = block_writer.resume_offset(max(int(end or 0), array.shape[0]), info.chunk_cells)
            self.blocks = block_writer.BlockWriter(array, start)
            # Value norms (when the run keeps them) go to their array before their examples' rows commit, from the
            # committed token count on: norms written before a crash and never committed are overwritten.
            self.norms = None
            self._norm_tokens = int(n_tokens or 0)
            if part is None and info.has_value_norms:
                self.norms = arrays.ValueNorms(store.locations.array_root, info.array_path, read_only=False)
            # Per-token loss (a causal LM's run) likewise, from the committed token count on.
            self.loss = None
            self._loss_tokens = int(n_tokens or 0)
            if part is None and info.has_token_loss:
                self.loss = arrays.TokenArray(store.locations.array_root, info.array_path, arrays.TOKEN_LOSS, read_only=False)
            self.peaks = None  # hidden-state peaks (massive activations) likewise
            self._peak_tokens = int(n_tokens or 0)
            if part is None and info.has_hidden_peaks:
                self.peaks = arrays.TokenArray(store.locations.array_root, info.array_path, arrays.HIDDEN_PEAKS, read_only=False)
            self.rows = None  # per-row attention statistics (store/row_stats.py) likewise: (stats, top) arrays
            self._row_tokens = int(n_tokens or 0)
            if part is None and info.has_row_stats:
                root = store.locations.array_root
                names = (row_stats.STATS, row_stats.TOP)
                self.rows = tuple(arrays.TokenArray(root, info.array_path, name, read_only=False) for name in names)
            # A Q/K run (store/qk.py) writes no cells: its queries, keys and log-sum-exps go to their per-token arrays like
            # the value norms, and its offsets stay those its maps would have in the cells, so every offset rule holds.
            self.qk = None
            self._qk_tokens = int(n_tokens or 0)
            self._virtual_end = int(end or 0)
            if info.qk is not None:
                if part is not None:
                    raise InvalidArgumentError(f"run {info.name!r} is in the Q/K tier, which a distributed ingest does not write")
                self.qk = qk.open_arrays(store.locations.array_root, info.array_path, read_only=False)
            # The committed index, mirrored in Zarr (by the coordinator of a distributed ingest, not its parts).
            self.index = None
            if part is None:
                self.index = arrays.RunIndex(store.locations.array_root, info.array_path, int(n_blocks or 0), int(n_tokens or 0))
                if self.index.length() < self.index.n or self.index.group.attrs.get(arrays.INDEX_PENDING):
                    self.index = write_index_from_sql(writer, info)  # after a distributed ingest cut off before it wrote it
        except BaseException as exc:
            self.close()
            if isinstance(exc, OSError) and not isinstance(exc, AttnStoreError):  # e.g. the disk is still full
                raise StorageIOError(
                    f"cannot write the arrays of run {info.name!r} under {store.locations.array_root}: "
                    f"{exc.strerror or exc}; the run is kept as interrupted: free space or fix permissions, "
                    f"then run the same ingest command to resume"
                ) from None
            raise
        # (end offset, sequence row, token rows, token ids, value norms (token, layer, head) or None, loss (token,) or None,
        # a Q/K run's (queries, keys, log-sum-exps) or None, hidden-state peaks (token, layer, field) or None, row
        # statistics (stats, top) or None)
        self._pending: list[
            tuple[int, dict, list[tuple], np.ndarray, np.ndarray | None, np.ndarray | None, tuple | None, np.ndarray | None, tuple | None]
        ] = []
        # Index entries committed in SQL, not yet in the Zarr index: written every INDEX_FLUSH_TOKENS tokens and at the end.
        self._index_queue: list[tuple[int, int, int, np.ndarray]] = []  # (example position, offset, length, token ids)
        self._index_tokens = 0
        self._lag_marked = False
        # Set when a commit fails after writing some examples' per-token values but before their rows committed: the
        # token counts those arrays are written from no longer follow SQL, so this writer commits nothing more (a new
        # writer, as a resumed ingest makes, starts again from SQL's committed tokens).
        self._broken = False

    def add(
        self,
        example_id: int,
        maps: np.ndarray | None,
        tokens: list[dict],
        truncated: bool = False,
        norms: np.ndarray | None = None,
        loss: np.ndarray | None = None,
        qk: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
        peaks: np.ndarray | None = None,
        rows: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """`norms`: the example's value norms, (token, layer, head), required where the run keeps them (and only there);
        `loss`: its per-token next-token loss, (token,), likewise; `peaks`: its hidden-state peaks (token, layer, field),
        likewise; `rows`: its row statistics (store/row_stats.py: stats (token, layer, head, field), top keys (token,
        layer, head, k)), likewise. A Q/K run takes `qk` (queries (token, layer, head, dim), keys (token, layer, kv head, dim), log-sum-exps
        (token, layer, head)) and no maps."""
        expected = (self.info.n_layers, self.info.n_heads)
        if (qk is None) != (self.qk is None) or (maps is None) == (qk is None):
            raise InvalidArgumentError(
                f"run {self.info.name!r} is in the {self.info.tier} tier: example {example_id} needs "
                f"{'queries, keys and log-sum-exps (qk=) and no maps' if self.qk is not None else 'its maps and no qk='}"
            )
        if qk is not None:
            self._check_qk(example_id, qk, len(tokens))
        size = self.info.n_layers * self.info.n_heads * len(tokens) ** 2
        if maps is not None and (
            maps.ndim != 4 or maps.shape[:2] != expected or maps.shape[2] != maps.shape[3] or maps.shape[2] != len(tokens)
        ):
            raise InvalidArgumentError(f"maps of shape {maps.shape} do not fit {len(tokens)} tokens and {expected} (layer, head)")
        if (norms is None) != (self.norms is None) and self.part is None:
            raise InvalidArgumentError(
                f"run {self.info.name!r} {'keeps' if self.norms is not None else 'does not keep'} value norms: "
                f"example {example_id} was given {'none' if norms is None else 'some'}"
            )
        if norms is not None and norms.shape != (len(tokens), *expected):
            raise InvalidArgumentError(f"value norms of shape {norms.shape} do not fit {len(tokens)} tokens and {expected} (layer, head)")
        if (loss is None) != (self.loss is None) and self.part is None:
            raise InvalidArgumentError(
                f"run {self.info.name!r} {'keeps' if self.loss is not None else 'does not keep'} per-token loss: "
                f"example {example_id} was given {'none' if loss is None else 'some'}"
            )
        if loss is not None and loss.shape != (len(tokens),):
            raise InvalidArgumentError(f"per-token loss of shape {loss.shape} does not fit {len(tokens)} tokens")
        if (peaks is None) != (self.peaks is None) and self.part is None:
            raise InvalidArgumentError(
                f"run {self.info.name!r} {'keeps' if self.peaks is not None else 'does not keep'} hidden-state peaks: "
                f"example {example_id} was given {'none' if peaks is None else 'some'}"
            )
        if peaks is not None and peaks.shape != (len(tokens), self.info.n_layers, len(arrays.PEAK_FIELDS)):
            raise InvalidArgumentError(f"hidden-state peaks of shape {peaks.shape} do not fit {len(tokens)} tokens")
        if (rows is None) != (self.rows is None) and self.part is None:
            raise InvalidArgumentError(
                f"run {self.info.name!r} {'keeps' if self.rows is not None else 'does not keep'} row statistics: "
                f"example {example_id} was given {'none' if rows is None else 'some'}"
            )
        shapes = ((len(tokens), *expected, len(row_stats.FIELDS)), (len(tokens), *expected, row_stats.TOP_K))
        if rows is not None and (len(rows) != 2 or (rows[0].shape, rows[1].shape) != shapes):
            raise InvalidArgumentError(f"row statistics of shapes {[r.shape for r in rows]} do not fit {len(tokens)} tokens and {expected}")
        if rows is not None and self.rows is not None:  # a run kept before the last fields keeps its own
            rows = (rows[0][..., : self.rows[0].array.shape[-1]], rows[1])
        if maps is not None and self.part is not None and self.blocks.offset_for(maps.size) + maps.size > self.part[1]:
            raise InvalidArgumentError(
                f"example {example_id}'s maps do not fit the cells {self.part[0]}..{self.part[1]} "
                f"allotted to this writer of run {self.info.name!r}"
            )
        if maps is not None:
            offset = self.blocks.append(maps)
        else:
            offset, self._virtual_end = self._virtual_end, self._virtual_end + size
        length = len(tokens)
        seq = dict(run_id=self.info.id, example_id=example_id, length=length, offset=offset, truncated=truncated, skipped=False)
        run_id = self.info.id
        toks = [(run_id, example_id, i, *token_values(t)) for i, t in enumerate(tokens)]
        ids = np.fromiter((t["token_id"] for t in tokens), np.int64, len(tokens))
        self._pending.append((offset + size, seq, toks, ids, norms, loss, qk, peaks, rows))

    def _check_qk(self, example_id: int, qk: tuple, n: int) -> None:
        entry, layers, heads = self.info.qk, self.info.n_layers, self.info.n_heads
        assert entry is not None
        shapes = tuple(getattr(a, "shape", None) for a in qk)
        wanted = ((n, layers, heads, entry["head_dim"]), (n, layers, entry["n_kv_heads"], entry["head_dim"]), (n, layers, heads))
        if len(qk) != 3 or shapes != wanted:
            raise InvalidArgumentError(f"example {example_id}: queries, keys and log-sum-exps of shapes {shapes} do not fit {wanted}")

    def add_skipped(self, example_id: int, length: int) -> None:
        seq = dict(run_id=self.info.id, example_id=example_id, length=length, offset=None, truncated=False, skipped=True)
        self._pending.append((0, seq, [], np.empty(0, np.int64), None, None, None, None, None))

    def _flush_blocks(self, final: bool, wait: bool) -> int:
        self.lease.check()
        try:
            return self.blocks.flush(final=final, wait=wait)
        except OSError as exc:
            raise StorageIOError(
                f"cannot write the maps of run {self.info.name!r} under {self.store.locations.array_root}: "
                f"{exc.strerror or exc}; the run is kept as interrupted: free space or fix permissions, "
                f"then run the same ingest command to resume"
            ) from None

    def commit(self, final: bool = False, wait: bool = True) -> int:
        """Write whole chunks, then commit rows of the examples now fully on disk; returns rows committed.

        `wait=False` (ingest's writer thread): the chunks are written in the background while this commits
        the rows of the chunks written before them, so compressing overlaps with SQL and the next batch's
        blocks. Rows then lag one commit; a commit with `wait` or `final` catches up."""
        if self._broken:
            raise StorageIOError(
                f"run {self.info.name!r}: an earlier commit of this writer failed midway, so it commits nothing more; "
                f"the run is kept as interrupted: run the same ingest command to resume"
            )
        durable = self._flush_blocks(final, wait) if self.qk is None else self._virtual_end  # a Q/K run's arrays: at commit
        ready = [p for p in self._pending if p[0] <= durable]
        self._pending = [p for p in self._pending if p[0] > durable]
        if not ready:
            if final and self._index_queue:  # every row is committed already (the last block ended on a chunk boundary)
                self.lease.check()
                self._flush_index()
            return 0
        seqs = [p[1] for p in ready]
        toks = [t for p in ready for t in p[2]]
        n_stored = sum(1 for q in seqs if not q["skipped"])
        try:
            self._commit_ready(ready, seqs, toks, n_stored, final)
        except BaseException:
            self._broken = True
            raise
        return len(ready)

    def _commit_ready(self, ready: list, seqs: list[dict], toks: list[tuple], n_stored: int, final: bool) -> None:
        """The per-token values of the examples now on disk, then (one transaction) their rows."""
        self._write_norms([p[4] for p in ready if p[4] is not None])
        self._write_loss([p[5] for p in ready if p[5] is not None])
        self._write_qk([p[6] for p in ready if p[6] is not None])
        if self.peaks is not None:
            self._peak_tokens += self._write_per_token(
                self.peaks, self._peak_tokens, [p[7] for p in ready if p[7] is not None], "hidden-state peaks"
            )
        if self.rows is not None:
            given = [p[8] for p in ready if p[8] is not None]
            for array, part in zip(self.rows, ([g[0] for g in given], [g[1] for g in given])):
                written = self._write_per_token(array, self._row_tokens, part, "row statistics")
            if given:
                self._row_tokens += written
        with self.store.session() as s:
            self.lease.check(s.connection())
            if self.index is not None:
                blocks = [p for p in ready if not p[1]["skipped"]]
                ids = [p[1]["example_id"] for p in blocks]
                position = dict(s.execute(sa.select(Example.id, Example.position).where(Example.id.in_(ids))).all()) if ids else {}
                self._index_queue += [(position[p[1]["example_id"]], p[1]["offset"], p[1]["length"], p[3]) for p in blocks]
                self._index_tokens += sum(len(p[3]) for p in blocks)
                if final or self._index_tokens >= INDEX_FLUSH_TOKENS:
                    self._flush_index()  # before the rows commit: an index entry never lacks its cells
                elif self._index_queue and not self._lag_marked:  # SQL is about to run ahead of the index
                    self.index.group.attrs.update({arrays.INDEX_PENDING: True})
                    self._lag_marked = True
            s.execute(sa.insert(Sequence), seqs)
            if toks:
                bulk_insert(s.connection(), "tokens", ("run_id", "example_id", "position", *TOKEN_FIELDS), toks)
            s.execute(
                sa.update(Run)
                .where(Run.id == self.info.id)
                .values(
                    n_stored=Run.n_stored + n_stored,
                    n_skipped=Run.n_skipped + (len(seqs) - n_stored),
                    n_truncated=Run.n_truncated + sum(1 for q in seqs if q["truncated"]),
                )
            )

    def _write_norms(self, norms: list[np.ndarray]) -> None:
        """The value norms of examples about to commit, after those committed (before their rows: a committed example
        never lacks its norms)."""
        if self.norms is not None:
            self._norm_tokens += self._write_per_token(self.norms, self._norm_tokens, norms, "value norms")

    def _write_loss(self, losses: list[np.ndarray]) -> None:
        """The per-token loss of examples about to commit, as `_write_norms` writes their value norms."""
        if self.loss is not None:
            self._loss_tokens += self._write_per_token(self.loss, self._loss_tokens, losses, "per-token loss")

    def _write_qk(self, parts: list[tuple]) -> None:
        """A Q/K run's queries, keys and log-sum-exps of examples about to commit, as `_write_norms` writes norms."""
        if self.qk is not None and parts:
            for array, values in zip(self.qk, zip(*parts)):
                written = self._write_per_token(array, self._qk_tokens, list(values), "queries and keys")
            self._qk_tokens += written

    def _write_per_token(self, array, start: int, parts: list[np.ndarray], what: str) -> int:
        """`parts` written to per-token `array` from token `start` on; the number of tokens written (0: none given)."""
        if not parts:
            return 0
        self.lease.check()
        values = np.concatenate(parts)
        try:
            array.write(start, values)
        except OSError as exc:
            raise StorageIOError(
                f"cannot write the {what} of run {self.info.name!r} under {self.store.locations.array_root}: "
                f"{exc.strerror or exc}; the run is kept as interrupted: free space or fix permissions, "
                f"then run the same ingest command to resume"
            ) from None
        return len(values)

    def _flush_index(self) -> None:
        assert self.index is not None
        queue, self._index_queue, self._index_tokens = self._index_queue, [], 0
        if not queue:
            return
        try:
            self.index.write(*(list(column) for column in zip(*queue)))
        except OSError as exc:
            raise StorageIOError(
                f"cannot write the index arrays of run {self.info.name!r} under {self.store.locations.array_root}: "
                f"{exc.strerror or exc}; the run is kept as interrupted: free space or fix permissions, "
                f"then run the same ingest command to resume"
            ) from None

    def finish(self, seconds: float, manifest_update: dict | None = None, rebuild_index: bool = False) -> RunInfo:
        """Commit the rest and mark the run complete. `rebuild_index`: write the index arrays anew from SQL and cut the
        cells array to the committed end (after a distributed ingest, whose workers write neither)."""
        try:
            self.commit(final=True)
            if rebuild_index:
                self.lease.check()
                self.index = write_index_from_sql(self._writer, self.info)
                block_writer.trim(self.blocks.array, committed_end(self.store, self.info))
            with self.store.session() as s:
                self.lease.check(s.connection())
                run = s.get(Run, self.info.id)
                run.status = "complete"
                run.finished_at = utcnow()
                run.ingest_seconds = (run.ingest_seconds or 0.0) + seconds
                if manifest_update:
                    run.manifest = {**(run.manifest or {}), **manifest_update}
            if self.index is not None:
                self.index.group.attrs.update({"status": "complete", "n_examples": self.index.n, arrays.INDEX_PENDING: False})
        finally:
            self.close()
        return self.store.run_info(self.info.id)

    def close(self) -> None:
        """Let a background chunk write end, then release the lease if this writer took it."""
        blocks = getattr(self, "blocks", None)
        if blocks is not None:
            blocks.close()
        if self._own_lease:
            self.lease.release()
