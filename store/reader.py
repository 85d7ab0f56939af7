"""Reading a store: connect to SQL + Zarr, then runs, examples, tokens, words, maps and saved results.

`StoreReader` only reads; `store.store.Store`, the class callers get from `open_store`, adds the
user's writes (saved results, pattern labels) and `store.writer` (store/writer.py: what ingest,
checks and bundles write and read with).

Longer than ~500 lines on purpose: one class, every read a user calls of runs, examples and maps (each a short method
over one query); splitting it would scatter one public surface over several classes. The reads of saved results (head
metrics, matches, probes, ablations, pattern labels, models) are its base `SavedResultReads`, in store/results.py.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import pandas as pd
import sqlalchemy as sa
import sqlalchemy.orm
from sqlalchemy.orm import sessionmaker

from . import progress
from .config import Locations, root_writable
from .db import check_connection, create_engine, session_scope, sql_write_denied, sqlite_path, sqlite_writable
from .errors import InvalidArgumentError, NotFoundError
from .frames import sql_frame
from .lazy import LazyModule
from .lru import LRU
from .migrate import upgrade_command, verify_schema
from .records import RunInfo
from .results import SavedResultReads
from .schema import Dataset, Example, Mention, Model, Run, Sequence, Token, Word
from .token_reads import QK_LAYERS_BYTES, TokenReads

if TYPE_CHECKING:
    from . import arrays, direct, qk, remote, summaries
else:  # these import zarr: each is imported at its first use, so commands that read SQL only never import zarr (store/lazy.py)
    arrays, direct, qk, remote, summaries = (
        LazyModule(f"{__package__}.{name}") for name in ("arrays", "direct", "qk", "remote", "summaries")
    )

# `attention`'s lookups: the (offset, length) of a window of example positions read from SQL at once, a few windows kept
BLOCK_WINDOW = 4096
BLOCK_WINDOWS_KEPT = 64  # 64 x 4,096 examples x 20 bytes: ~5 MB at most, whatever the run's size

RunRef = str | int


class StoreReader(SavedResultReads, TokenReads):
    """Read access to a store: SQL metadata at `locations.db_url` plus Zarr arrays under `locations.array_root`.

    A store opened with `locations.read_only` (--read-only, ATTNSTORE_READ_ONLY=1), or whose
    SQLite file, PostgreSQL tables (a SELECT-only role, a standby server) or local array root
    this user cannot write, is read-only (`read_only`, with `read_only_reason`): every read
    works, every write raises ReadOnlyStoreError before it starts.
    """

    def __init__(self, locations: Locations):
        self.locations = locations
        url = locations.db_url
        path = sqlite_path(url)
        if path and not os.path.exists(path):
            raise NotFoundError(f"no store database at {path}; create it with: {upgrade_command(url)}")
        sqlite_read_only = bool(path and not sqlite_writable(path))
        reasons = []
        if locations.read_only:
            reasons.append("opened with --read-only / ATTNSTORE_READ_ONLY")
        if sqlite_read_only:
            reasons.append(f"no write permission on its SQLite file {path}")
        if not root_writable(locations.array_root):
            reasons.append(f"no write permission on its array root {locations.array_root}")
        self.engine = create_engine(locations.db_url, read_only=sqlite_read_only or locations.read_only)
        check_connection(self.engine)
        verify_schema(self.engine)
        if not locations.read_only and (denied := sql_write_denied(self.engine)):
            reasons.append(denied)
        self.read_only_reason = "; ".join(reasons) or None
        self.read_only = bool(reasons)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._pins: dict[int, int] = {}  # run id -> largest block offset visible (see `pinned`)
        # while a run is pinned its snapshot does not change: its info (by id and name) and committed count, read once
        self._pinned_info: dict[RunRef, RunInfo] = {}
        self._pinned_count: dict[int, int] = {}
        self._root_checked = False  # a remote array root is checked once, on first use (`_array`)
        self._root_write_checked = False  # ... and for writing once, by `require_writable`
        # `attention`'s read path (issue 29), kept per store: what never changes of a run (its model's shape, array
        # path, codec), windows of its committed blocks' (offset, length) by example position (a block, once committed,
        # never moves; a position a window lacks is looked up again, so a run that grows is seen), and each run's
        # direct reader of its chunk files.
        self._maps_lock = threading.Lock()
        self._static_info: dict[RunRef, RunInfo] = {}
        self._block_windows: LRU[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = LRU(max_entries=BLOCK_WINDOWS_KEPT)
        self._direct: dict[str, tuple[tuple[int, int, int], direct.DirectCells | None]] = {}
        self._qk_handles: dict[str, tuple] = {}  # a Q/K run's three arrays by array path (`_qk_arrays`)
        self._qk_layers: LRU[tuple, tuple] = LRU(max_weight=QK_LAYERS_BYTES, weigh=lambda kept: sum(a.nbytes for a in kept))
        self._block_cache: direct.BlockCache | None = None  # made at the first one-example read (`block_cache`)

    def __repr__(self) -> str:
        return f"Store({self.locations.describe()})"

    @property
    def block_cache(self) -> direct.BlockCache:
        """This store's cache of decoded blocks for one-example reads (store/direct.py), its budget read from
        ATTNSTORE_READ_CACHE_MB when first needed; `set_read_cache(megabytes)` replaces it."""
        if self._block_cache is None:
            with self._maps_lock:
                if self._block_cache is None:
                    self._block_cache = direct.new_block_cache()
        return self._block_cache

    def set_read_cache(self, megabytes: float) -> direct.BlockCache:
        """A fresh, empty cache of decoded blocks of `megabytes` for this store (0 turns it off)."""
        self._block_cache = direct.new_block_cache(megabytes)
        return self._block_cache

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def session(self):
        return session_scope(self._sessions)

    # ------------------------------------------------------------------ runs, examples, tokens, words, maps

    def sql(self, query: str, params: dict | None = None, max_rows: int | None = None, max_bytes: int | None = None) -> pd.DataFrame:
        """Run a SQL query over the metadata and return a DataFrame (at most `max_rows` rows).

        One read-only statement (SELECT, WITH, VALUES, EXPLAIN; introspection PRAGMAs on SQLite)
        over the store's own tables and views, calling ordinary functions only, on its own
        read-only connection, under a time limit; anything else raises InvalidArgumentError("SQL
        error: ...") (what is allowed: store/sql_policy.py, docs/CLI.md). A result over
        `max_bytes`, or one value over 16 MiB, raises TooLargeError. See store/readonly.py.
        """
        from .readonly import run_readonly_sql

        # SQLite: by file (a read-only store's engine has no path in its URL); PostgreSQL: via the engine.
        target = self.locations.db_url if self.engine.dialect.name == "sqlite" else self.engine
        columns, rows = run_readonly_sql(target, query, params, max_rows, max_bytes=max_bytes)
        if columns is None:
            return pd.DataFrame()
        return pd.DataFrame(rows, columns=columns)

    def _frame(self, query) -> pd.DataFrame:
        with self.engine.connect() as conn:
            return sql_frame(conn, query)  # pd.read_sql_query's frame, from the driver's tuples (store/frames.py)

    def runs(self) -> pd.DataFrame:
        """One row per run: run, run_id, model, dataset, split, status, counts, settings, times."""
        q = (
            sa.select(
                Run.name.label("run"),
                Run.id.label("run_id"),
                Model.name.label("model"),
                Dataset.name.label("dataset"),
                Dataset.split,
                Run.status,
                Run.n_stored,
                Run.n_truncated,
                Run.n_skipped,
                Model.n_layers,
                Model.n_heads,
                Run.max_length,
                Run.truncation,
                Run.tokenization,
                Run.dtype,
                Run.attn_implementation,
                Run.started_at,
                Run.finished_at,
                Run.ingest_seconds,
            )
            .join(Model, Model.id == Run.model_id)
            .join(Dataset, Dataset.id == Run.dataset_id)
            .order_by(Run.id)
        )
        return self._frame(q)

    def run_info(self, run: RunRef) -> RunInfo:
        pinned = self._pinned_info.get(run)
        if pinned is not None:
            return pinned
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
                id=r.id,
                name=r.name,
                status=r.status,
                model=m.name,
                model_id=m.id,
                dataset=d.name,
                split=d.split,
                dataset_id=d.id,
                n_layers=m.n_layers,
                n_heads=m.n_heads,
                max_length=r.max_length,
                truncation=r.truncation,
                dtype=r.dtype,
                codec=r.codec,
                chunk_cells=r.chunk_cells,
                stored_array_path=r.array_path,
                attn_implementation=r.attn_implementation,
                special_tokens=m.special_tokens,
                n_stored=r.n_stored,
                n_truncated=r.n_truncated,
                n_skipped=r.n_skipped,
                manifest=r.manifest,
                tokenization=r.tokenization,
                dataset_format=d.format,
                dataset_options=d.options or {},
            )

    def examples(self, run: RunRef, texts: bool = True) -> pd.DataFrame:
        """Examples of a run: example (position in the corpus), example_id, texts, label, length, offset, flags.

        texts=False: without text_a, text_b, label, doc_id and sent_id (what reading the maps needs: a few dozen
        bytes per example instead of a few hundred)."""
        return self._example_rows(self.run_info(run), texts)

    def _example_rows(self, info: RunInfo, texts: bool, examples: Iterable[int] | None = None) -> pd.DataFrame:
        """`examples`' frame, of the given example positions only if `examples` (read by their range in SQL)."""
        described = (Example.text_a, Example.text_b, Example.label, Example.doc_id, Example.sent_id) if texts else ()
        q = (
            sa.select(
                Example.position.label("example"),
                Example.id.label("example_id"),
                *described,
                Sequence.length,
                Sequence.offset,
                Sequence.truncated,
                Sequence.skipped,
            )
            .join(Sequence, Sequence.example_id == Example.id)
            .where(self._visible(info))
            .order_by(Example.position)
        )
        frame = self._frame_of(q, examples)
        # bool even when empty (an empty column reads as object, and frame[~empty_object] selects no columns)
        return frame.astype({"truncated": bool, "skipped": bool})

    def storage_order(self, run: RunRef) -> np.ndarray:
        """The run's committed (not skipped) example positions in storage (offset) order, as `examples` sees them.

        int64, streamed from SQL into the array: 8 bytes per example held, where a frame of the run's
        example rows took ~390 at its peak (`tracemalloc`, 16,000 SST-2 sentences)."""
        return self._in_storage_order(self.run_info(run), Example.position)[0]

    def _in_storage_order(self, info: RunInfo, *columns) -> list[np.ndarray]:
        """int64 `columns` of the run's committed (not skipped) blocks in offset order, streamed from SQL: no frame
        of the run's rows is built, so a whole-run read holds 8 bytes per example and column."""
        q = (
            sa.select(*columns)
            .join(Sequence, Sequence.example_id == Example.id)
            .where(self._visible(info), sa.not_(Sequence.skipped))
            .order_by(Sequence.offset)
        )
        fields = np.dtype([(f"c{k}", np.int64) for k in range(len(columns))])
        with self.engine.connect().execution_options(stream_results=True, yield_per=4096) as conn:
            values = np.fromiter((tuple(row) for row in conn.execute(q)), dtype=fields)
        return [values[f"c{k}"] for k in range(len(columns))]

    def n_committed(self, run: RunRef, counted: bool = False) -> int:
        """How many of the run's examples have maps stored (skipped ones not counted), as `examples` sees them. Pinned
        (`pinned`): the run's `n_stored` read with the pin, unless `counted` (the rows counted: `attnstore check`
        compares the two)."""
        info = self.run_info(run)
        if info.id in self._pinned_count and not counted:
            return self._pinned_count[info.id]
        with self.engine.connect() as conn:
            q = sa.select(sa.func.count()).select_from(Sequence).where(self._visible(info), sa.not_(Sequence.skipped))
            n = int(conn.execute(q).scalar() or 0)
        if info.id in self._pins and not counted:
            self._pinned_count[info.id] = n
        return n

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
        # One statement, one snapshot: the last committed offset and the run's count of stored examples, which its
        # writer updates in the transaction that commits their rows (store/writer.py), so it is the number of
        # sequences the pin makes visible; `n_committed` then needs no count over the run's rows (seconds at millions).
        last_offset = sa.select(sa.func.max(Sequence.offset)).where(Sequence.run_id == info.id).scalar_subquery()
        stored = sa.select(Run.n_stored).where(Run.id == info.id).scalar_subquery()
        with self.engine.connect() as conn:
            last, n_stored = conn.execute(sa.select(last_offset, stored)).one()
        self._pins[info.id] = -1 if last is None else int(last)
        self._pinned_count[info.id] = int(n_stored or 0)
        self._pinned_info[info.id] = self._pinned_info[info.name] = info
        try:
            yield info
        finally:
            self._pins.pop(info.id, None)
            self._pinned_info.pop(info.id, None)
            self._pinned_info.pop(info.name, None)
            self._pinned_count.pop(info.id, None)

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
            raise NotFoundError(f"run {info.name!r} has no example {example} (it stores {info.n_stored} examples; see store.examples(run))")
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
                Token.position,
                Token.token,
                Token.token_id,
                Token.is_special,
                Token.segment,
                Token.word_position,
                Word.form.label("word"),
                Word.lemma,
                Word.upos,
                Word.xpos,
                Word.head,
                Word.deprel,
                Word.annotator,
                Token.char_start,
                Token.char_end,
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
        q = (
            sa.select(
                Word.position,
                Word.segment,
                Word.form,
                Word.lemma,
                Word.upos,
                Word.xpos,
                Word.head,
                Word.deprel,
                Word.annotator,
                Word.char_start,
                Word.char_end,
            )
            .where(Word.example_id == example_id)
            .order_by(Word.position)
        )
        df = self._frame(q)
        df["head"] = df["head"].astype("Int64")
        return df

    def token_table(self, run: RunRef, examples: Iterable[int] | None = None) -> pd.DataFrame:
        """All tokens of a run (example, position, token, token_id, word_position, segment, is_special), or of `examples`."""
        info = self.run_info(run)
        return self._frame_of(self._token_query(info), examples)

    def token_roles(self, run: RunRef, examples: Iterable[int] | None = None) -> pd.DataFrame:
        """What a token's role is read from, for all tokens of a run or of `examples`: example, token, token_id,
        is_special (token_table's columns a query's token flags need, read as one narrower query)."""
        info = self.run_info(run)
        return self._frame_of(self._token_query(info, (Token.token, Token.token_id, Token.is_special)), examples)

    def _frame_of(self, query, examples: Iterable[int] | None) -> pd.DataFrame:
        """`query`'s rows (its `example` column is Example.position), or those of `examples` only."""
        if examples is None:
            return self._frame(query)
        wanted = sorted({int(e) for e in examples})
        if not wanted:
            return self._frame(query.where(sa.false()))
        # a range in SQL (a bound parameter per example would not scale), then the exact set here
        frame = self._frame(query.where(Example.position.between(wanted[0], wanted[-1])))
        return frame[frame["example"].isin(wanted)].reset_index(drop=True)

    def _token_query(self, info: RunInfo, columns: tuple | None = None):
        columns = columns or (Token.position, Token.token, Token.token_id, Token.word_position, Token.segment, Token.is_special)
        return (
            sa.select(Example.position.label("example"), *columns)
            .join(Example, Example.id == Token.example_id)
            .join(Sequence, sa.and_(Sequence.example_id == Token.example_id, Sequence.run_id == Token.run_id))
            .where(Token.run_id == info.id, self._visible(info))
            .order_by(Example.position, Token.position)
        )

    def word_table(self, run: RunRef, examples: Iterable[int] | None = None) -> pd.DataFrame:
        """All words of a run's stored examples (or of `examples`): example, position, segment, form, lemma, upos, feats,
        head, deprel."""
        info = self.run_info(run)
        q = (
            sa.select(
                Example.position.label("example"),
                Word.position,
                Word.segment,
                Word.sentence,
                Word.form,
                Word.lemma,
                Word.upos,
                Word.feats,
                Word.head,
                Word.deprel,
            )
            .join(Example, Example.id == Word.example_id)
            .join(Sequence, sa.and_(Sequence.example_id == Example.id, self._visible(info)))
            .order_by(Example.position, Word.position)
        )
        frame = self._frame_of(q, examples)
        frame["head"] = frame["head"].astype("Int64")
        return frame

    def word_counts(self, run: RunRef) -> dict[int, int]:
        """Number of words of each of a run's stored examples (example position -> count), counted in SQL."""
        info = self.run_info(run)
        q = (
            sa.select(Example.position, sa.func.count())
            .join(Word, Word.example_id == Example.id)
            .join(Sequence, sa.and_(Sequence.example_id == Example.id, self._visible(info)))
            .group_by(Example.position)
        )
        with self.engine.connect() as conn:
            return {int(example): int(n) for example, n in conn.execute(q)}

    def dependency_relations(self, run: RunRef) -> list[str]:
        """The relations of the words with a head (non-root) of a run's committed (not skipped) examples, sorted, found
        in SQL: those a dependency query evaluates."""
        info = self.run_info(run)
        q = (
            sa.select(Word.deprel)
            .distinct()
            .join(Example, Example.id == Word.example_id)
            .join(Sequence, sa.and_(Sequence.example_id == Example.id, self._visible(info), sa.not_(Sequence.skipped)))
            .where(Word.deprel.is_not(None), Word.head.is_not(None))
        )
        with self.engine.connect() as conn:
            return sorted(str(relation) for (relation,) in conn.execute(q))

    def mention_table(self, run: RunRef, examples: Iterable[int] | None = None) -> pd.DataFrame:
        """Coreference mentions of a run's stored examples (or of `examples`): example, word_start, word_end, head, entity,
        kind, doc_order."""
        info = self.run_info(run)
        q = (
            sa.select(
                Example.position.label("example"),
                Mention.word_start,
                Mention.word_end,
                Mention.head,
                Mention.entity,
                Mention.kind,
                Mention.doc_order,
            )
            .join(Example, Example.id == Mention.example_id)
            .join(Sequence, sa.and_(Sequence.example_id == Example.id, self._visible(info)))
            .order_by(Example.position, Mention.doc_order)
        )
        return self._frame_of(q, examples)

    def _array(self, info: RunInfo, read_only: bool = True):
        root = self.locations.array_root
        if not self._root_checked and remote.is_remote(root):
            remote.check_root(root)  # a missing bucket, bad credentials or no answer: one line naming the fix
            self._root_checked = True
        return arrays.open_run_array(root, info.array_path, read_only=read_only)

    @staticmethod
    def _select(name: str, value, size: int):
        if value is None:
            return slice(None)
        values = [value] if isinstance(value, (int, np.integer)) else list(value)
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not -size <= v < size:
                raise InvalidArgumentError(f"{name} {v!r} is out of range: the model has {size} {name}s (0..{size - 1})")
        return values

    def attention(self, run: RunRef, example: int, layer=None, head=None, rows=None) -> np.ndarray:
        """One example's maps as a (layer, head, query, key) array, never padded.

        `layer` / `head` are None (all), an int or a list of ints; the result keeps
        all four axes either way. Rows sum to 1 over the example's L tokens.
        `rows`: None (all) or a range/slice of query rows (a block of a long example): only those rows are read, or, in
        a Q/K run (store/qk.py), rebuilt; keys are all L either way.
        Damaged or missing chunks raise DamagedDataError naming run, example and chunk; a run still in Zarr layout 1,
        OldLayoutError naming `attnstore db upgrade-arrays`.
        """
        return self._maps(self._maps_info(run), example, layer, head, rows)

    @staticmethod
    def _rows(rows, length: int) -> range | None:
        if rows is None:
            return None
        if isinstance(rows, (range, slice)) and (rows.step or 1) == 1:
            start = 0 if rows.start is None else rows.start
            stop = length if rows.stop is None else rows.stop
            if 0 <= start < stop <= length:
                return range(start, stop)
        raise InvalidArgumentError(f"rows {rows!r}: give a range of query rows within the example's {length} tokens, e.g. range(0, 512)")

    def _maps(self, info: RunInfo, example: int, layer, head, rows=None) -> np.ndarray:
        layers = self._select("layer", layer, info.n_layers)
        heads = self._select("head", head, info.n_heads)
        length, offset = self._block_of(info, example)
        wanted_rows = self._rows(rows, length)
        if info.qk is not None:
            chosen = [v % info.n_layers for v in layers] if not isinstance(layers, slice) else list(range(info.n_layers))
            chosen_heads = [v % info.n_heads for v in heads] if not isinstance(heads, slice) else list(range(info.n_heads))
            return self._rebuilt(info, self._token_start(info, offset), length, chosen, chosen_heads, wanted_rows)
        if wanted_rows is not None:
            return self._maps(info, example, layer, head)[:, :, wanted_rows.start : wanted_rows.stop]
        # Read only the layers asked for (they are contiguous in the block), and only the heads for one layer.
        wanted = range(info.n_layers) if isinstance(layers, slice) else [v % info.n_layers for v in layers]
        first, last = min(wanted), max(wanted)
        head_span = range(info.n_heads) if isinstance(heads, slice) or first != last else [v % info.n_heads for v in heads]
        h0, h1 = min(head_span), max(head_span)
        per_head = length * length
        start = offset + (first * info.n_heads + h0) * per_head
        n_layers, n_heads = last - first + 1, (h1 - h0 + 1 if first == last else info.n_heads)
        shape = arrays.block_shape(n_layers, n_heads, length)
        block = self._read_cells(info, start, start + int(np.prod(shape)), lambda a, b: f"run {info.name!r}, example {example}")
        block = block.reshape(shape)
        rows = [v - first for v in wanted] if not isinstance(layers, slice) else slice(None)
        cols = slice(None) if isinstance(heads, slice) else [v % info.n_heads - (h0 if first == last else 0) for v in heads]
        # every layer / head of the block asked for in order: the block itself, not a copy by fancy indexing (every map
        # of an example: 1.4 MB copied twice per read)
        if isinstance(rows, list) and rows == list(range(n_layers)):
            rows = slice(None)
        if isinstance(cols, list) and cols == list(range(n_heads)):
            cols = slice(None)
        return block[rows][:, cols]

    def _maps_info(self, run: RunRef) -> RunInfo:
        """`run_info`, read from SQL once per store for `attention`, which uses only what never changes of a run (its
        id, name, model shape, array path, codec); a pinned snapshot's info first."""
        info = self._pinned_info.get(run) or self._static_info.get(run)
        if info is None:
            info = self.run_info(run)
            _ = info.array_path  # a layout-1 run is refused before its info is kept: once upgraded, it is read
            with self._maps_lock:
                self._static_info[run] = info
        return info

    def _block_of(self, info: RunInfo, example: int) -> tuple[int, int]:
        """(length, offset) of an example's block: from a window of positions read once, else `_sequence` (SQL),
        which also raises for an example the run lacks or skipped, or one committed after a pinned snapshot."""
        if isinstance(example, bool) or not isinstance(example, (int, np.integer)):
            raise InvalidArgumentError(f"example must be an integer position in the corpus, not {example!r}")
        position = int(example)
        key = (info.id, position // BLOCK_WINDOW)
        for attempt in range(2):
            window = self._block_windows.get(key)
            if window is None or attempt:  # a position the window lacks may have been committed since it was read
                window = self._read_block_window(info, key[1])
            positions, offsets, lengths = window
            at = int(np.searchsorted(positions, position))
            if at < len(positions) and positions[at] == position:
                offset, length = int(offsets[at]), int(lengths[at])
                pin = self._pins.get(info.id)
                if pin is None or offset <= pin:
                    return length, offset
                break  # committed after the snapshot began: SQL says so
        _, length, offset_or_none = self._sequence(self.run_info(info.id), example)  # fresh counts for its message
        assert offset_or_none is not None  # _sequence refuses skipped examples
        return length, offset_or_none

    def _read_block_window(self, info: RunInfo, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q = (
            sa.select(Example.position, Sequence.offset, Sequence.length)
            .join(Sequence, Sequence.example_id == Example.id)
            .where(
                Sequence.run_id == info.id,
                sa.not_(Sequence.skipped),
                Sequence.offset.is_not(None),
                Example.position.between(window * BLOCK_WINDOW, (window + 1) * BLOCK_WINDOW - 1),
            )
            .order_by(Example.position)
        )
        with self.engine.connect() as conn:
            rows = np.array(conn.execute(q).all(), dtype=np.int64).reshape(-1, 3)
        value = (rows[:, 0].copy(), rows[:, 1].copy(), rows[:, 2].copy())
        self._block_windows.put((info.id, window), value)
        return value

    def _read_cells(self, info: RunInfo, start: int, stop: int, describe: arrays.Describe) -> np.ndarray:
        """Cells [start, stop) of the run: straight from the chunk files where it can (store/direct.py); else, and
        whenever that finds anything off, through zarr on a freshly opened array (`arrays.read_cells`), which names
        damage as it always did."""
        reader = None if remote.is_remote(self.locations.array_root) else self._direct_reader(info)
        if reader is not None and (cells := reader.read(start, stop, self.block_cache)) is not None:
            return cells
        return arrays.read_cells(self._array(info), start, stop, describe)

    def _direct_reader(self, info: RunInfo) -> direct.DirectCells | None:
        """A local run's direct reader, kept while its cells' zarr.json is the same file (inode, size, modification
        time: zarr replaces it on every write), so a changed or damaged one is opened again and named as before."""
        root = self.locations.array_root
        meta = os.path.join(root[len("file://") :] if root.startswith("file://") else root, *info.array_path.split("/"), "zarr.json")
        try:
            st = os.stat(meta)
        except OSError:
            return None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        kept = self._direct.get(info.array_path)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        reader = direct.direct_reader(self._array(info))  # NotFoundError / DamagedDataError naming the file, as before
        with self._maps_lock:
            self._direct[info.array_path] = (stamp, reader)
        return reader

    def labelled_attention(self, run: RunRef, example: int, layer=None, head=None) -> Any:
        """`attention` as an xarray.DataArray with dims (layer, head, query, key) and the tokens as coordinates
        (needs the `xarray` extra; see store/labelled.py)."""
        from .labelled import labelled_attention

        return labelled_attention(self, run, example, layer=layer, head=head)  # type: ignore[arg-type]

    def labelled_run(self, run: RunRef, examples: Iterable[int] | None = None, layer=None, head=None) -> Any:
        """Several examples (default: all) as an xarray.Dataset, one variable per example (see store/labelled.py)."""
        from .labelled import labelled_run

        return labelled_run(self, run, examples, layer=layer, head=head)  # type: ignore[arg-type]

    def summaries(self, run: RunRef | RunInfo) -> summaries.RunSummaries:
        """The run's kept summaries (store/summaries.py): `.parts(key, stamp)`, `.ranges(key, stamp)`, `.whole(...)`,
        `.keep(...)` and `.keep_ranges(...)` (writable stores), `.stamped()`, `.remove(key)`."""
        info = run if isinstance(run, RunInfo) else self.run_info(run)
        return summaries.RunSummaries(self, info)  # type: ignore[arg-type]

    def plot(self, run: RunRef, example: int, layer: int | None = None, head: int | None = None) -> Any:
        """A matplotlib Figure of one example's maps with token labels: one head (layer and head), one layer's
        heads (layer), or every head as a grid (neither); needs the `report` extra (see store/plot.py)."""
        from .plot import plot_attention

        return plot_attention(self, run, example, layer=layer, head=head)  # type: ignore[arg-type]

    def iter_attention(self, run: RunRef, examples: Iterable[int] | None = None, by_layer: bool = False) -> Iterator[tuple[int, Any]]:
        """Stream (example, maps) over a run in storage order with bounded memory (a Q/K run's maps rebuilt, float32,
        one example at a time; with `by_layer`, as `qk.LayerMaps`, rebuilt a layer at a time as they are read)."""
        info = self.run_info(run)
        if info.qk is not None:
            yield from self._iter_rebuilt(info, examples, by_layer)
            return
        if examples is None:  # the whole run: three int64 columns streamed from SQL, 24 bytes per example
            positions, offsets, lengths = self._in_storage_order(info, Example.position, Sequence.offset, Sequence.length)
        else:
            wanted = {int(e) for e in examples}
            # a subset's rows only: a long run is read range by range (queries/engine/), each range's rows once
            seqs = self._example_rows(info, texts=False, examples=wanted)
            seqs = seqs[~seqs["skipped"]]
            missing = wanted - set(seqs["example"])
            if missing:
                raise NotFoundError(f"run {info.name!r} has no stored example(s) {sorted(missing)[:10]}")
            seqs = seqs.sort_values("offset", kind="stable")
            positions, offsets, lengths = (seqs[c].to_numpy(np.int64) for c in ("example", "offset", "length"))
        # made one at a time as the reads reach them: a run's block references are never all held (~150 bytes each)
        refs = (arrays.BlockRef(int(e), int(o), int(n)) for e, o, n in zip(positions, offsets, lengths))

        def describe(keys: list) -> str:
            shown = ", ".join(str(k) for k in keys[:5]) + (", ..." if len(keys) > 5 else "")
            return f"run {info.name!r}, example{'s' if len(keys) > 1 else ''} {shown}"

        reader = None if remote.is_remote(self.locations.array_root) else self._direct_reader(info)
        slabs = arrays.iter_blocks(
            self._array(info), refs, info.n_layers, info.n_heads, describe=describe, ordered=True, direct=reader.read if reader else None
        )
        for key, maps in slabs:
            yield int(key), maps  # type: ignore[call-overload]  # keys are the example positions given above
            progress.advance()  # a progress bar listens only where a command asked for one (store/progress.py)
