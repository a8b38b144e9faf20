"""The dashboard as a new user meets it, in headless Chromium (Debian's, through
Playwright): the runs table's columns all in view at 1280 px and as cards on a 390 px
phone, no page wider than its window, a failed run's reason in words on its row and
its page, the failures bar of the fleet page opening the runs behind it, and a key
that is no admin's shown neither the fleet page nor another tenant's run."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest

from tests.driver.fleet import Fleet
from tests.web.browser import (
    CHROMIUM,
    DESKTOP,
    PHONE,
    columns_in_view,
    launch,
    overflow,
    sign_in,
)
from tests.web.conftest import ApiKeys, WebServer
from turnkeeper.config import Settings

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason="Debian chromium is not installed (scripts/system-deps)"
)
sync_api = pytest.importorskip("playwright.sync_api")

HEADERS = ["run", "status", "agent", "prompt", "started", "duration", "attempts", "error"]
ADMIN_HEADERS = ["run", "status", "agent", "key", "prompt", "started", "duration", "attempts",
                 "error"]  # fmt: skip
LONG_PROMPT = (
    "Rename the config loader and update every one of its callers across the code base\n"
    "then run the whole test suite twice and report what changed"
)
FAILING = {"preset": "scripted", "turns": 1, "pace": 0.01, "seed": 3, "args": ["--exit-code", "2"]}
FAILED_WORDS = "agent-exit: the agent exited with code 2"
SHOWN = ".filter(node => node.offsetParent !== null)"  # what is displayed


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        opened = launch(playwright)
        try:
            yield opened
        finally:
            opened.close()


def _page(browser: Any, base_url: str, key: str, size: dict[str, int]) -> Any:
    """A tab of its own at ``size``, signed in with ``key`` and on the runs page."""
    page = browser.new_context(base_url=base_url, viewport=size).new_page()
    page.set_default_timeout(60_000)  # a hang guard only
    page.goto("/login")
    sign_in(page, key)
    page.wait_for_url(f"{base_url}/")
    return page


def _headers(page: Any) -> list[str]:
    """The runs table's column headers a user sees."""
    return [
        str(text)
        for text in page.eval_on_selector_all(
            "table.runs th",
            "ths => ths.filter(t => t.offsetParent !== null).map(t => t.textContent)",
        )
    ]


def _card_labels(page: Any, run_id: str) -> list[str]:
    return [
        str(label)
        for label in page.eval_on_selector_all(
            f'tr[data-run-id="{run_id}"] td',
            f"tds => tds{SHOWN}.map(t => t.dataset.label)",
        )
    ]


def _row(page: Any, run_id: str) -> dict[str, str]:
    cells = page.eval_on_selector_all(
        f'tr[data-run-id="{run_id}"] td',
        f"tds => tds{SHOWN}.map(t => [t.dataset.label, t.textContent])",
    )
    return {str(label): str(text) for label, text in cells}


def _wait_listed(page: Any, expected: list[str]) -> None:
    page.wait_for_function(
        "ids => JSON.stringify([...document.querySelectorAll('tr[data-run-id]')]"
        ".map(r => r.dataset.runId)) === JSON.stringify(ids)",
        arg=expected,
    )


def test_the_runs_table_shows_every_column_at_1280_px_and_cards_on_a_phone(
    bare_web: WebServer, api_keys: ApiKeys, browser: Any
) -> None:
    """Queued runs (no workers): at 1280 px every column is in view, the prompt its first
    line cut to the column (its start whole in the title); at 390 px each run is a card;
    at neither width is the runs, run or session page wider than the window."""
    with bare_web.http(api_keys.alice) as alice:
        body = {"agent": "scripted", "prompt": LONG_PROMPT, "run_id": "loader-rename",
                "session_id": "refactors"}  # fmt: skip
        assert alice.post("/runs", json=body).status_code == 201
        body = {"agent": "scripted", "prompt": "Fix the typo", "run_id": "typo"}
        assert alice.post("/runs", json=body).status_code == 201

    for size in (DESKTOP, PHONE):
        page = _page(browser, bare_web.base_url, api_keys.alice, size)
        _wait_listed(page, ["typo", "loader-rename"])
        page.wait_for_selector("#who:has-text('key alice')")
        assert overflow(page) <= 0, size
        if size is DESKTOP:
            assert _headers(page) == HEADERS
            assert columns_in_view(page)
            assert _row(page, "loader-rename") == {
                "run": "loader-rename",
                "status": "queued",
                "agent": "scripted",
                "prompt": LONG_PROMPT.split("\n", maxsplit=1)[0],
                "started": "-",
                "duration": "-",
                "attempts": "0/5",
                "error": "-",
            }
            prompt = page.locator('tr[data-run-id="loader-rename"] td.prompt-cell')
            assert prompt.get_attribute("title") == LONG_PROMPT
            assert prompt.evaluate("td => getComputedStyle(td).textOverflow") == "ellipsis"
            assert prompt.evaluate("td => td.scrollWidth > td.clientWidth")  # cut to fit
        else:
            assert _headers(page) == []  # cards: each cell says what it is
            assert _card_labels(page, "loader-rename") == [
                "run", "status", "agent", "prompt", "started", "duration", "attempts",
            ]  # fmt: skip
        page.goto(f"/ui/runs/{quote('loader-rename', safe='')}")
        page.wait_for_selector("[data-field=status]")
        assert overflow(page) <= 0, size
        page.goto("/ui/sessions/refactors")
        page.wait_for_selector("#conversation[data-loaded]")
        assert overflow(page) <= 0, size
        page.context.close()

    admin = _page(browser, bare_web.base_url, api_keys.admin, DESKTOP)
    _wait_listed(admin, ["typo", "loader-rename"])
    admin.wait_for_selector("body.admin")
    assert _headers(admin) == ADMIN_HEADERS
    assert columns_in_view(admin)
    assert overflow(admin) <= 0


def test_a_failed_run_says_why_in_words_and_the_failures_bar_opens_it(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys, http: httpx.Client, browser: Any
) -> None:
    for run_id, agent in (("broken 1", FAILING), ("fine 1", "scripted")):
        response = http.post("/runs", json={"agent": agent, "prompt": "go", "run_id": run_id})
        assert response.status_code == 201, response.text
        fleet.wait_settled(run_id)
    assert fleet.client.require("broken 1").error is not None

    page = _page(browser, web.base_url, api_keys.alice, DESKTOP)
    _wait_listed(page, ["fine 1", "broken 1"])
    row = _row(page, "broken 1")
    assert {k: v for k, v in row.items() if k not in ("started", "duration")} == {
        "run": "broken 1",
        "status": "failed",
        "agent": "scripted",
        "prompt": "go",
        "attempts": "1/5",
        "error": FAILED_WORDS,
    }
    assert _row(page, "fine 1")["error"] == "-"
    error_cell = page.locator('tr[data-run-id="broken 1"] td.error-cell')
    assert error_cell.get_attribute("title") == FAILED_WORDS

    page.locator('tr[data-run-id="broken 1"] a').click()
    page.wait_for_url(f"**/ui/runs/{quote('broken 1', safe='')}")
    page.wait_for_selector("#failure:not([hidden])")
    assert page.locator("#failure .failure-reason").inner_text() == FAILED_WORDS
    fields = page.eval_on_selector_all(
        "#summary [data-field]", "fs => fs.map(f => f.dataset.field)"
    )
    assert fields == [
        "status", "epoch", "attempts", "agent", "session", "key", "created", "started",
        "finished", "duration",
    ]  # fmt: skip
    assert "committed" not in page.locator("#summary").inner_text()
    assert "{" not in page.locator("#failure").inner_text()  # words, never JSON
    assert page.locator("#conversation .marker.error").last.inner_text() == (
        "error: the agent exited with code 2"
    )
    page.set_viewport_size(PHONE)
    assert page.locator("#failure .failure-reason").inner_text() == FAILED_WORDS
    assert overflow(page) <= 0
    page.context.close()

    # The fleet page's failures bar (an admin's) opens the runs table on exactly the
    # failed runs of its minute.
    admin = _page(browser, web.base_url, api_keys.admin, DESKTOP)
    admin.goto("/ui/fleet")
    failed_bar = admin.locator("#chart-runs a.bar-link[data-bar=failed]")
    failed_bar.wait_for()
    assert failed_bar.count() == 1
    failed_bar.click()
    admin.wait_for_url("**/?status=failed&finished_since=**")
    _wait_listed(admin, ["broken 1"])
    assert admin.input_value("#f-status") == "failed"
    assert admin.locator("#f-window-text").inner_text().startswith("finished ")
    admin.click("#f-window-clear")  # any time: the failed runs of every minute
    _wait_listed(admin, ["broken 1"])
    assert admin.locator("#f-window").is_hidden()
    admin.goto("/ui/fleet")
    admin.locator("#chart-runs a.legend-item[data-series=completed]").click()
    admin.wait_for_url("**/?status=completed&finished_since=**")
    _wait_listed(admin, ["fine 1"])


def test_a_tenant_key_sees_no_fleet_link_and_another_tenants_run_is_a_plain_404(
    bare_web: WebServer, api_keys: ApiKeys, browser: Any
) -> None:
    with bare_web.http(api_keys.alice) as alice:
        body = {"agent": "scripted", "prompt": "mine", "run_id": "alice run"}
        assert alice.post("/runs", json=body).status_code == 201

    page = _page(browser, bare_web.base_url, api_keys.bob, DESKTOP)
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url.removeprefix(bare_web.base_url)))
    page.wait_for_selector("#who:has-text('key bob')")  # the key is known: links are settled
    assert page.locator("a[href='/ui/fleet']").count() == 1
    assert page.locator("a[href='/ui/fleet']:visible").count() == 0

    page.goto(f"/ui/runs/{quote('alice run', safe='')}")
    page.wait_for_selector("#not-found")
    assert page.locator("#not-found").inner_text() == (
        "Not found\n\nNo run “alice run” is visible to this key: it does not exist, or another "
        "key owns it.\n\nback to the runs"
    )
    assert page.locator("main:visible").count() == 1
    assert page.locator("table.attempts").is_hidden()
    assert page.locator("#raw-toggle").is_hidden()
    assert page.locator("#summary").is_hidden()
    assert page.locator("a[href='/ui/fleet']:visible").count() == 0

    page.goto("/ui/fleet")
    page.wait_for_selector("#not-found")
    assert page.locator("#not-found p").first.inner_text() == (
        "There is no fleet page for this key: it needs an admin key."
    )
    assert page.locator("main:visible").count() == 1
    assert page.locator("#fleet").is_hidden()
    assert page.locator("a[href='/ui/fleet']:visible").count() == 0
    assert [path for path in asked if path.startswith("/fleet")] == []  # never even asked

    admin = _page(browser, bare_web.base_url, api_keys.admin, DESKTOP)
    admin.wait_for_selector("#who:has-text('key admin')")
    assert admin.locator("a[href='/ui/fleet']:visible").count() == 1


def test_the_created_filter_keeps_the_runs_of_the_last_hour(
    bare_web: WebServer, api_keys: ApiKeys, settings: Settings, browser: Any
) -> None:
    """ "Created: last hour" lives in the URL (``?within=60``) and asks the API for the
    runs created since an hour before the server's clock; a window given in the URL
    that is not a time is said back as it was, and the API's refusal shown."""
    with bare_web.http(api_keys.alice) as alice:
        for run_id in ("yesterday", "today"):
            body = {"agent": "scripted", "prompt": "p", "run_id": run_id}
            assert alice.post("/runs", json=body).status_code == 201
    with psycopg.connect(settings.require_database_url()) as conn:
        conn.execute(
            "UPDATE runs SET created_at = now() - interval '1 day' WHERE run_id = 'yesterday'"
        )
    page = _page(browser, bare_web.base_url, api_keys.alice, DESKTOP)
    _wait_listed(page, ["today", "yesterday"])
    page.select_option("#f-within", "60")
    _wait_listed(page, ["today"])
    assert page.url == f"{bare_web.base_url}/?within=60"
    page.reload()
    _wait_listed(page, ["today"])
    assert page.input_value("#f-within") == "60"
    page.select_option("#f-within", "10080")  # a week
    _wait_listed(page, ["today", "yesterday"])

    page.goto("/?finished_since=<b>soon</b>")
    page.wait_for_selector("#refreshed.error")
    assert page.locator("#f-window-text").inner_text() == "finished since <b>soon</b>"
    assert (
        page.locator("#refreshed")
        .inner_text()
        .startswith("refresh failed: finished_since must be an ISO 8601 time with its zone")
    )
    assert page.locator("#f-window b").count() == 0
