#!/usr/bin/env python3
"""Screenshots of the built docs site in headless Chromium: the home page, a framework page, the API reference.

    python3 scripts/dev.py docs --site-dir /tmp/site
    .venv/bin/python scripts/docs_screenshots.py /tmp/site docs/images/site

Debian's ``chromium`` driven by Playwright, as the dashboard's browser tests do (no browser download). The site is
served over loopback HTTP (as ``mkdocs serve`` would) so that its scripts and search index load as on a web server.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import sys
import threading
from pathlib import Path

from playwright.sync_api import sync_playwright

PAGES = {
    "home": "/",
    "framework-langchain": "/frameworks/langchain/",
    "api-reference": "/api/core/",
    "api-reference-runner": "/api/core/#agentlightning.Runner",
}
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # the base class's parameter name
        pass  # one line per request would bury the screenshots' paths


def main(site: Path, out: Path) -> int:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    out.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=FLAGS, headless=True)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for name, path in PAGES.items():
                page.goto(base + path, wait_until="networkidle")
                page.screenshot(path=str(out / f"{name}.png"))
                print(f"{out / name}.png: {page.title()}")
            browser.close()
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
