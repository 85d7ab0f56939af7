"""A run's per-token arrays as the store reads them back: value norms (Kobayashi et al.), per-token loss, saliency,
and a Q/K run's queries, keys and log-sum-exps, from which its maps are rebuilt (store/qk.py). `TokenReads` is a base
of `StoreReader` (store/reader.py), so they are read as `store.value_norms(...)`, `store.attention(...)` of a Q/K run.
Every per-token array holds the run's tokens back to back in storage order, as its token_id index does.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import sqlalchemy as sa

from . import progress, row_stats
from .errors import DamagedDataError, InvalidArgumentError, NotFoundError
from .lazy import LazyModule
from .records import RunInfo
from .schema import Example, Sequence

if TYPE_CHECKING:
    from . import arrays, qk
    from .config import Locations
    from .lru import LRU
    from .reader import RunRef
else:  # these import zarr: each is imported at its first use (store/lazy.py)
    arrays, qk = (LazyModule(f"{__package__}.{name}") for name in ("arrays", "qk"))

# A Q/K run's maps are rebuilt on read (store/qk.py), float32: one read may build at most this many MiB (a whole
# example of SmolLM2 at 2,048 tokens is 4.5 GiB, at 8,192 tokens 72 GiB).
REBUILD_LIMIT_ENV = "ATTNSTORE_REBUILD_MB"
REBUILD_LIMIT_MB = 6144
NORM_READ_TOKENS = 1 << 16  # value norms read at once (x layers x heads float16 values)
ROW_READ_TOKENS = 1 << 12  # row statistics read at once: 4,096 x SmolLM2's 270 heads x 100 bytes = 111 MB


def rebuild_limit_bytes() -> int:
    return int(float(os.environ.get(REBUILD_LIMIT_ENV) or REBUILD_LIMIT_MB) * 2**20)


QK_LAYERS_BYTES = 64 << 20  # examples' layers of Q/K kept for pooled reads: SmolLM2's at 8,192 tokens are 13 MB each


class TokenReads:
    """The reads of per-token arrays; `StoreReader` gives them its SQL and locations (`engine`, `locations`,
    `run_info`, `_in_storage_order`) and the Q/K handles it keeps (`_qk_handles`, `_maps_lock`)."""

    if TYPE_CHECKING:
        engine: sa.Engine
        locations: Locations
        _maps_lock: threading.Lock
        _qk_handles: dict[str, tuple]
        _qk_layers: LRU[tuple, tuple]

        def run_info(self, run: RunRef) -> RunInfo: ...

        def _in_storage_order(self, info: RunInfo, *columns) -> list[np.ndarray]: ...

        def _maps_info(self, run: RunRef) -> RunInfo: ...

        def _block_of(self, info: RunInfo, example: int) -> tuple[int, int]: ...

        def _maps(self, info: RunInfo, example: int, layer, head, rows=None) -> np.ndarray: ...

    def _token_start(self, info: RunInfo, offset: int) -> int:
        """A Q/K run's example's first token in storage order: the tokens of the committed blocks before its offset."""
        q = sa.select(sa.func.coalesce(sa.func.sum(Sequence.length), 0)).where(
            Sequence.run_id == info.id, Sequence.offset.is_not(None), Sequence.offset < offset
        )
        with self.engine.connect() as conn:
            return int(conn.execute(q).scalar() or 0)

    def _rebuilt(self, info: RunInfo, start: int, length: int, layers: list[int], heads: list[int], rows: range | None) -> np.ndarray:
        """Maps of a Q/K run's example rebuilt from its stored queries, keys and log-sum-exps (store/qk.py), float32;
        only the layers asked for are read."""
        entry = info.qk
        assert entry is not None
        need = len(layers) * len(heads) * (len(rows) if rows is not None else length) * length * 4
        limit = rebuild_limit_bytes()
        if need > limit:
            raise InvalidArgumentError(
                f"run {info.name!r}: rebuilding {len(layers)} layer(s) x {len(heads)} head(s) of an example of {length} tokens "
                f"needs {need / 2**30:.1f} GiB, over the {limit / 2**30:.1f} GiB limit; read fewer layers, heads or rows "
                f"(store.attention(run, example, layer=, head=, rows=)) or raise {REBUILD_LIMIT_ENV} (MiB)"
            )
        lo, hi = min(layers), max(layers) + 1
        rows = rows if rows is not None else range(length)
        q, k, lse = self._qk_slices(info, start, length, lo, hi, rows)
        shifted = {**entry, "scale": entry["scale"][lo:hi], "window": entry["window"][lo:hi]}
        return qk.rebuild(q, k, lse, shifted, [v - lo for v in layers], heads, rows, n_keys=length)

    def _qk_slices(
        self, info: RunInfo, start: int, length: int, lo: int, hi: int, rows: range
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """An example's stored queries and log-sum-exps of `rows`, and its keys up to the last of them, for layers
        lo..hi-1."""
        stop = start + length
        q_array, k_array, lse_array = self._qk_arrays(info, stop)
        # only the rows asked for, and the keys up to the last of them (a causal row sees none past itself)
        first, last = start + rows.start, start + rows.stop
        try:
            q = np.asarray(q_array.array[first:last, lo:hi])
            k = np.asarray(k_array.array[start:last, lo:hi])
            lse = np.asarray(lse_array.array[first:last, lo:hi])
        except Exception as exc:
            raise DamagedDataError(
                f"run {info.name!r}: cannot read its queries and keys for tokens {start}..{stop} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); run `attnstore check`"
            ) from None
        if len(q) != len(rows) or len(k) != rows.stop or len(lse) != len(rows):
            raise DamagedDataError(
                f"run {info.name!r}: its Q/K arrays hold fewer tokens than its committed examples need ({stop}); run `attnstore check`"
            )
        return q, k, lse

    def pooled_attention(self, run: RunRef, example: int, layer: int, head: int, rows: range, factor: int) -> np.ndarray:
        """One head's map over query rows `rows` (starting on a multiple of `factor`), each factor x factor block of
        cells reduced to its largest weight: (ceil(len(rows) / factor), ceil(length / factor)) float32, what a zoomed-out
        view of a long map shows (api/http/routes/tiles.py). A Q/K run computes it without rebuilding the map
        (`qk.rebuild_pooled`); a dense run reads the rows and pools them."""
        info = self._maps_info(run)
        length, offset = self._block_of(info, example)
        if rows.start % factor or not 0 <= rows.start < rows.stop <= length:
            raise InvalidArgumentError(f"rows {rows!r}: give rows within the example's {length} tokens, starting on a multiple of {factor}")
        if info.qk is None:
            return qk.max_pool(self._maps(info, example, [layer], [head], rows)[0, 0].astype(np.float32), factor)
        start = self._token_start(info, offset)
        q, k, lse = self._example_layer_qk(info, start, length, layer)
        shifted = {**info.qk, "scale": info.qk["scale"][layer : layer + 1], "window": info.qk["window"][layer : layer + 1]}
        return qk.rebuild_pooled(
            q[rows.start : rows.stop], k[: rows.stop], lse[rows.start : rows.stop], shifted, 0, head, rows, length, factor
        )

    def _example_layer_qk(self, info: RunInfo, start: int, length: int, layer: int) -> tuple[np.ndarray, ...]:
        """One example's queries, keys and log-sum-exps of one layer (token, 1, head, ...), kept per store: a view's
        bands and other heads of the layer read them once (a committed example's never change)."""
        key = (info.id, info.array_path, start, length, layer)  # a run deleted and made again has a new id
        kept = self._qk_layers.get(key)
        if kept is None:
            arrays = self._qk_arrays(info, start + length)
            kept = tuple(np.asarray(a.array[start : start + length, layer : layer + 1]) for a in arrays)
            self._qk_layers.put(key, kept)
        return kept

    def _qk_arrays(self, info: RunInfo, stop: int) -> tuple:
        """A Q/K run's three arrays, opened once per store while they hold `stop` tokens (opened again when a run being
        written has grown past what the kept handles say)."""
        kept = self._qk_handles.get(info.array_path)
        if kept is None or kept[0].length() < stop:
            kept = qk.open_arrays(self.locations.array_root, info.array_path)
            with self._maps_lock:
                self._qk_handles[info.array_path] = kept
        return kept

    def _iter_rebuilt(self, info: RunInfo, examples: Iterable[int] | None, by_layer: bool = False) -> Iterator[tuple[int, Any]]:
        """(example, maps) rebuilt whole, or with `by_layer` as `qk.LayerMaps` (rebuilt a layer at a time as the reduce
        reaches it)."""
        positions, lengths, starts = self._token_spans(info, examples)
        layers, heads = list(range(info.n_layers)), list(range(info.n_heads))
        assert info.qk is not None
        for position, length, start in zip(positions.tolist(), lengths.tolist(), starts.tolist()):
            if by_layer:
                yield position, qk.LayerMaps(*self._qk_slices(info, start, length, 0, info.n_layers, range(length)), info.qk)
            else:
                yield position, self._rebuilt(info, start, length, layers, heads, None)
            progress.advance()

    def has_value_norms(self, run: RunRef) -> bool:
        """Whether the run keeps its value norms (`value_norms`, queries' weights="norm")."""
        return self.run_info(run).has_value_norms

    def require_value_norms(self, run: RunRef) -> None:
        """Refuse, in one line naming the run, a run that keeps no value norms."""
        info = self.run_info(run)
        if not info.has_value_norms:
            raise InvalidArgumentError(
                f"run {info.name!r} has no value norms (ingested before attnstore kept them, with --no-norms, on a Dask "
                f"scheduler, or its model's value and output projections were not found): ingest it again under a new "
                f"--name to use them"
            )

    def value_norms(self, run: RunRef, example: int) -> np.ndarray:
        """One example's value norms as a (layer, head, key) float32 array: ||f_h(x_j)||, the norm of token j's value
        vector through head h's slice of the output projection (value bias included, output bias not; Kobayashi et
        al. 2020), stored as float16. Weighting the maps by them, a[l, h, i, j] * n[l, h, j] = ||a_ij f_h(x_j)||."""
        return next(self.iter_value_norms(run, [example]))[1]

    def iter_value_norms(self, run: RunRef, examples: Iterable[int] | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """(example, (layer, head, key) float32 value norms) over the run's committed examples (or `examples`), in
        storage order, as `iter_attention` gives their maps."""
        info = self.run_info(run)
        self.require_value_norms(info.id)
        norms = arrays.ValueNorms(self.locations.array_root, info.array_path)
        for example, values in self._iter_token_values(info, norms, examples):
            yield example, np.ascontiguousarray(values.transpose(1, 2, 0), dtype=np.float32)

    def has_token_loss(self, run: RunRef) -> bool:
        """Whether the run keeps each token's next-token loss (a causal LM's run: `token_loss`)."""
        return self.run_info(run).has_token_loss

    def token_loss(self, run: RunRef, example: int) -> np.ndarray:
        """One example's next-token loss per token, a (token,) float32 array in nats: loss[i] = -log p(token[i+1] |
        tokens[..i]) under the run's causal LM, from the pass that made its maps; NaN at the last token (no next one)."""
        return next(self.iter_token_loss(run, [example]))[1]

    def iter_token_loss(self, run: RunRef, examples: Iterable[int] | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """(example, (token,) float32 next-token loss) over the run's committed examples (or `examples`), in storage
        order, as `iter_attention` gives their maps."""
        info = self.run_info(run)
        return self._iter_causal_lm_values(info, info.has_token_loss, arrays.TOKEN_LOSS, "has no per-token loss", "it", examples)

    def iter_hidden_peaks(self, run: RunRef, examples: Iterable[int] | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """(example, (token, layer, 3) float32) over the run's committed examples (or `examples`), in storage order: per
        token and layer, the layer's output hidden state's largest-magnitude entry (signed), its dimension and the median
        magnitude (store/arrays.py HIDDEN_PEAKS; Sun et al. 2024's massive activations)."""
        info = self.run_info(run)
        return self._iter_causal_lm_values(
            info, info.has_hidden_peaks, arrays.HIDDEN_PEAKS, "keeps no hidden-state peaks", "them", examples
        )

    def _iter_causal_lm_values(
        self, info: RunInfo, kept: bool, name: str, lacks: str, it: str, examples
    ) -> Iterator[tuple[int, np.ndarray]]:
        """A causal LM's per-token array `name` (token_loss, hidden_peak) per example, float32; refused in one line (saying
        the run `lacks` it) where the run keeps none. Checked before the first example is asked for."""
        if not kept:
            raise InvalidArgumentError(
                f"run {info.name!r} {lacks} (not a causal LM with its LM head, ingested with --no-token-loss, on a Dask "
                f"scheduler, or before attnstore kept {it}): ingest a causal LM again under a new --name to get {it}"
            )
        values = arrays.TokenArray(self.locations.array_root, info.array_path, name)
        return ((example, np.asarray(rows, dtype=np.float32)) for example, rows in self._iter_token_values(info, values, examples))

    def iter_row_stats(
        self, run: RunRef, examples: Iterable[int] | None = None, fields: tuple[str, ...] | None = None, top: bool = True
    ) -> Iterator[tuple[int, row_stats.ExampleRows]]:
        """(example, its per-row attention statistics) over the run's committed examples (or `examples`), in storage
        order (store/row_stats.py); refused in one line where the run keeps none. `fields`: only these (names, or the
        groups "first", "distance", "top"; None: all), each stored in chunks of its own; `top`: the top keys too."""
        info = self.run_info(run)
        if not info.has_row_stats:
            raise InvalidArgumentError(
                f"run {info.name!r} keeps no per-row attention statistics (not a causal LM's run with streaming capture, "
                f"ingested with --no-row-stats, on workers or a Dask scheduler, or before attnstore kept them): read its "
                f"maps, or ingest it again under a new --name"
            )
        root = self.locations.array_root
        read = row_stats.field_indices(fields)
        values = self._iter_token_values(info, arrays.TokenArray(root, info.array_path, row_stats.STATS), examples, ROW_READ_TOKENS, read)
        if not top:
            for example, stats in values:
                yield example, row_stats.ExampleRows(stats, None, read)
            return
        keys = self._iter_token_values(info, arrays.TokenArray(root, info.array_path, row_stats.TOP), examples, ROW_READ_TOKENS)
        for (example, stats), (same, top_keys) in zip(values, keys):
            assert example == same, (example, same)  # both in storage order
            yield example, row_stats.ExampleRows(stats, top_keys, read)

    def saliency_info(self, run: RunRef) -> dict | None:
        """What the run's saliency array holds (model, method, target, n_tokens, complete), or None without one."""
        info = self.run_info(run)
        return arrays.run_group_attribute(self.locations.array_root, info.array_path, arrays.SALIENCY)

    def iter_saliency(self, run: RunRef, examples: Iterable[int] | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """(example, (token,) float32 saliency) over the run's committed examples (or `examples`), in storage order:
        gradient x input of its fine-tuned model's prediction per token (`attnstore saliency`, ingest/saliency.py)."""
        info = self.run_info(run)
        meta = self.saliency_info(info.id)
        if not meta or not meta.get("complete"):
            raise InvalidArgumentError(
                f"run {info.name!r} has no saliency{' (its computation was cut off)' if meta else ''}: "
                f"run `attnstore saliency --run {info.name}` (its model must be a classifier fine-tuned in this store)"
            )
        values = arrays.TokenArray(self.locations.array_root, info.array_path, arrays.SALIENCY)
        for example, row in self._iter_token_values(info, values, examples):
            yield example, row.astype(np.float32)

    def _token_spans(self, info: RunInfo, examples: Iterable[int] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(positions, lengths, first tokens) of the run's committed examples (or `examples`) in storage order: where
        each one's rows of a per-token array start (tokens are stored back to back in that order)."""
        positions, lengths = self._in_storage_order(info, Example.position, Sequence.length)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        if examples is not None:
            wanted = np.unique(np.fromiter((int(e) for e in examples), dtype=np.int64))
            missing = np.setdiff1d(wanted, positions)
            if missing.size:
                raise NotFoundError(f"run {info.name!r} has no stored example(s) {missing[:10].tolist()}")
            keep = np.isin(positions, wanted)
            positions, lengths, starts = positions[keep], lengths[keep], starts[keep]
        return positions, lengths, starts

    def _iter_token_values(
        self, info: RunInfo, array: arrays.TokenArray, examples, window_tokens: int = NORM_READ_TOKENS, entries: list[int] | None = None
    ) -> Iterator[tuple[int, np.ndarray]]:
        """(example, its rows of a per-token array) in storage order, one read per window of nearby examples (at most
        `window_tokens` tokens, or one example); `entries`: only these entries of its last axis."""
        positions, lengths, starts = self._token_spans(info, examples)
        i = 0
        while i < len(positions):
            j = i + 1
            while j < len(positions) and starts[j] + lengths[j] - starts[i] <= window_tokens:
                j += 1
            first, last = int(starts[i]), int(starts[j - 1] + lengths[j - 1])
            window = array.read(first, last, entries)
            if len(window) != last - first:
                raise DamagedDataError(
                    f"run {info.name!r}: its {array.array.basename} array holds {array.length()} tokens, fewer than its "
                    f"committed examples need ({last}); run `attnstore check`"
                )
            for k in range(i, j):
                a = int(starts[k]) - first
                yield int(positions[k]), window[a : a + int(lengths[k])]
            i = j
