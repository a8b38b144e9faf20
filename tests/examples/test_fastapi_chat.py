"""examples/fastapi_chat, started as its README says, against a real turnkeeper, in headless
Chromium: a user signs in, sends a message and a follow-up, and the page shows the
conversation the runs' logs hold, item by item (text as text, tool calls with their
arguments and results); markup in a prompt stays text; another user sees none of it. Over
HTTP: a message sent again is the same run, a cross-site post is refused, and a turnkeeper
that does not answer is a 502 that says so."""

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
    start_fastapi_chat,
)
from tests.web.browser import DESKTOP
from turnkeeper.web.serve import free_port

UNREACHABLE = "turnkeeper does not answer; is it running at TURNKEEPER_URL?"
PREFIX = "fastapi-chat-"


def _session(user: str) -> str:
    return f"fastapi-chat/{user}"


def _page(browser: Any, example: Example, user: str) -> Any:
    context = browser.new_context(
        base_url=example.base_url,
        viewport=DESKTOP,
        http_credentials={"username": user, "password": USERS[user]},
    )
    page = context.new_page()
    page.set_default_timeout(90_000)  # a hang guard only
    page.goto("/")
    return page


@pytest.fixture
def ada(browser: Any, fastapi_chat: Example) -> Iterator[Any]:
    page = _page(browser, fastapi_chat, "ada")
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


def test_a_user_chats_and_the_page_shows_the_conversation(fleet: Fleet, ada: Any) -> None:
    prompts = ["hello there", "and a follow-up"]
    for replies, prompt in enumerate(prompts, start=1):
        send(ada, prompt, replies)
    assert ada.text_content("#status") == "done"

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
    assert rendered(ada) == expected


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
    fleet: Fleet, browser: Any, fastapi_chat: Example, ada: Any
) -> None:
    grace = _page(browser, fastapi_chat, "grace")
    send(ada, "for ada's eyes", replies=1)
    [run_id] = _runs(fleet, "ada")
    grace.reload()  # a page opened after ada's reply shows nothing of it either
    assert rendered(grace) == []
    # Grace's own page asks for ada's reply: the app says there is none.
    events = f"/messages/{run_id}/events"
    assert grace.request.get(events).status == 404
    assert ada.request.get(events).status == 200
    # Nor can grace put a message of hers under ada's message id.
    message_id = run_id.removeprefix(PREFIX)
    taken = grace.request.post("/messages", data={"prompt": "for ada's eyes", "id": message_id})
    assert (taken.status, taken.json()) == (
        409,
        {"detail": "that message id is taken; send it with a new one"},
    )
    assert _runs(fleet, "ada") == [run_id]
    assert _runs(fleet, "grace") == []
    grace.context.close()


def test_a_message_sent_again_is_the_same_run(fleet: Fleet, fastapi_chat: Example) -> None:
    message = {"prompt": "once", "id": str(uuid.uuid4())}
    with httpx.Client(base_url=fastapi_chat.base_url, timeout=60, auth=("ada", "lovelace")) as ada:
        first = ada.post("/messages", json=message)
        again = ada.post("/messages", json=message)
        assert (first.status_code, again.status_code) == (201, 201)
        assert first.json() == again.json() == {"run_id": f"{PREFIX}{message['id']}"}
        assert _runs(fleet, "ada") == [f"{PREFIX}{message['id']}"]
        assert ada.post("/messages", json={"prompt": "x", "id": "7"}).status_code == 422
        # A page of another site can make the browser post a form or plain text, with
        # ada's Basic credentials, but not JSON (that needs a preflight): refused.
        forged = ada.post(
            "/messages", content=orjson.dumps(message), headers={"Content-Type": "text/plain"}
        )
        assert forged.status_code == 422
        assert _runs(fleet, "ada") == [f"{PREFIX}{message['id']}"]
    with httpx.Client(base_url=fastapi_chat.base_url, timeout=60) as nobody:
        assert nobody.get("/").status_code == 401
        assert nobody.post("/messages", json=message).status_code == 401
    wrong = httpx.Client(base_url=fastapi_chat.base_url, timeout=60, auth=("ada", "hopper"))
    with wrong:
        assert wrong.get(f"/messages/{PREFIX}{message['id']}/events").status_code == 401


def test_an_unreachable_turnkeeper_is_a_502_that_says_so(tmp_path: Path) -> None:
    example = start_fastapi_chat(f"http://127.0.0.1:{free_port()}", "tk_unused", tmp_path)
    try:
        with httpx.Client(base_url=example.base_url, timeout=60, auth=("ada", "lovelace")) as ada:
            sent = ada.post("/messages", json={"prompt": "hello", "id": str(uuid.uuid4())})
            assert (sent.status_code, sent.json()) == (502, {"detail": UNREACHABLE})
            events = ada.get(f"/messages/{PREFIX}{uuid.uuid4()}/events")
            assert (events.status_code, events.json()) == (502, {"detail": UNREACHABLE})
    finally:
        example.stop()
