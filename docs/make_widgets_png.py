"""docs/widgets.png: the widgets on a real run of the embedded model, rendered by Voilà in Chromium.

    python -m workbench demo --output runs/demo           # or any run folder of the embedded model
    python docs/make_widgets_png.py runs/demo/train       # writes docs/widgets.png

A notebook is written to a temporary folder: it reopens the run (`workbench.debug.load_run`), and
shows the conversation view and the token view (coloured by advantage) of one episode of the last
saved training batch (a won game of two or three turns with a non-zero advantage, where there is one), and the training
dashboard of the whole run. Voilà serves it with the offline template (as tests/test_browser.py
does) and Debian's Chromium renders it through the playwright wheel (`executable_path`; its own
browsers are never downloaded). The screenshot is cut below the dashboard.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

CELLS = [
    """import os
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from workbench.debug import load_run
from workbench.widgets import ConversationView, TokenView, TrainingDashboard
run = load_run(os.environ["WORKBENCH_RUN"])
step = run.steps[-1]                        # the last saved training batch
batch = run.batch(step)
won = [i for i, e in enumerate(batch) if e.success and float(batch.advantages[i].abs().sum()) > 0]
shown = max(won, key=lambda i: (min(len(batch[i].turns), 3), -i)) if won else 0   # a won game of 2-3 turns""",
    """conv = ConversationView(run, step=step, index=shown, show_system=False)
conv.add_class("shot-conv")
conv""",
    """toks = TokenView(run, step=step, field="advantages", index=shown)   # the run's own tokenizer
toks.add_class("shot-tokens")
toks""",
    """TrainingDashboard(run, title=f"{run.config.training.adv_estimator} on {run.config.environment.name}, "
                             f"{run.config.model.model_name}", height=560)""",
]


def notebook(cells: list[str]) -> dict:
    return {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                       "source": c} for c in cells],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a run folder (e.g. runs/demo/train)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "widgets.png"))
    ap.add_argument("--width", type=int, default=1300)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="wb-shot-"))
    (tmp / "widgets_run.ipynb").write_text(json.dumps(notebook(CELLS)))
    labconfig = tmp / "config" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text('{"disabledExtensions": {"jupyterlab-jupytext": true}}')
    share = ROOT / "workbench" / "widgets" / "share"
    env = {**os.environ, "WORKBENCH_RUN": str(Path(args.run).resolve()), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "JUPYTER_PATH": os.pathsep.join(filter(None, [str(share), os.environ.get("JUPYTER_PATH")])),
           "JUPYTER_CONFIG_PATH": str(tmp / "config")}
    port = free_port()
    log = open(tmp / "voila.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "voila", "widgets_run.ipynb", "--no-browser", f"--port={port}",
         "--Voila.ip=127.0.0.1", "--template=workbench-offline", "--theme=light", "--show_tracebacks=True",
         f"--ServerApp.root_dir={tmp}"],
        cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(url + "voila/static/", timeout=2)
            except urllib.error.HTTPError:
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    sys.exit("voila did not start:\n" + (tmp / "voila.log").read_text()[-3000:])
                time.sleep(0.5)
                continue
            break
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": args.width, "height": 1900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url, timeout=300_000)
            page.wait_for_selector(".shot-conv .wb-conv-body .wb-assistant", timeout=300_000)
            page.wait_for_selector(".shot-tokens .wb-tokbox .wb-tok", timeout=300_000)
            page.wait_for_selector(".wb-dashboard .js-plotly-plot .scatterlayer .trace", timeout=300_000)
            page.wait_for_load_state("networkidle", timeout=120_000)
            page.wait_for_timeout(1500)  # plotly's first layout
            top = page.locator(".wb-dashboard").bounding_box()
            page.screenshot(path=args.out, full_page=True,
                            clip={"x": 0, "y": 0, "width": args.width, "height": top["y"] + top["height"] + 10})
            browser.close()
        if errors:
            sys.exit("page errors:\n" + "\n".join(errors))
        print(f"wrote {args.out}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


if __name__ == "__main__":
    main()
