"""What the browser tests need of the host, Chromium and Playwright's Python package: a run
without them skips those tests, unless it requires the browser (FLEET_REQUIRE_BROWSER, as
.ci/run sets), when a missing one fails the test instead of hiding it as a skip."""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import pytest

REQUIRE_BROWSER_ENV = "FLEET_REQUIRE_BROWSER"
CHROMIUM = os.environ.get("FLEET_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def missing_browser(reason: str) -> NoReturn:
    """Skip, unless the run requires the browser: then fail."""
    if os.environ.get(REQUIRE_BROWSER_ENV):
        pytest.fail(f"{REQUIRE_BROWSER_ENV} is set but there is {reason}")
    pytest.skip(reason)


def chromium_executable(configured: str) -> str:
    """`configured` if it is executable, else `chromium` on PATH."""
    found = configured if os.access(configured, os.X_OK) else shutil.which("chromium")
    if found:
        return found
    missing_browser(f"no Chromium at {configured} or on PATH (apt-get install -y chromium)")


def playwright_sync_api() -> Any:
    """`playwright.sync_api`, which drives the Chromium above."""
    try:
        return importlib.import_module("playwright.sync_api")
    except ImportError as exc:
        missing_browser(f"no playwright to drive Chromium ({exc})")


@contextmanager
def chromium_page(timeout_ms: int, width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A page of Debian's headless Chromium driven by Playwright, closed after."""
    executable = chromium_executable(CHROMIUM)
    sync_api = playwright_sync_api()
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(timeout_ms)
            yield page
        finally:
            browser.close()
