"""examples/django_chat through Django's test client: a signed-in user sends a message and
a follow-up, and each reply's stream is turnkeeper's log exactly, resumable from
``Last-Event-ID``; another user's reply is a 404, and nobody signed in gets a 401."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.driver.fleet import Fleet
from tests.web.conftest import ApiKeys, WebServer

django = pytest.importorskip("django")
# Set for the setup alone: left in os.environ at collection, it reached every process
# this test session starts (a Celery worker then set the example up as its Django project).
_given = os.environ.get("DJANGO_SETTINGS_MODULE")
os.environ["DJANGO_SETTINGS_MODULE"] = _given or "examples.django_chat.settings"
django.setup()
if _given is None:
    del os.environ["DJANGO_SETTINGS_MODULE"]

from django.test import Client, override_settings  # noqa: E402 - needs the setup above
from examples.django_chat.views import session_of  # noqa: E402


@pytest.fixture
def site(web: WebServer, api_keys: ApiKeys) -> Iterator[None]:
    """The example on bob's key: a tenant that may run only the catalog's agents."""
    with override_settings(TURNKEEPER_URL=web.base_url, TURNKEEPER_API_KEY=api_keys.bob):
        yield


def _stream(response: Any) -> tuple[list[tuple[int, dict[str, Any]]], str]:
    """The (seq, chunk) pairs of a relayed stream, and the name of its last event."""
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    text = b"".join(response.streaming_content).decode()
    chunks: list[tuple[int, dict[str, Any]]] = []
    last = ""
    for block in text.replace("\r\n", "\n").split("\n\n"):
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


def test_a_user_sends_two_messages_and_streams_each_reply(fleet: Fleet, site: None) -> None:
    ada = Client(REMOTE_USER="ada")
    page = ada.get("/")
    assert page.status_code == 200
    assert b'id="conversation"' in page.content
    run_ids = []
    for prompt in ("hello from django", "and a follow-up"):
        sent = ada.post("/messages", {"prompt": prompt})
        assert sent.status_code == 201, sent.content
        run_id = sent.json()["run_id"]
        run_ids.append(run_id)
        chunks, last = _stream(ada.get(f"/messages/{run_id}/events"))
        assert last == "end"
        assert chunks == fleet.log_of(run_id)
        assert [seq for seq, _ in chunks] == list(range(1, len(chunks) + 1))
        assert (chunks[0][1]["type"], chunks[-1][1]["type"]) == ("RUN_STARTED", "RUN_FINISHED")
        # A reconnect resumes after the last event it saw: the rest, each once.
        resumed, _ = _stream(ada.get(f"/messages/{run_id}/events", HTTP_LAST_EVENT_ID="3"))
        assert resumed == chunks[3:]
    runs = list(reversed(fleet.client.list_runs(session_id=session_of("ada"))))
    assert [run.run_id for run in runs] == run_ids
    assert [run.key_name for run in runs] == ["bob", "bob"]


def test_only_the_user_streams_their_reply(fleet: Fleet, site: None) -> None:
    sent = Client(REMOTE_USER="ada").post("/messages", {"prompt": "mine"})
    assert sent.status_code == 201
    run_id = sent.json()["run_id"]
    grace = Client(REMOTE_USER="grace")
    assert grace.get(f"/messages/{run_id}/events").status_code == 404
    assert grace.get("/messages/no-such-run/events").status_code == 404
    nobody = Client()
    assert nobody.get("/").status_code == 401
    assert nobody.post("/messages", {"prompt": "x"}).status_code == 401
    assert nobody.get(f"/messages/{run_id}/events").status_code == 401
    # The page's form posts with Django's CSRF token; a forged cross-site post has none.
    strict = Client(REMOTE_USER="ada", enforce_csrf_checks=True)
    assert strict.post("/messages", {"prompt": "forged"}).status_code == 403
    # The page's own form does carry the token: the same post from it is admitted.
    form = strict.get("/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert token is not None, form
    own = strict.post("/messages", {"prompt": "mine too", "csrfmiddlewaretoken": token[1]})
    assert own.status_code == 201, own.content
    assert [r.run_id for r in fleet.client.list_runs(session_id=session_of("ada"))] == [
        own.json()["run_id"],
        run_id,
    ]
