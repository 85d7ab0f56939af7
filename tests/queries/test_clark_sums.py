"""queries/clark.py and its compiled reduce (queries/_clark.c): exact fields of hand-built maps, the numpy
computation it replaced, float16 and float32 maps alike, and the one-line errors of a missing or stale build."""

import math
import sys
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from attnstore.queries.clark import CLARK_FIELDS, example_sums
from attnstore.queries.engine import kernel, kernels


def numpy_sums(maps, cls, sep, punct):
    """The fields as numpy computed them before the compiled reduce (`example_sums` at 71855b4, 2026-11-28), each p log p in
    float32 as the float16 table holds it and every sum in float64."""
    m = maps.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(m > 0, m * np.log(np.where(m > 0, m, 1)), np.float32(0))
    h = -logs.astype(np.float64).sum(-1)
    received = m.sum(axis=2, dtype=np.float64)
    to_sep = m[..., sep].sum(-1, dtype=np.float64)
    out = {
        name: np.diagonal(m, offset=k, axis1=2, axis2=3).sum(-1, dtype=np.float64)
        for name, k in (("to_previous", -1), ("to_self", 0), ("to_next", 1))
    }
    for name, mask in (("cls", cls), ("sep", sep), ("punct", punct), ("other", ~(cls | sep | punct))):
        out[f"received_{name}"] = received[..., mask].sum(-1)
    out["sep_from_sep"], out["sep_from_other"] = to_sep[..., sep].sum(-1), to_sep[..., ~sep].sum(-1)
    out["entropy"], out["entropy_from_cls"] = h.sum(-1), h[..., cls].sum(-1)
    return out


def random_maps(rng, shape, dtype):
    a = rng.random(shape) ** 4  # peaked rows, as attention is
    a[..., 0, :] = 0  # a row of zeros (0 log 0 = 0)
    return (a / np.maximum(a.sum(-1, keepdims=True), 1e-12)).astype(dtype)


def masks(length):
    cls, sep, punct = (np.zeros(length, bool) for _ in range(3))
    cls[0] = True
    sep[[length // 2, length - 1]] = True
    punct[1::3] = True  # a key may be punctuation and a separator at once; "other" is neither of the three
    return cls, sep, punct


def test_hand_built_map_gives_each_field_exactly():
    maps = np.array([[[[1, 0, 0], [0.5, 0.25, 0.25], [0, 0.5, 0.5]]]], np.float16)  # query 0 is [CLS], key 2 [SEP]
    cls, sep, punct = np.array([1, 0, 0], bool), np.array([0, 0, 1], bool), np.array([0, 1, 0], bool)
    got = {name: float(v[0, 0]) for name, v in example_sums(maps, cls, sep, punct).items()}
    exact = dict(to_previous=1.0, to_self=1.75, to_next=0.25, received_cls=1.5, received_sep=0.75, received_punct=0.75)
    exact |= dict(received_other=0.0, sep_from_sep=0.5, sep_from_other=0.25, entropy_from_cls=0.0)
    assert {name: got[name] for name in exact} == exact
    assert got["entropy"] == pytest.approx(2.5 * math.log(2), rel=1e-7)  # rows: 0, 1.5 ln 2, ln 2 (float32 p log p)
    assert list(got) == list(CLARK_FIELDS)


@pytest.mark.parametrize("length", [1, 2, 3, 4, 5, 9, 37])  # under, at and past the 4-cell unrolled loop
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_fields_equal_numpys_computation(length, dtype):
    rng = np.random.default_rng(length)
    maps = random_maps(rng, (3, 4, length, length), dtype)
    cls, sep, punct = masks(length)
    got, want = example_sums(maps, cls, sep, punct), numpy_sums(maps, cls, sep, punct)
    for name in CLARK_FIELDS:
        assert got[name].shape == (3, 4) and got[name].dtype == np.float64
        np.testing.assert_allclose(got[name], want[name], rtol=1e-13, atol=1e-15, err_msg=name)  # order of the sums


def test_float16_maps_give_the_fields_of_their_float32_cast_bit_for_bit():
    maps = random_maps(np.random.default_rng(1), (2, 3, 23, 23), np.float16)
    flags = masks(23)
    from16, from32 = example_sums(maps, *flags), example_sums(maps.astype(np.float32), *flags)
    for name in CLARK_FIELDS:
        np.testing.assert_array_equal(from16[name], from32[name], err_msg=name)


def test_strided_and_float64_maps_give_the_fields_of_a_contiguous_copy():
    maps = random_maps(np.random.default_rng(2), (4, 3, 11, 11), np.float16)
    flags = masks(11)
    view = maps.transpose(1, 0, 2, 3)  # (head, layer, ...): not C-contiguous
    want = example_sums(np.ascontiguousarray(view), *flags)
    for got in (example_sums(view, *flags), example_sums(view.astype(np.float64), *flags)):
        for name in CLARK_FIELDS:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_no_separator_and_only_separators():
    maps = random_maps(np.random.default_rng(3), (1, 2, 6, 6), np.float16)
    none, every = np.zeros(6, bool), np.ones(6, bool)
    got = example_sums(maps, none, none, none)
    assert not got["sep_from_sep"].any() and not got["sep_from_other"].any() and not got["entropy_from_cls"].any()
    np.testing.assert_allclose(got["received_other"], maps.astype(np.float64).sum((-2, -1)), rtol=1e-12)
    got = example_sums(maps, none, every, none)
    assert not got["sep_from_other"].any() and not got["received_other"].any()
    np.testing.assert_allclose(got["sep_from_sep"], got["received_sep"], rtol=1e-12)


def test_threads_give_the_same_fields_as_one():
    rng = np.random.default_rng(4)
    examples = [random_maps(rng, (6, 12, n, n), np.float16) for n in (30, 61, 90, 17)] * 4
    alone = [example_sums(m, *masks(m.shape[-1])) for m in examples]
    with ThreadPoolExecutor(2) as pool:
        threaded = list(pool.map(lambda m: example_sums(m, *masks(m.shape[-1])), examples))
    for a, b in zip(alone, threaded, strict=True):
        for name in CLARK_FIELDS:
            np.testing.assert_array_equal(a[name], b[name])


def test_the_kernel_refuses_buffers_of_the_wrong_size():
    sums = kernel("_clark").sums
    codes = np.zeros((2, 3, 3), np.uint16)
    out = np.empty((len(CLARK_FIELDS), 2))
    with pytest.raises(ValueError, match="maps holds 36 bytes, not 54"):
        sums(codes, 3, 3, np.zeros(3, np.uint8), np.zeros((65536, 2), np.float32), out.reshape(-1)[:33], True)
    with pytest.raises(ValueError, match="negative n_maps or length"):
        sums(codes, -1, 3, np.zeros(3, np.uint8), np.zeros((65536, 2), np.float32), out, True)
    with pytest.raises(ValueError, match="out holds"):
        sums(codes, 2, 3, np.zeros(3, np.uint8), np.zeros((65536, 2), np.float32), out[:1], True)


@pytest.mark.parametrize("name", ["_clark", "_patterns", "_words"])
def test_a_missing_build_fails_in_one_line_naming_the_fix(monkeypatch, name):
    kernel.cache_clear()
    monkeypatch.setitem(sys.modules, "attnstore.queries._kernels", None)  # as if never built: its import fails
    try:
        with pytest.raises(
            ImportError,
            match=rf"^attnstore's compiled reduce queries/{name}.c is not built: rebuild attnstore: pip install -e \. \(needs a C compiler",
        ):
            kernel(name)
    finally:
        kernel.cache_clear()


def test_a_stale_build_fails_in_one_line_naming_the_fix(monkeypatch):
    kernel.cache_clear()
    monkeypatch.setitem(kernels.VERSIONS, "_clark", 99)
    try:
        with pytest.raises(
            ImportError, match=r"^attnstore's compiled reduce queries/_clark.c is a stale build \(version 1, want 99\): rebuild attnstore"
        ):
            example_sums(np.ones((1, 1, 1, 1), np.float16), *(np.zeros(1, bool),) * 3)
    finally:
        kernel.cache_clear()


def test_a_build_without_a_part_is_a_stale_build(monkeypatch):
    """A build of attnstore.queries._kernels from before a C file became its part (no attribute of the file's name)."""
    kernel.cache_clear()
    monkeypatch.setitem(sys.modules, "attnstore.queries._kernels", types.ModuleType("attnstore.queries._kernels"))
    try:
        with pytest.raises(ImportError, match=r"^attnstore's compiled reduce queries/_words.c is a stale build \(version None, want 1\)"):
            kernel("_words")
    finally:
        kernel.cache_clear()


def test_every_compiled_reduce_is_a_part_of_one_module():
    import attnstore.queries._kernels as built

    assert {name for name in vars(built) if not name.startswith("__")} == set(kernels.VERSIONS)
    assert all(kernel(name) is getattr(built, name) for name in kernels.VERSIONS)


def test_the_cli_says_a_missing_build_in_one_line(store, make_run, monkeypatch):
    from click.testing import CliRunner

    from attnstore.api.cli import main

    maps = np.full((1, 2, 3, 3), 1 / 3, np.float16)
    run = make_run(store, [maps], [["[CLS]", "a", "[SEP]"]], name="unbuilt")
    kernel.cache_clear()
    monkeypatch.setitem(sys.modules, "attnstore.queries._kernels", None)
    try:
        args = ["query", "entropy", "--run", run, "--db", store.locations.db_url, "--root", str(store.locations.array_root)]
        result = CliRunner().invoke(main, args)
    finally:
        kernel.cache_clear()
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0] == "Error: attnstore's compiled reduce queries/_clark.c is not built: " + kernels.REBUILD
