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
from tests.web.browser import CHROMIUM, launch, sign_in
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
    links = row.locator("a")
    assert (links.nth(0).inner_text(), links.nth(1).inner_text()) == (RUN_ID, SESSION_ID)
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

    page.goto("/ui/fleet")  # alice is no admin: the page says so and shows nothing
    page.locator("#fleet-error").wait_for(state="visible")
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
