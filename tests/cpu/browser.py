"""Headless Chromium for tests: pages looked at as a reader's browser shows them, offline.

Playwright's Python package drives the system's Chromium (Debian's `chromium`, which
scripts/setup.sh installs as root) through `executable_path`: Playwright's own browser download
is never used, so nothing is fetched at run time. Without Playwright or a Chromium the tests that
use these helpers skip, saying what to install.

    from browser import chromium, page, serve

    with serve(site_dir) as base, page(f"{base}/index.html") as p:   # an http:// page (workers, fetch)
        assert p.locator("svg").count() > 0
        assert not p.blocked                                          # nothing asked for the network

    with chromium() as browser:                                       # one browser for several pages
        with page(report.as_uri(), browser=browser) as p: ...

Every request a page makes to anything but file:, data:, blob: and this machine's loopback is
aborted and recorded in `p.blocked`, so a page that needs a CDN fails its test here as it would
for an offline reader.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

# Where a Chromium is looked for, in order: $PCG_SYNTH_CHROMIUM, then these names on PATH.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
LOCAL_SCHEMES = ("file", "data", "blob", "about")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
INSTALL_HINT = ("install it with `apt-get install chromium` (scripts/setup.sh does as root) and the [test] "
                "extra (playwright), or point PCG_SYNTH_CHROMIUM at a Chromium binary")


def chromium_path() -> str | None:
    """The Chromium binary the helpers launch, or None when none is installed."""
    explicit = os.environ.get("PCG_SYNTH_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _is_local(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in LOCAL_SCHEMES or (parts.hostname or "") in LOOPBACK_HOSTS


@contextlib.contextmanager
def chromium() -> Iterator:
    """A headless Chromium (a Playwright `Browser`); skips the calling test when Playwright or a
    Chromium binary is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip(f"playwright is not installed: {INSTALL_HINT}")
    binary = chromium_path()
    if binary is None:
        pytest.skip(f"no Chromium found: {INSTALL_HINT}")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=binary, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def page(url: str, *, browser=None, wait_until: str = "load", timeout_s: float = 30.0) -> Iterator:
    """A Playwright `Page` that has opened `url` offline.

    Args:
        url: what to open (a file:// URI, or an http://127.0.0.1 address from `serve`).
        browser: a browser from `chromium()` to reuse; by default one is launched for this page.
        wait_until: Playwright's navigation event to wait for ("load", "domcontentloaded",
            "networkidle").
        timeout_s: limit on the navigation and on every later wait on this page.

    The page carries two lists: `blocked` (URLs of requests aborted because they would leave the
    machine) and `errors` (uncaught JavaScript errors and console errors, as text).
    """
    with contextlib.ExitStack() as stack:
        if browser is None:
            browser = stack.enter_context(chromium())
        context = browser.new_context()
        stack.callback(context.close)
        context.set_default_timeout(timeout_s * 1000)
        p = context.new_page()
        p.blocked, p.errors = [], []

        def route(r):
            if _is_local(r.request.url):
                r.continue_()
            else:
                p.blocked.append(r.request.url)
                r.abort("internetdisconnected")

        context.route("**/*", route)
        p.on("pageerror", lambda e: p.errors.append(str(e)))
        p.on("console", lambda m: p.errors.append(m.text) if m.type == "error" else None)
        p.goto(url, wait_until=wait_until)
        yield p


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # the request log would fill the test output
        pass


@contextlib.contextmanager
def serve(directory: str | Path) -> Iterator[str]:
    """Serves `directory` over HTTP on 127.0.0.1 (a free port) for the block; yields the base URL
    (`http://127.0.0.1:PORT`). For pages whose scripts fetch or start workers, which a file:// page
    may not do."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
