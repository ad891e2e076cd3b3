"""A real headless Chromium (Debian's /usr/bin/chromium) driven by Playwright."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
expect.set_options(timeout=15_000)  # a loaded CI machine; the page updates every second
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed: make test installs it (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})  # type: ignore[attr-defined]
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.console_errors = errors
    yield page
    context.close()


def screenshot(page: object, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"console-{name}.png"), full_page=True)  # type: ignore[attr-defined]
