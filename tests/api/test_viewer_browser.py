"""The web viewer in a real browser: headless Chromium (Debian's `chromium` + `chromium-driver`, driven by
Selenium) against `attnstore serve`'s app under uvicorn on 127.0.0.1, asserting on what is shown.

A hand-built store (exact maps, annotated words) checks the head view's lines, the matrix's pixels, the
per-head heatmap and the corpus search; a store ingested with the real model (marked `model`) is viewed
the same way. Screenshots go to $ATTNSTORE_SCREENSHOTS when set (docs/img/ holds the real-model ones:
`ATTNSTORE_SCREENSHOTS=docs/img pytest tests/api/test_viewer_browser.py -k real_ingest`), else to tmp_path.

Skipped, with the reason, where the browser, its driver, Selenium or the serve extra is not installed, except where
the browser is required: there (CI=true, or ATTNSTORE_REQUIRE_BROWSER=1, which `.ci/run` exports after installing
Chromium) each of these tests fails instead, so a green CI run has run them all.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from .browser_support import (
    BLACK,
    FIXTURES,
    PURPLE,
    REQUIRE_ENV,
    TOKEN_WORDS,
    TOKENS,
    WHITE,
    WORDS,
    YELLOW,
    canvas_pixel,
    hover_head,
    label_pixel,
    live_server,
    missing,
    model_view_pixel,
    pick,
    ready,
    screenshot_dir,
    texts,
    type_sentence,
    wait_for,
)

pytestmark = pytest.mark.slow  # a headless browser against a live server

try:
    import fastapi  # noqa: F401
except ImportError:
    missing("the serve extra (fastapi, uvicorn) is not installed")

from attnstore.queries import run_query  # noqa: E402


def test_viewer_shows_the_maps_heads_and_search(browser, hand_store, tmp_path):
    store, maps = hand_store
    shots = screenshot_dir(tmp_path)
    with live_server(store) as base:
        browser.get(base)
        # Example tab: the first example, layer 0, head 0 (uniform over 5 tokens: 25 lines, every cell 0.2)
        ready(browser, "headview", "hand|0|0|0")
        assert texts(browser, "#examples li .pos") == ["#0", "#1"]
        assert texts(browser, "#headview-svg text.tok-left") == TOKENS[0] == texts(browser, "#headview-svg text.tok-right")
        assert texts(browser, "#headview-svg text.special") == ["[CLS]", "[SEP]"] * 2
        assert len(browser.find_elements("css selector", "#headview-svg line.attn")) == 25
        assert "the cat sat" in browser.find_element("id", "example-text").text
        # L1-H2 attends to itself: 5 lines, each from a token to the same token; the matrix's diagonal is bright
        pick(browser, "layer-select", "1")
        pick(browser, "head-select", "2")
        ready(browser, "headview", "hand|0|1|2")
        lines = browser.find_elements("css selector", "#headview-svg line.attn")
        assert len(lines) == 5 and all(line.get_attribute("data-i") == line.get_attribute("data-j") for line in lines)
        matrix = ready(browser, "matrix", "hand|0|1|2")
        assert matrix.get_attribute("data-cells") == "25"
        assert canvas_pixel(browser, 2, 2) == YELLOW and canvas_pixel(browser, 2, 3) == PURPLE and canvas_pixel(browser, 4, 0) == PURPLE
        assert browser.current_url.endswith("#run=hand&example=0&layer=1&head=2&tab=example")  # a link to this view
        browser.save_screenshot(str(shots / "viewer-example-hand.png"))
        # the second example (6 tokens); L0-H1 attends to [CLS]: 6 lines into token 0, the first column bright
        browser.find_element("css selector", '#examples li[data-example="1"]').click()
        pick(browser, "layer-select", "0")
        pick(browser, "head-select", "1")
        ready(browser, "headview", "hand|1|0|1")
        assert texts(browser, "#headview-svg text.tok-left") == TOKENS[1]
        lines = browser.find_elements("css selector", "#headview-svg line.attn")
        assert len(lines) == 6 and {line.get_attribute("data-j") for line in lines} == {"0"}
        ready(browser, "matrix", "hand|1|0|1")
        assert canvas_pixel(browser, 3, 0) == YELLOW and canvas_pixel(browser, 3, 3) == PURPLE
        # every head of layer 0: 36 (uniform) + 6 (to [CLS]) + 36 (uniform) lines; hovering a token keeps its own
        pick(browser, "head-select", "all")
        ready(browser, "headview", "hand|1|0|all")
        assert len(browser.find_elements("css selector", "#headview-svg line.attn")) == 78
        from selenium.webdriver.common.action_chains import ActionChains

        ActionChains(browser).move_to_element(browser.find_elements("css selector", "#headview-svg text.tok-left")[2]).perform()
        wait_for(browser, lambda d: len(d.find_elements("css selector", "#headview-svg line.attn.on")) == 13, "hovered token's lines")

        # Heads tab: the saved entropy as a 2 x 3 heatmap; a head's cell opens it on the example
        browser.find_element("id", "tab-heads").click()
        summary = ready(browser, "summary", what="the per-head heatmap")
        assert summary.get_attribute("data-metric") == "entropy.entropy" and summary.get_attribute("data-source") == "saved"
        cells = browser.find_elements("css selector", "#summary-svg rect.hcell")
        assert len(cells) == 6
        saved = store.head_metrics("hand", metric="entropy.entropy").set_index(["layer", "head"])["value"]
        for cell in cells:
            layer, head = int(cell.get_attribute("data-layer")), int(cell.get_attribute("data-head"))
            assert float(cell.get_attribute("data-value")) == pytest.approx(saved[(layer, head)], abs=1e-9)
        assert (
            float(browser.find_element("css selector", '#summary-svg rect[data-layer="1"][data-head="2"]').get_attribute("data-value"))
            == 0.0
        )
        browser.save_screenshot(str(shots / "viewer-heads-hand.png"))
        pick(browser, "metric-select", '["special_tokens.to_cls",null]')  # not saved: computed on request
        wait_for(browser, lambda d: d.find_element("id", "summary").get_attribute("data-source") == "computed", "a computed metric")
        value = browser.find_element("css selector", '#summary-svg rect[data-layer="0"][data-head="1"]').get_attribute("data-value")
        assert float(value) == pytest.approx(1.0)
        browser.find_element("css selector", '#summary-svg rect[data-layer="1"][data-head="2"]').click()
        ready(browser, "headview", "hand|1|1|2")
        assert not browser.find_element("id", "view-example").get_attribute("hidden")

        # Search tab: nouns, and where they attend in L0-H1 ([CLS]), listed by example
        browser.find_element("id", "tab-search").click()
        wait_for(browser, lambda d: len(d.find_elements("css selector", "#search-upos option")) == 4, "the POS tags")
        pick(browser, "search-upos", "NOUN")
        pick(browser, "search-layer", "0")
        pick(browser, "search-head", "1")
        browser.find_element("id", "search-go").click()
        results = ready(browser, "search-results", what="search results")
        assert results.get_attribute("data-total") == "2"
        assert [e.get_attribute("data-example") for e in browser.find_elements("css selector", ".hit-example")] == ["0", "1"]
        hits = browser.find_elements("css selector", ".hit")
        assert [(h.get_attribute("data-example"), h.get_attribute("data-position")) for h in hits] == [("0", "2"), ("1", "2")]
        assert texts(browser, ".hit .tok.hit-token") == ["cat", "dog"]
        assert texts(browser, ".hit .tok.gold-head") == ["sat", "bark", "##ed"]
        assert all(t.startswith("attends most to: [CLS] (1.00)") for t in texts(browser, ".hit .top"))
        browser.save_screenshot(str(shots / "viewer-search-hand.png"))
        browser.find_element("id", "search-word").send_keys("zebra")
        browser.find_element("id", "search-go").click()
        wait_for(browser, lambda d: d.find_element("id", "search-results").get_attribute("data-total") == "0", "no hits")
        assert browser.find_element("id", "search-about").text == "no hits"
        # a bad request shows the server's error in the status line
        browser.find_element("id", "search-word").clear()
        pick(browser, "search-upos", "")
        browser.find_element("id", "search-go").click()
        wait_for(browser, lambda d: "at least one of word" in d.find_element("id", "status").text, "the error line")

        # the API reference page renders /openapi.json locally
        browser.get(base + "docs")
        wait_for(browser, lambda d: len(d.find_elements("css selector", "section.endpoint")) >= 10, "the API reference")
        assert any(t.endswith("/api/runs/{run}/search") for t in texts(browser, "section.endpoint h2"))
    severe = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE" and "status of 400" not in entry["message"]]
    assert severe == [], severe


@pytest.mark.model
def test_viewer_on_a_real_ingest(browser, tmp_path, loaded_model):
    """A few MRPC pairs ingested with the real model: the viewer shows their real tokens and maps."""
    from attnstore.ingest import ingest
    from attnstore.store import migrate, open_store

    url = f"sqlite:///{tmp_path / 'meta.sqlite'}"
    migrate.upgrade(url)
    store = open_store(db=url, root=str(tmp_path / "attention.zarr"))
    run = ingest(store, corpus=str(FIXTURES / "mrpc_dev_head.tsv"), fmt="pairs-tsv", loaded=loaded_model, progress=False).run.name
    for name, params in (("entropy", {}), ("special_tokens", {}), ("dependency", {"min_count": 10})):
        store.save_head_metrics(run, run_query(store, name, run=run, **params), prefix=name, params=params)
    det = store.head_metrics(run, metric="dependency.det:dep2head").sort_values(["value", "layer", "head"], ascending=[False, True, True])
    best_layer, best_head = int(det["layer"].iloc[0]), int(det["head"].iloc[0])
    shots = screenshot_dir(tmp_path)
    try:
        with live_server(store) as base:
            browser.get(f"{base}#run={run}&example=0&layer=2&head=3")
            ready(browser, "headview", f"{run}|0|2|3")
            tokens = store.tokens(run, 0)["token"].tolist()
            assert texts(browser, "#headview-svg text.tok-left") == tokens and tokens[0] == "[CLS]"
            weights = store.attention(run, 0, layer=[2], head=[3])[0, 0].astype(np.float64)
            lines = browser.find_elements("css selector", "#headview-svg line.attn")
            assert len(lines) == int((np.round(weights, 4) >= 0.02).sum())
            assert ready(browser, "matrix", f"{run}|0|2|3").get_attribute("data-cells") == str(len(tokens) ** 2)
            browser.save_screenshot(str(shots / "viewer-example.png"))
            # the model view: all 72 heads of the example from one request; hovering shows a head large
            view = ready(browser, "modelview", f"{run}|0", "the model view")
            assert (view.get_attribute("data-layers"), view.get_attribute("data-heads")) == ("6", "12")
            stored = store.attention(run, 0)
            for layer, head, i, j in ((0, 0, 0, 0), (2, 3, 5, 7), (5, 11, len(tokens) - 1, 0)):
                expected = browser.execute_script("return viridis(Math.round(arguments[0] * 255) / 255);", float(stored[layer, head, i, j]))
                assert model_view_pixel(browser, layer, head, i, j) == expected
            browser.execute_script("document.getElementById('modelview').scrollIntoView();")
            hover_head(browser, 4, 6)
            ready(browser, "zoom", f"{run}|0|4|6", "the hovered head")
            browser.save_screenshot(str(shots / "viewer-model-view.png"))
            browser.execute_script("window.scrollTo(0, 0);")
            # a typed sentence: the run's model on it at once, shown in the same views
            from attnstore.ingest.scratch import attention_for_text

            typed_text = "The cat sat on the mat because it was tired."
            want = attention_for_text(loaded_model, typed_text)
            type_sentence(browser, typed_text)
            ready(browser, "typed-form", what="the typed sentence")
            ready(browser, "headview", f"{run}|typed|2|3", "the typed sentence's head view")
            assert texts(browser, "#headview-svg text.tok-left") == want.token_texts
            ready(browser, "modelview", f"{run}|typed", "the typed sentence's model view")
            for layer, head, i, j in ((0, 0, 0, 0), (3, 9, 4, 6), (5, 11, len(want.tokens) - 1, 0)):
                value = float(want.attention[layer, head, i, j])
                expected = browser.execute_script("return viridis(Math.round(arguments[0] * 255) / 255);", value)
                assert model_view_pixel(browser, layer, head, i, j) == expected
            browser.save_screenshot(str(shots / "viewer-typed.png"))
            browser.find_element("id", "typed-back").click()
            ready(browser, "headview", f"{run}|0|2|3", "the stored example again")

            browser.find_element("id", "tab-heads").click()
            assert ready(browser, "summary").get_attribute("data-metric") == "entropy.entropy"  # the default
            from selenium.webdriver.support.ui import Select

            Select(browser.find_element("id", "metric-select")).select_by_visible_text('dependency.det:dep2head {"min_count": 10}')
            wait_for(
                browser,
                lambda d: d.find_element("id", "summary").get_attribute("data-metric") == "dependency.det:dep2head",
                "the det heatmap",
            )
            ready(browser, "summary")
            assert len(browser.find_elements("css selector", "#summary-svg rect.hcell")) == 72
            browser.save_screenshot(str(shots / "viewer-heads.png"))

            browser.find_element("id", "tab-search").click()
            wait_for(browser, lambda d: len(d.find_elements("css selector", "#search-deprel option")) > 5, "the relations")
            pick(browser, "search-deprel", "det")
            pick(browser, "search-layer", str(best_layer))
            pick(browser, "search-head", str(best_head))
            browser.find_element("id", "search-go").click()
            ready(browser, "search-results", what="search results")
            n_det = 0  # determiners, counted once per word (the search lists a word's first piece)
            for example in range(12):
                toks = store.tokens(run, example)
                n_det += toks[toks["deprel"] == "det"]["word_position"].nunique()
            assert browser.find_element("id", "search-results").get_attribute("data-total") == str(n_det) and n_det > 20
            assert len(browser.find_elements("css selector", ".hit")) == 20
            browser.save_screenshot(str(shots / "viewer-search.png"))
    finally:
        store.close()


SLASHED = ["glue/MRPC-dev-x", "ud/en_ewt-dev[sample=5,seed=0]-all-MiniLM-L6-v2"]  # as default run names look


def test_viewer_shows_runs_whose_names_hold_a_slash(browser, tmp_path, make_run):
    """Runs named like glue/MRPC-dev-... or ud/en_ewt-dev[sample=500,seed=0]-...: the viewer lists and shows each one
    (its API paths name the run by id), on a read-only server, where a metric that must read unsummarised maps is
    offered as a button rather than read unasked."""
    from urllib.parse import quote

    from attnstore.store import migrate, open_store

    url = f"sqlite:///{tmp_path / 'meta.sqlite'}"
    migrate.upgrade(url)
    store = open_store(db=url, root=str(tmp_path / "attention.zarr"))
    for k, name in enumerate(SLASHED):
        maps = []
        for tokens in TOKENS:
            n = len(tokens)
            m = np.full((2, 3, n, n), 1.0 / n, dtype=np.float32)
            m[1, 2] = np.eye(n, dtype=np.float32) if k == 0 else 0.0  # the first run: L1-H2 to itself
            if k == 1:
                m[1, 2, :, 0] = 1.0  # the second run: L1-H2 to [CLS]
            maps.append(m)
        make_run(store, maps, TOKENS, name=name, words_list=WORDS, token_words=TOKEN_WORDS)
    try:
        with live_server(store.locations) as base:  # opened read-only, as `attnstore serve` opens it
            browser.get(f"{base}#run={quote(SLASHED[0], safe='')}&example=1&layer=1&head=2")
            ready(browser, "headview", f"{SLASHED[0]}|1|1|2", what="the first run's head view")
            assert texts(browser, "#headview-svg text.tok-left") == TOKENS[1]
            lines = browser.find_elements("css selector", "#headview-svg line.attn")
            assert len(lines) == 6 and all(line.get_attribute("data-i") == line.get_attribute("data-j") for line in lines)
            assert [o.get_attribute("value") for o in browser.find_elements("css selector", "#run-select option")] == SLASHED
            assert "2 examples" in browser.find_element("id", "run-about").text
            pick(browser, "run-select", SLASHED[1])
            ready(browser, "headview", f"{SLASHED[1]}|0|0|0", what="the second run's head view")
            pick(browser, "layer-select", "1")
            pick(browser, "head-select", "2")
            ready(browser, "headview", f"{SLASHED[1]}|0|1|2")
            lines = browser.find_elements("css selector", "#headview-svg line.attn")
            assert len(lines) == 5 and {line.get_attribute("data-j") for line in lines} == {"0"}
            assert "run=ud%2Fen_ewt-dev%5Bsample%3D5%2Cseed%3D0%5D-all-MiniLM-L6-v2" in browser.current_url

            # Heads tab: entropy is neither saved nor summarised, and a read-only server keeps nothing it reads
            browser.find_element("id", "tab-heads").click()
            button = wait_for(browser, lambda d: d.find_elements("id", "metric-scan"), "the offer to read the maps")[0]
            assert "summarize --run" in browser.find_element("id", "status").text
            assert browser.find_element("id", "summary").get_attribute("data-state") == "error"
            button.click()
            summary = ready(browser, "summary", what="the heatmap read on request")
            assert summary.get_attribute("data-source") == "computed"
            cell = browser.find_element("css selector", '#summary-svg rect[data-layer="1"][data-head="2"]')
            assert float(cell.get_attribute("data-value")) == pytest.approx(0.0, abs=1e-6)  # one-hot rows

            browser.find_element("id", "tab-search").click()
            wait_for(browser, lambda d: len(d.find_elements("css selector", "#search-upos option")) == 4, "the POS tags")
            pick(browser, "search-upos", "NOUN")
            browser.find_element("id", "search-go").click()
            assert ready(browser, "search-results", what="search results").get_attribute("data-total") == "2"
    finally:
        store.close()
    severe = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE" and "status of 409" not in entry["message"]]
    assert severe == [], severe


def test_a_head_is_shown_beside_its_match_in_another_run(browser, hand_store, tmp_path):
    """A second run over the same examples with the two layers swapped: head 1-2 (each token on itself) is shown beside
    its match there, head 0-2, found by head_match."""
    from attnstore.tests.queries.helpers import hand_run, write_blocks

    store, maps = hand_store
    info = store.run_info("hand")
    swapped = hand_run(store, "swapped", dataset_id=info.dataset_id, n_layers=2, n_heads=3, dtype="float32", specials=info.special_tokens)
    ids = store.examples("hand").set_index("example")["example_id"]
    rows = store.token_table("hand")
    blocks = []
    for example, m in enumerate(maps):
        tokens = rows[rows["example"] == example]
        token_rows = [
            dict(
                token=t.token,
                token_id=int(t.token_id),
                word_position=None if t.is_special else int(t.word_position),
                segment=0,
                is_special=bool(t.is_special),
                char_start=None,
                char_end=None,
            )
            for t in tokens.itertuples()
        ]
        blocks.append((ids[example], m[::-1].copy(), token_rows))
    write_blocks(store, swapped.id, blocks)
    with live_server(store) as base:
        browser.get(base + "#run=hand&example=0&layer=1&head=2&tab=example")
        ready(browser, "matrix", "hand|0|1|2")
        assert browser.find_element("id", "match").get_attribute("hidden")  # no other run chosen yet
        assert [o.get_attribute("value") for o in browser.find_elements("css selector", "#compare-select option")] == ["", "swapped"]
        pick(browser, "compare-select", "swapped")
        match = ready(browser, "match", "swapped|0|0|2", "the matched head")
        assert match.get_attribute("data-cells") == "25"
        assert browser.find_element("id", "match-caption").text.startswith("(swapped: layer 0, head 2; distance 0.000")
        assert browser.current_url.endswith("&compare=swapped")
        cell, margin = float(match.get_attribute("data-cell")), float(match.get_attribute("data-margin"))
        centre = margin + 2.5 * cell  # the middle of cell (2, 2)
        pixel = browser.execute_script(
            """const c = document.getElementById('match-canvas'), r = c.width / c.clientWidth, x = Math.floor(arguments[0] * r);
            return Array.from(c.getContext('2d').getImageData(x, x, 1, 1).data.slice(0, 3));""",
            centre,
        )
        assert pixel == YELLOW  # the match attends to itself: a bright diagonal
        browser.save_screenshot(str(screenshot_dir(tmp_path) / "viewer-head-match-hand.png"))
        pick(browser, "head-select", "all")  # every head of a layer: no single head to match
        ready(browser, "headview", "hand|0|1|all")
        wait_for(browser, lambda d: d.find_element("id", "match").get_attribute("hidden"), "the match panel hidden")
    # on a read-only server nothing can be kept: the panel asks before reading the maps, then draws the match
    from attnstore.store import open_store

    shutil.rmtree(Path(store.locations.array_root) / "runs" / "hand" / "summary")  # what the writable server kept
    reader = open_store(db=store.locations.db_url, root=store.locations.array_root, read_only=True)
    try:
        with live_server(reader) as base:
            browser.get(base + "#run=hand&example=0&layer=1&head=2&tab=example&compare=swapped")
            ready(browser, "matrix", "hand|0|1|2")
            wait_for(browser, lambda d: d.find_elements("id", "match-scan"), "the offer to read the maps")
            assert "not computed for swapped yet" in browser.find_element("id", "match-caption").text
            browser.find_element("id", "match-scan").click()
            ready(browser, "match", "swapped|0|0|2", "the match read from the maps")
    finally:
        reader.close()


def test_labelling_page_writes_the_labellers_labels(browser, hand_store, tmp_path):
    from selenium.webdriver.common.keys import Keys

    from attnstore.api.serve import ServeSettings

    store, maps = hand_store
    run_id = store.run_info("hand").id
    first = int(np.random.default_rng(0).permutation(2)[0])  # next_map's order: examples by default_rng(0), then heads
    with live_server(store, ServeSettings(allow_save=True)) as base:
        browser.get(base + "label")
        browser.execute_script("localStorage.clear(); sessionStorage.clear();")
        browser.get(base + "label")
        browser.find_element("id", "labeller").send_keys("tester", Keys.TAB)
        ready(browser, "label-map", f"{run_id}.{first}.0.0", "the first map")
        n = len(TOKENS[first])
        assert browser.find_element("id", "label-map").get_attribute("data-length") == str(n)
        assert label_pixel(browser, 1, 1) == BLACK  # uniform: every cell at the maximum
        browser.save_screenshot(str(screenshot_dir(tmp_path) / "label-page-hand.png"))
        body = browser.find_element("tag name", "body")
        body.send_keys("1")  # vertical, then the next head: L0-H1 attends to [CLS]
        ready(browser, "label-map", f"{run_id}.{first}.0.1", "the second map")
        assert label_pixel(browser, 2, 0) == BLACK and label_pixel(browser, 2, 3) == WHITE
        body.send_keys("s")  # skipped: not labelled
        ready(browser, "label-map", f"{run_id}.{first}.0.2", "the third map")
        body.send_keys("h")
        ready(browser, "label-map", f"{run_id}.{first}.1.0", "the fourth map")
        browser.find_element("css selector", '.label-button[data-label="vertical+diagonal"]').click()
        ready(browser, "label-map", f"{run_id}.{first}.1.1", "the fifth map")
        wait_for(browser, lambda d: "3 labelled by tester" in d.find_element("id", "label-count").text, "the count")
    saved = store.pattern_labels("hand", source="human:tester")
    assert sorted(zip(saved["example"], saved["layer"], saved["head"], saved["label"])) == [
        (first, 0, 0, "vertical"),
        (first, 0, 2, "heterogeneous"),
        (first, 1, 0, "vertical+diagonal"),
    ]
    with live_server(store.locations) as base:  # read-only, as `attnstore serve` opens it without --allow-save
        browser.get(base + "label")  # another port: another origin, so the name is asked again
        browser.find_element("id", "labeller").send_keys("tester", Keys.TAB)
        ready(browser, "label-map", f"{run_id}.{first}.0.1", "the first map tester has not labelled, read-only")
        assert "read-only server" in browser.find_element("id", "status").text
        browser.find_element("tag name", "body").send_keys("2")
        wait_for(browser, lambda d: "error" in (d.find_element("id", "status").get_attribute("class") or ""), "the refusal")
        message = browser.find_element("id", "status").text
        assert "read-only" in message and "--allow-save" in message and "\n" not in message
    assert len(store.pattern_labels("hand", source="human:tester")) == 3


def test_a_missing_browser_fails_where_the_browser_tests_are_required(monkeypatch):
    """`.ci/run` exports ATTNSTORE_REQUIRE_BROWSER=1: there a missing browser fails the browser tests, where
    elsewhere (a developer's machine without Chromium) they skip, saying why."""
    ci_run = (Path(__file__).parents[2] / ".ci" / "run").read_text(encoding="utf-8")
    assert f"export {REQUIRE_ENV}=1" in ci_run
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        missing("it is not installed")
    for name, value in ((REQUIRE_ENV, "1"), ("CI", "true")):
        monkeypatch.setenv(name, value)
        with pytest.raises(pytest.fail.Exception, match="required here .* but it is not installed"):
            missing("it is not installed")
        monkeypatch.delenv(name)
