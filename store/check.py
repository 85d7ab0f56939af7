"""Verify a store: every chunk a run needs is present and decodes (checksums), block offsets
are consistent, every stored map's rows sum to 1, and SQL counts agree with the arrays.

`check_store(store)` returns one row per problem found (an empty frame means healthy) and
one summary row per run; `attnstore check` prints them and exits 1 on any damage. A run still in
Zarr layout 1 is not checked: its one problem says to run `attnstore db upgrade-arrays`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import sqlalchemy as sa

from . import arrays, qk, remote, row_stats, summaries
from .errors import AttnStoreError, BusyError, DamagedDataError, NotFoundError
from .float16 import as_float32
from .records import in_layout_1
from .schema import Sequence

ROW_SUM_TOLERANCE = 2e-3  # ingest refuses maps off by more than 1e-3; float16 storage adds < 2**-11
SLAB_CHUNKS = 16


@dataclass
class RunReport:
    run: str
    state: str
    examples: int = 0
    chunks: int = 0
    checksums: bool = False
    problems: list[dict] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)  # store keys removed by `check_store(..., repair=True)`

    def add(self, problem: str, example=None, chunk=None) -> None:
        self.problems.append(dict(run=self.run, example=example, chunk=chunk, problem=problem))


def _first_line(exc: BaseException, limit: int = 120) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]


class _BlockCheck:
    """Checks a run's blocks as they come in storage order, one step at a time (memory: one step, the set of
    chunks present, and the bad ones). `step`: the codec's largest change per value (lossy runs), which a row
    of L values may add up L times."""

    def __init__(self, report: RunReport, array, n_layers: int, n_heads: int, step: float = 0.0, sink_logits: bool = False):
        self.report, self.array, self.n_layers, self.n_heads, self.step = report, array, n_layers, n_heads, step
        self.sink_logits = sink_logits  # learned sink logits (gpt-oss): rows sum to at most 1, the sink holds the rest
        self.chunk = array.chunks[0]
        self.present = arrays.present_chunks(array)
        self.bad: dict[int, str] = {}
        self.reported: set[int] = set()
        self.decoded: set[int] = set()  # chunks decoded one at a time (each at most once)
        self.last_chunk = -1  # chunks up to this one are counted and looked at
        self.last_end, self.last_example = -1, None  # the block before this step's first

    def blocks(self, seqs: pd.DataFrame) -> None:
        """`seqs`: the next blocks in storage order (columns example, offset, length)."""
        report, array, chunk = self.report, self.array, self.chunk
        sizes = self.n_layers * self.n_heads * seqs["length"].to_numpy(np.int64) ** 2
        starts = seqs["offset"].to_numpy(np.int64)
        ends = starts + sizes
        examples = seqs["example"].to_numpy()
        before = np.concatenate([[self.last_end], ends[:-1]])
        before_example = [self.last_example, *examples[:-1]]
        for o in np.flatnonzero(starts < before):
            report.add(f"block overlaps the block of example {before_example[o]}", example=int(examples[o]))
        self.last_end, self.last_example = int(ends[-1]), examples[-1]
        for s, e in zip(starts, ends):  # chunks not yet looked at: counted, and missing or (no checksums) truncated?
            first, last = max(int(s) // chunk, self.last_chunk + 1), (int(e) - 1) // chunk
            for i in range(first, last + 1):
                report.chunks += 1
                if i not in self.present:
                    self.bad[i] = "is missing"
                elif not report.checksums:
                    why = arrays.legacy_chunk_problem(array, i)
                    if why:
                        self.bad[i] = why
            self.last_chunk = max(self.last_chunk, last)
        self._decode(starts, ends, examples, sizes)

    def _decode(self, starts, ends, examples, sizes) -> None:
        """Decode slab by slab. A slab that holds a chunk already known to be bad, or that fails to decode, is
        decoded chunk by chunk to name every bad one; its blocks are then read one by one, the good ones only."""
        report, array, chunk, bad = self.report, self.array, self.chunk, self.bad
        n_layers, n_heads = self.n_layers, self.n_heads
        k = 0
        while k < len(starts):
            j = k + 1
            while j < len(starts) and ends[j] - starts[k] <= SLAB_CHUNKS * chunk:
                j += 1
            slab = range(int(starts[k]) // chunk, (int(ends[j - 1]) - 1) // chunk + 1)
            data = None
            if not any(i in bad for i in slab):
                try:
                    data = array[slab.start * chunk : slab.stop * chunk]
                except Exception as exc:
                    if remote.failed(array, exc):
                        raise  # the object store failed (network, credentials): not damage
            if data is None:  # one chunk at a time: a missing chunk may sit beside a damaged one
                for i in slab:
                    if i not in bad and i not in self.decoded:
                        self._decode_chunk(i)
            for m in range(k, j):
                hit = [i for i in range(int(starts[m]) // chunk, (int(ends[m]) - 1) // chunk + 1) if i in bad]
                if hit:
                    self._report_chunks(hit, int(examples[m]))
                    continue
                if data is None:
                    try:
                        block = array[int(starts[m]) : int(ends[m])]
                    except Exception as exc:  # every chunk decoded alone: changed while this ran, or metadata
                        if remote.failed(array, exc):
                            raise
                        report.add(f"block cannot be read ({_first_line(exc)})", example=int(examples[m]))
                        continue
                else:
                    block = data[int(starts[m]) - slab.start * chunk : int(ends[m]) - slab.start * chunk]
                length = int(round(np.sqrt(sizes[m] / (n_layers * n_heads))))
                if block.size != sizes[m]:
                    report.add(
                        f"block ends at cell {int(ends[m])}, past the end of the array ({array.shape[0]} cells)",
                        example=int(examples[m]),
                    )
                    continue
                maps = as_float32(block.reshape(n_layers, n_heads, length, length))  # float16 by table, as numpy casts
                sums = maps.sum(-1)
                over = np.maximum(sums - 1, 0) if self.sink_logits else np.abs(sums - 1)
                err = float(np.nanmax(over)) if sums.size else 0.0
                if not np.isfinite(maps).all() or (maps < 0).any() or err > ROW_SUM_TOLERANCE + length * self.step:
                    report.add(
                        f"maps are not attention distributions (max row-sum error {err:.3g}): wrong or overwritten data",
                        example=int(examples[m]),
                    )
            report.examples += j - k
            k = j

    def _decode_chunk(self, i: int) -> None:
        """Decode chunk `i` alone; a failure marks it bad (a failure of the object store is raised)."""
        try:
            self.array[i * self.chunk : (i + 1) * self.chunk]
        except Exception as exc:
            if remote.failed(self.array, exc):
                raise  # the object store failed (network, credentials): not damage
            self.bad[i] = f"is damaged ({_first_line(exc, 100)})"
        self.decoded.add(i)

    def _report_chunks(self, hit: list[int], example: int) -> None:
        """Name every bad chunk of an example's block (each chunk once per example)."""
        for i in hit:
            self.reported.add(i)
            key = arrays.chunk_key(self.array, i)
            self.report.add(f"chunk {key} {self.bad[i]}", example=example, chunk=key)

    def finish(self) -> None:
        """Bad chunks no example's report named."""
        for i in sorted(set(self.bad) - self.reported):
            self.report.add(f"chunk {arrays.chunk_key(self.array, i)} {self.bad[i]}", chunk=arrays.chunk_key(self.array, i))


LEFTOVER = "it holds no committed data and can be deleted"
# A run still in Zarr layout 1 (store/records.py `in_layout_1`): the command first, so a narrow table still shows it.
LAYOUT_1 = "run `attnstore db upgrade-arrays` to convert it: stored in Zarr layout 1, which this version no longer reads"


def _leftovers(store, report: RunReport, info, state: str, repair: bool) -> None:
    """Temporary files (`<key>.<hex>.partial`) that writers killed mid-write left under the run's node: reported, or
    with `repair`, removed under the run's write lease (a run a live process writes is left alone: its temporary
    files may be writes in flight)."""
    if state == "writing":
        return
    root, node = store.locations.array_root, arrays.group_path_of(info.array_path)
    found = arrays.partial_files(root, node)
    if found and repair:
        from .writer import run_lease_name

        try:
            with store.writer.lease(run_lease_name(info.name), f"repairing run {info.name!r}"):
                report.repaired += arrays.remove_partial_files(root, node)
        except BusyError:  # a writer started meanwhile: it removes them itself
            return
        found = [(key, size) for key, size in found if key not in report.repaired]
    for key, size in found:
        report.add(f"leftover temporary file {key} ({size} bytes) of a writer that was killed; {LEFTOVER}", chunk=key)


def _summaries(store, report: RunReport, info, repair: bool) -> None:
    """Kept summaries whose arrays no longer hold the rows recorded when they were finished (a field missing, a field
    cut short): never read (queries rebuild them); reported, or with `repair` removed under the summary's build lease
    (one being rebuilt now is left to its builder)."""
    from .writer import summary_lease_name

    kept = store.summaries(info)
    for name, node in kept.stamped():
        damage = summaries.summary_damage(node)
        if damage is None:
            continue
        if repair:
            try:
                with store.writer.lease(summary_lease_name(info.id, name), f"repairing summary {name!r} of run {info.name!r}"):
                    report.repaired.append(kept.remove(name))
                continue
            except BusyError:
                pass
        report.add(
            f"kept summary {name!r} is incomplete: {damage}; it is not read (the next query rebuilds it); "
            "`attnstore check --repair` removes it",
            chunk=f"{arrays.group_path_of(info.array_path)}/summary/{name}",
        )


def check_run(store, run, repair: bool = False) -> RunReport:
    """Checks the run's committed blocks a step at a time, in storage order (memory is one step's rows and
    arrays, not the run's: `StoreWriter.block_steps`). `repair`: remove temporary files killed writers left."""
    info = store.run_info(run)
    state, _ = store.run_state(info.id)
    if in_layout_1(info.stored_array_path):  # refused by every read: reported as needing the upgrade, not checked
        report = RunReport(run=info.name, state=state)
        report.add(LAYOUT_1)
        return report
    with store.pinned(info.id):
        report = RunReport(run=info.name, state=state, checksums=(info.codec or {}).get("checksum") == "crc32c")
        _leftovers(store, report, info, state, repair)
        _summaries(store, report, info, repair)
        with store.engine.connect() as conn:
            skipped = sa.select(sa.func.count()).select_from(Sequence).where(store._visible(info), Sequence.skipped)
            n_skipped = int(conn.scalar(skipped) or 0)
        n_stored = store.n_committed(info.id, counted=True)  # the rows themselves, not the runs row's count
        if state == "complete" and (n_stored != info.n_stored or n_skipped != info.n_skipped):
            report.add(f"runs row says {info.n_stored} stored / {info.n_skipped} skipped, sequences hold {n_stored} / {n_skipped}")
        if n_stored == 0:
            return report
        array = None
        try:
            array = store._array(info)
        except NotFoundError:
            report.add(f"attention array {info.array_path} is missing under {store.locations.array_root}")
        except DamagedDataError as exc:  # its zarr.json is not JSON, or not the metadata attnstore wrote
            report.add(str(exc), chunk=f"{info.array_path}/zarr.json")
        # a Q/K run keeps no cells (store/qk.py): its three per-token arrays are checked below instead
        blocks = (
            None
            if array is None or info.qk
            else _BlockCheck(
                report,
                array,
                info.n_layers,
                info.n_heads,
                arrays.quantize_step(info.codec),
                sink_logits=info.sink_logits,
            )
        )
        index = _IndexCheck.open(report, store, info, n_stored, complete=state == "complete") if array is not None else None
        n_tokens = 0
        for seqs, token_ids in store.writer.block_steps(info.id):
            n_tokens += int(seqs["length"].sum())
            for ex, length, ids in zip(seqs["example"], seqs["length"], token_ids):
                if len(ids) != length:
                    report.add(f"{len(ids)} tokens in SQL for a block of length {length}", example=int(ex))
            if blocks is not None:
                blocks.blocks(seqs)
            if index is not None:
                index = index.step(seqs, token_ids)
        if blocks is not None:
            blocks.finish()
        if info.has_value_norms:
            _check_value_norms(report, store, info, n_tokens, complete=state == "complete")
        if info.qk:
            for name in (qk.QUERY, qk.KEY, qk.LSE):
                fix = "ingest the run again (its maps are rebuilt from this array)"
                _check_token_array(report, store, info, name, n_tokens, fix, exact=state == "complete", signed=True, step=QK_CHECK_TOKENS)
        if info.has_token_loss:
            fix = "ingest the run again for its per-token loss"
            _check_token_array(report, store, info, arrays.TOKEN_LOSS, n_tokens, fix, exact=state == "complete", nan_ok=True)
        if info.has_hidden_peaks:
            fix = "ingest the run again for its hidden-state peaks"
            _check_token_array(report, store, info, arrays.HIDDEN_PEAKS, n_tokens, fix, exact=state == "complete", signed=True)
        if info.has_row_stats:
            fix = "ingest the run again for its row statistics (its maps are unaffected)"
            exact = state == "complete"
            _check_token_array(report, store, info, row_stats.STATS, n_tokens, fix, exact=exact, step=ROW_CHECK_TOKENS)
            _check_token_array(report, store, info, row_stats.TOP, n_tokens, fix, exact=exact, signed=True, step=ROW_CHECK_TOKENS)
        try:
            saliency = arrays.run_group_attribute(store.locations.array_root, info.array_path, arrays.SALIENCY)
        except Exception as exc:  # the group's zarr.json cannot be read: the index check above reports that once
            if remote.is_remote(store.locations.array_root) and remote.is_storage_failure(exc):
                raise
            saliency = None
        if saliency and saliency.get("complete"):
            _check_token_array(report, store, info, arrays.SALIENCY, n_tokens, "run `attnstore saliency` again", signed=True)
    return report


NORM_CHECK_TOKENS = 1 << 16
ROW_CHECK_TOKENS = 1 << 12  # tokens of row statistics read at once (store/token_reads.py ROW_READ_TOKENS)
QK_CHECK_TOKENS = 1 << 11  # tokens of a Q/K array read at once: 2,048 x 30 layers x 9 heads x 64 float16 = 71 MB (SmolLM2)


def _check_value_norms(report: RunReport, store, info, n_tokens: int, complete: bool) -> None:
    """The run's value_norm array holds a finite, non-negative norm for every committed token (checksums verified as
    each chunk decodes); exactly those once the run is complete."""
    _check_token_array(report, store, info, arrays.VALUE_NORMS, n_tokens, "ingest the run again for its value norms", exact=complete)


def _check_token_array(
    report: RunReport,
    store,
    info,
    name: str,
    n_tokens: int,
    fix: str,
    exact: bool = True,
    signed: bool = False,
    nan_ok: bool = False,
    step: int = NORM_CHECK_TOKENS,
) -> None:
    """A per-token array (value_norm, saliency, token_loss) holds a finite value (non-negative unless `signed`; NaN
    allowed where `nan_ok`: token_loss's last tokens) for each of the `n_tokens` committed tokens (exactly those where
    `exact`); chunks' checksums are verified as they decode."""
    where = f"{arrays.group_path_of(info.array_path)}/{name}"
    try:
        values = arrays.TokenArray(store.locations.array_root, info.array_path, name)
        length = values.length()
    except DamagedDataError as exc:
        report.add(str(exc))
        return
    except Exception as exc:
        if remote.is_remote(store.locations.array_root) and remote.is_storage_failure(exc):
            raise
        report.add(f"{where} cannot be opened ({_first_line(exc)}); {fix}")
        return
    if length < n_tokens or (exact and length != n_tokens):
        report.add(f"{where} holds {length} tokens, the committed examples {n_tokens}; {fix}")
        return
    for start in range(0, n_tokens, step):
        stop = min(start + step, n_tokens)
        try:
            part = values.read(start, stop)
        except Exception as exc:
            if remote.is_remote(store.locations.array_root) and remote.is_storage_failure(exc):
                raise
            report.add(f"{where}: tokens {start}..{stop} cannot be read ({_first_line(exc)}); {fix}", chunk=where)
            return
        bad = (~np.isfinite(part) & ~(np.isnan(part) if nan_ok else False)) | ((part < 0) if not signed else False)
        if bad.any():
            token = start + int(np.argwhere(bad)[0][0])
            report.add(f"{where}: the value of token {token} (in storage order) is not finite (or negative); {fix}", chunk=where)
            return


class _IndexCheck:
    """The Zarr index arrays say what SQL says (a running run's index may run ahead of SQL), compared
    a step of SQL's blocks at a time. The first difference is reported; then the comparison stops."""

    def __init__(self, report: RunReport, index: arrays.RunIndex, where: str):
        self.report, self.index, self.where, self.entry = report, index, where, 0

    @classmethod
    def open(cls, report: RunReport, store, info, n: int, complete: bool) -> _IndexCheck | None:
        where = arrays.group_path_of(info.array_path)
        try:
            index = arrays.RunIndex(store.locations.array_root, info.array_path, 0, 0, read_only=True)
        except DamagedDataError as exc:  # a zarr.json that is not JSON: the message names it
            report.add(str(exc))
            return None
        except Exception as exc:  # missing index arrays
            if remote.is_remote(store.locations.array_root) and remote.is_storage_failure(exc):
                raise
            report.add(f"index arrays of {where} cannot be read ({_first_line(exc)})")
            return None
        if not complete and arrays.index_pending(store.locations.array_root, info.array_path):
            return None  # a distributed ingest writes the index when the run completes (ingest/distributed.py)
        if index.length() < n or (complete and index.length() != n):
            report.add(f"the Zarr index lists {index.length()} examples, SQL {n}; run `attnstore db upgrade-arrays --rebuild-index`")
            return None
        return cls(report, index, where)

    def step(self, seqs: pd.DataFrame, token_ids: list[np.ndarray]) -> _IndexCheck | None:
        """Compares the next blocks; returns None once a difference is reported (or the arrays fail to read)."""
        first, n = self.entry, len(seqs)
        try:
            stored = self.index.read_range(first, first + n)
        except Exception as exc:  # undecodable index arrays
            self.report.add(f"index arrays of {self.where} cannot be read ({_first_line(exc)})")
            return None
        if len(stored["example"]) != n:  # the arrays were cut while this ran
            self.report.add(
                f"the Zarr index lists {first + len(stored['example'])} examples, SQL more; "
                "run `attnstore db upgrade-arrays --rebuild-index`"
            )
            return None
        for name in ("example", "offset", "length"):
            differ = np.flatnonzero(stored[name] != seqs[name].to_numpy())
            if differ.size:
                i = int(differ[0])
                self.report.add(
                    f"the Zarr index's {name} of entry {first + i} is {stored[name][i]}, SQL says {seqs[name].iloc[i]}; "
                    "run `attnstore db upgrade-arrays --rebuild-index`",
                    example=int(seqs["example"].iloc[i]),
                )
                return None
        from_sql = np.concatenate(token_ids)
        if len(from_sql) != len(stored["token_id"]) or (from_sql != stored["token_id"]).any():
            self.report.add("the Zarr index's token ids differ from SQL's tokens; run `attnstore db upgrade-arrays --rebuild-index`")
            return None
        self.entry += n
        return self


def check_store(store, runs=None, repair: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary per run, problems) for the given runs (default: all, and the root's own metadata). Damage is
    reported, never raised: only a failure to reach the store (database, object store) or a run that does not
    exist is an error. `repair`: remove the temporary files of killed writers (each run under its write lease)
    instead of reporting them; the keys removed are in `problems.attrs["repaired"]`."""
    names = list(runs) if runs else list(store.runs()["run"])
    reports = [_check_root(store, repair)] if not runs else []
    for name in names:
        try:
            reports.append(check_run(store, name, repair=repair))
        except DamagedDataError as exc:
            r = RunReport(run=str(name), state="?")
            r.add(str(exc))
            reports.append(r)
        except Exception as exc:
            if isinstance(exc, (AttnStoreError, sa.exc.SQLAlchemyError)) or remote.is_storage_failure(exc):
                raise  # a run that does not exist, a store that cannot be reached: one line, as for any command
            r = RunReport(run=str(name), state="?")  # never a traceback: what stopped the check of this run is a problem
            r.add(f"the check of this run stopped at {type(exc).__name__}: {_first_line(exc, 200)}")
            reports.append(r)
    summary = pd.DataFrame(
        [
            dict(
                run=r.run,
                state=r.state,
                examples=r.examples,
                chunks=r.chunks,
                checksums="crc32c" if r.checksums else "none (ingested before checksums)",
                problems=len(r.problems),
            )
            for r in reports
            if r.run is not None
        ],
        columns=["run", "state", "examples", "chunks", "checksums", "problems"],
    )
    problems = pd.DataFrame([p for r in reports for p in r.problems], columns=["run", "example", "chunk", "problem"])
    problems.attrs["repaired"] = [key for r in reports for key in r.repaired]
    return summary, problems


def _check_root(store, repair: bool) -> RunReport:
    """The root group's and runs/ group's zarr.json parse (every writer opens them), and temporary files left beside
    them by killed writers (older than `arrays.SUMMARY_PARTIAL_AGE_S`: any writer may update these groups); problems
    with run None."""
    report = RunReport(run=None, state="")  # type: ignore[arg-type]
    root = store.locations.array_root
    for node in ("", "runs"):
        damage = arrays.group_metadata_damage(root, node)
        if damage is not None:
            report.add(str(damage), chunk=f"{node}/zarr.json".lstrip("/"))
        found = arrays.partial_files(root, node, recursive=False, min_age_s=arrays.SUMMARY_PARTIAL_AGE_S)
        if found and repair:
            report.repaired += arrays.remove_partial_files(root, node, recursive=False, min_age_s=arrays.SUMMARY_PARTIAL_AGE_S)
            found = [(key, size) for key, size in found if key not in report.repaired]
        for key, size in found:
            report.add(f"leftover temporary file {key} ({size} bytes) of a writer that was killed; {LEFTOVER}", chunk=key)
    return report
