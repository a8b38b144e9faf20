"""The AG-UI endpoint against a real stack, driven by the real ``@ag-ui/client``
(``HttpAgent`` in Node, from npm) and by plain HTTP for what a client should not send."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.driver.fleet import (
    Fleet,
    chunks_while_held,
    expected_log,
    follow_up_prompt,
    held_agent,
    release_held,
    wait_held,
)
from tests.web.agui_client import AguiClient, install_agui_client
from tests.web.conftest import ApiKeys, WebServer
from tests.web.sse_client import Event, iter_events
from turnkeeper.chunks import Chunk
from turnkeeper.web import create_app
from turnkeeper.web.agui import REFUSED_EVENT

THREAD = "chat/1 ü"  # a slash, a space and a non-ASCII letter travel in the body


@pytest.fixture(scope="session")
def agui_client() -> AguiClient:
    return install_agui_client()


def run_input(thread_id: str, run_id: str, text: str, **fields: Any) -> dict[str, Any]:
    """A RunAgentInput as HttpAgent sends it for one new user message."""
    return {
        "threadId": thread_id,
        "runId": run_id,
        "messages": [{"id": f"{run_id}/user", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
        **fields,
    }


def post_stream(
    http: httpx.Client, body: Any, *, agent: str = "scripted", headers: dict[str, str] | None = None
) -> list[Event]:
    """The events of one POST /agui stream, keep-alives left out."""
    return [
        item
        for item in iter_events(http, f"/agui/{agent}", method="POST", body=body, headers=headers)
        if isinstance(item, Event)
    ]


def assembled(log: list[Chunk]) -> list[dict[str, Any]]:
    """The messages HttpAgent's reducer makes of a log of text messages, tool calls and
    tool results (apply/default.ts): a tool call joins its parent message, a result
    follows the message that made the call."""
    messages: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    calls: dict[str, dict[str, Any]] = {}
    for chunk in log:
        kind = chunk["type"]
        if kind == "TEXT_MESSAGE_START":
            message = {"id": chunk["messageId"], "role": chunk["role"], "content": ""}
            if "metadata" in chunk:
                message["metadata"] = chunk["metadata"]
            messages.append(message)
            by_id[message["id"]] = message
        elif kind == "TEXT_MESSAGE_CONTENT":
            by_id[chunk["messageId"]]["content"] += chunk["delta"]
        elif kind == "TOOL_CALL_START":
            call = {
                "id": chunk["toolCallId"],
                "type": "function",
                "function": {"name": chunk["toolCallName"], "arguments": ""},
            }
            if "metadata" in chunk:
                call["metadata"] = chunk["metadata"]
            by_id[chunk["parentMessageId"]].setdefault("toolCalls", []).append(call)
            calls[call["id"]] = call
        elif kind == "TOOL_CALL_ARGS":
            calls[chunk["toolCallId"]]["function"]["arguments"] += chunk["delta"]
        elif kind == "TOOL_CALL_RESULT":
            result = {
                "id": chunk["messageId"],
                "toolCallId": chunk["toolCallId"],
                "role": chunk["role"],
                "content": chunk["content"],
            }
            if "metadata" in chunk:
                result["metadata"] = chunk["metadata"]
            holder = next(
                i
                for i, m in enumerate(messages)
                if any(c["id"] == chunk["toolCallId"] for c in m.get("toolCalls", []))
            )
            after = holder + 1
            while after < len(messages) and messages[after]["role"] == "tool":
                after += 1
            messages.insert(after, result)
    return messages


def user(run_id: str, text: str) -> dict[str, Any]:
    return {"id": f"{run_id}/user", "role": "user", "content": text}


def check_turn(turn: dict[str, Any], oracle: list[Chunk]) -> None:
    """What came over the wire is the run's log, seq for seq, and the client's events
    are exactly those events."""
    assert turn["error"] is None, turn["error"]
    assert [frame["id"] for frame in turn["wire"]] == [str(s) for s in range(1, len(oracle) + 1)]
    assert [frame["data"] for frame in turn["wire"]] == oracle
    assert turn["events"] == oracle


@pytest.mark.slow
def test_a_conversation_through_the_real_agui_client(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys, agui_client: AguiClient, tmp_path: Path
) -> None:
    result = agui_client.run(
        {
            "url": f"{web.base_url}/agui/scripted",
            "key": api_keys.alice,
            "threadId": THREAD,
            "turns": [{"runId": "r1", "text": "tidy up"}, {"runId": "r2", "text": "and the notes"}],
        },
        tmp_path,
    )
    workdir = tmp_path / "oracle"
    first = expected_log("r1", THREAD, "scripted", "tidy up", workdir)  # type: ignore[arg-type]
    follow_up = follow_up_prompt("and the notes", [("tidy up", first)])
    second = expected_log("r2", THREAD, "scripted", follow_up, workdir)  # type: ignore[arg-type]
    assert (result["warnings"], result["schemaProblems"]) == ([], [])
    first_turn, second_turn = result["turns"]
    check_turn(first_turn, first)
    check_turn(second_turn, second)
    assert first_turn["newMessages"] == assembled(first)
    assert second_turn["newMessages"] == assembled(second)
    assert result["messages"] == [
        user("r1", "tidy up"),
        *assembled(first),
        user("r2", "and the notes"),
        *assembled(second),
    ]
    # The agent's own closing words, as the client assembled them from their deltas.
    assert result["messages"][len(assembled(first))]["content"] == (
        "Finished \u201ctidy up\u201d. I looked at the workspace and created notes.md with the "
        "task and a plan."
    )
    assert [r.run_id for r in fleet.client.list_runs(session_id=THREAD)] == ["r2", "r1"]
    assert next(e.entry_id for e in fleet.client.transcript(THREAD)) == "r1/input"
    assert fleet.log_of("r2") == list(enumerate(second, start=1))


HELD_LINES = 12


@pytest.fixture
def held_web(fleet: Fleet, tmp_path: Path) -> Iterator[tuple[WebServer, str]]:
    """The web app with ``held``: the catalog's scripted agent, stopped after HELD_LINES
    lines until released (tests.driver.fleet.held_agent); returns the agent's token."""
    token = f"held-{fleet.settings.namespace}"
    spec = held_agent({"preset": "scripted"}, token, HELD_LINES)
    catalog = tmp_path / "agents.toml"
    catalog.write_text(
        "[agents.held]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in spec.items())
    )
    server = WebServer.start_app(
        create_app(fleet.settings.model_copy(update={"agents_file": catalog}), ping_seconds=0.5)
    )
    try:
        yield server, token
    finally:
        release_held(token)
        server.stop()


def test_the_client_finishes_once_across_a_worker_killed_mid_stream(
    fleet: Fleet,
    held_web: tuple[WebServer, str],
    api_keys: ApiKeys,
    agui_client: AguiClient,
    tmp_path: Path,
) -> None:
    web, token = held_web
    fleet.start_worker(concurrency=2)  # someone to take over when the owner dies
    conversation = agui_client.start(
        {
            "url": f"{web.base_url}/agui/held",
            "key": api_keys.alice,
            "threadId": "crash-thread",
            "turns": [{"runId": "k1", "text": "tidy up"}],
        },
        tmp_path,
    )
    oracle = expected_log("k1", "crash-thread", {"preset": "scripted"}, "tidy up", tmp_path / "o")
    held = chunks_while_held("k1", {"preset": "scripted"}, "tidy up", HELD_LINES, tmp_path / "h")
    assert 1 < held < len(oracle) - 1
    wait_held(token)
    fleet.wait_chunks("k1", held)
    assert len(fleet.log_of("k1")) == held  # all the held agent said, and no more
    run = fleet.client.require("k1")
    assert not run.status.is_terminal  # the agent is held: the run cannot have settled
    fleet.signal_worker_of(run, signal.SIGKILL)
    release_held(token)
    result = conversation.result()
    settled = fleet.wait_settled("k1")
    assert (settled.status.value, settled.epoch) == ("completed", 2)  # it was taken over
    assert (result["warnings"], result["schemaProblems"]) == ([], [])
    (turn,) = result["turns"]
    check_turn(turn, oracle)
    assert result["messages"] == [user("k1", "tidy up"), *assembled(oracle)]
    ids = [message["id"] for message in result["messages"]]
    assert len(ids) == len(set(ids))  # each message exactly once


def test_a_retried_post_reattaches_and_resumes_after_last_event_id(
    fleet: Fleet, web: WebServer, http: httpx.Client
) -> None:
    body = run_input("retry-thread", "x1", "tidy up")
    # A resume of a run that does not exist admits nothing.
    early = http.post("/agui/scripted", json=body, headers={"Last-Event-ID": "3"})
    assert (early.status_code, early.json()) == (
        404,
        {"error": "no run has the id 'x1'", "run_id": "x1"},
    )
    assert fleet.client.get("x1") is None
    first = post_stream(http, body)
    fleet.wait_settled("x1")
    log = fleet.log_of("x1")
    assert [(e.id, e.chunk) for e in first] == [(str(s), c) for s, c in log]
    assert first[-1].chunk["type"] == "RUN_FINISHED"
    again = post_stream(http, body)  # the same runId: the same run, not a second one
    assert [(e.id, e.chunk) for e in again] == [(e.id, e.chunk) for e in first]
    assert [r.run_id for r in fleet.client.list_runs(session_id="retry-thread")] == ["x1"]
    assert fleet.client.require("x1").attempt_count == 1
    for after in (1, 5, len(log) - 1, len(log)):
        resumed = post_stream(http, body, headers={"Last-Event-ID": str(after)})
        assert [(e.id, e.chunk) for e in resumed] == [(str(s), c) for s, c in log[after:]], after
    past = http.post("/agui/scripted", json=body, headers={"Last-Event-ID": str(len(log) + 1)})
    assert (past.status_code, past.json()["reason"]) == (400, "offset-ahead")
    # The same runId with another prompt is another request: refused, never re-run.
    other = http.post("/agui/scripted", json=run_input("retry-thread", "x1", "something else"))
    assert (other.status_code, other.json()["reason"]) == (409, "payload-differs")


def test_identical_posts_racing_make_one_run(
    fleet: Fleet, web: WebServer, api_keys: ApiKeys
) -> None:
    """Four clients post the same new thread and run at once (a double-click, a retry
    racing its original): one run, and each of them streams all of it."""
    body = run_input("race-thread", "race-1", "tidy up")
    start = threading.Barrier(4)

    def post() -> list[tuple[str | None, Chunk]]:
        with web.http(api_keys.alice) as client:
            start.wait(timeout=60)
            return [(e.id, e.chunk) for e in post_stream(client, body)]

    with ThreadPoolExecutor(4) as pool:
        streams = list(pool.map(lambda _: post(), range(4)))
    fleet.wait_settled("race-1")
    log = [(str(seq), chunk) for seq, chunk in fleet.log_of("race-1")]
    assert streams == [log] * 4
    assert [r.run_id for r in fleet.client.list_runs()] == ["race-1"]
    assert fleet.client.require("race-1").attempt_count == 1


def test_refusals(fleet: Fleet, web: WebServer, api_keys: ApiKeys, http: httpx.Client) -> None:
    body = run_input("alice-thread", "a1", "tidy up")
    with web.http() as anonymous:
        missing = anonymous.post("/agui/scripted", json=body)
        assert missing.status_code == 401
        assert missing.headers["WWW-Authenticate"] == 'Bearer realm="turnkeeper"'
    with web.http("not-a-key") as forged:
        assert forged.post("/agui/scripted", json=body).status_code == 401
    assert post_stream(http, body)[-1].chunk["type"] == "RUN_FINISHED"
    with web.http(api_keys.bob) as bob:
        # Alice's run and Alice's thread do not exist for Bob, and nothing is admitted.
        for stolen in (run_input("bob-thread", "a1", "tidy up"), body):
            hidden = bob.post("/agui/scripted", json=stolen)
            assert hidden.status_code == 404, hidden.text
        assert bob.post("/agui/scripted", json=run_input("alice-thread", "b1", "hi")).json() == {
            "error": "no session has the id 'alice-thread'",
            "session_id": "alice-thread",
        }
        # A resume tells Alice's run from no run no better: the same status and body.
        for run_id in ("a1", "never-made"):
            resume = bob.post(
                "/agui/scripted",
                json=run_input("bob-thread", run_id, "tidy up"),
                headers={"Last-Event-ID": "1"},
            )
            assert (resume.status_code, resume.json()) == (
                404,
                {"error": f"no run has the id {run_id!r}", "run_id": run_id},
            ), run_id
    assert [r.run_id for r in fleet.client.list_runs()] == ["a1"]

    def refused(payload: Any, agent: str = "scripted") -> tuple[int, str]:
        response = http.post(f"/agui/{agent}", json=payload)
        return response.status_code, response.json().get("reason", "")

    fresh = run_input("t", "r", "p")
    assert refused(fresh, agent="no-such-agent") == (400, "unknown-agent")
    for props, expected in (
        ({"command": ["sh", "-c", "id"]}, (400, "forwarded-props")),
        ({"agent": {"command": ["sh"]}}, (400, "forwarded-props")),
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, (400, "bad-spec")),
        ({"env": {"A": 1}}, (400, "forwarded-props")),
        ({"provider": "local"}, (403, "provider-downgrade")),
        ({"timeout": 10**9}, (400, "timeout-out-of-range")),
        ({"max_attempts": 0}, (400, "forwarded-props")),
        ([1, 2], (400, "forwarded-props")),
    ):
        assert refused({**fresh, "forwardedProps": props}) == expected, props
    assistant_last = {**fresh, "messages": [*fresh["messages"], {"id": "a", "role": "assistant"}]}
    image = {"type": "image", "source": {"type": "url", "value": "https://example.com/x.png"}}
    with_image = {
        **fresh,
        "messages": [{"id": "u", "role": "user", "content": [image]}],
    }
    for payload, expected in (
        ({**fresh, "messages": []}, (400, "no-user-message")),
        (assistant_last, (400, "no-user-message")),
        (with_image, (400, "unsupported-content")),
        ({**fresh, "threadId": "a\nb"}, (400, "invalid-session-id")),
        ({**fresh, "runId": "r" * 256}, (400, "invalid-run-id")),
        ({**fresh, "runId": 7}, (400, "invalid-request")),
        ({key: v for key, v in fresh.items() if key != "threadId"}, (400, "invalid-request")),
        ({**fresh, "messages": [{"id": "u", "role": "user", "content": "\ud800"}]}, None),
    ):
        if expected is None:  # a lone surrogate: what httpx cannot even encode, sent raw
            raw = b'{"threadId":"t","runId":"r","messages":[{"id":"u","role":"user",'
            raw += b'"content":"\\ud800"}],"tools":[],"context":[],"state":{}}'
            response = http.post(
                "/agui/scripted", content=raw, headers={"Content-Type": "application/json"}
            )
            assert (response.status_code, response.json()["reason"]) == (400, "invalid-request")
            continue
        assert refused(payload) == expected, payload
    for garbage in ("abc", "-1", "1" * 20):
        bad_offset = http.post("/agui/scripted", json=fresh, headers={"Last-Event-ID": garbage})
        assert (bad_offset.status_code, bad_offset.json()["reason"]) == (400, "invalid-offset")
    huge = run_input("t", "r", "x" * (fleet.settings.max_body_bytes + 1))
    assert http.post("/agui/scripted", json=huge).status_code == 413
    json_type = {"Content-Type": "application/json"}
    not_json = http.post("/agui/scripted", content=b"{", headers=json_type)
    assert (not_json.status_code, not_json.json()["reason"]) == (400, "invalid-request")
    assert [r.run_id for r in fleet.client.list_runs()] == ["a1"]  # nothing else admitted


# An agent that writes AG-UI events of its own, in an order HttpAgent's verifier refuses.
HOSTILE_EVENTS: list[Chunk] = [
    {"type": "RUN_STARTED", "threadId": "evil", "runId": "evil"},
    {"type": "TEXT_MESSAGE_CONTENT", "messageId": "ghost", "delta": "boo"},
    {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant", "subagentRunId": "s"},
    {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"},
    {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "hello"},
    {"type": "STEP_STARTED", "stepName": "plan"},
    {"type": "SUBAGENT_STARTED", "subagentRunId": "s", "name": "helper"},
    {"type": "TEXT_MESSAGE_CHUNK", "messageId": "c", "delta": "hi"},
    {"type": "TOOL_CALL_END", "toolCallId": "nope"},
    {"type": "RUN_FINISHED", "threadId": "evil", "runId": "evil"},
]


@pytest.fixture
def hostile_web(fleet: Fleet, api_keys: ApiKeys, tmp_path: Path) -> Iterator[WebServer]:
    """The web app with a catalog agent that prints HOSTILE_EVENTS as its output."""
    code = f"import json\nfor e in {HOSTILE_EVENTS!r}:\n    print(json.dumps(e), flush=True)\n"
    catalog = tmp_path / "agents.toml"
    command = json.dumps([sys.executable, "-c", code])
    catalog.write_text(f'[agents.hostile]\ncommand = {command}\nformat = "agui"\n')
    server = WebServer.start_app(
        create_app(fleet.settings.model_copy(update={"agents_file": catalog}), ping_seconds=0.5)
    )
    try:
        yield server
    finally:
        server.stop()


def test_an_agents_own_events_reach_the_client_only_as_its_verifier_accepts(
    fleet: Fleet, hostile_web: WebServer, api_keys: ApiKeys, agui_client: AguiClient, tmp_path: Path
) -> None:
    result = agui_client.run(
        {
            "url": f"{hostile_web.base_url}/agui/hostile",
            "key": api_keys.alice,
            "threadId": "hostile-thread",
            "turns": [{"runId": "h1", "text": "go"}],
        },
        tmp_path,
    )
    (turn,) = result["turns"]
    assert turn["error"] is None, turn["error"]
    assert (result["warnings"], result["schemaProblems"]) == ([], [])
    log = [chunk for _, chunk in fleet.log_of("h1")]
    assert log == [
        {"type": "RUN_STARTED", "threadId": "hostile-thread", "runId": "h1"},
        *HOSTILE_EVENTS[1:-1],
        {"type": "RUN_FINISHED", "threadId": "hostile-thread", "runId": "h1"},
    ]
    started, ghost, tagged, twice, content, step, subagent, piece, stray, finished = log

    def refused(chunk: Chunk, reason: str) -> Chunk:
        return {
            "type": "CUSTOM",
            "name": REFUSED_EVENT,
            "value": {"reason": reason, "event": chunk},
        }

    untagged = {k: v for k, v in tagged.items() if k != "subagentRunId"}
    sent = [
        started,
        refused(ghost, "messageId 'ghost' is not open"),
        untagged,
        refused(twice, "messageId 'm' is already open"),
        content,
        step,
        refused(subagent, "subagent lifecycles are not passed on"),
        refused(
            piece, "TEXT_MESSAGE_CHUNK is not passed on: send its START, CONTENT and END events"
        ),
        refused(stray, "toolCallId 'nope' is not open"),
        {"type": "STEP_FINISHED", "stepName": "plan"},
        {"type": "TEXT_MESSAGE_END", "messageId": "m"},
        finished,
    ]
    assert [frame["data"] for frame in turn["wire"]] == sent
    assert [frame["id"] for frame in turn["wire"]] == [*map(str, range(1, 10)), None, None, "10"]
    assert turn["events"] == sent
    assert result["messages"] == [
        user("h1", "go"),
        {"id": "m", "role": "assistant", "content": "hello"},
    ]
