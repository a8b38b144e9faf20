"""The browser the dashboard tests and ``scripts/screenshots.py`` drive: Debian's
Chromium, headless, through Playwright, with the same flags and the same sign-in."""

from __future__ import annotations

from typing import Any

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


def launch(playwright: Any) -> Any:
    return playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)


def sign_in(page: Any, key: str) -> None:
    """On the login page: give the key and submit."""
    page.fill("#key", key)
    page.click("#login button[type=submit]")
