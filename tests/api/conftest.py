"""Fixtures of the browser tests: one headless Chromium per test module, the hand-built store and a tiny model's store
(tests/api/browser_support.py holds what they share)."""

from __future__ import annotations

import numpy as np
import pytest

from attnstore.queries import run_query

from .browser_support import TOKEN_WORDS, TOKENS, WAIT_S, WORDS, browser_paths, missing


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
