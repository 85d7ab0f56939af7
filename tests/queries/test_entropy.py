import math

import numpy as np

from attnstore.queries import run_query
from attnstore.queries.entropy import row_entropy


def test_row_entropy_handles_zeros():
    rows = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]], dtype=np.float32)
    np.testing.assert_allclose(row_entropy(rows), [0.0, math.log(2), math.log(3)], atol=1e-6)


def test_entropy_exact_values(store, hand_run):
    df = run_query(store, "entropy", run=hand_run).sort_values(["layer", "head"])
    uniform = (5 * math.log(5) + 3 * math.log(3)) / 8
    uniform_cls = (math.log(5) + math.log(3)) / 2
    # one-hot heads have zero entropy; the uniform head (L1H0) has the uniform entropy
    np.testing.assert_allclose(df["entropy"], [0.0, 0.0, uniform, 0.0], atol=1e-6)
    np.testing.assert_allclose(df["entropy_from_cls"], [0.0, 0.0, uniform_cls, 0.0], atol=1e-6)
    np.testing.assert_allclose(df["uniform_entropy"], uniform, atol=1e-9)
    np.testing.assert_allclose(df["uniform_entropy_from_cls"], uniform_cls, atol=1e-9)
