"""A headless Chromium (Debian's ``chromium``, driven by Playwright; nothing is downloaded) and screenshots of
every page a failing test had open, saved under ``MIRSERVE_SCREENSHOTS`` (default: the test's tmp dir)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium_path() -> str | None:
    found = os.environ.get("MIRSERVE_CHROMIUM") or next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)
    return found


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


@pytest.fixture(scope="session")
def browser():
    path = chromium_path()
    if path is None:
        pytest.skip("no Chromium browser is installed (apt-get install chromium); the web page tests need one")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser, request, tmp_path):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    opened = context.new_page()
    yield opened
    failed = getattr(request.node, "report_call", None)
    if failed is not None and failed.failed:
        folder = Path(os.environ.get("MIRSERVE_SCREENSHOTS") or tmp_path)
        folder.mkdir(parents=True, exist_ok=True)
        for index, open_page in enumerate(context.pages):
            shot = folder / f"{request.node.name}-{index}.png"
            open_page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot of {open_page.url}: {shot}")
    context.close()
