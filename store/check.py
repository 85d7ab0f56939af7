"""Verify a store: every chunk a run needs is present and decodes (checksums), block offsets
are consistent, every stored map's rows sum to 1, and SQL counts agree with the arrays.

`check_store(store)` returns one row per problem found (an empty frame means healthy) and
one summary row per run; `attnstore check` prints them and exits 1 on any damage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import sqlalchemy as sa

from . import arrays, remote
from .errors import DamagedDataError, NotFoundError
from .schema import Token

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

    def add(self, problem: str, example=None, chunk=None) -> None:
        self.problems.append(dict(run=self.run, example=example, chunk=chunk, problem=problem))


def _check_blocks(report: RunReport, array, seqs: pd.DataFrame, n_layers: int, n_heads: int, step: float = 0.0) -> None:
    """`step`: the codec's largest change per value (lossy runs), which a row of L values may add up L times."""
    chunk = array.chunks[0]
    present = arrays.present_chunks(array)
    sizes = n_layers * n_heads * seqs["length"].to_numpy(np.int64) ** 2
    starts = seqs["offset"].to_numpy(np.int64)
    ends = starts + sizes
    examples = seqs["example"].to_numpy()
    order = np.argsort(starts, kind="stable")
    starts, ends, examples, sizes = starts[order], ends[order], examples[order], sizes[order]
    k: int
    j: int
    overlap = np.flatnonzero(starts[1:] < ends[:-1])
    for o in overlap:
        report.add(f"block overlaps the block of example {examples[o]}", example=int(examples[o + 1]))
    needed = sorted({i for s, e in zip(starts, ends) for i in range(s // chunk, (e - 1) // chunk + 1)})
    report.chunks = len(needed)
    bad: dict[int, str] = {i: "is missing" for i in needed if i not in present}
    if not report.checksums:
        for i in needed:
            if i not in bad:
                why = arrays.legacy_chunk_problem(array, i)
                if why:
                    bad[i] = why
    # Decode slab by slab; a slab that fails is retried chunk by chunk to name the bad ones.
    reported: set[int] = set()
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
            except Exception:
                for i in slab:
                    try:
                        array[i * chunk : (i + 1) * chunk]
                    except Exception as exc:
                        if remote.failed(array, exc):
                            raise  # the object store failed (network, credentials): not damage
                        bad[i] = f"is damaged ({str(exc).splitlines()[0][:100]})"
        for m in range(k, j):
            hit = [i for i in range(int(starts[m]) // chunk, (int(ends[m]) - 1) // chunk + 1) if i in bad]
            if hit:
                reported.add(hit[0])
                report.add(
                    f"chunk {arrays.chunk_key(array, hit[0])} {bad[hit[0]]}",
                    example=int(examples[m]),
                    chunk=arrays.chunk_key(array, hit[0]),
                )
                continue
            if data is None:
                block = array[int(starts[m]) : int(ends[m])]
            else:
                block = data[int(starts[m]) - slab.start * chunk : int(ends[m]) - slab.start * chunk]
            length = int(round(np.sqrt(sizes[m] / (n_layers * n_heads))))
            maps = block.reshape(n_layers, n_heads, length, length).astype(np.float32)
            sums = maps.sum(-1)
            err = float(np.nanmax(np.abs(sums - 1))) if sums.size else 0.0
            if not np.isfinite(maps).all() or (maps < 0).any() or err > ROW_SUM_TOLERANCE + length * step:
                report.add(
                    f"maps are not attention distributions (max row-sum error {err:.3g}): wrong or overwritten data",
                    example=int(examples[m]),
                )
        report.examples += j - k
        k = j
    for i in sorted(set(bad) - reported):
        report.add(f"chunk {arrays.chunk_key(array, i)} {bad[i]}", chunk=arrays.chunk_key(array, i))


def check_run(store, run) -> RunReport:
    info = store.run_info(run)
    state, _ = store.run_state(info.id)
    with store.pinned(info.id):
        report = RunReport(run=info.name, state=state, checksums=(info.codec or {}).get("checksum") == "crc32c")
        seqs = store.examples(info.id, texts=False)
        stored = seqs[~seqs["skipped"]]
        if state == "complete":
            if len(stored) != info.n_stored or int(seqs["skipped"].sum()) != info.n_skipped:
                report.add(
                    f"runs row says {info.n_stored} stored / {info.n_skipped} skipped, sequences hold "
                    f"{len(stored)} / {int(seqs['skipped'].sum())}"
                )
        with store.engine.connect() as conn:
            counts = dict(
                conn.execute(sa.select(Token.example_id, sa.func.count()).where(Token.run_id == info.id).group_by(Token.example_id)).all()
            )
        for ex, ex_id, length in zip(stored["example"], stored["example_id"], stored["length"]):
            if counts.get(ex_id, 0) != length:
                report.add(f"{counts.get(ex_id, 0)} tokens in SQL for a block of length {length}", example=int(ex))
        if stored.empty:
            return report
        try:
            array = store._array(info)
        except NotFoundError:
            report.add(f"attention array {info.array_path} is missing under {store.locations.array_root}")
            return report
        _check_blocks(report, array, stored, info.n_layers, info.n_heads, arrays.quantize_step(info.codec))
        if arrays.group_path_of(info.array_path):
            _check_index(report, store, info, stored, complete=state == "complete")
    return report


def _check_index(report: RunReport, store, info, stored: pd.DataFrame, complete: bool) -> None:
    """Layout 2: the Zarr index arrays say what SQL says (a running run's index may run ahead of SQL)."""
    try:
        index = arrays.RunIndex(store.locations.array_root, info.array_path, 0, 0, read_only=True).read()
    except Exception as exc:  # missing or undecodable index arrays
        report.add(f"index arrays of {arrays.run_node_path(info.array_path)} cannot be read ({str(exc).splitlines()[0][:120]})")
        return
    seqs = stored.sort_values("offset")
    n = len(seqs)
    if not complete and arrays.index_pending(store.locations.array_root, info.array_path):
        return  # a distributed ingest writes the index when the run completes (ingest/distributed.py)
    if len(index["example"]) < n or (complete and len(index["example"]) != n):
        report.add(f"the Zarr index lists {len(index['example'])} examples, SQL {n}; run `attnstore db upgrade-arrays --rebuild-index`")
        return
    for name, column in (("example", "example"), ("offset", "offset"), ("length", "length")):
        differ = np.flatnonzero(index[name][:n] != seqs[column].to_numpy())
        if differ.size:
            i = int(differ[0])
            report.add(
                f"the Zarr index's {name} of entry {i} is {index[name][i]}, SQL says {seqs[column].iloc[i]}; "
                "run `attnstore db upgrade-arrays --rebuild-index`",
                example=int(seqs["example"].iloc[i]),
            )
            return
    entry = 0  # SQL's tokens are read a step of blocks at a time: memory is one step's rows, not the run's
    for blocks, token_ids in store.block_steps(info.id):
        starts, lengths = index["token_start"][entry : entry + len(blocks)], index["length"][entry : entry + len(blocks)]
        stored_ids = np.concatenate([index["token_id"][a : a + b] for a, b in zip(starts, lengths)])
        from_sql = np.concatenate(token_ids)
        if len(from_sql) != len(stored_ids) or (from_sql != stored_ids).any():
            report.add("the Zarr index's token ids differ from SQL's tokens; run `attnstore db upgrade-arrays --rebuild-index`")
            return
        entry += len(blocks)


def check_store(store, runs=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary per run, problems) for the given runs (default: all)."""
    names = list(runs) if runs else list(store.runs()["run"])
    reports = []
    for name in names:
        try:
            reports.append(check_run(store, name))
        except DamagedDataError as exc:  # pragma: no cover - check_run records damage itself
            r = RunReport(run=str(name), state="?")
            r.add(str(exc))
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
        ],
        columns=["run", "state", "examples", "chunks", "checksums", "problems"],
    )
    problems = pd.DataFrame([p for r in reports for p in r.problems], columns=["run", "example", "chunk", "problem"])
    return summary, problems
