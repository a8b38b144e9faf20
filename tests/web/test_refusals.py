"""Input refused before admission, each case with its documented status and JSON body
(docs/api.md, "Errors"), against the real app: a prompt the agent cannot take, an
empty prompt, a body that is not JSON, a run id that is taken, a key that is not of
the key format, a foreign Host; and the SSE route's line ends.

The app runs without workers (``bare_web``): what is admitted stays queued, and what
is refused must leave no run behind.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from tests.web.conftest import ApiKeys, WebServer, stream_tokens
from turnkeeper.client import Client
from turnkeeper.config import Settings
from turnkeeper.log import RunLog
from turnkeeper.sandbox.command import MAX_ARGUMENT_BYTES

LIMIT = MAX_ARGUMENT_BYTES  # one argument of an exec, NUL included: 128 KiB - 1
JSON = "application/json"


def too_long(size: int) -> dict[str, str]:
    return {
        "error": f"the prompt is {size} bytes (UTF-8), and the agent takes it as one "
        f"command-line argument, at most {LIMIT} bytes: shorten it, or give the agent "
        "{prompt_file} or its standard input instead",
        "reason": "prompt-too-long",
        "prompt_bytes": str(size),
        "limit_bytes": str(LIMIT),
    }


EMPTY = {
    "error": "the prompt is empty: give the agent the input of its turn",
    "reason": "empty-prompt",
}
NOT_JSON = {
    "error": "the request body must be JSON, sent with `Content-Type: application/json`",
    "reason": "unsupported-media-type",
}


def run_ids(settings: Settings) -> list[str]:
    client = Client.from_settings(settings)
    try:
        return sorted(run.run_id for run in client.list_runs())
    finally:
        client.close()


def agui_input(run_id: str, text: str) -> dict[str, Any]:
    return {
        "threadId": run_id,
        "runId": run_id,
        "messages": [{"id": "u1", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    }


def test_a_prompt_the_agent_cannot_take_is_a_413_before_admission(
    settings: Settings, bare_web: WebServer, api_keys: ApiKeys
) -> None:
    """The scripted agent takes its prompt as one argument: over HTTP a longer one is
    refused with the limit, in UTF-8 bytes (what the agent receives), not characters;
    an agent that reads it on stdin takes it. Every body route says the same."""
    with bare_web.http(api_keys.alice) as alice:

        def post(prompt: str, run_id: str, agent: str = "scripted") -> httpx.Response:
            return alice.post("/runs", json={"agent": agent, "prompt": prompt, "run_id": run_id})

        big = post("x" * 200_000, "big")
        assert (big.status_code, big.json()) == (413, too_long(200_000))
        over = post("x" * (LIMIT + 1), "over")
        assert (over.status_code, over.json()) == (413, too_long(LIMIT + 1))
        # 65,536 characters, 131,072 bytes: one byte too many, in what exec passes.
        umlauts = post("ü" * (LIMIT // 2 + 1), "umlauts")
        assert (umlauts.status_code, umlauts.json()) == (413, too_long(LIMIT + 1))
        four_byte = post("🦀" * (LIMIT // 4 + 1), "crabs")  # 32,768 characters
        assert (four_byte.status_code, four_byte.json()) == (413, too_long(LIMIT + 1))
        session = alice.post(
            "/sessions/chat-1/runs", json={"agent": "scripted", "prompt": "x" * (LIMIT + 1)}
        )
        assert (session.status_code, session.json()) == (413, too_long(LIMIT + 1))
        agui = alice.post("/agui/scripted", json=agui_input("agui-big", "x" * (LIMIT + 1)))
        assert (agui.status_code, agui.json()) == (413, too_long(LIMIT + 1))
        assert run_ids(settings) == []

        at_limit = post("x" * LIMIT, "at-limit")
        assert at_limit.status_code == 201, at_limit.text
        umlauts_at_limit = post("ü" * (LIMIT // 2) + "x", "umlauts-at-limit")
        assert umlauts_at_limit.status_code == 201, umlauts_at_limit.text
        on_stdin = post("x" * 200_000, "on-stdin", agent="claude-code")
        assert on_stdin.status_code == 201, on_stdin.text
        # A NUL cannot be an argument, nor stored: refused either way, never a 500.
        nul = post("a\x00b", "nul")
        assert (nul.status_code, nul.json()) == (
            400,
            {"error": "a prompt argument cannot hold NUL", "reason": "bad-prompt"},
        )
        nul_on_stdin = post("a\x00b", "nul-on-stdin", agent="claude-code")
        assert (nul_on_stdin.status_code, nul_on_stdin.json()) == (
            400,
            {"error": "payload contains a NUL character", "reason": "not-json"},
        )
    assert run_ids(settings) == ["at-limit", "on-stdin", "umlauts-at-limit"]


@pytest.mark.parametrize("prompt", ["", " ", "\n\t \u3000"])
def test_an_empty_prompt_is_a_422(
    settings: Settings, bare_web: WebServer, api_keys: ApiKeys, prompt: str
) -> None:
    with bare_web.http(api_keys.alice) as alice:
        for response in (
            alice.post("/runs", json={"agent": "scripted", "prompt": prompt}),
            alice.post("/runs", json={"agent": "claude-code", "prompt": prompt}),
            alice.post("/sessions/chat-1/runs", json={"agent": "scripted", "prompt": prompt}),
            alice.post("/agui/scripted", json=agui_input("agui-empty", prompt)),
        ):
            assert (response.status_code, response.json()) == (422, EMPTY)
        missing = alice.post("/runs", json={"agent": "scripted"})
        assert (missing.status_code, missing.json()) == (
            400,
            {"error": "prompt: Field required", "reason": "invalid-request"},
        )
    assert run_ids(settings) == []


def test_a_body_that_is_not_json_is_a_415(
    settings: Settings, bare_web: WebServer, api_keys: ApiKeys
) -> None:
    body = json.dumps({"agent": "scripted", "prompt": "p"}).encode()
    with bare_web.http(api_keys.alice) as alice:
        for content_type in (
            None,
            "text/plain",
            "text/plain; charset=utf-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "json",
        ):
            headers = {} if content_type is None else {"content-type": content_type}
            for path in ("/runs", "/sessions/chat-1/runs", "/agui/scripted"):
                response = alice.post(path, content=body, headers=headers)
                assert (response.status_code, response.json()) == (415, NOT_JSON), (
                    path,
                    content_type,
                )
        # Refused for the body's type only after the key: no key is a 401 still.
        with bare_web.http() as anonymous:
            nobody = anonymous.post("/runs", content=body, headers={"content-type": "text/plain"})
            assert (nobody.status_code, nobody.json()["reason"]) == (401, "missing-key")
        assert run_ids(settings) == []
        # What FastAPI reads as JSON is JSON: a charset, a +json type, any case.
        for n, content_type in enumerate(
            ("application/json; charset=utf-8", "Application/JSON", "application/vnd.x+json")
        ):
            sent = json.dumps({"agent": "scripted", "prompt": "p", "run_id": f"j{n}"})
            response = alice.post("/runs", content=sent, headers={"content-type": content_type})
            assert response.status_code == 201, (content_type, response.text)
        # JSON that is not UTF-8, or not JSON at all, under the right type: a 400.
        for raw, error in (
            (b'{"agent": "scripted", "prompt": "\xff"}', "There was an error parsing the body"),
            (b'{"agent": "scripted", "prompt": "p"', "35: JSON decode error"),
            (b"", "Field required"),
            (b"[]", "Input should be a valid dictionary or object to extract fields from"),
        ):
            response = alice.post("/runs", content=raw, headers={"content-type": JSON})
            assert (response.status_code, response.json()) == (
                400,
                {"error": error, "reason": "invalid-request"},
            ), raw
        # UTF-16 with its BOM is JSON to Python's decoder (RFC 8259 allows only UTF-8
        # between systems): read as the text it is, never mangled.
        utf16 = json.dumps({"agent": "scripted", "prompt": "grüß 🦀", "run_id": "u16"})
        sent16 = alice.post("/runs", content=utf16.encode("utf-16"), headers={"content-type": JSON})
        assert sent16.status_code == 201, sent16.text
        assert alice.get("/runs/u16").json()["prompt"] == "grüß 🦀"
    assert run_ids(settings) == ["j0", "j1", "j2", "u16"]


def test_a_run_id_that_exists_is_taken_whatever_its_session(
    bare_web: WebServer, api_keys: ApiKeys
) -> None:
    """Resubmitting ``order-42`` without a session: its own session is named after it,
    and it is the run id that is taken, not "session 'order-42'"."""
    order = {"agent": "scripted", "prompt": "ship it", "run_id": "order-42"}
    with bare_web.http(api_keys.alice) as alice, bare_web.http(api_keys.bob) as bob:
        assert alice.post("/runs", json=order).status_code == 201
        for body in (order, {**order, "prompt": "mine now"}, {**order, "session_id": "order-42"}):
            taken = bob.post("/runs", json=body)
            assert (taken.status_code, taken.json()) == (
                409,
                {
                    "error": "run id 'order-42' is taken; choose another run id",
                    "run_id": "order-42",
                    "reason": "run-id-taken",
                },
            )
        again = alice.post("/runs", json=order)  # the same request: the same run
        assert (again.status_code, again.json()["run_id"]) == (201, "order-42")
        other = alice.post("/runs", json={**order, "prompt": "ship it twice"})
        assert (other.status_code, other.json()) == (
            409,
            {
                "error": "run id 'order-42' is taken by a run of another request (its agent, "
                "prompt or options differ); choose another run id, or send that request again",
                "run_id": "order-42",
                "reason": "payload-differs",
            },
        )
        moved = alice.post("/runs", json={**order, "session_id": "chat-9"})
        assert (moved.status_code, moved.json()) == (
            409,
            {
                "error": "run id 'order-42' is taken by a run of another session; choose "
                "another run id",
                "run_id": "order-42",
                "reason": "session-differs",
            },
        )
        joined = bob.post("/runs", json={**order, "run_id": "bob-1", "session_id": "order-42"})
        assert (joined.status_code, joined.json()) == (
            409,
            {
                "error": "session 'order-42' is taken; choose another session id",
                "run_id": "bob-1",
                "reason": "session-taken",
            },
        )


MALFORMED = {
    "error": "the API key is malformed: a key is `tk_` and 43 letters, digits, `-` or `_`, "
    "as `turnkeeper keys create` prints it",
    "reason": "malformed-key",
}


def test_a_key_not_of_the_key_format_is_malformed(bare_web: WebServer, api_keys: ApiKeys) -> None:
    header = {"error": "the Authorization header must be `Bearer KEY`", "reason": "malformed-key"}
    unknown = {"error": "the API key is unknown or revoked", "reason": "invalid-key"}
    on_key = 'Bearer realm="turnkeeper", error="invalid_token"'
    on_header = 'Bearer realm="turnkeeper", error="invalid_request"'
    cases: list[tuple[bytes, dict[str, str], str]] = [
        (b"Bearer hello", MALFORMED, on_key),
        (b"Bearer " + api_keys.alice[:-1].encode(), MALFORMED, on_key),
        (b"Bearer " + api_keys.alice.encode() + b"A", MALFORMED, on_key),
        (b"Bearer tk_" + b"A" * 42 + b"=", MALFORMED, on_key),
        (b"Bearer tk_" + "ü".encode() * 43, MALFORMED, on_key),
        (b"Bearer TK_" + api_keys.alice[3:].encode(), MALFORMED, on_key),
        (b"Bearer tk_" + b"A" * 43, unknown, on_key),
        (b"Basic " + api_keys.alice.encode(), header, on_header),
        (b"Bearer", header, on_header),
        (b"hello", header, on_header),
    ]
    with httpx.Client(base_url=bare_web.base_url) as http:
        for value, body, challenge in cases:
            for method, path in (("GET", "/runs"), ("GET", "/runs/x/events"), ("GET", "/key")):
                response = http.request(method, path, headers={"authorization": value})
                assert (response.status_code, response.json()) == (401, body), (value, path)
                assert response.headers["www-authenticate"] == challenge, value
        alice = http.get("/key", headers={"authorization": f"Bearer {api_keys.alice}"})
        assert alice.json()["name"] == "alice"


def test_a_foreign_host_gets_the_json_error_body(bare_web: WebServer, api_keys: ApiKeys) -> None:
    refused = {
        "error": "the Host header names no host this server answers to",
        "reason": "invalid-host",
    }
    with bare_web.http(api_keys.alice) as alice:
        for host in ("evil.example", "evil.example:80", "localhost.evil.example", "[::1", "a b"):
            for method, path in (("GET", "/healthz"), ("POST", "/runs"), ("GET", "/nowhere")):
                response = alice.request(
                    method, path, headers={"host": host}, json={"agent": "scripted", "prompt": "p"}
                )
                assert (response.status_code, response.json()) == (400, refused), (host, path)
                assert response.headers["content-type"] == JSON
                assert response.headers["x-content-type-options"] == "nosniff"
        assert alice.get("/healthz", headers={"host": "LOCALHOST:8000"}).status_code == 200


def test_the_event_stream_ends_its_lines_in_lf(
    settings: Settings, bare_web: WebServer, api_keys: ApiKeys
) -> None:
    """``GET /runs/{id}/events`` byte for byte: LF line ends only, on chunks, the end
    event and keep-alives alike (the app pings every 0.5 s here)."""
    client = Client.from_settings(settings)
    writer = RunLog.from_settings(settings)
    try:
        run_id = client.submit("scripted", "p", run_id="lf").run_id
        writer.fence(run_id, 1)
        chunks = [{"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "a\r\nb\rc"}] * 2
        writer.append(run_id, 1, 1, chunks)
        writer.close(run_id, 1)
    finally:
        writer.client.close()
        client.close()
    token = stream_tokens().issue("lf")
    with bare_web.http() as anonymous:  # a trusted client's run: its token opens it
        raw = anonymous.get(f"/runs/lf/events?token={token}").content
    frames = re.sub(rb": ping[^\r\n]*\n\n", b"", raw)
    data = b'{"delta":"a\\r\\nb\\rc","messageId":"m","type":"TEXT_MESSAGE_CONTENT"}'
    assert frames == (
        b"id: 1\ndata: " + data + b"\n\nid: 2\ndata: " + data + b"\n\n"
        b'event: end\ndata: {"last_seq":2}\n\n'
    )
    assert b"\r" not in raw
