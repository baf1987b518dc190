"""The widgets in a real browser: Voilà serves notebooks/browser_demo.ipynb, Chromium renders it.

Needs Debian's chromium (`apt-get install chromium`) and the playwright wheel (its own
browsers are never downloaded: we pass `executable_path`). Checks that the
conversation view, the token view and a plotly chart render; that there is no page
error or console error; that every request went to the local server (no CDN); and
that the first assistant turn of episode 0 (read from the batch the notebook saved)
is visible. A screenshot is saved under tmp_path.
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
    env = {**os.environ, "WORKBENCH_DEMO_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1",
           "JUPYTER_PATH": os.pathsep.join(filter(None, [str(share), os.environ.get("JUPYTER_PATH")]))}
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
            page.wait_for_selector(".wb-conversation .wb-conv-body .wb-assistant", timeout=RENDER_TIMEOUT_MS)
            page.wait_for_selector(".wb-tokens .wb-tokbox .wb-tok", timeout=RENDER_TIMEOUT_MS)
            page.wait_for_selector(".wb-dashboard .js-plotly-plot .scatterlayer .trace", timeout=RENDER_TIMEOUT_MS)
            page.wait_for_load_state("networkidle", timeout=60_000)
            page.wait_for_timeout(1000)  # let plotly finish its first layout
            shot = tmp_path / "voila.png"
            page.screenshot(path=str(shot), full_page=True)

            batch = TrajectoryBatch.load(tmp_path / "batch.jsonl")
            first_action = batch[0].turns[0].action
            conv_text = page.inner_text(".wb-conversation")
            assert " ".join(first_action.split()) in " ".join(conv_text.split()), (first_action, conv_text[:2000])
            assert "assistant · turn 0" in conv_text.lower()  # the role line is upper-cased by CSS
            shown = next((i for i in range(len(batch)) if batch.advantages[i].abs().sum() > 0), 0)  # as the notebook
            n_tokens = page.locator(".wb-tokens .wb-tokbox .wb-tok").count()
            assert n_tokens == batch[shown].num_tokens
            title = page.locator(".wb-tokens .wb-tok:not(.wb-untrained)").first.get_attribute("title")
            assert "advantages=" in title and "trained" in title
            assert page.locator(".wb-dashboard .js-plotly-plot .gtitle, .wb-dashboard .js-plotly-plot .annotation-text").count() >= 9
            # everything (plotly.js and widget code included) came from the local server
            foreign = [u for u in requests if not u.startswith((url, "data:", "blob:", "about:"))]
            assert not foreign, f"requests outside the local server: {foreign}"
            assert shot.stat().st_size > 20_000
        finally:
            browser.close()
    assert not errors, "\n".join(errors)
    print(f"rendered in {time.time() - start:.1f}s; screenshot {tmp_path / 'voila.png'}")
    if os.environ.get("WORKBENCH_SCREENSHOT_DIR"):
        shutil.copy(tmp_path / "voila.png", Path(os.environ["WORKBENCH_SCREENSHOT_DIR"]) / "voila.png")
