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

import contextlib
import os
import shutil
import socket
import threading
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # a headless browser against a live server

REQUIRE_ENV = "ATTNSTORE_REQUIRE_BROWSER"


def browser_required() -> bool:
    """Whether a missing browser (or serve extra) fails these tests rather than skipping them: CI=true, or
    ATTNSTORE_REQUIRE_BROWSER set to anything but 0 (`.ci/run` exports it)."""
    return os.environ.get("CI", "").lower() == "true" or os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def missing(why: str) -> None:
    """Skip for `why`, or fail where the browser tests are required."""
    if browser_required():
        pytest.fail(f"the browser tests are required here (CI=true or {REQUIRE_ENV}=1) but {why}", pytrace=False)
    pytest.skip(why)


try:
    import fastapi  # noqa: F401
except ImportError:
    missing("the serve extra (fastapi, uvicorn) is not installed")

from attnstore.api.serve import create_app  # noqa: E402
from attnstore.queries import run_query  # noqa: E402

WAIT_S = 20  # every wait for the page is bounded
FIXTURES = Path(__file__).parents[1] / "fixtures"

TOKENS = [["[CLS]", "the", "cat", "sat", "[SEP]"], ["[CLS]", "a", "dog", "bark", "##ed", "[SEP]"]]
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
]
TOKEN_WORDS = [[None, 0, 1, 2, None], [None, 0, 1, 2, 2, None]]


def browser_paths() -> tuple[str, str] | None:
    binary = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which("chromedriver") or next((p for p in ("/usr/lib/chromium/chromedriver",) if os.path.exists(p)), None)
    return (binary, driver) if binary and driver else None


@pytest.fixture(scope="module")
def browser():
    paths = browser_paths()
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        paths = None
    if paths is None:
        missing("headless Chromium is not installed (apt-get install chromium chromium-driver; pip install selenium)")
    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(paths[1]), options=options)  # the system driver: nothing is downloaded
    driver.set_page_load_timeout(WAIT_S)
    driver.set_script_timeout(WAIT_S)
    yield driver
    driver.quit()


@contextlib.contextmanager
def live_server(store, settings=None):
    """The app under uvicorn on a free 127.0.0.1 port, in a background thread."""
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = create_app(store, settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(WAIT_S * 20):
            if server.started or not thread.is_alive():
                break
            thread.join(0.05)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(WAIT_S)


def screenshot_dir(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("ATTNSTORE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def wait_for(driver, condition, what: str):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(lambda d: condition(d))
    except TimeoutException:
        status = driver.find_element("id", "status").text
        raise AssertionError(f"timed out waiting for {what}; status line: {status!r}") from None


def ready(driver, element_id: str, key: str | None = None, what: str = ""):
    def check(d):
        element = d.find_element("id", element_id)
        return (
            element
            if element.get_attribute("data-state") == "ready" and (key is None or element.get_attribute("data-key") == key)
            else None
        )

    return wait_for(driver, check, what or f"#{element_id} to be drawn")


def texts(driver, selector: str) -> list[str]:
    return [e.get_attribute("textContent") for e in driver.find_elements("css selector", selector)]


def pick(driver, select_id: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", select_id)).select_by_value(value)


def canvas_pixel(driver, i: int, j: int) -> list[int]:
    """The colour drawn at the centre of matrix cell (query i, key j)."""
    return driver.execute_script(
        """const fig = document.getElementById('matrix'), c = document.getElementById('matrix-canvas');
        const cell = Number(fig.dataset.cell), margin = Number(fig.dataset.margin), r = c.width / c.clientWidth;
        const x = Math.floor((margin + arguments[1] * cell + cell / 2) * r), y = Math.floor((margin + arguments[0] * cell + cell / 2) * r);
        return Array.from(c.getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3));""",
        i,
        j,
    )


YELLOW, PURPLE = [253, 231, 37], [68, 1, 84]  # viridis at 1 and at 0


@pytest.fixture
def hand_store(tmp_path, make_run):
    from attnstore.store import migrate, open_store

    url = f"sqlite:///{tmp_path / 'meta.sqlite'}"
    migrate.upgrade(url)
    store = open_store(db=url, root=str(tmp_path / "attention.zarr"))
    maps = []
    for tokens in TOKENS:
        n = len(tokens)
        m = np.full((2, 3, n, n), 1.0 / n, dtype=np.float32)  # uniform, except:
        m[1, 2] = np.eye(n, dtype=np.float32)  # L1-H2 attends to itself
        m[0, 1] = 0.0
        m[0, 1, :, 0] = 1.0  # L0-H1 attends to [CLS]
        maps.append(m)
    make_run(store, maps, TOKENS, name="hand", words_list=WORDS, token_words=TOKEN_WORDS)
    store.save_head_metrics("hand", run_query(store, "entropy", run="hand"), prefix="entropy")
    yield store, maps
    store.close()


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


def label_pixel(driver, i: int, j: int) -> list[int]:
    """The colour drawn at the centre of the labelling page's cell (query i, key j)."""
    return driver.execute_script(
        """const fig = document.getElementById('label-map'), c = document.getElementById('label-canvas');
        const cell = Number(fig.dataset.cell), margin = Number(fig.dataset.margin), r = c.width / c.clientWidth;
        const x = Math.floor((margin + arguments[1] * cell + cell / 2) * r), y = Math.floor((margin + arguments[0] * cell + cell / 2) * r);
        return Array.from(c.getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3));""",
        i,
        j,
    )


BLACK, WHITE = [0, 0, 0], [255, 255, 255]


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


# ------------------------------------------------------------------ the model view and a typed sentence (issue 29)


def pixel_of(driver, canvas_id: str, x: float, y: float) -> list[int]:
    """The colour drawn at CSS pixel (x, y) of a canvas."""
    return driver.execute_script(
        """const c = document.getElementById(arguments[0]), r = c.width / c.clientWidth;
        const x = Math.floor(arguments[1] * r), y = Math.floor(arguments[2] * r);
        return Array.from(c.getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3));""",
        canvas_id,
        x,
        y,
    )


def model_view_pixel(driver, layer: int, head: int, i: int, j: int) -> list[int]:
    """The colour at the centre of token cell (query i, key j) of head (layer, head) in the model view's grid."""
    d = driver.find_element("id", "modelview").get_attribute
    cell, gap, left, top, n = (float(d(k)) for k in ("data-cell", "data-gap", "data-left", "data-top", "data-tokens"))
    x = left + head * (cell + gap) + (j + 0.5) * cell / n
    y = top + layer * (cell + gap) + (i + 0.5) * cell / n
    return pixel_of(driver, "modelview-canvas", x, y)


def zoom_pixel(driver, i: int, j: int) -> list[int]:
    d = driver.find_element("id", "zoom").get_attribute
    cell, margin = float(d("data-cell")), float(d("data-margin"))
    return pixel_of(driver, "zoom-canvas", margin + j * cell + cell / 2, margin + i * cell + cell / 2)


def hover_head(driver, layer: int, head: int, click: bool = False) -> None:
    """Move the pointer over head (layer, head) of the model view (and click it)."""
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = driver.find_element("id", "modelview-canvas")
    d = driver.find_element("id", "modelview").get_attribute
    cell, gap, left, top = (float(d(k)) for k in ("data-cell", "data-gap", "data-left", "data-top"))
    x = left + head * (cell + gap) + cell / 2 - canvas.size["width"] / 2
    y = top + layer * (cell + gap) + cell / 2 - canvas.size["height"] / 2
    chain = ActionChains(driver).move_to_element_with_offset(canvas, int(x), int(y))
    (chain.click() if click else chain).perform()


def npy_requests(driver) -> list[str]:
    return driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes('format=npy'));")


def test_the_model_view_shows_every_head_and_hovering_shows_one_large(browser, hand_store, tmp_path):
    store, maps = hand_store
    with live_server(store) as base:
        browser.get(base + "#run=hand&example=0&layer=0&head=0")
        view = ready(browser, "modelview", "hand|0", "the model view")
        assert (view.get_attribute("data-layers"), view.get_attribute("data-heads"), view.get_attribute("data-tokens")) == ("2", "3", "5")
        assert len(npy_requests(browser)) == 1  # every map of the example in one request
        # L1-H2 attends to itself, L0-H1 to [CLS]: bright diagonal, bright first column; the rest uniform (0.2)
        assert model_view_pixel(browser, 1, 2, 3, 3) == YELLOW and model_view_pixel(browser, 1, 2, 3, 1) == PURPLE
        assert model_view_pixel(browser, 0, 1, 4, 0) == YELLOW and model_view_pixel(browser, 0, 1, 4, 4) == PURPLE
        uniform = browser.execute_script("return viridis(Math.round(0.2 * 255) / 255);")
        assert model_view_pixel(browser, 0, 0, 2, 3) == uniform and model_view_pixel(browser, 1, 1, 0, 4) == uniform
        # hovering a head shows it large, with its values under the pointer
        hover_head(browser, 1, 2)
        ready(browser, "zoom", "hand|0|1|2", "the hovered head, large")
        assert browser.find_element("id", "zoom-caption").text == "(layer 1, head 2)"
        assert view.get_attribute("data-hover") == "1,2" and browser.find_element("id", "modelview-mark").is_displayed()
        assert zoom_pixel(browser, 2, 2) == YELLOW and zoom_pixel(browser, 2, 1) == PURPLE
        hover_head(browser, 0, 1)
        ready(browser, "zoom", "hand|0|0|1", "another hovered head")
        assert zoom_pixel(browser, 3, 0) == YELLOW and zoom_pixel(browser, 3, 3) == PURPLE
        browser.save_screenshot(str(screenshot_dir(tmp_path) / "viewer-model-view-hand.png"))
        # clicking a head picks it for the head view and the matrix
        hover_head(browser, 1, 2, click=True)
        ready(browser, "headview", "hand|0|1|2", "the clicked head in the head view")
        assert browser.find_element("id", "head-select").get_attribute("value") == "2"
        # another example: its own single request; back to the first: from memory
        browser.find_element("css selector", '#examples li[data-example="1"]').click()
        ready(browser, "modelview", "hand|1", "the second example's model view")
        assert browser.find_element("id", "modelview").get_attribute("data-tokens") == "6"
        assert model_view_pixel(browser, 0, 1, 5, 0) == YELLOW
        assert len(npy_requests(browser)) == 2


@pytest.fixture
def tiny_store(tmp_path, tiny_bert):
    pytest.importorskip("torch")
    from attnstore.ingest.runner import ingest
    from attnstore.store import migrate, open_store

    url = f"sqlite:///{tmp_path / 'meta.sqlite'}"
    migrate.upgrade(url)
    store = open_store(db=url, root=str(tmp_path / "attention.zarr"))
    corpus = tmp_path / "tiny.txt"
    corpus.write_text("the cat sat on the mat.\na dog ran.\n", encoding="utf-8")
    ingest(store, corpus=str(corpus), fmt="text", model=tiny_bert, annotator="whitespace", name="tiny", progress=False)
    yield store
    store.close()


def type_sentence(driver, text: str, text_b: str = "") -> None:
    for field, value in (("typed-text", text), ("typed-text-b", text_b)):
        box = driver.find_element("id", field)
        box.clear()
        box.send_keys(value)
    driver.find_element("id", "typed-go").click()


def test_a_typed_sentence_is_run_and_shown_at_once(browser, tiny_store, tiny_bert, tmp_path):
    from attnstore.api.serve import ServeSettings
    from attnstore.ingest.scratch import attention_for_text

    text, text_b = "dogs bark.", "cats hiss!"
    want = attention_for_text(tiny_bert, text, text_b)
    with live_server(tiny_store) as base:
        browser.get(base + "#run=tiny&example=0&layer=1&head=2")
        ready(browser, "modelview", "tiny|0", "the stored example's model view")
        assert browser.find_element("id", "typed-save-label").get_attribute("hidden")  # read-only: no saving
        type_sentence(browser, text, text_b)
        form = ready(browser, "typed-form", what="the typed sentence")
        ready(browser, "headview", "tiny|typed|1|2", "the typed sentence's head view")
        assert texts(browser, "#headview-svg text.tok-left") == want.token_texts
        assert "typed A" in browser.find_element("id", "example-text").text and text_b in browser.find_element("id", "example-text").text
        assert "not stored" in browser.find_element("id", "typed-about").text
        view = ready(browser, "modelview", "tiny|typed", "the typed sentence's model view")
        assert (view.get_attribute("data-layers"), view.get_attribute("data-heads")) == ("2", "4")
        assert int(view.get_attribute("data-tokens")) == len(want.tokens)
        for layer, head, i, j in ((0, 0, 0, 0), (1, 3, 2, 5), (1, 2, len(want.tokens) - 1, 1)):
            value = float(want.attention[layer, head, i, j])
            expected = browser.execute_script("return viridis(Math.round(arguments[0] * 255) / 255);", value)
            assert model_view_pixel(browser, layer, head, i, j) == expected, (layer, head, i, j)
        hover_head(browser, 0, 3)
        ready(browser, "zoom", "tiny|typed|0|3", "the typed sentence's hovered head")
        for i, j in ((0, 0), (3, 4)):
            expected = browser.execute_script("return viridis(arguments[0]);", float(want.attention[0, 3, i, j]))
            assert zoom_pixel(browser, i, j) == expected
        ms = float(form.get_attribute("data-ms"))
        browser.save_screenshot(str(screenshot_dir(tmp_path) / "viewer-typed-tiny.png"))
        # back to the stored example
        browser.find_element("id", "typed-back").click()
        ready(browser, "headview", "tiny|0|1|2", "the stored example again")
        assert ms < 10_000
    assert tiny_store.runs()["run"].tolist() == ["tiny"]  # nothing was kept
    # a server that may write: "save as a run" keeps it as a run of its own
    with live_server(tiny_store, ServeSettings(allow_save=True, allowed_hosts=("127.0.0.1",))) as base:
        browser.get(base + "#run=tiny&example=0")
        ready(browser, "modelview", "tiny|0", "the stored example's model view")
        assert not browser.find_element("id", "typed-save-label").get_attribute("hidden")
        browser.find_element("id", "typed-save").click()
        type_sentence(browser, text, text_b)
        saved = wait_for(browser, lambda d: d.find_element("id", "typed-form").get_attribute("data-saved") or None, "the saved sentence")
        assert saved.startswith("scratch/tiny/") and "saved as run" in browser.find_element("id", "typed-about").text
    np.testing.assert_array_equal(tiny_store.attention(saved, 0), want.attention)


def test_without_the_ingest_extra_the_text_box_says_so(browser, tiny_store, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # as if torch were not installed
    with live_server(tiny_store) as base:
        browser.get(base + "#run=tiny&example=0")
        ready(browser, "modelview", "tiny|0", "the stored example's model view")  # the rest of the viewer works
        about = wait_for(browser, lambda d: d.find_element("id", "typed-about").text or None, "the text box's note")
        assert about.startswith("typing a sentence is not available: the ingest extra is not installed (torch is missing)")
        assert browser.find_element("id", "typed-go").get_attribute("disabled") and browser.find_element("id", "typed-text").get_attribute(
            "disabled"
        )


# ------------------------------------------------------------------ the URL on Back/Forward, the colour bar (issue 49)


def shown_tab(driver) -> str:
    return next(name for name in ("example", "heads", "search") if not driver.find_element("id", f"view-{name}").get_attribute("hidden"))


def showing(driver, tab: str, key: str | None = None, what: str = ""):
    """Wait until the viewer shows `tab` (and, on the Example tab, the head view of `key`)."""

    def check(d):
        if shown_tab(d) != tab:
            return None
        element = d.find_element("id", "headview")
        return key is None or (element.get_attribute("data-state") == "ready" and element.get_attribute("data-key") == key)

    wait_for(driver, check, what or f"the {tab} tab showing {key}")


def selected_example(driver) -> list[str]:
    return [li.get_attribute("data-example") for li in driver.find_elements("css selector", "#examples li.selected")]


def test_back_forward_and_a_pasted_link_change_the_view(browser, hand_store):
    """Each choice made in the page is a history entry; Back and Forward show the view their URL names, and a link
    pasted in the address bar shows its view, without reloading the page."""
    store, _ = hand_store
    browser.get_log("browser")  # what earlier tests left in the log
    with live_server(store) as base:
        browser.get(base + "#run=hand&example=0&layer=0&head=0")
        ready(browser, "headview", "hand|0|0|0")
        browser.execute_script("window.notReloaded = true;")
        pick(browser, "layer-select", "1")
        ready(browser, "headview", "hand|0|1|0")
        pick(browser, "head-select", "2")
        ready(browser, "headview", "hand|0|1|2")
        browser.find_element("css selector", '#examples li[data-example="1"]').click()
        ready(browser, "headview", "hand|1|1|2")
        browser.find_element("id", "tab-heads").click()
        ready(browser, "summary", what="the per-head heatmap")
        assert "tab=heads" in browser.current_url

        browser.back()
        showing(browser, "example", "hand|1|1|2", "Back: the Example tab again")
        assert browser.current_url.endswith("#run=hand&example=1&layer=1&head=2&tab=example")
        browser.back()
        showing(browser, "example", "hand|0|1|2", "Back: the first example")
        assert selected_example(browser) == ["0"] and texts(browser, "#headview-svg text.tok-left") == TOKENS[0]
        browser.back()
        showing(browser, "example", "hand|0|1|0", "Back: head 0")
        assert browser.find_element("id", "head-select").get_attribute("value") == "0"
        browser.back()
        showing(browser, "example", "hand|0|0|0", "Back: layer 0")
        assert browser.find_element("id", "layer-select").get_attribute("value") == "0"
        assert len(browser.find_elements("css selector", "#headview-svg line.attn")) == 25  # uniform: every line
        browser.forward()
        showing(browser, "example", "hand|0|1|0", "Forward: layer 1")
        assert browser.find_element("id", "layer-select").get_attribute("value") == "1"
        browser.forward()
        browser.forward()
        showing(browser, "example", "hand|1|1|2", "Forward: the second example")
        assert selected_example(browser) == ["1"]
        browser.forward()
        showing(browser, "heads", what="Forward: the Heads tab")
        ready(browser, "summary", what="the per-head heatmap again")

        # a link pasted (or edited) in the address bar: its view, at once
        browser.get(base + "#run=hand&example=1&layer=0&head=1&tab=example")
        showing(browser, "example", "hand|1|0|1", "the pasted link's view")
        lines = browser.find_elements("css selector", "#headview-svg line.attn")
        assert len(lines) == 6 and {line.get_attribute("data-j") for line in lines} == {"0"}  # L0-H1: to [CLS]
        assert (
            browser.find_element("id", "layer-select").get_attribute("value"),
            browser.find_element("id", "head-select").get_attribute("value"),
        ) == (
            "0",
            "1",
        )
        browser.back()  # the Heads tab, from before the link
        showing(browser, "heads", what="Back from the pasted link")
        assert browser.execute_script("return window.notReloaded === true;")  # all of it in one page load
    severe = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert severe == [], severe


def test_the_matrix_has_a_labelled_colour_bar(browser, hand_store, tmp_path):
    """Beside the matrix: the viridis scale of the attention weights, 0 at the bottom to 1 at the top, ticked and
    labelled, running beside the heatmap's cells."""
    import io

    from PIL import Image

    store, _ = hand_store
    with live_server(store) as base:
        browser.get(base + "#run=hand&example=0&layer=1&head=2")
        matrix = ready(browser, "matrix", "hand|0|1|2")
        bar = browser.find_element("id", "matrix-colorbar")
        assert texts(browser, "#matrix-colorbar text.tick") == ["0", "0.2", "0.4", "0.6", "0.8", "1"]
        assert texts(browser, "#matrix-colorbar text.label") == ["attention weight"]
        top, height = float(bar.get_attribute("data-top")), float(bar.get_attribute("data-height"))
        assert top == float(matrix.get_attribute("data-margin")) and height >= 5 * float(matrix.get_attribute("data-cell"))
        canvas, svg = browser.find_element("id", "matrix-canvas").rect, bar.rect
        assert svg["x"] >= canvas["x"] + canvas["width"] and svg["y"] == canvas["y"]  # beside it, level with it
        image = Image.open(io.BytesIO(bar.screenshot_as_png)).convert("RGB")
        for y in (int(top) + 1, int(top + height / 2), int(top + height) - 2):  # the bar's colour at y: viridis there
            want = browser.execute_script("return viridis(arguments[0]);", 1 - (y + 0.5 - top) / height)
            assert all(abs(a - b) <= 4 for a, b in zip(image.getpixel((6, y)), want)), (y, image.getpixel((6, y)), want)
        assert max(abs(a - b) for a, b in zip(image.getpixel((6, int(top) + 1)), YELLOW)) <= 6
        assert max(abs(a - b) for a, b in zip(image.getpixel((6, int(top + height) - 2)), PURPLE)) <= 6
        # the other heatmaps with the same scale carry it too: the model view's hovered head
        ready(browser, "zoom", "hand|0|1|2", "the model view's large head")
        assert texts(browser, "#zoom-colorbar text.tick")[-1] == "1"
        browser.save_screenshot(str(screenshot_dir(tmp_path) / "viewer-colorbar-hand.png"))


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
