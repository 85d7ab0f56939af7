"""The labelling page's API (`attnstore serve`, /api/label...): the next map for a labeller (rules/CNN disagreements
first, never one they labelled or skipped), a label written as source human:NAME through the same writer as
`patterns import`, refused in one line on a read-only server; on SQLite and PostgreSQL."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*httpx2")
    from fastapi.testclient import TestClient

from attnstore.api.pattern_labels import export_labels, labeller_source, next_map  # noqa: E402
from attnstore.api.serve import ServeSettings, create_app  # noqa: E402
from attnstore.queries.patterns import classify_maps  # noqa: E402
from attnstore.tests.snapshots import store_with  # noqa: E402

RUN = "tolabel"
TOKENS = [["[CLS]", "a", "b", "c", "d", "[SEP]"], ["[CLS]", "e", "f", "g", "[SEP]"]]


def maps_of(length: int) -> np.ndarray:
    """1 layer x 2 heads: head 0 on [CLS] (vertical), head 1 on the previous token (diagonal)."""
    m = np.zeros((1, 2, length, length), np.float32)
    m[0, 0, :, 0] = 1
    m[0, 1, 0, 1] = 1
    for i in range(1, length):
        m[0, 1, i, i - 1] = 1
    return m


@pytest.fixture
def labelled_store(store):
    return store, [maps_of(len(t)) for t in TOKENS]


def build_labelled_store(store, make_run):
    make_run(store, [maps_of(len(t)) for t in TOKENS], TOKENS, name=RUN)


# For a test of `labelled_store`: the store build_labelled_store fills, built once per session on SQLite and copied (tests/snapshots.py).
store = store_with("labelled_store", build_labelled_store)


def client_for(store, **settings) -> TestClient:
    return TestClient(create_app(store, ServeSettings(**settings), allowed_hosts=["testserver"]), raise_server_exceptions=False)


def error_of(response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and "\n" not in body["error"] and "Traceback" not in body["error"]
    return body["error"]


def keys_in_order(store) -> list[tuple[int, int, int]]:
    """Every map of the run in the order next_map walks it (default_rng(0) over the examples, then the heads)."""
    order = np.asarray([0, 1])[np.random.default_rng(0).permutation(2)]
    return [(int(e), 0, h) for e in order for h in range(2)]


def test_next_map_label_and_the_order(labelled_store):
    store, maps = labelled_store
    order = keys_in_order(store)
    with client_for(store, allow_save=True) as c:
        first = c.get("/api/label/next", params={"labeller": "alice"}).json()
        assert first["labeller"] == "alice" and first["source"] == "human:alice" and first["labelled"] == 0
        item = first["map"]
        assert (item["example"], item["layer"], item["head"]) == order[0] and item["why"] == "unlabelled" and item["cnn"] is None
        assert item["tokens"] == TOKENS[item["example"]] and item["special"] == [t.startswith("[") for t in TOKENS[item["example"]]]
        np.testing.assert_allclose(item["attention"], maps[item["example"]][0, item["head"]], atol=1e-5)
        assert item["rules"] == classify_maps(maps[item["example"]], np.array(item["special"]), np.zeros(item["length"], int))[0, 0]
        body = dict(labeller="alice", run=RUN, example=item["example"], layer=0, head=item["head"], label="vertical")
        saved = c.post("/api/label", json=body).json()
        assert saved == {"saved": 1, "source": "human:alice", "run": RUN, "labelled": 1}
        second = c.get("/api/label/next", params={"labeller": "alice"}).json()["map"]
        assert (second["example"], second["layer"], second["head"]) == order[1]
        # a skipped map is passed over; another labeller starts at the same map as alice (their labels overlap)
        skip = f"{second['run_id']}.{second['example']}.0.{second['head']}"
        third = c.get("/api/label/next", params={"labeller": "alice", "skip": skip}).json()["map"]
        assert (third["example"], third["layer"], third["head"]) == order[2]
        bob = c.get("/api/label/next", params={"labeller": "bob"}).json()["map"]
        assert (bob["example"], bob["layer"], bob["head"]) == order[0]
        # labelling again replaces the labeller's label; the list of labellers counts them
        c.post("/api/label", json=dict(body, label="heterogeneous"))
        assert c.get("/api/label/labellers").json() == {"labellers": [dict(source="human:alice", labeller="alice", n_labels=1)]}
    stored = store.pattern_labels(RUN, source="human:alice")
    assert stored[["example", "head", "label"]].values.tolist() == [[item["example"], item["head"], "heterogeneous"]]
    assert export_labels(store, source="human:alice")[0]["labeller"] == "alice"


def test_disagreements_between_rules_and_cnn_come_first(labelled_store):
    store, maps = labelled_store
    special = [np.array([t.startswith("[") for t in tokens]) for tokens in TOKENS]
    rules = {(e, 0, h): classify_maps(maps[e], special[e], np.zeros(len(TOKENS[e]), int))[0, h] for e in (0, 1) for h in (0, 1)}
    assert rules[(1, 0, 1)] == "diagonal"
    cnn = pd.DataFrame([dict(run=RUN, example=e, layer=la, head=h, label=label, confidence=0.9) for (e, la, h), label in rules.items()])
    cnn.loc[(cnn["example"] == 1) & (cnn["head"] == 1), "label"] = "block"  # the CNN disagrees on one map
    store.save_pattern_labels(cnn, source="cnn")
    item = next_map(store, "carol")
    assert (item["example"], item["layer"], item["head"]) == (1, 0, 1)
    assert item["why"] == "rules and CNN disagree" and item["rules"] == "diagonal" and item["cnn"] == "block" and item["disagree"]
    assert item["cnn_confidence"] == pytest.approx(0.9)
    store.save_pattern_labels(pd.DataFrame([dict(run=RUN, example=1, layer=0, head=1, label="diagonal")]), source=labeller_source("carol"))
    after = next_map(store, "carol")
    assert after["why"] == "unlabelled" and after["cnn"] == rules[(after["example"], 0, after["head"])] and not after["disagree"]
    # a run with every map labelled has nothing left
    for e, la, h in rules:
        store.save_pattern_labels(pd.DataFrame([dict(run=RUN, example=e, layer=la, head=h, label="vertical")]), source="human:carol")
    assert next_map(store, "carol") is None


def test_a_read_only_server_refuses_to_write_in_one_line(labelled_store):
    store, _ = labelled_store
    with client_for(store) as c:  # allow_save is off by default
        item = c.get("/api/label/next", params={"labeller": "dan"}).json()
        assert item["writable"] is False and item["map"] is not None  # reading works
        message = error_of(c.post("/api/label", json=dict(labeller="dan", run=RUN, example=0, layer=0, head=0, label="vertical")), 403)
        assert "read-only" in message and "--allow-save" in message
    assert store.pattern_labels().empty


def test_bad_labels_and_labellers_are_refused(labelled_store):
    store, _ = labelled_store
    good = dict(labeller="erin", run=RUN, example=0, layer=0, head=0, label="vertical")
    with client_for(store, allow_save=True) as c:
        assert "unknown label" in error_of(c.post("/api/label", json=dict(good, label="stripes")), 400)
        assert "labeller" in error_of(c.post("/api/label", json=dict(good, labeller="  ")), 400)
        assert "labeller" in error_of(c.get("/api/label/next", params={"labeller": "x" * 59}), 400)
        assert "out of range" in error_of(c.post("/api/label", json=dict(good, head=5)), 400)
        error_of(c.post("/api/label", json=dict(good, run="nope")), 404)
        error_of(c.post("/api/label", json=dict(good, example=9)), 404)
        assert "RUN_ID.EXAMPLE.LAYER.HEAD" in error_of(c.get("/api/label/next", params={"labeller": "erin", "skip": "1.2"}), 400)
    assert store.pattern_labels().empty
