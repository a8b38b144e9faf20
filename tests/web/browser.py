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


def overflow(page: Any) -> int:
    """How many pixels the page is wider than its window (0 or less: it fits)."""
    return int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


def columns_in_view(page: Any) -> bool:
    """On the runs page: every column header a user sees lies within the window, its
    name whole (not cut by an ellipsis), and every cell within its column (a long text
    never spills into the next one)."""
    return bool(
        page.evaluate(
            """() => {
                const ths = [...document.querySelectorAll('table.runs th')]
                  .filter(t => t.offsetParent !== null);
                const edges = ths.map(t => t.getBoundingClientRect());
                if (edges.some(e => e.left < 0 || e.right > window.innerWidth)) return false;
                if (ths.some(t => t.scrollWidth > t.clientWidth)) return false;
                return [...document.querySelectorAll('table.runs tbody tr')].every(row => {
                  const cells = [...row.children].filter(c => c.offsetParent !== null);
                  return cells.length === edges.length && cells.every((cell, i) => {
                    const box = cell.getBoundingClientRect();
                    return box.left >= edges[i].left - 1 && box.right <= edges[i].right + 1;
                  });
                });
            }"""
        )
    )
