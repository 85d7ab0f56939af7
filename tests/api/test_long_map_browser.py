"""The long-map page (api/web/long.html) in headless Chromium: an 8,192-token map of a tiny decoder's Q/K run browsed
by zooming: the pixels are the server's tiles, zooming in shows the tokens, the URL keeps the view. Prints the time
each view took to draw (docs/PERFORMANCE.md)."""

from __future__ import annotations

import numpy as np
import pytest

from .browser_support import WAIT_S, live_server, missing, screenshot_dir, wait_for

pytestmark = pytest.mark.slow  # a headless browser against a live server

try:
    import fastapi  # noqa: F401
except ImportError:
    missing("the serve extra (fastapi, uvicorn) is not installed")

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")
LUT_STOPS = [
    [68, 1, 84],
    [71, 45, 123],
    [59, 82, 139],
    [44, 114, 142],
    [33, 145, 140],
    [40, 174, 128],
    [94, 201, 98],
    [173, 220, 48],
    [253, 231, 37],
]


def colour(byte: int) -> list[int]:
    """long.js's LUT: viridis at byte / 255."""
    x = byte / 255 * (len(LUT_STOPS) - 1)
    i = min(len(LUT_STOPS) - 2, int(x))
    f = x - i
    return [round(c + f * (LUT_STOPS[i + 1][k] - c)) for k, c in enumerate(LUT_STOPS[i])]


@pytest.fixture(scope="module")
def long_store(tmp_path_factory):
    """A tiny Llama (8,192 positions) over one 8,192-token example, in the Q/K tier."""
    from attnstore.ingest.runner import ingest
    from attnstore.store import migrate, open_store
    from attnstore.tests.ingest.test_decoders import byte_level_tokenizer

    folder = tmp_path_factory.mktemp("long")
    torch.manual_seed(0)
    tok = byte_level_tokenizer(bos=False)
    config = T.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=37, max_position_embeddings=8192,
    )  # fmt: skip
    T.LlamaForCausalLM(config).save_pretrained(folder / "model")
    tok.save_pretrained(folder / "model")
    (folder / "doc.txt").write_text(" ".join(["The cat sat on the mat. A dog barked at the cat, and it ran away."] * 600) + "\n")
    url = f"sqlite:///{folder / 'meta.sqlite'}"
    migrate.upgrade(url)
    store = open_store(db=url, root=str(folder / "attention.zarr"))
    corpus = str(folder / "doc.txt")
    ingest(store, corpus=corpus, fmt="text", model=str(folder / "model"), annotator="whitespace", name="long", progress=False)
    assert store.run_info("long").tier == "qk" and store.examples("long")["length"].tolist() == [8192]
    yield store
    store.close()


def drawn(driver, draws: int) -> float:
    """Wait for the page's draw number `draws`; its time in ms."""
    wait_for(driver, lambda d: d.execute_script("return window.longMap && window.longMap.draws") >= draws, f"draw {draws}")
    return driver.execute_script("return window.longMap.lastDrawMs")


def pixel(driver, x: int, y: int) -> list[int]:
    return driver.execute_script(
        "const c = document.getElementById('long-canvas').getContext('2d');"
        "return Array.from(c.getImageData(arguments[0], arguments[1], 1, 1).data.slice(0, 3));",
        x,
        y,
    )


def test_an_8192_token_map_is_browsed_by_zooming(browser, long_store, tmp_path):
    import requests

    with live_server(long_store) as base:
        browser.get(f"{base}long#run=long&example=0&layer=1&head=2&level=3")
        overview_ms = drawn(browser, 1)
        canvas = browser.find_element("id", "long-canvas")
        assert canvas.get_attribute("data-state") == "drawn" and canvas.get_attribute("data-tiles") == "16"  # 4 x 4 tiles
        tile = np.frombuffer(
            requests.get(
                f"{base}api/runs/long/examples/0/tile", params=dict(layer=1, head=2, level=3, row=1, col=0), timeout=WAIT_S
            ).content,
            np.uint8,
        ).reshape(256, 256)
        for y, x in ((300, 10), (400, 200), (511, 0), (260, 255)):  # canvas pixel (x, y) = tile (1, 0)'s (y - 256, x)
            assert pixel(browser, x, y) == colour(int(tile[y - 256, x])), (x, y)
        assert pixel(browser, 1000, 10) == colour(0)  # above the diagonal: nothing a causal row sees
        browser.save_screenshot(str(screenshot_dir(tmp_path) / "long_map_overview.png"))
        browser.find_element("id", "long-fit").click()  # level 3 is already the whole map: drawn again, from kept tiles
        warm_ms = drawn(browser, 2)
        for draws in (3, 4, 5):  # level 2, 1, 0, each drawn before the next click
            browser.find_element("id", "long-in").click()
            zoomed_ms = drawn(browser, draws)
        browser.save_screenshot(str(screenshot_dir(tmp_path) / "long_map_zoomed.png"))
        assert "level=0" in browser.current_url and "cells a pixel" in browser.find_element("id", "long-about").text
        labels = browser.find_elements("css selector", "#long-rows span")
        first = int(labels[0].get_attribute("data-position"))
        assert labels[0].get_attribute("textContent") == long_store.tokens("long", 0)["token"].iloc[first]
        print(f"long map, 8,192 tokens, 1,024 x 1,024 view in Chromium: overview {overview_ms:.0f} ms (cold), "
              f"{warm_ms:.0f} ms (kept tiles), zoomed to 1 cell a pixel {zoomed_ms:.0f} ms")  # fmt: skip
