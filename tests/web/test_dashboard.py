"""The dashboard in headless Chromium (Debian's, driven by Playwright): live runs table, and a
run page that streams the conversation and resumes after a reload without duplicates or gaps."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.driver.fleet import Fleet
from tests.web.conftest import WebServer

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason="Debian chromium is not installed (scripts/system-deps)"
)

sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture
def page(web: WebServer) -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            context = browser.new_context(base_url=web.base_url)
            page = context.new_page()
            page.set_default_timeout(60_000)  # a hang guard only
            yield page
        finally:
            browser.close()


def _rendered(page: Any) -> list[tuple[int, str]]:
    cells = page.eval_on_selector_all(
        "#conversation [data-seq]",
        "nodes => nodes.map(n => [Number(n.dataset.seq), n.dataset.type])",
    )
    return [(int(seq), str(kind)) for seq, kind in cells]


def test_dashboard_streams_a_run_and_resumes_after_reload(
    fleet: Fleet, http: httpx.Client, page: Any
) -> None:
    agent = {"preset": "scripted", "turns": 3, "pace": 0.12, "seed": 5}
    response = http.post("/runs", json={"agent": agent, "prompt": "look", "run_id": "dash 1"})
    assert response.status_code == 201

    page.goto("/")
    row = page.locator('tr[data-run-id="dash 1"]')
    row.wait_for()  # the table refreshed by itself
    page.wait_for_function(
        """() => { const r = document.querySelector('tr[data-run-id="dash 1"] .status');
                   return r && r.textContent === 'running'; }"""
    )

    row.locator("a").click()
    page.wait_for_url(f"**/ui/runs/{quote('dash 1', safe='')}")
    page.wait_for_function(
        "() => Number(document.querySelector('#conversation').dataset.lastSeq) >= 10"
    )
    before = _rendered(page)
    assert fleet.client.require("dash 1").status.value == "running"  # reloading mid-stream

    page.reload()
    page.wait_for_selector("#conversation[data-ended='true']")
    after = _rendered(page)

    full = fleet.log_of("dash 1")
    expected = [(seq, str(chunk["type"])) for seq, chunk in full]
    assert after == expected  # every chunk once, in order: no duplicates, no gaps
    assert before == expected[: len(before)]
    assert len(before) < len(expected)
    texts = "".join(
        str(chunk.get("delta", "")) for _, chunk in full if chunk["type"] == "TEXT_MESSAGE_CONTENT"
    )
    assert page.locator("#conversation .msg").all_inner_texts() != []
    assert "".join(page.locator("#conversation .msg").all_inner_texts()).replace(
        "\n", ""
    ) == texts.replace("\n", "")
    tool_names = [c["toolCallName"] for _, c in full if c["type"] == "TOOL_CALL_START"]
    assert [t.strip() for t in page.locator("#conversation .tool .name").all_inner_texts()] == [
        f"⏺ {name}" for name in tool_names
    ]
    page.wait_for_function(
        "() => document.querySelector('[data-field=status]').textContent.endsWith('completed')"
    )
