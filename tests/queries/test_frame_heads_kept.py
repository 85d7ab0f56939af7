"""K2 `frame_heads` from the LU <-> frame element maxima kept with the run (`lu_fe_max`, queries/engine/):
the naive reference's values and filter counts for every filter setting, subset and `core`; no map read once kept;
rebuilt when stale; read-only stores compute for the call alone and keep nothing.

Random FrameNet-style runs: several annotation sets per example (some without an LU, some with no overt frame
element), frame elements of every core type inside and outside the core sets, non-overt ones, words split into
pieces and words left without a token; float16 maps. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import zarr

from attnstore.queries import run_query
from attnstore.queries.engine import concatenate, summarise_examples, summary
from attnstore.queries.frame_heads import FRAMES_SQL, LU_FE_MAX
from attnstore.store import open_store
from attnstore.store.errors import InvalidArgumentError
from attnstore.tests.queries import reference
from attnstore.tests.queries.helpers import frame_dataset, hand_run, positions_to_ids, token_rows, write_blocks
from attnstore.tests.snapshots import store_with

# The analysis, not the database: SQLite only (kept summaries are Zarr; each query's SQL meets PostgreSQL in test_conformance.py).
pytestmark = pytest.mark.one_backend

SPECIALS = {"cls": {"token": "[CLS]", "id": 101}, "sep": {"token": "[SEP]", "id": 102}}
CORE_TYPES = ("Core", "Peripheral", "Extra-Thematic", "Core-Unexpressed", "")
N_EXAMPLES = 12
PATH = "runs/{}/summary/lu_fe_max"


def random_example(seed: int):
    """(words, frames, tokens, token_words, maps (2, 3, L, L) float16) of one random FrameNet-style example."""
    rng = np.random.default_rng(seed)
    n = 14 if seed in (2, 9) else int(rng.integers(3, 11))  # two sentences over max_words=12
    words = [f"w{i}" for i in range(n)]

    def span(longest: int) -> tuple[int, int]:
        start = int(rng.integers(0, n))
        return start, min(n, start + int(rng.integers(1, longest + 1)))

    def fe_span() -> tuple[int | None, int | None]:
        if rng.random() < 0.1:
            return None, None  # not overt (null instantiation)
        return span(4 if rng.random() < 0.2 else 2)

    frames = []
    for k in range(int(rng.integers(0 if seed == 4 else 1, 5))):  # example 4 may have no frame at all
        lu = (None, None) if rng.random() < 0.12 else span(2)
        elements = []
        for j in range(int(rng.integers(0, 4))):
            start, end = fe_span()
            elements.append(
                dict(
                    name=f"FE{j}",
                    core_type=str(rng.choice(CORE_TYPES, p=(0.6, 0.1, 0.1, 0.1, 0.1))),
                    in_core_set=bool(rng.random() < 0.5),
                    word_start=start,
                    word_end=end,
                    char_start=0,
                    char_end=1,
                )
            )
        frames.append(
            dict(
                annoset_id=seed * 10 + k,
                frame_id=k,
                frame=f"F{k}",
                lu_id=k,
                lu="x.v",
                target_start=lu[0],
                target_end=lu[1],
                char_start=0,
                char_end=1,
                elements=elements,
            )
        )
    covered = n - int(rng.integers(0, 3)) if seed % 3 == 0 else n  # the last words without a token (truncated)
    tokens, token_words = ["[CLS]"], [None]
    for i in range(covered):
        pieces = int(rng.integers(1, 3))
        tokens += [words[i], *["##p"] * (pieces - 1)]
        token_words += [i] * pieces
    tokens.append("[SEP]")
    token_words.append(None)
    size = len(tokens)
    raw = rng.random((2, 3, size, size), dtype=np.float32) ** 3 + 1e-4
    maps = (raw / raw.sum(-1, keepdims=True)).astype(np.float16)
    if seed % 2:  # L0H0 all on [CLS]: every LU <-> FE weight is 0, a maximum that still counts
        maps[0, 0] = 0
        maps[0, 0, :, 0] = 1
    return words, frames, tokens, token_words, maps


def build_run(store, name: str, examples: list) -> str:
    dataset_id = frame_dataset(store, name, [(words, frames) for words, frames, _, _, _ in examples])
    run = hand_run(store, name, dataset_id=dataset_id, n_layers=2, n_heads=3, dtype="float16", specials=SPECIALS)
    ids = positions_to_ids(store, dataset_id)
    order = (*range(1, len(examples)), 0)  # storage order differs from example order
    write_blocks(store, run.id, [(ids[p], examples[p][4], token_rows(examples[p][2], examples[p][3], SPECIALS)) for p in order])
    return name


@pytest.fixture
def frame_run(store):
    return "keptframes"


def build_frame_run(store, make_run):
    build_run(store, "keptframes", [random_example(seed) for seed in range(N_EXAMPLES)])


# For a test of `frame_run`: the store build_frame_run fills, built once per session on SQLite and copied (tests/snapshots.py).
store = store_with("frame_run", build_frame_run)


def naive(store, name, **params):
    """The naive reference's frame (tests/queries/reference.py), or its error's message."""
    return outcome(store, name, query=reference.query, **params)


class ReadOnce:
    """The store as the naive reference reads it over many filter settings: the run's data it reads whatever the
    setting (the FrameNet rows, the examples, word counts, token tables and maps) read from the store once and kept,
    since nothing writes them during the test; everything else (the query's own calls, run state, kept summaries) is
    the store's. Each of the 104 settings read them all again: 11 of the 17 s on PostgreSQL."""

    def __init__(self, store) -> None:
        self._store, self._kept = store, {}

    def __getattr__(self, name):
        return getattr(self._store, name)

    def _once(self, key, read):
        if key not in self._kept:
            self._kept[key] = read()
        return self._kept[key]

    def sql(self, query, params=None, **limits):
        if query != FRAMES_SQL or limits:
            return self._store.sql(query, params, **limits)
        return self._once(("sql", repr(params)), lambda: self._store.sql(query, params)).copy()

    def examples(self, run, texts=True):
        return self._once(("examples", run, texts), lambda: self._store.examples(run, texts)).copy()

    def word_counts(self, run):
        return dict(self._once(("word_counts", run), lambda: self._store.word_counts(run)))

    def token_table(self, run, examples=None):
        wanted = None if examples is None else tuple(int(e) for e in examples)
        return self._once(("token_table", run, wanted), lambda: self._store.token_table(run, wanted)).copy()

    def iter_attention(self, run, examples=None):
        wanted = None if examples is None else tuple(int(e) for e in examples)
        kept = self._once(("maps", run, wanted), lambda: [(e, maps.copy()) for e, maps in self._store.iter_attention(run, wanted)])
        return ((e, maps.copy()) for e, maps in kept)


def outcome(store, name, query=run_query, **params):
    """The frame, or the error's message (the query and its reference must refuse alike)."""
    try:
        return query(store, name, **params)
    except InvalidArgumentError as exc:
        return str(exc)


def assert_same(a, b):
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    assert a.attrs == b.attrs
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for column in a.columns:
        np.testing.assert_allclose(a[column].to_numpy(float), b[column].to_numpy(float), rtol=1e-12, atol=0)


FILTERS = [
    *(
        dict(examples=examples, max_words=12, max_fe_words=fe_words, min_distance=distance, core=core, distance_to=to, one_word_target=one)
        for examples in (None, [0, 3, 5, 6], [8, 7, 99])  # 99: not stored, left out by the query and its reference
        for fe_words in (1, 3)
        for distance in (0, 2, 4)
        for core in ("type", "set")
        for to, one in (("all", True), ("core", False))
    ),
    *(
        dict(max_words=words, max_fe_words=fe_words, min_distance=1, core=core, distance_to=to, one_word_target=one)
        for words in (8, 14)
        for fe_words in (2, 4)
        for core in ("type", "set")
        for to in ("all", "core")
        for one in (True, False)
    ),
]


# 3: the summary is kept and read in parts of 3 examples; every filter setting in one part, every fifth in parts (what
# parts change is how the kept rows are read back, the same for every setting: the suite's time, 104 settings x 2)
@pytest.mark.parametrize("range_size", [4096, 3])
def test_kept_maxima_give_the_naive_values_and_counts(store, frame_run, monkeypatch, range_size):
    monkeypatch.setattr("attnstore.queries.engine.kinds.SUMMARY_RANGE", range_size)
    settings = FILTERS if range_size == 4096 else FILTERS[::5]
    passed = 0
    read_once = ReadOnce(store)
    for filters in settings:
        params = dict(run=frame_run, **filters)
        result = outcome(store, "frame_heads", **params)
        assert_same(result, naive(read_once, "frame_heads", **params))
        passed += not isinstance(result, str)
    assert passed > len(settings) / 2  # most settings keep sentences; the rest raise the same error naming the same counts
    for params in (dict(), dict(min_distance=1, core="set"), dict(max_fe_words=2, examples=[1, 2, 3, 5, 6], percentile=90.0)):
        assert_same(
            outcome(store, "frame_heads_top", run=frame_run, **params),
            naive(store, "frame_heads_top", run=frame_run, **params),
        )
    group = zarr.open_group(store.locations.array_root, path=PATH.format(frame_run), mode="r")
    assert group.attrs["stamp"] == {"version": 1, "n_examples": N_EXAMPLES}


def test_the_kept_values_are_the_maxima_over_each_frame_elements_tokens(store, frame_run):
    info = store.run_info(frame_run)
    arrays = summary(store, info, LU_FE_MAX)
    assert arrays["example"].tolist() == [*range(1, N_EXAMPLES), 0]  # storage order
    for index, example in enumerate(arrays["example"]):
        words, frames, _, token_words, maps = random_example(int(example))
        assert arrays["n_words"][index] == len(words)
        lu = arrays["lu"][arrays["lu_start"][index] : arrays["lu_start"][index + 1]]
        fe = arrays["fe"][arrays["fe_start"][index] : arrays["fe_start"][index + 1]]
        fe_max = arrays["fe_max"][arrays["fe_start"][index] : arrays["fe_start"][index + 1]]
        overt = [(k, e) for k, f in enumerate(frames) for e in f["elements"] if e["word_start"] is not None]
        assert len(lu) == len(frames) and len(fe) == len(overt)
        tok = np.array([-1 if w is None else w for w in token_words])
        for (k, element), row, value in zip(overt, fe, fe_max):
            start, end = frames[k]["target_start"], frames[k]["target_end"]
            assert row.tolist() == [k, element["word_start"], element["word_end"], element["core_type"] == "Core", element["in_core_set"]]
            lu_tok = np.flatnonzero((tok >= start) & (tok < end)) if start is not None else []
            fe_tok = np.flatnonzero((tok >= element["word_start"]) & (tok < element["word_end"]))
            if not len(lu_tok) or not len(fe_tok):
                assert (value == -1).all()
                continue
            expected = np.full((2, 3), -np.inf)
            for i in lu_tok:
                for j in fe_tok:
                    expected = np.maximum(expected, np.maximum(maps[:, :, i, j], maps[:, :, j, i]))
            np.testing.assert_array_equal(value, expected.astype(np.float32))
    assert (arrays["fe_max"] == -1).all(axis=(1, 2)).any() and (arrays["fe_max"] >= 0).all(axis=(1, 2)).any()
    assert (arrays["lu"][:, 0] == -1).any()  # an annotation set without an LU


def test_kept_maxima_are_read_without_decoding_maps_and_rebuilt_when_stale(store, frame_run, monkeypatch):
    first = run_query(store, "frame_heads", run=frame_run, min_distance=1)
    with monkeypatch.context() as m:
        m.setattr(type(store), "iter_attention", lambda *a, **k: pytest.fail("the maps were read"))
        pd.testing.assert_frame_equal(run_query(store, "frame_heads", run=frame_run, min_distance=1), first, check_exact=True)
        run_query(store, "frame_heads_top", run=frame_run, min_distance=1, core="set", examples=[1, 2, 3, 5, 6])
    group = zarr.open_group(store.locations.array_root, path=PATH.format(frame_run), mode="r+")
    group["fe_max"][...] = 0  # as if kept before the last example was stored: not used, built again
    group.attrs["stamp"] = {"version": 1, "n_examples": N_EXAMPLES - 1}
    again = run_query(store, "frame_heads", run=frame_run, min_distance=1)
    pd.testing.assert_frame_equal(again, first, check_exact=True)
    assert_same(again, naive(store, "frame_heads", run=frame_run, min_distance=1))
    assert zarr.open_group(store.locations.array_root, path=PATH.format(frame_run), mode="r").attrs["stamp"]["n_examples"] == N_EXAMPLES


def test_read_only_stores_compute_alone_and_keep_nothing(store, frame_run, monkeypatch):
    reader = open_store(db=store.locations.db_url, root=store.locations.array_root, read_only=True)
    try:
        result = run_query(reader, "frame_heads", run=frame_run, min_distance=1, core="set")
    finally:
        reader.close()
    assert not zarr.open_group(store.locations.array_root, path=f"runs/{frame_run}", mode="r").get("summary")
    assert_same(result, run_query(store, "frame_heads", run=frame_run, min_distance=1, core="set"))


def test_a_run_without_frames_is_refused_before_any_pass(store, make_run):
    maps = np.full((1, 2, 3, 3), 1 / 3, dtype=np.float32)
    run = make_run(store, [maps], [["[CLS]", "x", "[SEP]"]], name="noframes")
    with pytest.raises(InvalidArgumentError, match="has no FrameNet frames"):
        run_query(store, "frame_heads", run=run)
    assert not zarr.open_group(store.locations.array_root, path=f"runs/{run}", mode="r").get("summary")


def test_ranges_summarised_apart_concatenate_to_the_one_pass(store, frame_run):
    """What a Dask scheduler does (queries/engine/passes.py): contiguous ranges in storage order, each prepared alone."""
    info = store.run_info(frame_run)
    order = store.examples(info.id).sort_values("offset")["example"].tolist()
    whole = summarise_examples(store, info, LU_FE_MAX)
    parts = concatenate(LU_FE_MAX, [summarise_examples(store, info, LU_FE_MAX, part) for part in (order[:5], order[5:9], order[9:])])
    assert sorted(parts) == sorted(whole)
    for field, values in whole.items():
        np.testing.assert_array_equal(parts[field], values, err_msg=field)


def test_word_counts_are_the_word_tables_counts(store, frame_run):
    """The filters' word counts come from one SQL count, not the whole word table."""
    counts = store.word_counts(frame_run)
    assert counts and counts == {int(k): int(v) for k, v in store.word_table(frame_run).groupby("example").size().items()}
