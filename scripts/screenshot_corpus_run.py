"""Screenshot the page of a corpus run (e.g. a ``document-curation/nightly`` run) in the Prefect UI.

Usage (from the repository root, with PREFECT_API_URL naming the server that holds the run):
    .venv/bin/python scripts/screenshot_corpus_run.py FLOW_RUN_ID [--out docs/prefect-nightly-run.png]

Headless Chromium (Debian package ``chromium``) opens the run's page on its Artifacts tab, switches
the tab to its list view (each artifact's description shown whole: the ``corpus`` artifact's says
the run-over-run figures) through Chromium's DevTools protocol, and writes the page as a PNG. The
browser is a process of this script, with a profile of its own, and is ended with it.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

LIST_VIEW = 'button[aria-label="List view"]'


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def screenshot(url: str, out: Path, width: int, height: int, click: str, settle_s: float = 10.0) -> None:
    """Open ``url``, click the element ``click`` (a CSS selector) once the page has settled, and write the page to ``out``."""
    from websockets.sync.client import connect

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed: apt-get install -y chromium")
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        browser = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                                    f"--remote-debugging-port={port}", f"--user-data-dir={profile}", f"--window-size={width},{height}",
                                    "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=2))
                    target = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
                    break
                except (OSError, StopIteration):
                    if time.monotonic() > deadline:
                        raise RuntimeError("headless Chromium did not open its DevTools port within 60 s") from None
                    time.sleep(0.3)
            with connect(target, max_size=None) as ws:
                calls = iter(range(1, 1_000_000))

                def call(method: str, **params: Any) -> dict[str, Any]:
                    call_id = next(calls)
                    ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
                    while (reply := json.loads(ws.recv())).get("id") != call_id:
                        pass
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]

                call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
                call("Page.navigate", url=url)
                time.sleep(settle_s)
                found = call("Runtime.evaluate", expression=f"(() => {{ const e = document.querySelector({json.dumps(click)});"
                                                            " if (e) e.click(); return !!e; })()", returnByValue=True)
                if not found["result"]["value"]:
                    raise RuntimeError(f"{url} has no {click!r} to click: is it a flow run's page on its Artifacts tab?")
                time.sleep(2.0)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(base64.b64decode(call("Page.captureScreenshot", format="png")["data"]))
        finally:
            browser.terminate()
            browser.wait(timeout=30)
    print(f"wrote {out} from {url}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("flow_run_id")
    parser.add_argument("--out", type=Path, default=Path("docs/prefect-nightly-run.png"))
    parser.add_argument("--window", default="1600,1000", help="Browser window size, WIDTH,HEIGHT.")
    args = parser.parse_args()
    api_url = os.environ.get("PREFECT_API_URL")
    if not api_url:
        raise SystemExit("PREFECT_API_URL is not set: export the API address of the server that holds the run, e.g. http://127.0.0.1:4200/api")
    width, height = (int(v) for v in args.window.split(","))
    screenshot(f"{api_url.removesuffix('/').removesuffix('/api')}/v2/runs/flow-run/{args.flow_run_id}?tab=Artifacts", args.out, width, height,
               LIST_VIEW)


if __name__ == "__main__":
    main()
