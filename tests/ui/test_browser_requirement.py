"""A run that requires the browser (FLEET_REQUIRE_BROWSER, as .ci/run sets) fails where
Chromium or Playwright is missing; any other run skips the browser tests."""

from __future__ import annotations

import sys

import pytest

from tests.ui.browser import REQUIRE_BROWSER_ENV, chromium_executable, playwright_sync_api

NOWHERE = "/nonexistent/chromium"


@pytest.fixture
def no_playwright(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)  # import raises ImportError


@pytest.fixture
def no_chromium(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")


@pytest.mark.usefixtures("no_playwright")
def test_a_missing_playwright_fails_a_run_that_requires_the_browser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(REQUIRE_BROWSER_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="FLEET_REQUIRE_BROWSER is set.*playwright"):
        playwright_sync_api()
    monkeypatch.delenv(REQUIRE_BROWSER_ENV)
    with pytest.raises(pytest.skip.Exception, match="no playwright"):
        playwright_sync_api()


@pytest.mark.usefixtures("no_chromium")
def test_a_missing_chromium_fails_a_run_that_requires_the_browser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(REQUIRE_BROWSER_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"FLEET_REQUIRE_BROWSER is set.*{NOWHERE}"):
        chromium_executable(NOWHERE)
    monkeypatch.delenv(REQUIRE_BROWSER_ENV)
    with pytest.raises(pytest.skip.Exception, match="no Chromium"):
        chromium_executable(NOWHERE)
