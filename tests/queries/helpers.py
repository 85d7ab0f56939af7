"""Helpers shared by the query tests: random maps, frame comparison with a query's naive reference (tests/queries/
reference.py), a read-only view of a store, summaries kept with a run (queries/engine/) made stale.

Imported as `attnstore.tests.queries.helpers` (the tests run with --import-mode=importlib)."""

import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import numpy as np
import pandas as pd
import pytest
import zarr

from attnstore.queries import run_query
from attnstore.store import open_store
from attnstore.tests.queries import reference


def random_maps(n_tokens: int, seed: int, n_layers: int, n_heads: int) -> np.ndarray:
    """Random float16 maps (layer, head, L, L), rows summing to 1, no entry 0."""
    rng = np.random.default_rng(seed)
    raw = rng.random((n_layers, n_heads, n_tokens, n_tokens), dtype=np.float32) ** 3 + 1e-3
    return (raw / raw.sum(-1, keepdims=True)).astype(np.float16)


def sparse_random_maps(rng: np.random.Generator, size: int, *, unattended_keys: bool = False) -> np.ndarray:
    """Random float16 maps (2 layers, 3 heads, size, size) whose first token is [CLS], with word-level corner cases:
    4 rows with everything on [CLS] (no other token gets attention), 4 rows of ties, and with `unattended_keys` 4 keys
    (columns) nobody attends to."""
    raw = rng.random((2, 3, size, size), dtype=np.float32) ** 3
    raw[..., 0] += 1e-3
    for layer, head, row in zip(*(rng.integers(k, size=4) for k in (2, 3, size))):
        raw[layer, head, row, 1:] = 0  # everything on [CLS]
    for layer, head, row in zip(*(rng.integers(k, size=4) for k in (2, 3, size))):
        raw[layer, head, row, 2:] = raw[layer, head, row, 1]  # ties
    if unattended_keys:
        for layer, head, column in zip(*(rng.integers(k, size=4) for k in (2, 3, size))):
            raw[layer, head, :, max(column, 1)] = 0  # a key nobody attends to
    return (raw / raw.sum(-1, keepdims=True)).astype(np.float16)


def assert_same_frames(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Same columns and rows; text columns equal, numeric ones within 1e-12 relative (NaN where NaN)."""
    assert_same_frames_within(a, b, 1e-12)


def assert_same_frames_within(a: pd.DataFrame, b: pd.DataFrame, rtol: float) -> None:
    """`assert_same_frames` within `rtol` relative (and rtol / 10 absolute) for frames computed from float32 maps made
    two ways (weights="norm": the framework's vectorised weighting against the reference's loops)."""
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for column in a.columns:
        if not pd.api.types.is_numeric_dtype(a[column]):
            assert a[column].tolist() == b[column].tolist()
        else:
            atol = 0 if rtol <= 1e-12 else rtol / 10
            np.testing.assert_allclose(a[column].to_numpy(float), b[column].to_numpy(float), rtol=rtol, atol=atol, equal_nan=True)


def forbid_map_reads(monkeypatch, store, *methods: str) -> None:
    """Fail the test if `store`'s maps are read (or any of its other `methods` is called)."""
    for method in ("iter_attention", *methods):
        monkeypatch.setattr(type(store), method, lambda *a, _name=method, **k: pytest.fail(f"{_name} was called"))


@contextmanager
def read_only_store(store) -> Iterator:
    """The same store (database and array root) opened read-only."""
    reader = open_store(db=store.locations.db_url, root=store.locations.array_root, read_only=True)
    try:
        yield reader
    finally:
        reader.close()


def summary_group(store, run: str, kind: str, mode: str = "r") -> zarr.Group:
    """The Zarr group of the run's kept summary `kind`."""
    return zarr.open_group(store.locations.array_root, path=f"runs/{run}/summary/{kind}", mode=mode)


def has_summaries(store, run: str) -> bool:
    """Whether any summary is kept with the run."""
    return bool(zarr.open_group(store.locations.array_root, path=f"runs/{run}", mode="r").get("summary"))


def check_rebuilt_once_grown(store, run: str, kind: str, compare: Callable[[], object], zero: Iterable[str] = ()) -> None:
    """Make the run's kept summary `kind` look built before its last example was stored (its stamp one example short;
    the fields `zero` zeroed, so that stale values would show), call `compare()` (which queries the run and checks
    the result), and check that the summary was built again over every example."""
    group = summary_group(store, run, kind, "r+")
    stamp = dict(group.attrs["stamp"])
    for field in zero:
        group[field][...] = 0
    group.attrs["stamp"] = {**stamp, "n_examples": stamp["n_examples"] - 1}
    compare()
    assert summary_group(store, run, kind).attrs["stamp"] == stamp


def check_kept_frames(monkeypatch, store, run: str, cases: list[tuple[str, dict]], frames: list[pd.DataFrame]):
    """Each case's (query name, parameters) frame is its naive reference's (tests/queries/reference.py); and it is
    computed again from what was kept, without reading a map (the maps stay forbidden for the rest of the test)."""
    for (name, params), frame in zip(cases, frames):
        assert_same_frames(frame, reference.query(store, name, run=run, **params))
    forbid_map_reads(monkeypatch, store)
    for (name, params), frame in zip(cases, frames):
        assert_same_frames(run_query(store, name, run=run, **params), frame)


def check_read_only_and_grown_rebuilt(store, run: str, query: str, kind: str, zero=()):
    """`query` on a read-only view of the store gives its naive reference's frame and keeps nothing; on the store it
    keeps summary `kind`, which is built again once the run has grown (`check_rebuilt_once_grown`)."""
    expected = reference.query(store, query, run=run)
    with read_only_store(store) as reader:
        assert_same_frames(run_query(reader, query, run=run), expected)
    assert not has_summaries(store, run)  # nothing kept
    run_query(store, query, run=run)
    check_rebuilt_once_grown(store, run, kind, lambda: assert_same_frames(run_query(store, query, run=run), expected), zero=zero)


def hand_run(
    store,
    name: str,
    *,
    dataset_id: int,
    n_layers: int,
    n_heads: int,
    dtype: str,
    specials: dict,
    chunk_cells: int = 64,
    codec=None,
    value_norms: bool = False,
    manifest: dict | None = None,
):
    """A hand-made model's run over `dataset_id`, started as ingest starts one (chunks of 64 cells by default); returns its
    RunInfo. Also what conftest's `make_run` starts its runs with. `manifest`: entries of the run's manifest (a Q/K
    run's `qk`)."""
    model_id = store.writer.find_or_create_model(
        name=f"hand-{name}",
        source="tests",
        weights_sha256=uuid.uuid4().hex,
        architecture="Hand",
        n_layers=n_layers,
        n_heads=n_heads,
        max_length=512,
        tokenizer="none",
        special_tokens=specials,
    )
    return store.writer.start_run(
        name=name,
        model_id=model_id,
        dataset_id=dataset_id,
        dtype=dtype,
        codec=codec or {"name": "blosc", "cname": "zstd", "clevel": 1, "shuffle": "shuffle", "blocksize": 0},
        chunk_cells=chunk_cells,
        max_length=512,
        truncation="truncate",
        attn_implementation="eager",
        batch_size=1,
        code_version="test",
        corpus_checksum="x",
        manifest={**({"value_norms": True} if value_norms else {}), **(manifest or {})},
    )


def write_saliency(store, run: str, values: list, meta: dict | None = None) -> None:
    """Give a hand-made run a saliency, as `attnstore saliency` stores it: per example its tokens' values, in storage
    order, in the run group's `saliency` array, and the group attribute saying it is complete."""
    from attnstore.store import arrays

    info = store.run_info(run)
    root = store.locations.array_root
    arrays.create_token_array(root, info.array_path, arrays.SALIENCY, (), "float32", arrays.SALIENCY_CHUNK_TOKENS, {})
    arrays.TokenArray(root, info.array_path, arrays.SALIENCY, read_only=False).write(0, np.concatenate(values).astype(np.float32))
    tokens = sum(len(v) for v in values)
    described = dict(model=info.model, method="grad_x_input", target="test", n_tokens=tokens, n_examples=len(values), complete=True)
    arrays.set_run_group_attribute(root, info.array_path, arrays.SALIENCY, {**described, **(meta or {})})


def write_blocks(store, run_id: int, blocks: Iterable[tuple[int, np.ndarray, list[dict]]]) -> None:
    """Store (example id, maps, token rows) in the given order, one commit each, and complete the run."""
    writer = store.writer.run_writer(run_id)
    for example_id, maps, rows in blocks:
        writer.add(int(example_id), maps, rows)
        writer.commit()
    writer.finish(0.0)


def frame_dataset(store, name: str, sentences: Iterable[tuple[list[str], list[dict]]]) -> int:
    """A FrameNet-style dataset of (words, frames) sentences; returns its id."""
    from attnstore.store.records import ExampleInput

    dataset_id, _ = store.writer.find_or_create_dataset(
        name=f"hand-{name}", split="exemplars", checksum=uuid.uuid4().hex, format="framenet", source="tests", annotator="whitespace"
    )
    store.writer.add_examples(
        dataset_id,
        [
            ExampleInput(
                position=position,
                text_a=" ".join(words),
                words=tuple(dict(position=i, segment=0, form=w) for i, w in enumerate(words)),
                frames=tuple(frames),
            )
            for position, (words, frames) in enumerate(sentences)
        ],
        "whitespace",
    )
    store.writer.complete_dataset(dataset_id)
    return dataset_id


def positions_to_ids(store, dataset_id: int) -> dict[int, int]:
    """Example position -> example id in a dataset."""
    return dict(store.sql("SELECT position, id FROM examples WHERE dataset_id = :d", {"d": dataset_id}).values.tolist())


def token_rows(tokens: list[str], token_words: list, specials: dict) -> list[dict]:
    """Token rows for hand-made maps: special tokens get their ids from `specials`, others 1000 + position."""
    ids = {v["token"]: v["id"] for v in specials.values()}
    return [
        dict(token=t, token_id=ids.get(t, 1000 + k), word_position=w, segment=0, is_special=w is None, char_start=None, char_end=None)
        for k, (t, w) in enumerate(zip(tokens, token_words))
    ]


# A repeated-token run (ingest/generated.py's layout): a first token, then T ids, then the same T ids; 1 layer x 3 heads
# with a known stripe each: head 0 induction (row i of the second copy on i - T + 1), head 1 duplicate (on i - T),
# head 2 previous token (on i - 1). Every other row on token 0. The last example is not a repetition (its copies differ).
REPEATED_IDS = [[7, 21, 22, 23, 21, 22, 23], [7, 31, 32, 33, 31, 32, 33], [7, 41, 42, 41, 42], [7, 51, 52, 53, 54]]
REPEATED_LENGTHS = [3, 2]


def mark_causal(store, run: str) -> None:
    """Mark a hand-made run's model causal (a decoder's), as ingest records a probed model."""
    import sqlalchemy as sa

    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE models SET causal = :c WHERE id = :i"), {"c": True, "i": store.run_info(run).model_id})


def repeated_maps(ids: list[int], t: int | None) -> np.ndarray:
    n = len(ids)
    maps = np.zeros((1, 3, n, n), dtype=np.float32)
    maps[..., 0] = 1.0  # every row on the first token...
    for i in range(1, n):
        maps[0, 2, i] = 0
        maps[0, 2, i, i - 1] = 1.0  # ...except head 2's: always the previous token
    if t:
        for i in range(n - t, n):  # the second copy's rows
            for head, key in ((0, i - t + 1), (1, i - t)):
                maps[0, head, i] = 0
                maps[0, head, i, key] = 1.0
    return maps


def repeated_run(store, make_run, name: str = "repeated", row_stats: bool = False) -> str:
    """A causal run over a `repeated_tokens` dataset of REPEATED_IDS (lengths 3, 3, 2; the last one none); `row_stats`:
    keeping the maps' per-row statistics, as a causal LM's ingest does."""
    lengths = [3, 3, 2, None]
    maps = [repeated_maps(ids, t) for ids, t in zip(REPEATED_IDS, lengths, strict=True)]
    tokens = [[f"w{i}" for i in ids] for ids in REPEATED_IDS]
    run = make_run(
        store,
        maps,
        tokens,
        name=name,
        specials={},
        token_ids=REPEATED_IDS,
        norms_list=[np.linspace(0.5, 1.5, 3 * len(ids), dtype=np.float32).reshape(1, 3, len(ids)) for ids in REPEATED_IDS],
        dataset_format="repeated_tokens",
        dataset_options={"lengths": REPEATED_LENGTHS, "seed": 0},
        row_stats=row_stats,
    )
    mark_causal(store, run)
    return run


# A needle-in-a-haystack run with its generation (ingest/generation.py's layout): 1 layer x 3 heads; prompt ids with the
# needle [51, 52, 53, 54] at positions 3..6, then the generated tokens (segment 1). Head 0 copies: each generating row
# (the token before each generated one) puts its top attention on the needle position holding the token it writes;
# head 1 on the first token; head 2 on the needle but one position off (no copy).
NEEDLE_IDS = [51, 52, 53, 54]
NEEDLE_WORDS = {51: "Ġsandwich", 52: "Ġin", 53: "ĠDolores", 54: "ĠPark", 60: "Ġnothing", 61: "Ġhere"}
NEEDLE_PROMPTS = [[7, 8, 9, 51, 52, 53, 54, 10, 11], [7, 51, 52, 53, 54, 9, 10], [7, 8, 51, 52, 53, 54, 9]]
# the first answer recalls the whole needle, the second none of it, the third 3 of its 4 words (recall 0.75 > 0.5)
NEEDLE_ANSWERS = [[51, 52, 53, 54], [60, 61], [51, 53, 54]]


def needle_maps(prompt: list[int], answer: list[int]) -> np.ndarray:
    ids = prompt + answer
    n, start = len(ids), len(prompt)
    first = prompt.index(NEEDLE_IDS[0])
    maps = np.zeros((1, 3, n, n), dtype=np.float32)
    maps[..., 0] = 1.0
    for step, token in enumerate(answer):
        row = start - 1 + step
        if token in NEEDLE_IDS:
            key = first + NEEDLE_IDS.index(token)
            maps[0, 0, row] = 0
            maps[0, 0, row, key], maps[0, 0, row, 0] = 0.6, 0.4
            maps[0, 2, row] = 0
            maps[0, 2, row, key - 1], maps[0, 2, row, 0] = 0.6, 0.4
    return maps


def needle_run(store, make_run, name: str = "needle", row_stats: bool = False) -> str:
    """A causal run over a `needle` dataset (needle "sandwich in Dolores Park"), each example prompt + generation;
    `row_stats`: keeping the maps' per-row statistics, as a causal LM's ingest does."""
    maps = [needle_maps(p, a) for p, a in zip(NEEDLE_PROMPTS, NEEDLE_ANSWERS, strict=True)]
    ids = [p + a for p, a in zip(NEEDLE_PROMPTS, NEEDLE_ANSWERS, strict=True)]
    tokens = [[NEEDLE_WORDS.get(i, f"w{i}") for i in e] for e in ids]
    segments = [[0] * len(p) + [1] * len(a) for p, a in zip(NEEDLE_PROMPTS, NEEDLE_ANSWERS, strict=True)]
    run = make_run(
        store,
        maps,
        tokens,
        name=name,
        specials={},
        token_ids=ids,
        token_segments=segments,
        dataset_format="needle",
        dataset_options={"needle": "sandwich in Dolores Park", "needle_ids": NEEDLE_IDS},
        row_stats=row_stats,
    )
    mark_causal(store, run)
    return run
