"""The dashboard in headless Chromium (Debian's, driven by Playwright): a login page that takes
an API key, a live runs table of that key's runs (all runs for an admin key), a run page that
streams the conversation and resumes after a reload without duplicates or gaps, and a 401 (a
revoked key) that sends the user back to the login page."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import signal
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest

from tests.driver.fleet import Fleet
from tests.web.browser import CHROMIUM, launch, sign_in
from tests.web.conftest import ApiKeys, WebServer

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason="Debian chromium is not installed (scripts/system-deps)"
)

sync_api = pytest.importorskip("playwright.sync_api")


@contextlib.contextmanager
def _browser_page(base_url: str) -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            context = browser.new_context(base_url=base_url)
            page = context.new_page()
            page.set_default_timeout(60_000)  # a hang guard only
            yield page
        finally:
            browser.close()


@pytest.fixture
def page(web: WebServer) -> Iterator[Any]:
    with _browser_page(web.base_url) as page:
        yield page


@pytest.fixture
def bare_page(bare_web: WebServer) -> Iterator[Any]:
    """A page on the web app alone (no workers: submitted runs stay queued)."""
    with _browser_page(bare_web.base_url) as page:
        yield page


def _rendered(page: Any) -> list[tuple[int, str]]:
    cells = page.eval_on_selector_all(
        "#conversation [data-seq]",
        "nodes => nodes.map(n => [Number(n.dataset.seq), n.dataset.type])",
    )
    return [(int(seq), str(kind)) for seq, kind in cells]


def _sign_in(page: Any, key: str) -> None:
    sign_in(page, key)


def _listed(page: Any) -> list[str]:
    return [
        str(v)
        for v in page.eval_on_selector_all(
            "tr[data-run-id]", "rows => rows.map(r => r.dataset.runId)"
        )
    ]


def _emoji_free(page: Any) -> bool:
    """No character of the page's text lies in the emoji planes or in the symbol
    blocks only emoji fonts draw (what rendered as empty boxes)."""
    return bool(
        page.evaluate(
            r"""() => !/[\u{1F000}-\u{1FFFF}\u2300-\u23FF\u25A0-\u27BF\u2B00-\u2BFF]/u
                   .test(document.body.innerText)"""
        )
    )


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
    shown_tools = page.locator("#conversation .tool .name").all_inner_texts()
    assert [t.strip() for t in shown_tools] == tool_names
    # Every icon is inline SVG: nothing on the page needs an emoji font.
    assert page.locator("#conversation .tool .name > svg.icon").count() == len(tool_names)
    assert _emoji_free(page)
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
    page.goto("about:blank")  # nothing of the run page may hear the 401 first and navigate
    fleet.client.store.revoke_key("admin")
    page.goto(f"{web.base_url}/")  # its first API call is refused with 401: to the login page
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
    its tool calls (``name args``), then their results. A turn ends when every call it
    made has its result (or with the log)."""
    shown: list[tuple[str, str]] = []
    texts: dict[str, str] = {}
    calls: dict[str, list[str]] = {}
    results: list[str] = []

    def close_turn() -> None:
        shown.extend(("assistant", text) for text in texts.values())
        shown.extend(("tool-call", f"{name} {args}") for name, args in calls.values())
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


def _listed_ids(page: Any) -> list[str]:
    return [
        str(v)
        for v in page.eval_on_selector_all("tr[data-run-id]", "rs => rs.map(r => r.dataset.runId)")
    ]


def _wait_listed(page: Any, expected: list[str]) -> None:
    """Until the runs table lists exactly ``expected`` (it refreshes by itself)."""
    page.wait_for_function(
        "ids => JSON.stringify([...document.querySelectorAll('tr[data-run-id]')]"
        ".map(r => r.dataset.runId)) === JSON.stringify(ids)",
        arg=expected,
    )


def _page_through(page: Any, base_url: str, alice: httpx.Client) -> None:
    """Pages of two, newest first, the page in the URL; a run that arrives meanwhile
    moves the rows, not the user."""
    # Pages of two, newest first; the page is in the URL too.
    page.goto("/?per=2&search=-")
    _wait_listed(page, ["bob-fix", "fix-echo"])
    assert page.locator("#page-prev").is_disabled()
    page.click("#page-next")
    _wait_listed(page, ["docs-1", "fix-2"])
    assert page.url == f"{base_url}/?per=2&search=-&page=2"
    assert page.locator("#page-range").inner_text() == "3-4 of 5 · page 2 of 3"
    page.click("#page-next")
    _wait_listed(page, ["fix-1"])
    assert page.locator("#page-next").is_disabled()
    page.click("#page-prev")
    _wait_listed(page, ["docs-1", "fix-2"])

    # A new run arrives: the refresh shows it where it belongs, the user stays put.
    body = {"agent": "scripted", "prompt": "p", "run_id": "late-1"}
    assert alice.post("/runs", json=body).status_code == 201
    _wait_listed(page, ["fix-echo", "docs-1"])
    assert page.url == f"{base_url}/?per=2&search=-&page=2"
    assert page.input_value("#f-search") == "-"
    assert page.locator("#page-range").inner_text() == "3-4 of 6 · page 2 of 3"


def test_the_runs_page_filters_pages_and_keeps_its_place_while_it_refreshes(
    bare_web: WebServer, api_keys: ApiKeys, bare_page: Any
) -> None:
    """Queued runs of two tenants (no workers: nothing moves but what the test does):
    the filters, the search and the pages narrow the table, live in the URL, survive a
    reload, and a refresh that brings a new run keeps the page and the filters."""
    page = bare_page
    with bare_web.http(api_keys.alice) as alice, bare_web.http(api_keys.bob) as bob:
        for run_id, session in (("fix-1", "s-fix"), ("fix-2", "s-fix"), ("docs-1", "s-docs")):
            body = {"agent": "scripted", "prompt": "p", "run_id": run_id, "session_id": session}
            assert alice.post("/runs", json=body).status_code == 201
        echo = {"command": ["/bin/echo", "hi"], "format": "text"}
        body = {"agent": echo, "prompt": "p", "run_id": "fix-echo"}
        assert alice.post("/runs", json=body).status_code == 201
        assert (
            bob.post(
                "/runs", json={"agent": "scripted", "prompt": "p", "run_id": "bob-fix"}
            ).status_code
            == 201
        )
        assert alice.post("/runs/fix-1/cancel").status_code == 200  # queued: aborted at once

        page.goto("/login")
        _sign_in(page, api_keys.admin)
        page.wait_for_url(f"{bare_web.base_url}/")
        _wait_listed(page, ["bob-fix", "fix-echo", "docs-1", "fix-2", "fix-1"])
        assert page.locator("#f-key-label").is_visible()  # an admin key filters by key

        page.select_option("#f-status", "queued")
        _wait_listed(page, ["bob-fix", "fix-echo", "docs-1", "fix-2"])
        page.fill("#f-search", "FIX")
        _wait_listed(page, ["bob-fix", "fix-echo", "fix-2"])
        page.fill("#f-key", "alice")
        _wait_listed(page, ["fix-echo", "fix-2"])
        page.fill("#f-agent", "scripted")
        _wait_listed(page, ["fix-2"])
        assert page.url == f"{bare_web.base_url}/?status=queued&search=FIX&key=alice&agent=scripted"
        page.reload()  # the filters come back from the URL
        _wait_listed(page, ["fix-2"])
        assert [page.input_value(f) for f in ("#f-status", "#f-search", "#f-key", "#f-agent")] == [
            "queued", "FIX", "alice", "scripted",
        ]  # fmt: skip

        page.click("#f-clear")
        _wait_listed(page, ["bob-fix", "fix-echo", "docs-1", "fix-2", "fix-1"])
        page.fill("#f-session", "s-fix")
        _wait_listed(page, ["fix-2", "fix-1"])
        page.click("#f-clear")
        _page_through(page, bare_web.base_url, alice)

        # A tenant sees only its own runs and no key filter.
        page.evaluate("() => sessionStorage.clear()")
        page.goto("/login")
        _sign_in(page, api_keys.bob)
        page.wait_for_url(f"{bare_web.base_url}/")
        _wait_listed(page, ["bob-fix"])
        assert not page.locator("#f-key-label").is_visible()
        assert _emoji_free(page)


def test_the_cancel_button_cancels_a_live_run(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys, http: httpx.Client, page: Any
) -> None:
    agent = {"preset": "scripted", "turns": 40, "pace": 0.3, "seed": 4}
    response = http.post("/runs", json={"agent": agent, "prompt": "go on", "run_id": "long 1"})
    assert response.status_code == 201
    page.goto("/login")
    _sign_in(page, api_keys.alice)
    page.wait_for_url(f"{web.base_url}/")
    page.goto(f"/ui/runs/{quote('long 1', safe='')}")
    page.wait_for_function(
        "() => Number(document.querySelector('#conversation').dataset.lastSeq) >= 5"
    )
    assert page.locator("#prompt .msg.user").inner_text() == "go on"
    cancel = page.locator("#cancel")
    cancel.wait_for(state="visible")
    cancel.click()
    page.wait_for_selector("#conversation[data-ended='true']")
    page.wait_for_function(
        "() => document.querySelector('[data-field=status] .status').textContent === 'aborted'"
    )
    run = fleet.wait_settled("long 1")
    assert run.status.value == "aborted"
    assert run.cancel_requested_at is not None
    assert cancel.is_hidden()  # a settled run has nothing to cancel
    expected = [(seq, str(chunk["type"])) for seq, chunk in fleet.log_of("long 1")]
    assert _rendered(page) == expected
    assert expected[-1][1] == "RUN_ERROR"
    assert page.locator("#conversation .marker.error").last.inner_text() == (
        f"error: {fleet.log_of('long 1')[-1][1]['message']}"
    )


def _timeline(page: Any) -> list[int | str]:
    """The conversation in document order: each chunk's seq, and ``takeover N`` for
    the mark of epoch N."""
    items = page.eval_on_selector_all(
        "#conversation [data-seq], #conversation .marker.takeover",
        """nodes => nodes.map(n => n.dataset.takeoverEpoch
                                    ? `takeover ${n.dataset.takeoverEpoch}`
                                    : Number(n.dataset.seq))""",
    )
    return [item if isinstance(item, str) else int(item) for item in items]


def _stored_times(fleet: Fleet, run_id: str) -> dict[int, tuple[dt.datetime, dt.datetime]]:
    """Per epoch: when its attempt first and last stored journal bytes (its segments are
    those stored between its start and its end)."""
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        rows = conn.execute(
            "SELECT a.epoch, min(s.created_at), max(s.created_at) FROM attempts a"
            " JOIN segments s ON s.run_id = a.run_id AND s.created_at >= a.started_at"
            " AND s.created_at <= COALESCE(a.ended_at, now())"
            " WHERE a.run_id = %s GROUP BY a.epoch",
            (run_id,),
        ).fetchall()
    return {int(epoch): (first, last) for epoch, first, last in rows}


def _check_takeover_page(
    page: Any,
    *,
    expected: list[int | str],
    said: str,
    before: int,
    attempt_rows: list[list[str]],
    full: list[tuple[int, dict[str, Any]]],
) -> None:
    """The run page of a settled run taken over once, after chunk ``before``."""
    page.wait_for_selector("#conversation[data-ended='true']")
    # The summary, the attempts and the marks' words come from one answer: once it says
    # the run settled, they are final.
    page.wait_for_function(
        "() => document.querySelector('[data-field=status] .status').textContent === 'completed'"
    )
    page.wait_for_selector("#conversation .marker.takeover")
    assert _timeline(page) == expected
    mark = page.locator("#conversation .marker.takeover")
    assert mark.inner_text() == said
    assert mark.get_attribute("data-before-seq") == str(before + 1)
    raw = page.eval_on_selector_all(
        "#raw-chunks > *",
        "ns => ns.map(n => n.dataset.takeoverEpoch ? 'takeover' : Number(n.dataset.rawSeq))",
    )
    seqs = [seq for seq, _ in full]
    assert raw == [*seqs[:before], "takeover", *seqs[before:]]
    rows = page.eval_on_selector_all(
        "#attempts tr", "rs => rs.map(r => [...r.children].map(c => c.textContent))"
    )
    assert [[row[0], row[1], row[2], row[5]] for row in rows] == attempt_rows
    texts = "".join(str(c.get("delta", "")) for _, c in full if c["type"] == "TEXT_MESSAGE_CONTENT")
    shown = "".join(page.locator("#conversation .msg").all_inner_texts())
    assert shown.replace("\n", "") == texts.replace("\n", "")  # a cut message, whole
    assert _emoji_free(page)


@pytest.mark.slow
def test_a_takeover_is_marked_where_the_successor_began_after_a_sigkill(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys, http: httpx.Client, page: Any
) -> None:
    """The run's worker is frozen mid-run (so the log stops growing), its log length
    noted, then killed: the other worker takes the run over. The run page, open all
    along and reloaded after the end, marks the takeover right before the first chunk
    after that length, in the conversation and among the raw chunks, says what
    happened in the attempts' words, and lists both attempts."""
    fleet.start_worker()  # a second worker, to take the run over
    fleet.wait_ready()
    agent = {"preset": "scripted", "turns": 4, "pace": 0.2, "seed": 11}
    response = http.post("/runs", json={"agent": agent, "prompt": "rename it", "run_id": "tk 1"})
    assert response.status_code == 201
    page.goto("/login")
    _sign_in(page, api_keys.alice)
    page.wait_for_url(f"{web.base_url}/")
    page.goto(f"/ui/runs/{quote('tk 1', safe='')}")
    fleet.wait_chunks("tk 1", 12)
    owned = fleet.client.require("tk 1")
    assert owned.owner is not None
    pgid = fleet.signal_worker_of(owned, signal.SIGSTOP)
    before = len(fleet.log_of("tk 1"))  # nothing more is appended at epoch 1
    os.killpg(pgid, signal.SIGKILL)
    done = fleet.wait_settled("tk 1")
    assert (done.status.value, done.epoch) == ("completed", 2)

    attempts = http.get(f"/runs/{quote('tk 1', safe='')}").json()["attempts"]
    assert [(a["attempt"], a["epoch"], a["outcome"], a["log_seq"]) for a in attempts] == [
        (1, 1, "superseded", None),
        (2, 2, "completed", before + 1),
    ]
    # Alice's key is a tenant's: which host and process owned the run is the fleet's.
    assert [a["owner"] for a in attempts] == [None, None]
    with web.http(api_keys.admin) as admin:
        owners = [
            a["owner"] for a in admin.get(f"/runs/{quote('tk 1', safe='')}").json()["attempts"]
        ]
    assert owners[0] == owned.owner
    assert owners[1] not in (None, owned.owner)
    cause = {"crash": " (its process died)", "lease": " (its lease ran out)"}[
        attempts[0]["handover_cause"]
    ]
    # The pause in the output: from the last bytes epoch 1 stored to the first of epoch 2
    # (the agent wrote on meanwhile, so both stored some), on the database clock.
    stored = _stored_times(fleet, "tk 1")
    pause = round((stored[2][0] - stored[1][1]).total_seconds(), 3)
    assert attempts[1]["takeover_seconds"] == pause
    assert pause > 0
    # The page rounds as JavaScript's toFixed does: half up, on the float's exact value.
    shown = Decimal(pause).quantize(Decimal("0.1"), ROUND_HALF_UP)
    said = (
        f"its worker stopped{cause}; epoch 2 took over after {shown} s; nothing was replayed to you"
    )
    full = fleet.log_of("tk 1")
    seqs = [seq for seq, _ in full]
    expected = [*seqs[:before], "takeover 2", *seqs[before:]]
    attempt_rows = [
        ["1", "-", "1", "superseded (" + attempts[0]["handover_cause"] + ")"],
        ["2", "-", "2", "completed"],
    ]

    check: dict[str, Any] = {
        "expected": expected,
        "said": said,
        "before": before,
        "attempt_rows": attempt_rows,
        "full": full,
    }
    _check_takeover_page(page, **check)  # the page that was open through the takeover
    page.reload()  # and one that knew of it before the first chunk
    _check_takeover_page(page, **check)
    page.click("#raw-toggle")
    assert page.locator("#raw").is_visible()
    assert page.locator("#conversation").is_hidden()  # the raw chunks stand in for it
    assert page.locator("#raw-toggle").get_attribute("aria-pressed") == "true"
    page.click("#raw-toggle")
    assert page.locator("#raw").is_hidden()
    assert page.locator("#conversation").is_visible()
