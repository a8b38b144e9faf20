"""Both examples on one turnkeeper and one key, the way examples/README.md runs them one
after the other: the same user sending the same message (the same id, picked by the page)
through each makes two runs, one per example, each in its own conversation."""

from __future__ import annotations

import uuid

import httpx

from tests.driver.fleet import Fleet
from tests.examples.pages import USERS, Example, signed_in


def test_the_examples_never_share_a_run(
    fleet: Fleet, fastapi_chat: Example, django_chat: Example
) -> None:
    message = {"prompt": "the same words", "id": str(uuid.uuid4())}
    auth = ("ada", USERS["ada"])
    with httpx.Client(base_url=fastapi_chat.base_url, timeout=60, auth=auth) as fastapi:
        sent = fastapi.post("/messages", json=message)
        assert (sent.status_code, sent.json()) == (201, {"run_id": f"fastapi-chat-{message['id']}"})
    with signed_in(django_chat, "ada") as django:
        sent = django.post("/messages", data=message)
        assert (sent.status_code, sent.json()) == (201, {"run_id": f"django-chat-{message['id']}"})
    runs = {
        session: [run.run_id for run in fleet.client.list_runs(session_id=session)]
        for session in ("fastapi-chat/ada", "django-chat/ada")
    }
    assert runs == {
        "fastapi-chat/ada": [f"fastapi-chat-{message['id']}"],
        "django-chat/ada": [f"django-chat-{message['id']}"],
    }
    for [run_id] in runs.values():
        assert fleet.wait_settled(run_id).status.value == "completed"
    # Each example streams its own run and knows nothing of the other's.
    with httpx.Client(base_url=fastapi_chat.base_url, timeout=60, auth=auth) as fastapi:
        assert fastapi.get(f"/messages/fastapi-chat-{message['id']}/events").status_code == 200
        assert fastapi.get(f"/messages/django-chat-{message['id']}/events").status_code == 404
    with signed_in(django_chat, "ada") as django:
        assert django.get(f"/messages/django-chat-{message['id']}/events").status_code == 200
        assert django.get(f"/messages/fastapi-chat-{message['id']}/events").status_code == 404
