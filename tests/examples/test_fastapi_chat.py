"""examples/fastapi_chat in headless Chromium (Debian's, driven by Playwright): a user
signs in, sends a message and a follow-up, and the page shows each reply's events exactly
as turnkeeper logged them; another user cannot stream that user's replies."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from examples.fastapi_chat.app import create_app, session_of

from tests.driver.fleet import Fleet
from tests.web.browser import ARGS, CHROMIUM
from tests.web.conftest import ApiKeys, WebServer

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason="Debian chromium is not installed (scripts/system-deps)"
)

sync_api = pytest.importorskip("playwright.sync_api")

USERS = {"ada": "lovelace", "grace": "hopper"}


@pytest.fixture
def chat(web: WebServer, api_keys: ApiKeys) -> Iterator[WebServer]:
    """The example app on bob's key: a tenant that may run only the catalog's agents."""
    server = WebServer.start_app(create_app(web.base_url, api_keys.bob, USERS))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def page(chat: WebServer) -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            context = browser.new_context(
                base_url=chat.base_url,
                http_credentials={"username": "ada", "password": USERS["ada"]},
            )
            page = context.new_page()
            page.set_default_timeout(90_000)  # a hang guard only
            yield page
        finally:
            browser.close()


def _send(page: Any, prompt: str, replies: int) -> None:
    page.fill("#prompt", prompt)
    page.click("#ask button[type=submit]")
    page.wait_for_selector(f'#conversation[data-replies="{replies}"]', state="attached")


def _rendered(page: Any) -> list[tuple[str, int, str]]:
    cells = page.eval_on_selector_all(
        "#conversation [data-seq]",
        "nodes => nodes.map(n => [n.dataset.run, Number(n.dataset.seq), n.dataset.type])",
    )
    return [(str(run), int(seq), str(kind)) for run, seq, kind in cells]


def _texts(chunks: list[dict[str, Any]]) -> list[str]:
    texts: dict[str, str] = {}
    for chunk in chunks:
        if chunk["type"] == "TEXT_MESSAGE_START":
            texts[chunk["messageId"]] = ""
        elif chunk["type"] == "TEXT_MESSAGE_CONTENT":
            texts[chunk["messageId"]] += chunk["delta"]
    return list(texts.values())


def test_a_user_chats_and_the_page_shows_each_reply_once(
    fleet: Fleet, chat: WebServer, page: Any
) -> None:
    page.goto("/")
    _send(page, "hello there", replies=1)
    _send(page, "and a follow-up", replies=2)

    runs = list(reversed(fleet.client.list_runs(session_id=session_of("ada"))))
    assert [run.key_name for run in runs] == ["bob", "bob"]
    expected: list[tuple[str, int, str]] = []
    chunks: list[dict[str, Any]] = []
    for run in runs:
        log = fleet.log_of(run.run_id)
        assert log[-1][1]["type"] == "RUN_FINISHED"
        expected += [(run.run_id, seq, chunk["type"]) for seq, chunk in log]
        chunks += [chunk for _, chunk in log]
    # The page, line by line: both replies' whole logs, in order, each event once.
    assert _rendered(page) == expected
    shown = page.eval_on_selector_all(".assistant", "nodes => nodes.map(n => n.textContent)")
    assert shown == _texts(chunks)
    users = page.eval_on_selector_all(".user", "nodes => nodes.map(n => n.textContent)")
    assert users == ["hello there", "and a follow-up"]


def test_a_user_cannot_stream_another_users_reply(fleet: Fleet, chat: WebServer) -> None:
    with httpx.Client(base_url=chat.base_url, timeout=60, auth=("ada", USERS["ada"])) as ada:
        response = ada.post("/messages", json={"prompt": "mine"})
        assert response.status_code == 201
        run_id = response.json()["run_id"]
    with httpx.Client(base_url=chat.base_url, timeout=60, auth=("grace", USERS["grace"])) as grace:
        assert grace.get(f"/messages/{run_id}/events").status_code == 404
        assert grace.get("/messages/no-such-run/events").status_code == 404
    with httpx.Client(base_url=chat.base_url, timeout=60) as nobody:
        assert nobody.get("/").status_code == 401
        assert nobody.post("/messages", json={"prompt": "x"}).status_code == 401
    with httpx.Client(base_url=chat.base_url, timeout=60, auth=("ada", "wrong")) as wrong:
        assert wrong.get(f"/messages/{run_id}/events").status_code == 401
