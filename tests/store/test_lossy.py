"""The opt-in lossy encoding (`--codec u8`): each value stored as round(255 v) in one byte.

Exact expectations: the read-back value is what numcodecs' FixedScaleOffset gives (so any zarr-python
reads it the same), never more than 0.0025 (half a step plus float16 rounding) from the value ingested; `check` accepts
the row sums it shifts; a run cannot be resumed with the other codec.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from attnstore.api.cli import main
from attnstore.queries import run_query
from attnstore.store import arrays
from attnstore.store.check import check_store
from attnstore.store.errors import ConflictError

TOKENS = [["[CLS]", "a", "b", "c", "[SEP]"], ["[CLS]", "d", "e", "[SEP]"], ["[CLS]"] + list("fghijklmn") + ["[SEP]"]]


def maps_for(tokens, seed):
    rng = np.random.default_rng(seed)
    raw = rng.random((2, 3, len(tokens), len(tokens))) ** 4  # skewed rows, like attention
    return (raw / raw.sum(-1, keepdims=True)).astype(np.float16)


MAPS = [maps_for(t, i) for i, t in enumerate(TOKENS)]


def quantised(maps: np.ndarray) -> np.ndarray:
    """FixedScaleOffset(offset=0, scale=255, float16 -> uint8) encode then decode, as numcodecs does it."""
    return (np.around(maps * np.float16(255)).astype(np.uint8) / 255).astype(np.float16)


@pytest.fixture
def lossy(store, make_run):
    return make_run(store, MAPS, TOKENS, name="u8", dtype="float16", codec=dict(arrays.LOSSY_U8_CODEC))


def test_values_come_back_quantised_to_one_byte(store, lossy):
    for e, maps in enumerate(MAPS):
        got = store.attention(lossy, e)
        np.testing.assert_array_equal(got, quantised(maps))
        assert np.abs(got.astype(np.float32) - maps.astype(np.float32)).max() <= arrays.quantize_step(arrays.LOSSY_U8_CODEC)
    meta = (Path(store.locations.array_root) / store.run_info(lossy).array_path / "zarr.json").read_text()
    assert '"numcodecs.fixedscaleoffset"' in meta and '"astype": "u1"' in meta


def test_check_accepts_the_shifted_row_sums_and_queries_stay_close(store, make_run, lossy):
    summary, problems = check_store(store)
    assert problems.empty, problems
    exact = make_run(store, MAPS, TOKENS, name="exact", dtype="float16")
    a = run_query(store, "entropy", run=lossy).set_index(["layer", "head"])
    b = run_query(store, "entropy", run=exact).set_index(["layer", "head"])
    diff = (a - b).abs().to_numpy().max()
    assert 0 < diff < 0.05  # changed, but little: the measured effect on a real run is in PERFORMANCE.md


def test_a_run_cannot_resume_with_the_other_codec(store, make_run, lossy):
    info = store.run_info(lossy)
    with pytest.raises(ConflictError, match="codec stored='u8' asked='lossless'"):
        store.writer.start_run(
            name=lossy,
            model_id=info.model_id,
            dataset_id=info.dataset_id,
            dtype="float16",
            codec=dict(arrays.DEFAULT_CODEC),
            chunk_cells=info.chunk_cells,
            max_length=info.max_length,
            truncation=info.truncation,
        )


def test_an_unknown_quantisation_is_refused():
    with pytest.raises(arrays.InvalidArgumentError, match="unsupported quantisation"):
        arrays.make_codec({**arrays.LOSSY_U8_CODEC, "quantize": {"kind": "fixed-u4", "scale": 15}}, "float16")


def test_ingest_offers_the_codec():
    result = CliRunner().invoke(main, ["ingest", "--help"])
    assert result.exit_code == 0 and "--codec [lossless|u8]" in result.output
