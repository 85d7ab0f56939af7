"""Labelled arrays (xarray): one example as a DataArray, several as a Dataset, exact values on a hand-built run."""

from __future__ import annotations

import numpy as np
import pytest

xr = pytest.importorskip("xarray")


def test_one_example_and_a_run_as_labelled_arrays(store, make_run):
    from attnstore.store.labelled import labelled_attention, labelled_run

    rng = np.random.default_rng(0)
    first = rng.random((2, 3, 4, 4)).astype(np.float32)
    first /= first.sum(-1, keepdims=True)
    second = np.full((2, 3, 3, 3), 1 / 3, dtype=np.float32)
    make_run(store, [first, second], [["[CLS]", "a", "b", "[SEP]"], ["[CLS]", "c", "[SEP]"]], name="xr")
    one = labelled_attention(store, "xr", 0)
    assert one.dims == ("layer", "head", "query", "key") and one.shape == (2, 3, 4, 4)
    np.testing.assert_array_equal(one.values, first)
    assert one.coords["key_token"].values.tolist() == ["[CLS]", "a", "b", "[SEP]"]
    assert one.coords["query_is_special"].values.tolist() == [True, False, False, True]
    # selection by label: layer 1, head 2, from token "a" to [CLS]
    value = one.sel(layer=1, head=2).where(one.query_token == "a", drop=True).isel(key=0).item()
    assert value == pytest.approx(first[1, 2, 1, 0])
    sub = labelled_attention(store, "xr", 0, layer=1, head=[0, 2])
    assert sub.coords["layer"].values.tolist() == [1] and sub.coords["head"].values.tolist() == [0, 2]
    np.testing.assert_array_equal(sub.values, first[[1]][:, [0, 2]])
    assert one.attrs["run"] == "xr" and one.attrs["example"] == 0
    assert store.labelled_attention("xr", 0).equals(one)  # the Store methods are the same functions
    run = labelled_run(store, "xr")
    assert set(run.data_vars) == {"example_0", "example_1"}
    assert run["example_1"].dims == ("layer", "head", "query_1", "key_1")
    np.testing.assert_array_equal(run["example_1"].values, second)
    assert run["example_1"].coords["key_token_1"].values.tolist() == ["[CLS]", "c", "[SEP]"]
