"""Type a sentence and look, and the model view's one request (issue 29), through FastAPI's test client: POST
/api/runs/RUN/scratch answers the tokens and maps an ingest stores for the same sentence (JSON and base64 .npy),
within its caps (413 naming them), 501 in one line without the ingest extra, 403 for a save on a read-only server,
and a saved sentence is a run of its own (SQLite and PostgreSQL: the save writes); every map of an example in one
`.npy` request."""

from __future__ import annotations

import base64
import io
import sys
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*httpx2")
    from fastapi.testclient import TestClient

from attnstore.api.serve import ServeSettings, create_app  # noqa: E402
from attnstore.ingest.runner import ingest  # noqa: E402
from attnstore.ingest.scratch import attention_for_text  # noqa: E402

SENTENCES = ["the cat sat on the mat.", "a dog ran home, fast."]
PAIR = ("the cat sat.", "a dog ran.")


@pytest.fixture
def typed_store(store, tmp_path, tiny_bert):
    corpus = tmp_path / "typed.txt"
    corpus.write_text(SENTENCES[0] + "\n", encoding="utf-8")  # alone in its batch: stored bit for bit as typed
    ingest(store, corpus=str(corpus), fmt="text", model=tiny_bert, annotator="whitespace", name="tiny", progress=False)
    return store


def client_for(store, **settings) -> TestClient:
    return TestClient(create_app(store, ServeSettings(**settings), allowed_hosts=["testserver"]), raise_server_exceptions=False)


def error_of(response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and "Traceback" not in body["error"] and "\n" not in body["error"]
    return body["error"]


def npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


@pytest.mark.one_backend
def test_a_typed_sentence_answers_the_maps_its_ingest_stores(typed_store, tiny_bert):
    store = typed_store
    with client_for(store) as client:
        about = client.get("/api/info").json()["scratch"]
        assert about == {"available": True, "max_tokens": 128, "max_chars": 2000}
        started = time.perf_counter()
        body = client.post("/api/runs/tiny/scratch", json={"text": SENTENCES[0], "maps": "json"}).json()
        first = time.perf_counter() - started  # loads the run's model
        stored = store.attention("tiny", 0)
        assert body["shape"] == list(stored.shape) and body["dtype"] == "float16" and body["n_layers"] == 2 and body["n_heads"] == 4
        np.testing.assert_array_equal(np.array(body["attention"], dtype=np.float64), stored.astype(np.float64))
        tokens = store.tokens("tiny", 0)
        assert [t["token"] for t in body["tokens"]] == tokens["token"].tolist()
        assert [t["is_special"] for t in body["tokens"]] == tokens["is_special"].astype(bool).tolist()
        assert body["weights_match"] is True and body["saved"] is None and body["truncated"] is False
        started = time.perf_counter()
        compact = client.post("/api/runs/tiny/scratch", json={"text": SENTENCES[0]}).json()  # npy: the default
        again = time.perf_counter() - started  # the model is kept
        assert "attention" not in compact
        np.testing.assert_array_equal(npy(base64.b64decode(compact["attention_npy"])), stored)
        one = client.post("/api/runs/tiny/scratch", json={"text": SENTENCES[0], "layer": 1, "head": 2, "maps": "json"}).json()
        assert one["shape"] == [1, 1, *stored.shape[2:]] and one["layers"] == [1] and one["heads"] == [2]
        np.testing.assert_array_equal(np.array(one["attention"]), stored[1:2, 2:3].astype(np.float64))
        layer = client.post("/api/runs/tiny/scratch", json={"text": SENTENCES[0], "layer": 0}).json()
        np.testing.assert_array_equal(npy(base64.b64decode(layer["attention_npy"])), stored[:1])
        print(f"typed sentence round trip: first {first * 1000:.0f} ms (model load), then {again * 1000:.1f} ms")
        assert again < first
        pair = client.post("/api/runs/tiny/scratch", json={"text": PAIR[0], "text_b": PAIR[1], "digits": 3, "maps": "json"}).json()
        want = attention_for_text(tiny_bert, *PAIR)
        np.testing.assert_allclose(np.array(pair["attention"]), np.round(want.attention.astype(np.float64), 3))
        assert {t["segment"] for t in pair["tokens"]} == {0, 1} and pair["text_b"] == PAIR[1]
        # the model view's request: every map of a stored example in one binary answer
        started = time.perf_counter()
        r = client.get("/api/runs/tiny/examples/0/attention", params={"format": "npy"})
        print(f"model view request (all {stored.size} cells): {(time.perf_counter() - started) * 1000:.1f} ms")
        np.testing.assert_array_equal(npy(r.content), stored)


@pytest.mark.one_backend
def test_caps_and_bad_input_answer_in_one_line(typed_store):
    with client_for(typed_store, max_scratch_tokens=12) as client:
        assert client.get("/api/info").json()["scratch"]["max_tokens"] == 12
        message = error_of(client.post("/api/runs/tiny/scratch", json={"text": "abcdefghijklmnop"}), 413)
        assert message.startswith(
            "the typed text is 18 tokens, over the limit of 12 tokens: this server runs the model on at most 12 tokens"
        )
        assert "--max-scratch-tokens" in message
        assert "at most 2000 characters" in error_of(client.post("/api/runs/tiny/scratch", json={"text": "a " * 1001}), 413)
        assert "the text is empty" in error_of(client.post("/api/runs/tiny/scratch", json={"text": "  \n "}), 400)
        assert "maps" in error_of(client.post("/api/runs/tiny/scratch", json={"text": "abc", "maps": "xml"}), 400)
        assert "text" in error_of(client.post("/api/runs/tiny/scratch", json={}), 400)
        assert "no run 'nope'" in error_of(client.post("/api/runs/nope/scratch", json={"text": "abc"}), 404)
        assert "--allow-save" in error_of(client.post("/api/runs/tiny/scratch", json={"text": "abc", "save": True}), 403)
        assert "layers 0..1" in error_of(client.post("/api/runs/tiny/scratch", json={"text": "abc", "layer": 2}), 400)
        assert "heads 0..3" in error_of(client.post("/api/runs/tiny/scratch", json={"text": "abc", "head": 4}), 400)
    with client_for(typed_store, max_json_cells=30) as client:  # every map of "abc" as JSON: 2 x 4 x 5 x 5 cells
        message = error_of(client.post("/api/runs/tiny/scratch", json={"text": "abc", "maps": "json"}), 413)
        assert "200 cells, over this server's 30 as JSON" in message and "`layer`" in message
        assert client.post("/api/runs/tiny/scratch", json={"text": "abc", "maps": "json", "layer": 0, "head": 0}).status_code == 200
    with client_for(typed_store, scratch=False) as client:
        assert client.get("/api/info").json()["scratch"]["available"] is False
        assert "--no-scratch" in error_of(client.post("/api/runs/tiny/scratch", json={"text": "abc"}), 501)


@pytest.mark.one_backend
def test_without_the_ingest_extra_the_server_says_so_in_one_line(typed_store, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails as if the extra were not installed
    with client_for(typed_store) as client:
        about = client.get("/api/info").json()["scratch"]
        assert about["available"] is False and "torch is missing" in about["why"]
        message = error_of(client.post("/api/runs/tiny/scratch", json={"text": "the cat sat."}), 501)
        assert message == (
            "this server cannot run a model on typed text: running a model on typed text needs the 'ingest' extra "
            "(torch is not installed): pip install torch==2.13.0 'attnstore[ingest]'"
        )
        assert client.get("/api/runs/tiny/examples/0").status_code == 200  # the rest of the server is unaffected


def test_a_typed_sentence_saved_is_a_run_of_its_own(typed_store):
    """Both backends: the save writes a dataset and a run."""
    store = typed_store
    with client_for(store, allow_save=True) as client:
        body = client.post("/api/runs/tiny/scratch", json={"text": SENTENCES[1], "text_b": "and back.", "save": True}).json()
        saved = body["saved"]
        assert saved["run"].startswith("scratch/tiny/") and saved["n_stored"] == 1
        np.testing.assert_array_equal(store.attention(saved["run"], 0), npy(base64.b64decode(body["attention_npy"])))
        info = store.run_info(saved["run"])
        assert (info.dataset, info.tokenization, info.dtype, info.status) == ("scratch", "text", "float16", "complete")
        again = client.post("/api/runs/tiny/scratch", json={"text": SENTENCES[1], "text_b": "and back.", "save": True}).json()
        assert again["saved"]["run_id"] == saved["run_id"]  # the same sentence is the same run
        runs = [r["run"] for r in client.get("/api/runs").json()["runs"]]
        assert sorted(runs) == sorted(["tiny", saved["run"]])
