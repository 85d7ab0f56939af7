"""What the browser tests share: finding Chromium, a live server, waits and reads of the page, the pixels of its canvases
and the hand-built store's tokens (tests/api/conftest.py holds the fixtures; test_viewer_browser*.py the tests)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
from pathlib import Path

import pytest

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


@contextlib.contextmanager
def live_server(store, settings=None):
    """The app under uvicorn on a free 127.0.0.1 port, in a background thread."""
    import uvicorn

    from attnstore.api.serve import create_app

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


def type_sentence(driver, text: str, text_b: str = "") -> None:
    for field, value in (("typed-text", text), ("typed-text-b", text_b)):
        box = driver.find_element("id", field)
        box.clear()
        box.send_keys(value)
    driver.find_element("id", "typed-go").click()


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
