import math

import numpy as np
import pytest

from attnstore.queries import run_query
from attnstore.queries.clark import row_entropy
from attnstore.queries.errors import InvalidArgumentError


def test_row_entropy_handles_zeros():
    rows = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]], dtype=np.float32)
    np.testing.assert_allclose(row_entropy(rows), [0.0, math.log(2), math.log(3)], atol=1e-6)


def test_row_entropy_equals_the_masked_log_bit_for_bit_and_keeps_float16_subnormals():
    """The fast form (zeros raised to the smallest normal float before the log) against the masked log it replaced, on
    float16 maps cast to float32 as the Clark summary does; float16 input is cast first, so its subnormals count."""
    rng = np.random.default_rng(0)
    maps = (rng.random((2, 3, 40, 40)) ** 8).astype(np.float16)
    maps[..., :5] = 0
    maps = maps.astype(np.float32)
    masked = -(maps * np.log(maps, out=np.zeros_like(maps), where=maps > 0)).sum(-1)
    np.testing.assert_array_equal(row_entropy(maps), masked)
    out = np.empty_like(maps)
    np.testing.assert_array_equal(row_entropy(maps, out), masked)
    tiny = np.array([[6e-8, 1.0]], dtype=np.float16)  # a float16 subnormal beside 1
    p = float(tiny[0, 0])
    np.testing.assert_allclose(row_entropy(tiny), [-p * math.log(p)], rtol=1e-6)


def test_entropy_per_example_exact_values(store, hand_run):
    """Default (Clark et al.'s code): each example's mean entropy, then the mean over examples (L=5 and L=3)."""
    df = run_query(store, "entropy", run=hand_run).sort_values(["layer", "head"])
    uniform = (math.log(5) + math.log(3)) / 2
    # one-hot heads have zero entropy; the uniform head (L1H0) has the uniform entropy
    np.testing.assert_allclose(df["entropy"], [0.0, 0.0, uniform, 0.0], atol=1e-6)
    np.testing.assert_allclose(df["entropy_from_cls"], [0.0, 0.0, uniform, 0.0], atol=1e-6)
    np.testing.assert_allclose(df["uniform_entropy"], uniform, atol=1e-9)
    np.testing.assert_allclose(df["uniform_entropy_from_cls"], uniform, atol=1e-9)


def test_entropy_pooled_exact_values(store, hand_run):
    df = run_query(store, "entropy", run=hand_run, average="token").sort_values(["layer", "head"])
    uniform = (5 * math.log(5) + 3 * math.log(3)) / 8
    uniform_cls = (math.log(5) + math.log(3)) / 2
    np.testing.assert_allclose(df["entropy"], [0.0, 0.0, uniform, 0.0], atol=1e-6)
    np.testing.assert_allclose(df["entropy_from_cls"], [0.0, 0.0, uniform_cls, 0.0], atol=1e-6)
    np.testing.assert_allclose(df["uniform_entropy"], uniform, atol=1e-9)
    np.testing.assert_allclose(df["uniform_entropy_from_cls"], uniform_cls, atol=1e-9)


def test_per_example_and_pooled_differ_when_entropy_varies_within_an_example(store, make_run):
    """Example 0 (L=2): rows of entropy ln 2 and 0; example 1 (L=4): four rows of entropy ln 4."""
    a = np.zeros((1, 1, 2, 2), dtype=np.float32)
    a[0, 0, 0] = 0.5
    a[0, 0, 1, 1] = 1
    b = np.full((1, 1, 4, 4), 0.25, dtype=np.float32)
    run = make_run(store, [a, b], [["[CLS]", "x"], ["[CLS]", "y", "z", "[SEP]"]], name="ent")
    example = run_query(store, "entropy", run=run)
    pooled = run_query(store, "entropy", run=run, average="token")
    assert example["entropy"].item() == pytest.approx((math.log(2) / 2 + math.log(4)) / 2, abs=1e-6)
    assert pooled["entropy"].item() == pytest.approx((math.log(2) + 4 * math.log(4)) / 6, abs=1e-6)
    assert example["uniform_entropy"].item() == pytest.approx((math.log(2) + math.log(4)) / 2)
    assert pooled["uniform_entropy"].item() == pytest.approx((2 * math.log(2) + 4 * math.log(4)) / 6)


def test_unknown_average_is_refused(store, hand_run):
    with pytest.raises(InvalidArgumentError, match="average="):
        run_query(store, "entropy", run=hand_run, average="")
