"""The dashboard in headless Chromium (Debian's, driven by Playwright): a login page that takes
an API key, a live runs table of that key's runs (all runs for an admin key), a run page that
streams the conversation and resumes after a reload without duplicates or gaps, and a 401 (a
revoked key) that sends the user back to the login page."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.driver.fleet import Fleet
from tests.web.conftest import ApiKeys, WebServer

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


def _sign_in(page: Any, key: str) -> None:
    page.fill("#key", key)
    page.click("#login button[type=submit]")


def _listed(page: Any) -> list[str]:
    return [
        str(v)
        for v in page.eval_on_selector_all(
            "tr[data-run-id]", "rows => rows.map(r => r.dataset.runId)"
        )
    ]


def test_dashboard_streams_a_run_and_resumes_after_reload(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys, http: httpx.Client, page: Any
) -> None:
    with web.http(api_keys.bob) as bob:
        assert (
            bob.post(
                "/runs", json={"agent": "scripted", "prompt": "hi", "run_id": "bob 1"}
            ).status_code
            == 201
        )
    agent = {"preset": "scripted", "turns": 3, "pace": 0.12, "seed": 5}
    response = http.post("/runs", json={"agent": agent, "prompt": "look", "run_id": "dash 1"})
    assert response.status_code == 201

    page.goto("/")
    page.wait_for_url("**/login?next=%2F")  # no key yet: the login page
    _sign_in(page, "tk_not-a-key")
    page.wait_for_function(
        "() => document.querySelector('#login-error').textContent.includes('unknown or revoked')"
    )
    assert page.url.endswith("/login?next=%2F")
    _sign_in(page, api_keys.alice)
    page.wait_for_url(f"{web.base_url}/")
    row = page.locator('tr[data-run-id="dash 1"]')
    row.wait_for()  # the table refreshed by itself
    assert _listed(page) == ["dash 1"]  # alice's runs only, not bob's
    assert page.locator("#who").inner_text() == "key alice"
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


def test_an_admin_key_sees_every_run_and_a_revoked_key_is_sent_back_to_login(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys, page: Any
) -> None:
    for name, key in (("alice", api_keys.alice), ("bob", api_keys.bob)):
        with web.http(key) as client:
            body = {"agent": "scripted", "prompt": "hi", "run_id": f"{name} run"}
            assert client.post("/runs", json=body).status_code == 201

    page.goto("/login")
    _sign_in(page, api_keys.admin)
    page.wait_for_url(f"{web.base_url}/")
    page.wait_for_function("() => document.querySelectorAll('tr[data-run-id]').length === 2")
    assert _listed(page) == ["bob run", "alice run"]
    assert page.locator("#who").inner_text() == "key admin (admin: every run)"

    page.goto(f"/ui/runs/{quote('alice run', safe='')}")
    page.wait_for_selector("#conversation[data-ended='true']")
    fleet.client.store.revoke_key("admin")
    page.goto("/")  # the next API call is refused with 401: back to the login page
    page.wait_for_url("**/login?next=%2F")
    assert page.evaluate("() => sessionStorage.getItem('turnkeeper.key')") is None


def test_the_login_page_only_ever_goes_on_to_a_page_of_this_site(
    web: WebServer, api_keys: ApiKeys, page: Any
) -> None:
    """``?next=`` is the page to return to after signing in; whatever it says, the browser
    stays on this site (a backslash or a tab makes a browser read ``/\\host`` and
    ``/<tab>/host`` as ``//host``, another site)."""
    landed = []
    page.route("http://evil.example/**", lambda route: route.fulfill(body="evil"))
    for next_page in (
        "/ui/runs/r%201?x=1",
        "/\\evil.example/",
        "/\t/evil.example/",
        "/\n/evil.example/",
        "//evil.example/",
        "http://evil.example/",
        "/%5Cevil.example/",
    ):
        page.goto(f"/login?next={quote(next_page, safe='')}")
        _sign_in(page, api_keys.alice)
        page.wait_for_url(lambda url: "/login" not in url)
        landed.append(page.url.removeprefix(web.base_url))
    assert landed == ["/ui/runs/r%201?x=1", "/", "/", "/", "/", "/", "/%5Cevil.example/"]


def _turns(fleet: Fleet, run_id: str) -> list[tuple[str, str]]:
    """A run's turns as its log says them, in the page's words: each turn's messages, then
    its tool calls (``⏺ name args``), then their results. A turn ends when every call it
    made has its result (or with the log)."""
    shown: list[tuple[str, str]] = []
    texts: dict[str, str] = {}
    calls: dict[str, list[str]] = {}
    results: list[str] = []

    def close_turn() -> None:
        shown.extend(("assistant", text) for text in texts.values())
        shown.extend(("tool-call", f"⏺ {name} {args}") for name, args in calls.values())
        shown.extend(("tool-result", content) for content in results)
        texts.clear()
        calls.clear()
        results.clear()

    for _, chunk in fleet.log_of(run_id):
        kind = chunk["type"]
        if kind == "TEXT_MESSAGE_START":
            texts.setdefault(chunk["messageId"], "")
        elif kind == "TEXT_MESSAGE_CONTENT":
            texts[chunk["messageId"]] = texts.get(chunk["messageId"], "") + chunk["delta"]
        elif kind == "TOOL_CALL_START":
            calls[chunk["toolCallId"]] = [chunk["toolCallName"], ""]
        elif kind == "TOOL_CALL_ARGS":
            calls[chunk["toolCallId"]][1] += chunk["delta"]
        elif kind == "TOOL_CALL_RESULT":
            results.append(chunk["content"])
            if len(results) == len(calls):
                close_turn()
    close_turn()
    return shown


def _shown(page: Any) -> list[tuple[str, str]]:
    cells = page.eval_on_selector_all(
        "#conversation [data-kind]", "nodes => nodes.map(n => [n.dataset.kind, n.textContent])"
    )
    return [(str(kind), str(text)) for kind, text in cells]


def test_the_session_page_shows_the_active_path_and_switches_to_another_branch(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys, http: httpx.Client, page: Any
) -> None:
    """Two runs of a session, the second branched from the first entry (the first prompt):
    the page shows the active path (prompt 1, prompt 2, run 2's turns) and, switched at the
    branch point, the first run's path (prompt 1, run 1's turns); then a 404 and a 401."""
    session = "chat/1 ü"  # a slash, a space and a non-ASCII letter in the page's URL
    agent = {"preset": "scripted", "turns": 2, "pace": 0.01, "seed": 3}
    sent = (("s1", "first question", None), ("s2", "second try", "s1/input"))
    for run_id, prompt, parent in sent:
        body = {"agent": agent, "prompt": prompt, "run_id": run_id, "parent_entry_id": parent}
        response = http.post(f"/sessions/{quote(session, safe='')}/runs", json=body)
        assert response.status_code == 201, response.text
        fleet.wait_settled(run_id)
    first, second = _turns(fleet, "s1"), _turns(fleet, "s2")
    turn_shape = ["assistant", "tool-call", "tool-result"] * 2 + ["assistant"]
    assert [kind for kind, _ in first] == [kind for kind, _ in second] == turn_shape

    page.goto("/login")
    _sign_in(page, api_keys.alice)
    page.wait_for_url(f"{web.base_url}/")
    page.goto(f"/ui/runs/{quote('s2', safe='')}")
    page.locator("#session-link").click()  # the run page links to its session's page
    page.wait_for_url(f"**/ui/sessions/{quote(session, safe='')}")
    page.wait_for_selector("#conversation[data-loaded='settled']")
    active_leaf = fleet.client.transcript(session)[-1].entry_id
    assert page.locator("#conversation").get_attribute("data-leaf") == active_leaf
    assert _shown(page) == [("user", "first question"), ("user", "second try"), *second]
    assert page.locator("#session-runs [data-run-id]").evaluate_all(
        "cells => cells.map(c => c.dataset.runId)"
    ) == ["s1", "s2"]
    branch = page.locator('.branch[data-parent-id="s1/input"] .branch-choice')
    assert branch.all_inner_texts() == [
        "run s1: assistant",
        "run s2: “second try” (active)",
    ]
    assert branch.evaluate_all("bs => bs.map(b => b.getAttribute('aria-pressed'))") == [
        "false",
        "true",
    ]

    branch.first.click()  # the first run's own reply to the first prompt
    page.wait_for_selector("#conversation[data-active-path='false']")
    s1_leaf = [e.entry_id for e in fleet.client.store.session_entries(session) if e.run_id == "s1"]
    assert page.locator("#conversation").get_attribute("data-leaf") == s1_leaf[-1]
    assert _shown(page) == [("user", "first question"), *first]
    assert branch.evaluate_all("bs => bs.map(b => b.getAttribute('aria-pressed'))") == [
        "true",
        "false",
    ]
    assert "display only" in page.locator("#branch-state").inner_text()
    assert fleet.client.transcript(session)[-1].entry_id == active_leaf  # the leaf stayed

    page.locator('.branch-choice[data-entry-id="s2/input"]').click()  # and back
    page.wait_for_selector("#conversation[data-active-path='true']")
    assert _shown(page) == [("user", "first question"), ("user", "second try"), *second]

    page.goto(f"/ui/sessions/{quote('no such session', safe='')}")
    page.wait_for_selector("#session-error")
    assert page.locator("#session-error").inner_text() == (
        "No session “no such session” is visible to this key: it does not exist, "
        "or another key owns it."
    )
    fleet.client.store.revoke_key("alice")
    page.goto(f"/ui/sessions/{quote(session, safe='')}")  # a 401: back to the login page
    page_path = f"/ui/sessions/{quote(session, safe='')}"
    page.wait_for_url(f"**/login?next={quote(page_path, safe='')}")
