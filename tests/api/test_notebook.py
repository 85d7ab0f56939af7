"""docs/notebooks/quickstart.ipynb runs top to bottom in a fresh Jupyter kernel, and its figures render inline.

The kernel builds the notebook's own small store from the MRPC excerpt in tests/fixtures (8 pairs) with the real
model. A figure that does not render leaves its cell with only a text/plain "<Figure ...>": each figure cell must
have an image/png output, `store.plot`'s and the pyplot figure drawn after it (a library that switched the
backend to Agg would blank that one).
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

pytestmark = pytest.mark.model
ROOT = Path(__file__).parents[2]
NOTEBOOK = ROOT / "docs" / "notebooks" / "quickstart.ipynb"
DATA = ROOT / "tests" / "fixtures" / "data"


def _tagged(nb, tag: str) -> list:
    return [cell for cell in nb.cells if cell.cell_type == "code" and tag in cell.metadata.get("tags", [])]


def _pngs(cell) -> list[bytes]:
    return [base64.b64decode(out["data"]["image/png"]) for out in cell.outputs if "image/png" in out.get("data", {})]


def test_quickstart_notebook_runs_and_shows_its_figures(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    pytest.importorskip("xarray")
    monkeypatch.setenv("ATTNSTORE_DATA", str(DATA))
    monkeypatch.delenv("ATTNSTORE_QUICKSTART_HOME", raising=False)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's own default: the inline backend, as in Jupyter
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebook's store goes here

    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if any cell fails

    assert list(tmp_path.glob("attnstore-quickstart-*/meta.sqlite")), "the notebook built its store elsewhere"
    (runs,) = _tagged(nb, "runs")
    # the notebook ingests limit=8: of the real MRPC dev (408 pairs) run MRPC-dev[:8]-..., as its saved output shows; of
    # the 8-pair excerpt here, every pair, so the whole corpus and no [:8]
    assert "MRPC-dev-all-MiniLM-L6-v2" in runs.outputs[0]["data"]["text/plain"]
    for tag in ("figure", "pyplot"):
        (cell,) = _tagged(nb, tag)
        images = _pngs(cell)
        assert len(images) == 1, f"the {tag!r} cell shows no picture: {[list(o.get('data', {})) for o in cell.outputs]}"
        assert images[0][:8] == b"\x89PNG\r\n\x1a\n" and len(images[0]) > 10_000
    assert len(_tagged(nb, "query")) == 3 and len(_tagged(nb, "sql")) == 2
    for cell in _tagged(nb, "sql"):
        assert "text/html" in cell.outputs[-1]["data"]  # a DataFrame
    errors = [out for cell in nb.cells for out in cell.get("outputs", []) if out["output_type"] == "error"]
    assert not errors
