"""The web viewer in a real browser, continued: the model view of every head, a typed sentence, the URL on Back and
Forward, the colour bar (the browser, live server and hand-built store: tests/api/conftest.py, browser_support.py)."""

from __future__ import annotations

import numpy as np
import pytest

from .browser_support import (
    PURPLE,
    TOKENS,
    YELLOW,
    hover_head,
    live_server,
    missing,
    model_view_pixel,
    npy_requests,
    pick,
    ready,
    screenshot_dir,
    selected_example,
    showing,
    texts,
    type_sentence,
    wait_for,
    zoom_pixel,
)

pytestmark = pytest.mark.slow  # a headless browser against a live server

try:
    import fastapi  # noqa: F401
except ImportError:
    missing("the serve extra (fastapi, uvicorn) is not installed")


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
