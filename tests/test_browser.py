"""The widgets in a real browser: Voilà serves notebooks/browser_demo.ipynb, Chromium renders it.

Needs Debian's chromium (`apt-get install chromium`) and the playwright wheel (its own
browsers are never downloaded: we pass `executable_path`). Checks that the
conversation view, the token view and a plotly chart render; that there is no page
error or console error; that every request went to the local server (no CDN); and
that the first assistant turn of episode 0 (read from the batch the notebook saved)
is visible. Then the tutorial layouts below them: a click on a row of the episode table
opens that episode in its linked views (01); the "colour by" dropdowns of two token views
side by side are not clipped (05); every reward-tuner slider's readout is visible and
clear of the summary text, and typing a value into a readout re-scores (04).
Screenshots are saved under tmp_path (voila.png, the whole page; widgets.png, the top
views; with WORKBENCH_SCREENSHOT_DIR set, both are copied there).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "browser_demo.ipynb"
CHROMIUM = os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
RENDER_TIMEOUT_MS = 300_000  # the notebook trains the tiny model for two steps first


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def voila(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not found: apt-get install chromium")
    pytest.importorskip("playwright")
    pytest.importorskip("voila")
    port = free_port()
    # workbench-offline: Voilà's lab template minus its Font Awesome links to a CDN
    share = ROOT / "workbench" / "widgets" / "share"
    # jupytext (installed for the notebook pairs) ships a JupyterLab extension that Voilà's
    # page cannot load (a console error): disabled for this page, it only matters in JupyterLab.
    labconfig = tmp_path / "config" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text('{"disabledExtensions": {"jupyterlab-jupytext": true}}')
    env = {**os.environ, "WORKBENCH_DEMO_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1",
           "JUPYTER_PATH": os.pathsep.join(filter(None, [str(share), os.environ.get("JUPYTER_PATH")])),
           "JUPYTER_CONFIG_PATH": os.pathsep.join(filter(None, [str(tmp_path / "config"),
                                                                os.environ.get("JUPYTER_CONFIG_PATH")]))}
    log = open(tmp_path / "voila.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "voila", str(NOTEBOOK), "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1",
         "--template=workbench-offline", "--theme=light", "--show_tracebacks=True", f"--ServerApp.root_dir={NOTEBOOK.parent}"],
        cwd=NOTEBOOK.parent, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(url + "voila/static/", timeout=2)
        except urllib.error.HTTPError:
            break  # the server answers (404 for the bare static folder is fine)
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail("voila did not start:\n" + (tmp_path / "voila.log").read_text()[-3000:])
            time.sleep(0.5)
            continue
        break
    yield url, tmp_path
    os.killpg(proc.pid, signal.SIGTERM)  # voila and the kernel it started (our own process group)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()


def test_widgets_render_in_voila(voila):
    from playwright.sync_api import sync_playwright

    from workbench.trajectory import TrajectoryBatch

    url, tmp_path = voila
    errors: list[str] = []
    requests: list[str] = []
    start = time.time()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1900})
            page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
            page.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}")
                    if msg.type == "error" else None)
            page.on("request", lambda req: requests.append(req.url))
            page.goto(url, timeout=RENDER_TIMEOUT_MS)
            page.wait_for_selector(".wb-conversation.demo-main .wb-conv-body .wb-assistant", timeout=RENDER_TIMEOUT_MS)
            page.wait_for_selector(".wb-tokens.demo-main .wb-tokbox .wb-tok", timeout=RENDER_TIMEOUT_MS)
            page.wait_for_selector(".demo-tuner .widget-slider", timeout=RENDER_TIMEOUT_MS)
            page.wait_for_selector(".wb-dashboard .js-plotly-plot .scatterlayer .trace", timeout=RENDER_TIMEOUT_MS)
            page.wait_for_load_state("networkidle", timeout=60_000)
            page.wait_for_timeout(1000)  # let plotly finish its first layout
            shot = tmp_path / "voila.png"
            page.screenshot(path=str(shot), full_page=True)
            top = page.locator(".wb-dashboard").bounding_box()
            page.screenshot(path=str(tmp_path / "widgets.png"), full_page=True,
                            clip={"x": 0, "y": 0, "width": 1300, "height": top["y"] + top["height"] + 10})

            batch = TrajectoryBatch.load(tmp_path / "batch.jsonl")
            first_action = batch[0].turns[0].action
            conv_text = page.inner_text(".wb-conversation.demo-main")
            assert " ".join(first_action.split()) in " ".join(conv_text.split()), (first_action, conv_text[:2000])
            assert "assistant · turn 0" in conv_text.lower()  # the role line is upper-cased by CSS
            shown = next((i for i in range(len(batch)) if batch.advantages[i].abs().sum() > 0), 0)  # as the notebook
            n_tokens = page.locator(".wb-tokens.demo-main .wb-tokbox .wb-tok").count()
            assert n_tokens == batch[shown].num_tokens
            title = page.locator(".wb-tokens.demo-main .wb-tok:not(.wb-untrained)").first.get_attribute("title")
            assert "advantages=" in title and "trained" in title
            titles = page.locator(".wb-dashboard .js-plotly-plot .annotation-text").all_text_contents()
            # reward, success, KL, entropy, losses, response length, throughput all move in 2 steps; a
            # panel flat for the whole run (KL coefficient, clip fraction) is not drawn
            assert {"reward (mean ± std)", "success rate", "entropy", "losses"} <= set(titles) and len(titles) >= 7
            # everything (plotly.js and widget code included) came from the local server
            foreign = [u for u in requests if not u.startswith((url, "data:", "blob:", "about:"))]
            assert not foreign, f"requests outside the local server: {foreign}"
            assert shot.stat().st_size > 20_000
            check_table_click(page, batch)
            check_side_by_side(page)
            check_tuner(page, tmp_path)
        finally:
            browser.close()
    assert not errors, "\n".join(errors)
    print(f"rendered in {time.time() - start:.1f}s; screenshot {tmp_path / 'voila.png'}")
    if os.environ.get("WORKBENCH_SCREENSHOT_DIR"):
        for name in ("voila.png", "widgets.png", "tuner.png"):
            shutil.copy(tmp_path / name, Path(os.environ["WORKBENCH_SCREENSHOT_DIR"]) / name)


def overlaps(a: dict, b: dict) -> bool:
    return (a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
            and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


def inside(inner: dict, outer: dict, slack: float = 1.0) -> bool:
    return (inner["x"] >= outer["x"] - slack and inner["y"] >= outer["y"] - slack
            and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + slack
            and inner["y"] + inner["height"] <= outer["y"] + outer["height"] + slack)


def check_table_click(page, batch) -> None:
    """01: a click on a table row opens that episode in the conversation and token views."""
    box = page.locator(".demo-table")
    target = 2
    header = box.locator(".wb-conversation .wb-conv-body b").first
    assert header.inner_text() == f"episode {batch[0].episode_id}"
    box.locator(f".wb-table-html tr[data-key='{target}']").click()
    box.locator(f".wb-table-html tr.wb-selected[data-key='{target}']").wait_for(timeout=30_000)
    page.wait_for_function(
        "([sel, text]) => document.querySelector(sel) && document.querySelector(sel).innerText === text",
        arg=[".demo-table .wb-conversation .wb-conv-body b", f"episode {batch[target].episode_id}"], timeout=30_000)
    tokens_head = box.locator(".wb-tokens .wb-tokens-body .wb-head").first.inner_text()
    assert tokens_head.startswith(f"episode {batch[target].episode_id} ·")


def check_side_by_side(page) -> None:
    """05: in each half, the episode and colour-by dropdowns lie inside the view (not clipped)."""
    views = page.locator(".demo-pair .wb-tokens")
    assert views.count() == 2
    for k in range(2):
        view = views.nth(k)
        outer = view.bounding_box()
        selects = view.locator(".wb-tokens-controls select")
        assert selects.count() == 2
        for j in range(2):
            assert inside(selects.nth(j).bounding_box(), outer), (k, j, selects.nth(j).bounding_box(), outer)


def check_tuner(page, tmp_path: Path) -> None:
    """04: readouts visible and clear of the summary; typing a weight re-scores."""
    tuner = page.locator(".demo-tuner")
    tuner.scroll_into_view_if_needed()
    note = tuner.locator(".wb-tuner-note").bounding_box()
    sliders = tuner.locator(".widget-slider")
    assert sliders.count() == 4
    viewport = page.viewport_size
    for k in range(sliders.count()):
        readout = sliders.nth(k).locator(".widget-readout")
        assert readout.is_visible()
        box = readout.bounding_box()
        assert not overlaps(box, note), (k, box, note)
        assert box["x"] + box["width"] <= viewport["width"]
    slider = sliders.filter(has_text="success_bonus")
    readout = slider.locator(".widget-readout")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("2.5")
    page.keyboard.press("Enter")
    tuner.locator(".wb-tuner-note", has_text="success_bonus=2.50").wait_for(timeout=30_000)
    assert readout.inner_text().strip() == "2.50"
    tuner.screenshot(path=str(tmp_path / "tuner.png"))
