"""Sessions over HTTP and through the Python client, against a real stack: each message
a run of the session, its follow-up continuing the conversation, the tree with its
active path, and another key's 404."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from tests.driver.fleet import Fleet, expected_log, follow_up_prompt
from tests.web.conftest import ApiKeys, WebServer
from tests.web.sse_client import read_stream

SCRIPTED: dict[str, Any] = {"preset": "scripted", "turns": 1, "pace": 0.01, "seed": 3}
SESSION = "chat/1 ü"  # a slash, a space and a non-ASCII letter travel through every URL
PATH = f"/sessions/{quote(SESSION, safe='')}"


def _send(http: httpx.Client, prompt: str, run_id: str) -> list[dict[str, Any]]:
    response = http.post(
        f"{PATH}/runs", json={"agent": SCRIPTED, "prompt": prompt, "run_id": run_id}
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["run_id"], body["session_id"]) == (run_id, SESSION)
    chunks, end = read_stream(http, body["stream_url"])
    assert end.event == "end"
    assert [seq for seq, _ in chunks] == list(range(1, len(chunks) + 1))
    return [chunk for _, chunk in chunks]


def test_a_conversation_over_http(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys, http: httpx.Client, tmp_path: Path
) -> None:
    workdir = tmp_path / "oracle"
    first = _send(http, "tidy up", "m1")
    said = expected_log("m1", SESSION, SCRIPTED, "tidy up", workdir)
    assert first == said
    fleet.wait_settled("m1")
    second = _send(http, "and the notes", "m2")
    follow_up = follow_up_prompt("and the notes", [("tidy up", said)])
    assert second == expected_log("m2", SESSION, SCRIPTED, follow_up, workdir)
    fleet.wait_settled("m2")

    tree = http.get(PATH).json()
    stored = [e.entry_id for e in fleet.client.transcript(SESSION)]
    assert stored[0] == "m1/input"
    assert "m2/input" in stored
    assert tree["active_path"] == stored
    assert tree["leaf_id"] == stored[-1]
    assert [(e["entry_id"], e["active"]) for e in tree["entries"]] == [(i, True) for i in stored]
    assert [e["parent_id"] for e in tree["entries"]] == [None, *stored[:-1]]
    assert [(r["run_id"], r["status"]) for r in tree["runs"]] == [
        ("m1", "completed"),
        ("m2", "completed"),
    ]

    # A branch from the end of m1: the tree keeps m2's entries, off the active path.
    end_of_m1 = [i for i in stored if i.startswith("m1/")][-1]
    unknown_parent = http.post(
        f"{PATH}/runs", json={"agent": SCRIPTED, "prompt": "p", "parent_entry_id": "nope"}
    )
    assert (unknown_parent.status_code, unknown_parent.json()["reason"]) == (400, "unknown-entry")
    branched = http.post(
        f"{PATH}/runs",
        json={"agent": SCRIPTED, "prompt": "retry", "run_id": "m2b", "parent_entry_id": end_of_m1},
    )
    assert branched.status_code == 201, branched.text
    fleet.wait_settled("m2b")
    tree = http.get(PATH).json()
    on_path = [i for i in stored if i.startswith("m1/")]
    on_path += [e["entry_id"] for e in tree["entries"] if e["run_id"] == "m2b"]
    assert tree["active_path"] == on_path
    assert {e["entry_id"]: e["active"] for e in tree["entries"]} == {
        **dict.fromkeys(on_path, True),
        **{i: False for i in stored if i.startswith("m2/")},
    }
    assert next(e for e in tree["entries"] if e["entry_id"] == "m2b/input")["parent_id"] == (
        end_of_m1
    )

    # Another key: the same 404 as for a session that does not exist, and nothing sent.
    unknown = f"/sessions/{quote('no such session', safe='')}"
    with web.http(api_keys.bob) as bob:
        for method, path, body in (
            ("GET", PATH, None),
            ("POST", f"{PATH}/runs", {"agent": "scripted", "prompt": "let me in"}),
        ):
            hidden = bob.request(method, path, json=body)
            assert hidden.status_code == 404, hidden.text
            assert hidden.json() == {
                "error": f"no session has the id {SESSION!r}",
                "session_id": SESSION,
            }
        missing = bob.get(unknown)
        assert missing.status_code == 404
        assert missing.json() == {
            "error": "no session has the id 'no such session'",
            "session_id": "no such session",
        }
    assert [r.run_id for r in fleet.client.list_runs(session_id=SESSION)] == ["m2b", "m2", "m1"]


def test_a_conversation_through_the_python_client(fleet: Fleet, tmp_path: Path) -> None:
    chat = fleet.client.session("py-chat", agent=SCRIPTED)
    workdir = tmp_path / "oracle"
    first = chat.send("tidy up", run_id="p1")
    assert first.run.session_id == "py-chat"
    said = expected_log("p1", "py-chat", SCRIPTED, "tidy up", workdir)
    assert [chunk for _, chunk in first] == said
    fleet.wait_settled("p1")
    second = chat.send("and the notes", run_id="p2")
    follow_up = follow_up_prompt("and the notes", [("tidy up", said)])
    assert [chunk for _, chunk in second] == expected_log(
        "p2", "py-chat", SCRIPTED, follow_up, workdir
    )
    assert second.refresh().status.value == "completed"  # settled before its log closed
    assert [r.run_id for r in chat.runs()] == ["p1", "p2"]
    assert chat.transcript()[0].entry_id == "p1/input"
