"""The dashboard against hostile strings: an agent's output and a user's prompt, run id
and session id full of markup are shown as text on every page, never parsed; every page
carries the strict CSP; the runs search is literal (no wildcard reaches another tenant's
runs or their count)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
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
from turnkeeper.web.edge import CONTENT_SECURITY_POLICY

IMG = "<img src=x onerror=\"document.title='pwned'\">"
SCRIPT = "<script>document.title='pwned'</script>"
SVG = '<svg onload="document.title=\'pwned\'"><a href="javascript:alert(1)">x</a></svg>'
URL = "javascript:alert(document.cookie)"
RUN_ID = f"run {IMG}"
SESSION_ID = f"session {SVG}"
PROMPT = f"prompt {SCRIPT} {IMG}"
LINES = [
    {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
    {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": f"text {IMG} {URL}"},
    {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
    {"type": "TOOL_CALL_START", "toolCallId": 'c"]1', "toolCallName": f"tool {SVG}"},
    {"type": "TOOL_CALL_ARGS", "toolCallId": 'c"]1', "delta": f"args {SCRIPT}"},
    {"type": "TOOL_CALL_END", "toolCallId": 'c"]1'},
    {"type": "TOOL_CALL_RESULT", "messageId": "r1", "toolCallId": 'c"]1', "content": IMG},
    {"type": "CUSTOM", "name": f"custom {IMG}", "value": {"v": SCRIPT}},
    {"type": "RUN_ERROR", "message": f"error {SVG}"},
]
HOSTILE = (IMG, SCRIPT, SVG)
# Strings that break layouts rather than parsers: long and unbroken, right to left
# (with a bidi override that would turn the rest of a line around), or both.
HEBREW = "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd"  # "hello world"
ARABIC = "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645"  # the same
RTL = f"\u202e{HEBREW} {ARABIC}"
LONG_ID = "r" * 200 + IMG
RTL_ID = f"{HEBREW} {ARABIC} <b>bold</b> " + "\u0639" * 120  # ids refuse the override
LONG_SESSION = "s" * 255
LONG_PROMPT = f"{IMG} {'y' * 5000}\nthe second line"
RTL_PROMPT = f"{RTL} {SCRIPT} " + "\u05e2" * 400
LONG_ERROR = f"{'E' * 3000} {SVG} {RTL}"

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason="Debian chromium is not installed (scripts/system-deps)"
)
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture
def page(web: WebServer) -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            context = browser.new_context(base_url=web.base_url)
            page = context.new_page()
            page.set_default_timeout(60_000)  # a hang guard only
            yield page
        finally:
            browser.close()


def _parsed_markup(page: Any) -> list[str]:
    """Elements no page of ours makes: what a string parsed as HTML would add."""
    return [
        str(tag)
        for tag in page.evaluate(
            """() => [...document.querySelectorAll(
                   'img, iframe, object, embed, script:not([src]), svg:not(.icon),'
                   + ' a[href^="javascript"], [onerror], [onload]')]
                 .map(n => n.outerHTML)"""
        )
    ]


def _agent() -> dict[str, Any]:
    code = "import sys\nfor line in sys.argv[1:]:\n    print(line, flush=True)\n"
    return {
        "command": [sys.executable, "-c", code, *(json.dumps(line) for line in LINES)],
        "format": "agui",
    }


def test_hostile_output_prompt_and_ids_are_text_on_every_page(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys, http: httpx.Client, page: Any
) -> None:
    body = {"agent": _agent(), "prompt": PROMPT, "run_id": RUN_ID, "session_id": SESSION_ID}
    response = http.post("/runs", json=body)
    assert response.status_code == 201, response.text
    fleet.wait_settled(RUN_ID)
    seen_policies: dict[str, str | None] = {}

    def seen(response: Any) -> None:
        if response.request.resource_type == "document":
            path = response.url.removeprefix(web.base_url).split("?")[0]
            seen_policies[path] = response.headers.get("content-security-policy")

    page.on("response", seen)
    page.goto("/login")
    sign_in(page, api_keys.alice)
    page.wait_for_url(f"{web.base_url}/")
    page.wait_for_selector("tr[data-run-id]")
    row = page.locator("tr[data-run-id]").first
    assert row.get_attribute("data-run-id") == RUN_ID
    assert row.locator("a").all_inner_texts() == [RUN_ID]
    prompt = row.locator("td.prompt-cell")
    assert (prompt.inner_text(), prompt.get_attribute("title")) == (PROMPT, PROMPT)
    assert _parsed_markup(page) == []

    page.goto(f"/ui/runs/{quote(RUN_ID, safe='')}")
    page.wait_for_selector("#conversation[data-ended='true']")
    page.click("#raw-toggle")
    page.locator("#raw-chunks .raw-chunk").first.wait_for()
    assert page.locator("#run-id").inner_text() == RUN_ID
    assert page.locator("#prompt .msg.user").inner_text() == PROMPT
    conversation = page.locator("#conversation").inner_text()
    for text in (f"text {IMG} {URL}", f"tool {SVG}", f"args {SCRIPT}", f"custom {IMG}"):
        assert text in conversation
    assert f"error {SVG}" in conversation
    assert SCRIPT in page.locator("#raw-chunks").inner_text()
    assert page.locator("#session-link").inner_text() == SESSION_ID
    assert _parsed_markup(page) == []

    page.click("#session-link")
    page.wait_for_url("**/ui/sessions/**")
    page.wait_for_selector("#conversation[data-loaded='settled'] [data-kind='user']")
    assert page.locator("#session-id").inner_text() == SESSION_ID
    assert PROMPT in page.locator("#conversation").inner_text()
    assert _parsed_markup(page) == []

    page.goto("/ui/fleet")  # alice is no admin: a plain "not found", nothing of the page
    page.locator("#not-found").wait_for(state="visible")
    assert page.locator("#fleet").is_hidden()
    assert page.locator("#tiles").inner_text() == ""
    assert page.title() != "pwned"
    pages = sorted(seen_policies)
    assert [path.split("/")[:3][-1] for path in pages] == [
        "", "login", "fleet", "runs", "sessions",
    ]  # fmt: skip
    for path in pages:
        assert seen_policies[path] == CONTENT_SECURITY_POLICY, path
    assert "script-src 'self';" in CONTENT_SECURITY_POLICY
    assert "unsafe" not in CONTENT_SECURITY_POLICY


def test_the_runs_search_is_literal_and_never_counts_another_tenants_runs(
    bare_web: WebServer, api_keys: ApiKeys
) -> None:
    with bare_web.http(api_keys.alice) as alice, bare_web.http(api_keys.bob) as bob:
        for run_id in ("bob_%_1", "bob\\2", "100%bob"):
            response = bob.post(
                "/runs", json={"agent": "scripted", "prompt": "p", "run_id": run_id}
            )
            assert response.status_code == 201, response.text
        response = alice.post("/runs", json={"agent": "scripted", "prompt": "p", "run_id": "a_1"})
        assert response.status_code == 201, response.text
        for search, mine in (("%", []), ("_", ["a_1"]), ("\\", []), ("b", []), ("%b", [])):
            body = alice.get("/runs", params={"search": search}).json()
            assert ([r["run_id"] for r in body["runs"]], body["total"]) == (mine, len(mine))
        for search, theirs in (("%", ["100%bob", "bob_%_1"]), ("_", ["bob_%_1"])):
            body = bob.get("/runs", params={"search": search}).json()
            assert ([r["run_id"] for r in body["runs"]], body["total"]) == (theirs, len(theirs))
        assert bob.get("/runs", params={"search": "\\"}).json()["total"] == 1
        body = alice.get("/runs", params={"agent": "%"}).json()
        assert (body["runs"], body["total"]) == ([], 0)
        assert alice.get("/runs", params={"key": "bob"}).status_code == 403
        assert alice.get("/runs", params={"offset": str(10**30)}).status_code == 400


def _wide_open(page: Any, path: str, ready: str) -> None:
    page.goto(path)
    page.wait_for_selector(ready)


def test_long_unbroken_and_right_to_left_strings_never_widen_a_page(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys, http: httpx.Client
) -> None:
    """Run ids, a session id, prompts and an agent's error message that are very long
    and unbroken, right to left, with a bidi override, and full of markup: at 1280 and
    390 px no page is wider than its window, every runs column stays in its place, and
    nothing is parsed as markup."""
    failing = {"preset": "scripted", "turns": 1, "pace": 0.01, "seed": 2,
               "args": ["--error", LONG_ERROR]}  # fmt: skip
    runs = (
        (LONG_ID, LONG_PROMPT, LONG_SESSION, "scripted"),
        (RTL_ID, RTL_PROMPT, None, failing),
    )
    for run_id, prompt, session, agent in runs:
        body = {"agent": agent, "prompt": prompt, "run_id": run_id, "session_id": session}
        response = http.post("/runs", json=body)
        assert response.status_code == 201, response.text
        fleet.wait_settled(run_id)
    refused = http.post("/runs", json={"agent": "scripted", "prompt": "p", "run_id": RTL})
    assert (refused.status_code, refused.json()["reason"]) == (400, "invalid-run-id")
    failed = fleet.client.require(RTL_ID)
    assert (failed.status.value, failed.error["message"]) == ("failed", LONG_ERROR)

    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            for size in (DESKTOP, PHONE):
                page = browser.new_context(base_url=web.base_url, viewport=size).new_page()
                page.set_default_timeout(60_000)  # a hang guard only
                page.goto("/login")
                sign_in(page, api_keys.alice)
                page.wait_for_url(f"{web.base_url}/")
                page.wait_for_selector(".error-cell[title]")
                assert overflow(page) <= 0, size
                if size is DESKTOP:
                    assert columns_in_view(page)
                ids = page.eval_on_selector_all(
                    "tr[data-run-id]", "rs => rs.map(r => r.dataset.runId)"
                )
                assert ids == [RTL_ID, LONG_ID]
                row = page.locator("tr[data-run-id]").first
                assert row.locator("td.error-cell").inner_text() == f"agent-error: {LONG_ERROR}"
                assert row.locator("td.status-cell").inner_text() == "failed"
                assert _parsed_markup(page) == []
                for run_id in (LONG_ID, RTL_ID):
                    _wide_open(
                        page,
                        f"/ui/runs/{quote(run_id, safe='')}",
                        "#conversation[data-ended='true']",
                    )
                    assert page.locator("#run-id").inner_text() == run_id
                    assert overflow(page) <= 0, (size, run_id)
                    assert _parsed_markup(page) == []
                assert page.locator("#failure .failure-reason").inner_text() == (
                    f"agent-error: {LONG_ERROR}"
                )
                _wide_open(
                    page, f"/ui/sessions/{LONG_SESSION}", "#conversation[data-loaded='settled']"
                )
                assert overflow(page) <= 0, size
                assert _parsed_markup(page) == []
                assert page.title() != "pwned"
                page.context.close()
        finally:
            browser.close()
