"""examples/django_chat, set up and started as its README says (``migrate``,
``createsuperuser``, ``runserver``), against a real turnkeeper: in headless Chromium a user
signs in on the login page, sends a message and a follow-up, and the page shows the
conversation the runs' logs hold, item by item; markup in a prompt stays text; another
user sees none of it. Over HTTP: the relayed stream is the log, resumable from
``Last-Event-ID``; a post needs the sign-in and Django's CSRF token; a turnkeeper that does
not answer is a 502 that says so."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.driver.fleet import Fleet
from tests.examples.pages import (
    MARKUP,
    USERS,
    Example,
    conversation_of,
    rendered,
    send,
    signed_in,
    start_django_chat,
)
from tests.web.browser import DESKTOP
from turnkeeper.chunks import Chunk
from turnkeeper.web.serve import free_port

UNREACHABLE = "turnkeeper does not answer; is it running at TURNKEEPER_URL?"
PREFIX = "django-chat-"


def _session(user: str) -> str:
    return f"django-chat/{user}"


def _sign_in(page: Any, user: str, password: str) -> None:
    page.fill("#username", user)
    page.fill("#password", password)
    page.click("#login button[type=submit]")


def _page(browser: Any, example: Example, user: str) -> Any:
    """A signed-in page of ``user``: the chat, reached through the login page."""
    context = browser.new_context(base_url=example.base_url, viewport=DESKTOP)
    page = context.new_page()
    page.set_default_timeout(90_000)  # a hang guard only
    page.goto("/")
    assert page.url == f"{example.base_url}/login?next=/"
    _sign_in(page, user, USERS[user])
    page.wait_for_url(f"{example.base_url}/")
    assert page.text_content("#user") == user
    return page


@pytest.fixture
def ada(browser: Any, django_chat: Example) -> Iterator[Any]:
    page = _page(browser, django_chat, "ada")
    yield page
    page.context.close()


def _runs(fleet: Fleet, user: str) -> list[str]:
    """The user's runs, oldest first."""
    return [run.run_id for run in reversed(fleet.client.list_runs(session_id=_session(user)))]


def _expected(fleet: Fleet, prompts: list[str], run_ids: list[str]) -> list[tuple[str, ...]]:
    expected: list[tuple[str, ...]] = []
    for prompt, run_id in zip(prompts, run_ids, strict=True):
        log = fleet.log_of(run_id)
        assert log[-1][1]["type"] == "RUN_FINISHED"
        expected += conversation_of(run_id, prompt, log)
    return expected


def test_a_user_signs_in_chats_and_the_page_shows_the_conversation(
    fleet: Fleet, browser: Any, django_chat: Example
) -> None:
    page = browser.new_context(base_url=django_chat.base_url, viewport=DESKTOP).new_page()
    page.set_default_timeout(90_000)  # a hang guard only
    page.goto("/")
    _sign_in(page, "ada", "hopper")  # grace's password
    assert page.text_content(".errors") == (
        "That name and password do not match a user of this site."
    )
    _sign_in(page, "ada", USERS["ada"])
    page.wait_for_url(f"{django_chat.base_url}/")
    assert page.text_content("#user") == "ada"

    prompts = ["hello from django", "and a follow-up"]
    for replies, prompt in enumerate(prompts, start=1):
        send(page, prompt, replies)
    assert page.text_content("#status") == "done"

    run_ids = _runs(fleet, "ada")
    assert len(run_ids) == 2
    assert all(run_id.startswith(PREFIX) for run_id in run_ids)
    assert [run.key_name for run in fleet.client.list_runs(session_id=_session("ada"))] == [
        "bob",
        "bob",
    ]
    expected = _expected(fleet, prompts, run_ids)
    # What the scripted agent did, and so what the page must show: it said something,
    # called tools and answered, in each reply.
    assert [(run, kind) for run, kind, *_ in expected] == [
        (run_ids[0], "user"), (run_ids[0], "assistant"), (run_ids[0], "tool"),
        (run_ids[0], "assistant"), (run_ids[0], "tool"), (run_ids[0], "assistant"),
        (run_ids[1], "user"), (run_ids[1], "assistant"), (run_ids[1], "tool"),
        (run_ids[1], "assistant"), (run_ids[1], "tool"), (run_ids[1], "assistant"),
    ]  # fmt: skip
    assert rendered(page) == expected

    # Signed out, the chat is the login page again, and the page's requests are refused.
    page.click("#logout button[type=submit]")
    page.wait_for_url(f"{django_chat.base_url}/login")
    assert page.request.get(f"/messages/{run_ids[0]}/events").status == 401
    page.goto("/")
    assert page.url == f"{django_chat.base_url}/login?next=/"
    page.context.close()


def test_markup_in_a_prompt_is_shown_as_text(fleet: Fleet, ada: Any) -> None:
    send(ada, MARKUP, replies=1)
    [run_id] = _runs(fleet, "ada")
    expected = _expected(fleet, [MARKUP], [run_id])
    assert rendered(ada) == expected
    # The agent repeats the prompt: the markup reached the page in its reply too.
    assert any(MARKUP in text for _, kind, *shown in expected if kind != "user" for text in shown)
    assert ada.locator("#conversation img, #conversation script, #conversation b").count() == 0
    assert ada.evaluate("window.pwned") is None


def test_another_user_sees_none_of_it(
    fleet: Fleet, browser: Any, django_chat: Example, ada: Any
) -> None:
    grace = _page(browser, django_chat, "grace")
    send(ada, "for ada's eyes", replies=1)
    [run_id] = _runs(fleet, "ada")
    grace.reload()  # a page opened after ada's reply shows nothing of it either
    assert rendered(grace) == []
    # Grace's own page asks for ada's reply: the site says there is none.
    events = f"/messages/{run_id}/events"
    assert grace.request.get(events).status == 404
    assert ada.request.get(events).status == 200
    # Nor can grace put a message of hers under ada's message id (with her page's token).
    token = grace.input_value("#ask [name=csrfmiddlewaretoken]")
    form = {"prompt": "for ada's eyes", "id": run_id.removeprefix(PREFIX)}
    taken = grace.request.post(
        "/messages", form={**form, "csrfmiddlewaretoken": token}, headers={"Referer": grace.url}
    )
    assert (taken.status, taken.text()) == (409, "that message id is taken; send it with a new one")
    assert _runs(fleet, "ada") == [run_id]
    assert _runs(fleet, "grace") == []
    grace.context.close()


def _stream(response: httpx.Response) -> tuple[list[tuple[int, Chunk]], str]:
    """The (seq, chunk) pairs of a relayed stream, and the name of its last event."""
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    chunks: list[tuple[int, Chunk]] = []
    last = ""
    for block in response.text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
        if "data" not in fields:
            continue
        last = fields.get("event", "message")
        if last == "message":
            chunks.append((int(fields["id"]), orjson.loads(fields["data"])))
    return chunks, last


def test_the_relayed_stream_is_the_log_and_resumes(fleet: Fleet, django_chat: Example) -> None:
    message = {"prompt": "hello over http", "id": str(uuid.uuid4())}
    with signed_in(django_chat, "ada") as ada:
        sent = ada.post("/messages", data=message)
        again = ada.post("/messages", data=message)  # the same message sent again
        assert (sent.status_code, again.status_code) == (201, 201), sent.text
        run_id = f"{PREFIX}{message['id']}"
        assert sent.json() == again.json() == {"run_id": run_id}
        assert _runs(fleet, "ada") == [run_id]
        chunks, last = _stream(ada.get(f"/messages/{run_id}/events"))
        assert last == "end"
        assert chunks == fleet.log_of(run_id)
        assert [seq for seq, _ in chunks] == list(range(1, len(chunks) + 1))
        # A reconnect resumes after the last event it saw: the rest, each once.
        resumed, _ = _stream(ada.get(f"/messages/{run_id}/events", headers={"Last-Event-ID": "3"}))
        assert resumed == chunks[3:]
        assert ada.post("/messages", data={"prompt": "x", "id": "7"}).status_code == 400
        # Without the CSRF token (a forged cross-site post), the post is refused.
        del ada.headers["X-CSRFToken"]
        assert ada.post("/messages", data={**message, "id": str(uuid.uuid4())}).status_code == 403
    with httpx.Client(base_url=django_chat.base_url, timeout=60) as nobody:
        assert nobody.get("/").headers["Location"] == "/login?next=/"
        assert nobody.get(f"/messages/{run_id}/events").status_code == 401
    assert _runs(fleet, "ada") == [run_id]


def test_an_unreachable_turnkeeper_is_a_502_that_says_so(tmp_path: Path) -> None:
    example = start_django_chat(f"http://127.0.0.1:{free_port()}", "tk_unused", tmp_path)
    try:
        with signed_in(example, "ada") as ada:
            sent = ada.post("/messages", data={"prompt": "hello", "id": str(uuid.uuid4())})
            assert (sent.status_code, sent.text) == (502, UNREACHABLE)
            events = ada.get(f"/messages/{PREFIX}{uuid.uuid4()}/events")
            assert (events.status_code, events.text) == (502, UNREACHABLE)
    finally:
        example.stop()
