"""`attnstore serve`: every endpoint of the HTTP API over a hand-built store, on SQLite and PostgreSQL.

Exact values throughout: maps equal `store.attention`, tokens `store.tokens`, metrics and query results
`run_query`, search hits the hand-annotated words; and every bound (page size, cell budget, examples
per query, SQL rows, statement time) and every bad input answers 4xx with a JSON error.
"""

from __future__ import annotations

import io
import json
import threading
import warnings

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
with warnings.catch_warnings():  # starlette's TestClient asks for httpx2; httpx still works
    warnings.filterwarnings("ignore", message=".*httpx2")
    from fastapi.testclient import TestClient

from attnstore.api.serve import ServeSettings, create_app  # noqa: E402
from attnstore.queries import run_query  # noqa: E402
from attnstore.tests.snapshots import store_with  # noqa: E402

RUN = "served"
TOKENS = [
    ["[CLS]", "the", "cat", "sat", "[SEP]"],
    ["[CLS]", "a", "dog", "bark", "##ed", "[SEP]"],
    ["[CLS]", "cats", "sat", ".", "[SEP]"],
]
WORDS = [
    [
        dict(form="the", upos="DET", deprel="det", head=1),
        dict(form="cat", upos="NOUN", deprel="nsubj", head=2),
        dict(form="sat", upos="VERB", deprel="root"),
    ],
    [
        dict(form="a", upos="DET", deprel="det", head=1),
        dict(form="dog", upos="NOUN", deprel="nsubj", head=2),
        dict(form="barked", upos="VERB", deprel="root"),
    ],
    [
        dict(form="Cats", upos="NOUN", deprel="nsubj", head=1),
        dict(form="sat", upos="VERB", deprel="root"),
        dict(form=".", upos="PUNCT", deprel="punct", head=1),
    ],
]
TOKEN_WORDS = [[None, 0, 1, 2, None], [None, 0, 1, 2, 2, None], [None, 0, 1, 2, None]]


def hand_maps(length: int, seed: int) -> np.ndarray:
    """2 layers x 3 heads; L0-H0 attends to the previous token, L1-H2 to the next one, the rest random."""
    rng = np.random.default_rng(seed)
    maps = rng.random((2, 3, length, length)).astype(np.float32)
    maps /= maps.sum(-1, keepdims=True)
    maps[0, 0] = np.eye(length, k=-1)
    maps[0, 0, 0, 0] = 1.0  # the first token attends to itself
    maps[1, 2] = np.eye(length, k=1)
    maps[1, 2, -1, -1] = 1.0
    return maps


@pytest.fixture
def served(store):
    return store, [hand_maps(len(t), seed) for seed, t in enumerate(TOKENS)]


def build_served(store, make_run):
    maps = [hand_maps(len(t), seed) for seed, t in enumerate(TOKENS)]
    make_run(store, maps, TOKENS, name=RUN, words_list=WORDS, token_words=TOKEN_WORDS)


# For a test of `served`: the store build_served fills, built once per session on SQLite and copied (tests/snapshots.py).
store = store_with("served", build_served)


TEST_HOST = ["testserver"]  # the test client's Host header; the server answers only the names it is given


def client_for(store, **settings) -> TestClient:
    return TestClient(create_app(store, ServeSettings(**settings), allowed_hosts=TEST_HOST), raise_server_exceptions=False)


@pytest.fixture
def client(served):
    with client_for(served[0]) as c:
        yield c


def error_of(response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and "Traceback" not in body["error"]
    return body["error"]


# ------------------------------------------------------------------ runs, examples, tokens


@pytest.mark.one_backend
def test_runs_and_one_run(served, client):
    store, _ = served
    runs = client.get("/api/runs").json()["runs"]
    assert [r["run"] for r in runs] == [RUN] and runs[0]["n_stored"] == 3 and runs[0]["n_layers"] == 2
    info = store.run_info(RUN)
    by_name = client.get(f"/api/runs/{RUN}").json()["run"]
    by_id = client.get(f"/api/runs/{info.id}").json()["run"]
    assert by_name == by_id and by_name["id"] == info.id and by_name["n_heads"] == 3 and by_name["status"] == "complete"
    assert by_name["array_path"] == "runs/served/cells"
    assert "no run 'nope'" in error_of(client.get("/api/runs/nope"), 404)
    about = client.get("/api/info").json()
    assert about["read_only"] is True and about["limits"]["max_page"] == 500 and about["limits"]["max_cells"] == 2_000_000


@pytest.mark.one_backend
def test_a_layout_1_run_is_described_but_its_maps_and_queries_are_refused_in_one_line(served):
    """A run in Zarr layout 1 (before 2026-11-23): what the server reads of SQL is served, a read of its arrays answers
    400 with the line that names `attnstore db upgrade-arrays`."""
    from attnstore.tests.store.test_layout import make_legacy

    store, _ = served
    legacy = make_legacy(store, RUN)
    refusal = (
        f"run {RUN!r} is stored in Zarr layout 1, which this version no longer reads: "
        "run `attnstore db upgrade-arrays` to convert it (a byte-for-byte chunk copy)"
    )
    with client_for(store) as c:
        assert c.get(f"/api/runs/{RUN}").json()["run"]["array_path"] == legacy
        assert c.get(f"/api/runs/{RUN}/examples/1").json()["tokens"][2]["token"] == "dog"
        assert error_of(c.get(f"/api/runs/{RUN}/examples/1/attention", params={"layer": 0, "head": 0}), 400) == refusal
        assert error_of(c.get(f"/api/runs/{RUN}/queries/entropy", params={"scan": 1}), 400) == refusal


def test_examples_are_paginated_and_filtered(client):
    page = client.get(f"/api/runs/{RUN}/examples", params={"limit": 2}).json()
    assert (page["total"], page["n_examples"], page["offset"], page["limit"]) == (3, 3, 0, 2)
    assert [e["example"] for e in page["items"]] == [0, 1] and page["items"][0]["text_a"] == "the cat sat"
    assert page["items"][1]["length"] == 6 and page["items"][1]["skipped"] is False
    rest = client.get(f"/api/runs/{RUN}/examples", params={"offset": 2, "limit": 2}).json()
    assert [e["example"] for e in rest["items"]] == [2]
    assert client.get(f"/api/runs/{RUN}/examples", params={"offset": 10}).json()["items"] == []
    cats = client.get(f"/api/runs/{RUN}/examples", params={"q": "CAT"}).json()
    assert [e["example"] for e in cats["items"]] == [0, 2] and cats["total"] == 2
    long = client.get(f"/api/runs/{RUN}/examples", params={"min_length": 6}).json()
    assert [e["example"] for e in long["items"]] == [1]
    short = client.get(f"/api/runs/{RUN}/examples", params={"max_length": 5, "truncated": "false"}).json()
    assert [e["example"] for e in short["items"]] == [0, 2]
    assert "limit" in error_of(client.get(f"/api/runs/{RUN}/examples", params={"limit": 501}), 400)
    assert "offset" in error_of(client.get(f"/api/runs/{RUN}/examples", params={"offset": -1}), 400)
    assert "min_length" in error_of(client.get(f"/api/runs/{RUN}/examples", params={"min_length": "x"}), 400)


@pytest.mark.one_backend
def test_one_example_has_its_tokens(served, client):
    store, _ = served
    body = client.get(f"/api/runs/{RUN}/examples/1").json()
    assert body["example"]["example"] == 1 and body["example"]["text_a"] == "a dog barked"
    tokens = body["tokens"]
    expected = store.tokens(RUN, 1)
    assert [t["token"] for t in tokens] == expected["token"].tolist() == TOKENS[1]
    assert [t["word"] for t in tokens] == [None, "a", "dog", "barked", "barked", None]
    assert [t["upos"] for t in tokens][1:5] == ["DET", "NOUN", "VERB", "VERB"]
    assert [t["head"] for t in tokens][1:4] == [1, 2, None] and tokens[0]["is_special"] in (True, 1)
    assert "no example 7" in error_of(client.get(f"/api/runs/{RUN}/examples/7"), 404)
    assert "example" in error_of(client.get(f"/api/runs/{RUN}/examples/x"), 400)


# ------------------------------------------------------------------ maps


@pytest.mark.one_backend
def test_maps_as_json_and_npy_equal_the_store(served, client):
    store, maps = served
    one = client.get(f"/api/runs/{RUN}/examples/1/attention", params={"layer": 1, "head": 2}).json()
    assert one["layers"] == [1] and one["heads"] == [2] and one["shape"] == [1, 1, 6, 6] and one["dtype"] == "float32"
    np.testing.assert_array_equal(np.array(one["attention"], dtype=np.float32), store.attention(RUN, 1, layer=[1], head=[2]))
    np.testing.assert_array_equal(np.array(one["attention"])[0, 0], np.eye(6, k=1) + np.diag([0] * 5 + [1]))
    some = client.get(f"/api/runs/{RUN}/examples/0/attention", params={"layer": "0,1", "head": "1-2"}).json()
    assert some["layers"] == [0, 1] and some["heads"] == [1, 2]
    np.testing.assert_array_equal(np.array(some["attention"], dtype=np.float32), maps[0][:, 1:3])
    rounded = client.get(f"/api/runs/{RUN}/examples/0/attention", params={"layer": 0, "head": 1, "digits": 3}).json()
    np.testing.assert_array_equal(np.array(rounded["attention"]), np.round(maps[0][:1, 1:2].astype(np.float64), 3))
    binary = client.get(f"/api/runs/{RUN}/examples/2/attention", params={"format": "npy"})
    assert binary.status_code == 200 and binary.headers["content-type"] == "application/octet-stream"
    assert binary.headers["x-attnstore-layers"] == "0,1" and "example2.npy" in binary.headers["content-disposition"]
    array = np.load(io.BytesIO(binary.content), allow_pickle=False)
    assert array.dtype == np.float32 and array.shape == (2, 3, 5, 5)
    np.testing.assert_array_equal(array, store.attention(RUN, 2))
    block = client.get(f"/api/runs/{RUN}/examples/1/attention", params={"layer": 1, "head": "0-1", "rows": "2-4"}).json()
    assert block["rows"] == [2, 4] and block["shape"] == [1, 2, 3, 6]
    np.testing.assert_array_equal(np.array(block["attention"], dtype=np.float32), maps[1][1:2, 0:2, 2:5])


@pytest.mark.one_backend
def test_maps_refuse_bad_input_and_slices_over_the_budget(served):
    store, _ = served
    with client_for(store, max_json_cells=60, max_cells=100) as c:
        url = f"/api/runs/{RUN}/examples/1/attention"
        assert "layer 2 is out of range: the model has 2 layers (0..1)" in error_of(c.get(url, params={"layer": 2}), 400)
        assert "head 5 is out of range" in error_of(c.get(url, params={"layer": 0, "head": 5}), 400)
        assert "0-based layers" in error_of(c.get(url, params={"layer": "x"}), 400)
        assert "0-based heads" in error_of(c.get(url, params={"head": "2-1"}), 400)
        assert "format" in error_of(c.get(url, params={"format": "xml"}), 400)
        assert "digits" in error_of(c.get(url, params={"digits": 12}), 400)
        assert "the example has 6 query rows (0..5)" in error_of(c.get(url, params={"layer": 0, "head": 0, "rows": "4-6"}), 400)
        assert "like 0-511" in error_of(c.get(url, params={"layer": 0, "head": 0, "rows": "a-b"}), 400)
        assert "no example 9" in error_of(c.get(f"/api/runs/{RUN}/examples/9/attention"), 404)
        assert "no run 'other'" in error_of(c.get("/api/runs/other/examples/0/attention"), 404)
        # 2 heads x 36 cells = 72 > 60 (JSON); as .npy (budget 100) it is fine, every head (216) is not
        too_big = error_of(c.get(url, params={"layer": 0, "head": "0,1"}), 413)
        assert "72 cells, over this server's budget of 60" in too_big and "layer=L&head=H" in too_big
        assert c.get(url, params={"layer": 0, "head": "0,1", "format": "npy"}).status_code == 200
        assert "budget of 100" in error_of(c.get(url, params={"format": "npy"}), 413)
        assert c.get(url, params={"layer": 0, "head": 0}).status_code == 200


# ------------------------------------------------------------------ per-head metrics and queries


def test_head_metrics_saved_and_computed_on_request(served, client):
    store, _ = served
    saved = run_query(store, "entropy", run=RUN)
    store.save_head_metrics(RUN, saved, prefix="entropy")
    listing = client.get(f"/api/runs/{RUN}/head_metrics").json()
    by_metric = {m["metric"]: m for m in listing["metrics"]}
    assert by_metric["entropy.entropy"]["source"] == "saved" and by_metric["entropy.entropy"]["n"] == 6
    assert by_metric["special_tokens.to_cls"]["source"] == "on request"
    matrix = client.get(f"/api/runs/{RUN}/head_metrics/entropy.entropy").json()
    assert matrix["source"] == "saved" and matrix["params"] == "{}" and (matrix["n_layers"], matrix["n_heads"]) == (2, 3)
    np.testing.assert_allclose(np.array(matrix["values"]), saved["entropy"].to_numpy().reshape(2, 3))
    assert matrix["min"] == pytest.approx(saved["entropy"].min()) and matrix["values"][0][0] == pytest.approx(0.0)
    computed = client.get(f"/api/runs/{RUN}/head_metrics/special_tokens.to_cls").json()
    expected = run_query(store, "special_tokens", run=RUN)["to_cls"].to_numpy().reshape(2, 3)
    assert computed["source"] == "computed" and computed["n_examples"] == 3 and "all 3 examples" in computed["note"]
    np.testing.assert_allclose(np.array(computed["values"]), expected)
    assert "no saved metric 'dependency.nsubj:dep2head'" in error_of(
        client.get(f"/api/runs/{RUN}/head_metrics/dependency.nsubj:dep2head"), 404
    )
    assert "saved with params" in error_of(client.get(f"/api/runs/{RUN}/head_metrics/entropy.entropy", params={"params": '{"a": 1}'}), 404)


@pytest.mark.one_backend
def test_computed_metrics_and_queries_are_capped(served):
    store, _ = served
    with client_for(store, max_query_examples=2) as c:
        computed = c.get(f"/api/runs/{RUN}/head_metrics/entropy.entropy").json()
        assert computed["n_examples"] == 2 and "first 2 of 3" in computed["note"]
        expected = run_query(store, "entropy", run=RUN, examples=[0, 1])["entropy"].to_numpy().reshape(2, 3)
        np.testing.assert_allclose(np.array(computed["values"]), expected)
        refused = error_of(c.get(f"/api/runs/{RUN}/queries/entropy"), 413)
        assert "would read 3 examples" in refused and "examples=0-1" in refused
        assert c.get(f"/api/runs/{RUN}/queries/entropy", params={"examples": "0-1"}).status_code == 200
        assert c.get(f"/api/runs/{RUN}/queries/word_maps", params={"example": 1, "layer": 1, "head": 2}).status_code == 200


@pytest.mark.one_backend
def test_queries_are_listed_and_run(served, client):
    store, _ = served
    queries = {q["name"]: q for q in client.get("/api/queries").json()["queries"]}
    assert {"entropy", "special_tokens", "dependency", "word_maps"} <= set(queries)
    average = {p["name"]: p for p in queries["entropy"]["parameters"]}["average"]
    assert average == {"name": "average", "type": "str", "nullable": False, "required": False, "default": "example"}
    assert queries["entropy"]["per_head"] is True and queries["word_maps"]["per_head"] is False
    body = client.get(f"/api/runs/{RUN}/queries/entropy", params={"average": "token"}).json()
    expected = run_query(store, "entropy", run=RUN, average="token")
    assert body["columns"] == list(expected.columns) and body["n_rows"] == 6 and body["truncated"] is False
    assert body["params"] == {"average": "token"} and body["run_state"] == "complete" and body["n_examples"] == 3
    np.testing.assert_allclose(np.array(body["rows"], dtype=float), expected.to_numpy(dtype=float))
    again = client.get(f"/api/runs/{RUN}/queries/entropy", params={"average": "token", "max_rows": 2}).json()
    assert again["rows"] == body["rows"][:2] and again["truncated"] is True and again["n_rows"] == 6
    words = client.get(f"/api/runs/{RUN}/queries/word_maps", params={"example": 1, "layer": 1, "head": 2}).json()
    assert words["per_head"] is False and "attention" in words["columns"]
    assert "no query named 'nope'" in error_of(client.get(f"/api/runs/{RUN}/queries/nope"), 404)
    assert "has no parameter 'bogus'" in error_of(client.get(f"/api/runs/{RUN}/queries/entropy", params={"bogus": 1}), 400)
    assert "average" in error_of(client.get(f"/api/runs/{RUN}/queries/entropy", params={"average": "median"}), 400)
    assert "must be an integer" in error_of(client.get(f"/api/runs/{RUN}/queries/word_maps", params={"layer": "x"}), 400)
    assert "max_rows" in error_of(client.get(f"/api/runs/{RUN}/queries/entropy", params={"max_rows": 0}), 400)
    assert "out of range" in error_of(client.get(f"/api/runs/{RUN}/queries/word_maps", params={"layer": 7}), 400)
    assert "no run" in error_of(client.get("/api/runs/nope/queries/entropy"), 404)


JSON = {"Content-Type": "application/json"}  # what a state-changing request must send (api/http/middleware.py RequestGuard)


def test_saving_needs_allow_save_and_a_writable_store(served, tmp_path):
    store, _ = served
    read_only = create_app(store.locations, allowed_hosts=TEST_HOST)  # opened at startup, read-only by default
    with TestClient(read_only, raise_server_exceptions=False) as c:
        assert "--allow-save" in error_of(c.post(f"/api/runs/{RUN}/queries/entropy/save", headers=JSON), 403)
        assert c.get("/api/info").json()["read_only"] is True
    assert store.head_metrics(RUN).empty
    with TestClient(
        create_app(store.locations, ServeSettings(allow_save=True), allowed_hosts=TEST_HOST), raise_server_exceptions=False
    ) as c:
        saved = c.post(f"/api/runs/{RUN}/queries/relative_position/save", params={"average": "token"}, headers=JSON).json()
        assert saved == {"query": "relative_position", "run": RUN, "saved": 18, "metric_prefix": "relative_position."}
        assert "not per head" in error_of(c.post(f"/api/runs/{RUN}/queries/word_maps/save", headers=JSON), 400)
    values = store.head_metrics(RUN, metric="relative_position.to_next")
    assert len(values) == 6 and json.loads(values["params"].iloc[0]) == {"average": "token"}
    expected = run_query(store, "relative_position", run=RUN, average="token")["to_next"]
    np.testing.assert_allclose(values["value"].to_numpy(), expected.to_numpy())


# ------------------------------------------------------------------ corpus search


def test_search_finds_words_pos_and_relations(served, client):
    store, maps = served
    url = f"/api/runs/{RUN}/search"
    cat = client.get(url, params={"word": "CAT"}).json()
    assert cat["total"] == 1 and [(h["example"], h["position"], h["word"], h["deprel"]) for h in cat["hits"]] == [(0, 2, "cat", "nsubj")]
    assert cat["hits"][0]["head_positions"] == [3] and "attention" not in cat["hits"][0]
    assert cat["examples"]["0"]["tokens"] == TOKENS[0]
    nouns = client.get(url, params={"upos": "NOUN"}).json()
    assert [(h["example"], h["position"]) for h in nouns["hits"]] == [(0, 2), (1, 2), (2, 1)]
    subjects = client.get(url, params={"deprel": "nsubj", "upos": "NOUN", "word": "cats"}).json()
    assert [(h["example"], h["word"]) for h in subjects["hits"]] == [(2, "Cats")]
    barked = client.get(url, params={"word": "barked"}).json()
    assert [h["position"] for h in barked["hits"]] == [3]  # the first piece of each word
    pieces = client.get(url, params={"word": "barked", "pieces": "all"}).json()
    assert [h["token"] for h in pieces["hits"]] == ["bark", "##ed"] and pieces["hits"][0]["head_positions"] == []
    assert [h["position"] for h in client.get(url, params={"token": "##ED"}).json()["hits"]] == [4]
    # where the determiners attend in L1-H2 (the next token) and L0-H1 (random maps): rows of the stored maps
    dets = client.get(url, params={"deprel": "det", "layer": 1, "head": 2, "k": 2}).json()
    assert [(h["example"], h["position"]) for h in dets["hits"]] == [(0, 1), (1, 1)]
    assert dets["hits"][0]["top"][0] == {"position": 2, "token": "cat", "weight": 1.0} and dets["hits"][0]["head_positions"] == [2]
    random_head = client.get(url, params={"deprel": "det", "layer": 0, "head": 1, "k": 3}).json()
    for hit in random_head["hits"]:
        row = maps[hit["example"]][0, 1, hit["position"]].astype(np.float64)
        assert hit["attention"] == np.round(row, 4).tolist()
        assert [t["position"] for t in hit["top"]] == np.argsort(-row, kind="stable")[:3].tolist()
    page = client.get(url, params={"upos": "NOUN", "offset": 1, "limit": 1}).json()
    assert page["total"] == 3 and [(h["example"], h["position"]) for h in page["hits"]] == [(1, 2)] and list(page["examples"]) == ["1"]
    past = client.get(url, params={"upos": "NOUN", "offset": 5}).json()
    assert past["hits"] == [] and past["total"] == 3
    none = client.get(url, params={"word": "zebra"}).json()
    assert (none["total"], none["hits"], none["examples"]) == (0, [], {})
    assert "at least one of word" in error_of(client.get(url), 400)
    assert "both layer and head" in error_of(client.get(url, params={"word": "cat", "layer": 1}), 400)
    assert "head 3 is out of range" in error_of(client.get(url, params={"word": "cat", "layer": 1, "head": 3}), 400)
    assert "pieces" in error_of(client.get(url, params={"word": "cat", "pieces": "some"}), 400)
    assert "limit" in error_of(client.get(url, params={"word": "cat", "limit": 101}), 400)
    assert "k" in error_of(client.get(url, params={"word": "cat", "k": 21}), 400)
    facets = client.get(f"/api/runs/{RUN}/annotations").json()
    assert facets["upos"][:2] == [{"value": "NOUN", "n": 3}, {"value": "VERB", "n": 3}]
    assert {f["value"]: f["n"] for f in facets["deprel"]} == {"det": 2, "nsubj": 3, "root": 3, "punct": 1}


# ------------------------------------------------------------------ read-only SQL


def test_sql_reads_with_limits_and_refuses_writes(served, client):
    store, _ = served
    ok = client.get("/api/sql", params={"q": "SELECT position, token FROM tokens ORDER BY example_id, position", "max_rows": 4}).json()
    assert ok["columns"] == ["position", "token"] and ok["rows"] == [[0, "[CLS]"], [1, "the"], [2, "cat"], [3, "sat"]]
    assert ok["truncated"] is True and ok["n_rows"] == 4
    posted = client.post("/api/sql", json={"query": "SELECT count(*) AS n FROM words WHERE upos = :tag", "params": {"tag": "NOUN"}}).json()
    assert posted["rows"] == [[3]] and posted["truncated"] is False
    view = client.get(
        "/api/sql", params={"q": "SELECT form FROM token_annotations WHERE run = 'served' AND deprel = 'det' ORDER BY example"}
    ).json()
    assert view["rows"] == [["the"], ["a"]]
    before = store.sql("SELECT count(*) AS n FROM tokens").n[0]
    for statement in ("DELETE FROM tokens", "DROP TABLE tokens", "INSERT INTO runs (name) VALUES ('x')", "UPDATE words SET form = 'x'"):
        assert "not allowed in attnstore sql (read-only)" in error_of(client.get("/api/sql", params={"q": statement}), 400)
        assert "read-only" in error_of(client.post("/api/sql", json={"query": statement}), 400)
    assert "one statement" in error_of(client.get("/api/sql", params={"q": "SELECT 1; DELETE FROM tokens"}), 400)
    assert store.sql("SELECT count(*) AS n FROM tokens").n[0] == before == 16
    assert "SQL error" in error_of(client.get("/api/sql", params={"q": "SELECT nothing FROM nowhere"}), 400)
    assert "no statement" in error_of(client.get("/api/sql", params={"q": "  "}), 400)
    assert "max_rows" in error_of(client.get("/api/sql", params={"q": "SELECT 1", "max_rows": 5001}), 400)
    assert "q: Field required" in error_of(client.get("/api/sql"), 400)
    assert "query" in error_of(client.post("/api/sql", json={"sql": "SELECT 1"}), 400)
    assert "at most 20000" in error_of(client.get("/api/sql", params={"q": "SELECT 1" + " " * 20_000}), 413)


def test_sql_statements_stop_at_the_time_limit(served):
    store, _ = served
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    with client_for(store, sql_timeout_s=0.3) as c:
        assert "statement stopped after 0.3 s" in error_of(c.get("/api/sql", params={"q": endless}), 400)
        assert c.get("/api/sql", params={"q": "SELECT 1 AS one"}).json()["rows"] == [[1]]


# ------------------------------------------------------------------ errors, static files, the command


@pytest.mark.one_backend
def test_unknown_routes_methods_and_unexpected_errors_are_json(served, client, caplog, monkeypatch):
    assert "no such endpoint: GET /api/nothing" in error_of(client.get("/api/nothing"), 404)
    assert "Method Not Allowed" in error_of(client.delete("/api/runs"), 405)
    store, _ = served

    def broken():
        raise RuntimeError("secret detail")

    monkeypatch.setattr(store, "runs", broken)
    with caplog.at_level("ERROR", logger="attnstore.serve"):
        message = error_of(client.get("/api/runs"), 500)
    assert message == "internal error (RuntimeError); the server's log has the details" and "secret" not in message
    assert "secret detail" in caplog.text and "Traceback" in caplog.text  # logged on the server's side only


@pytest.mark.one_backend
def test_viewer_and_api_reference_are_served_locally(client):
    page = client.get("/")
    assert page.status_code == 200 and 'src="static/app.js"' in page.text and 'id="headview-svg"' in page.text
    assert "http" not in page.text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing from outside
    for path, kind in (("/static/app.js", "javascript"), ("/static/app.css", "text/css"), ("/docs", "text/html")):
        response = client.get(path)
        assert response.status_code == 200 and kind in response.headers["content-type"], path
    assert "cdn" not in client.get("/docs").text.lower()
    spec = client.get("/openapi.json").json()
    assert {"/api/runs", "/api/runs/{run}/examples/{example}/attention", "/api/runs/{run}/search", "/api/sql"} <= set(spec["paths"])
    assert error_of(client.get("/static/nothing.js"), 404)


def test_concurrent_requests_on_a_live_server(served):
    """uvicorn's thread pool: many requests at once on the store opened read-only (as `attnstore serve` opens
    it), each answered with its own example's values. (A read-only SQLite engine once shared one connection
    per thread among five and crashed here.)"""
    import socket

    import httpx
    import uvicorn

    store, maps = served
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = create_app(store.locations)  # opened read-only at startup
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    failures: list[str] = []
    try:
        for _ in range(200):
            if server.started:
                break
            thread.join(0.05)
        assert server.started, "uvicorn did not start within 10 s"
        base = f"http://127.0.0.1:{port}/api/runs/{RUN}"

        def worker(n: int) -> None:
            with httpx.Client(timeout=20) as http:
                for i in range(6):
                    example = (n + i) % 3
                    got = http.get(f"{base}/examples/{example}/attention", params={"layer": 0, "head": 1})
                    if got.status_code != 200 or not np.array_equal(
                        np.array(got.json()["attention"], dtype=np.float32)[0, 0], maps[example][0, 1]
                    ):
                        failures.append(f"maps {example}: {got.status_code}")
                    tokens = http.get(f"{base}/examples/{example}").json()["tokens"]
                    if [t["token"] for t in tokens] != TOKENS[example]:
                        failures.append(f"tokens {example}")
                    hits = http.get(f"{base}/search", params={"upos": "NOUN"}).json()["hits"]
                    if len(hits) != 3:
                        failures.append("search")

        workers = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        assert not any(w.is_alive() for w in workers)
    finally:
        server.should_exit = True
        thread.join(10)
    assert failures == []


@pytest.mark.one_backend
def test_serve_command_errors_are_one_line(served, monkeypatch, tmp_path):
    import importlib.util

    from click.testing import CliRunner

    from attnstore.api.cli import main

    runner = CliRunner()
    assert "--allow-save" in runner.invoke(main, ["serve", "--help"]).output
    missing = runner.invoke(main, ["serve", "--db", f"sqlite:///{tmp_path / 'none.sqlite'}", "--root", str(tmp_path / "z")])
    assert missing.exit_code == 1 and "no store database" in missing.output and len(missing.output.strip().splitlines()) == 1
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real_find_spec(name, *a))
    store, _ = served
    result = runner.invoke(main, ["serve", "--db", store.locations.db_url, "--root", store.locations.array_root])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "this command needs the 'serve' extra (uvicorn is not installed): pip install 'attnstore[serve]'" in result.output
