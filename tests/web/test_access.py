"""Stream tokens and request validation (400 with a message)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.web.conftest import ApiKeys, WebServer, stream_tokens
from turnkeeper.config import Settings
from turnkeeper.embedded.ports import free_port
from turnkeeper.embedded.redis import EmbeddedRedis
from turnkeeper.errors import (
    AuthenticationError,
    InvalidInputError,
    StoreError,
    StoreUnavailableError,
)
from turnkeeper.store.store import Store
from turnkeeper.web import create_app
from turnkeeper.web.tokens import StreamTokens

TOKENS = stream_tokens()


@pytest.fixture
def http(bare_web: WebServer, api_keys: ApiKeys) -> Iterator[httpx.Client]:
    with bare_web.http(api_keys.alice) as client:
        yield client


@pytest.fixture
def anonymous(bare_web: WebServer) -> Iterator[httpx.Client]:
    with bare_web.http() as client:
        yield client


def _queued(http: httpx.Client, run_id: str) -> dict[str, Any]:
    response = http.post("/runs", json={"agent": "scripted", "prompt": "p", "run_id": run_id})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    assert body["status"] == "queued"
    return body


def test_tokens_unit() -> None:
    now = 1_700_000_000.0
    token = TOKENS.issue("r1", now=now)
    TOKENS.verify(token, "r1", now=now + 59)
    cases = {
        "expired": (token, "r1", now + 60),
        "other run": (token, "r2", now),
        "other secret": (StreamTokens(b"x", 60).issue("r1", now=now), "r1", now),
        "pushed expiry": (f"{int(now) + 999}.{token.split('.')[1]}", "r1", now),
        "malformed": ("garbage", "r1", now),
        "non-ascii": ("1.é", "r1", now),
        "empty": ("", "r1", now),
    }
    for name, (value, run_id, when) in cases.items():
        with pytest.raises(AuthenticationError):
            TOKENS.verify(value, run_id, now=when)
        assert name


def test_forged_expired_and_missing_tokens_are_refused(
    http: httpx.Client, anonymous: httpx.Client
) -> None:
    body = _queued(http, "guarded")
    base = "/runs/guarded/events"
    refused = {
        "missing": base,
        "forged": f"{base}?token={int(time.time()) + 600}.{'A' * 43}",
        "other run": f"{base}?token={TOKENS.issue('other')}",
        "expired": f"{base}?token={TOKENS.issue('guarded', now=time.time() - 120)}",
        "other secret": f"{base}?token={StreamTokens(b'nope', 60).issue('guarded')}",
    }
    reasons = {}
    for name, url in refused.items():
        response = anonymous.get(url)
        assert response.status_code == 401, name
        assert response.headers["www-authenticate"].startswith("Bearer"), name
        reasons[name] = response.json()["reason"]
    assert reasons == {
        "missing": "missing",
        "forged": "forged",
        "other run": "forged",
        "expired": "expired",
        "other secret": "forged",
    }
    # The issued token opens the stream (it parks on the queued run's empty log).
    with anonymous.stream("GET", body["stream_url"]) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            assert line.startswith(": ping")  # nothing written yet: keep-alives only
            break


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"prompt": "p"}, "agent: Field required"),
        ({"agent": "scripted"}, "prompt: Field required"),
        ({"agent": "scripted", "prompt": "p", "extra": 1}, "extra: Extra inputs are not permitted"),
        ({"agent": "nope", "prompt": "p"}, "unknown agent 'nope'; the catalog has: "),
        ({"agent": {"preset": "scripted", "turns": -1}, "prompt": "p"}, "invalid options"),
        ({"agent": "scripted", "prompt": "p", "provider": "docker"}, "provider: Input should be"),
        ({"agent": "scripted", "prompt": "p", "run_id": ""}, "run_id must be a non-empty string"),
        ({"agent": "scripted", "prompt": "p", "run_id": "x" * 256}, "at most 255 characters"),
        ({"agent": "scripted", "prompt": "p", "run_id": "a\nb"}, "run_id contains a control"),
        ({"agent": "scripted", "prompt": "p", "session_id": "a\x00"}, "session_id contains a"),
        # Ids reach logs, terminals and the dashboard: nothing that breaks a line or
        # reorders the text around it there (NEL, the line separator, a bidi override).
        ({"agent": "scripted", "prompt": "p", "run_id": "a\x85b"}, "run_id contains a control"),
        ({"agent": "scripted", "prompt": "p", "run_id": "a\u2028b"}, "run_id contains a control"),
        ({"agent": "scripted", "prompt": "p", "run_id": "a\u202eb"}, "run_id contains a control"),
        ({"agent": "scripted", "prompt": "p", "session_id": "\u2066x"}, "session_id contains a"),
        ({"agent": "scripted", "prompt": "p", "max_attempts": 0}, "max_attempts: Input should"),
        ({"agent": "scripted", "prompt": 5}, "prompt: Input should be a valid string"),
        ({"agent": "scripted", "prompt": "p", "max_attempts": "2"}, "max_attempts: Input should"),
    ],
)
def test_submit_validation_is_400_with_a_message(
    http: httpx.Client, payload: dict[str, Any], message: str
) -> None:
    response = http.post("/runs", json=payload)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]


def test_path_and_offset_validation(http: httpx.Client) -> None:
    assert (
        http.post(
            "/runs", content=b"{not json", headers={"content-type": "application/json"}
        ).status_code
        == 400
    )
    assert http.get("/runs/a%01b").json()["error"] == "run_id contains a control character"
    assert http.get("/runs/a%01b").status_code == 400
    body = _queued(http, "offsets")
    for bad in ("-1", "abc", "1.5", "9" * 30, "²", "\u0661", "%2B1", "1_0", "%201"):
        response = http.get(f"{body['stream_url']}&offset={bad}")
        assert response.status_code == 400, bad
        assert "offset must be a non-negative integer" in response.json()["error"]
    response = http.get(body["stream_url"], headers={"Last-Event-ID": "x"})
    assert response.status_code == 400
    assert "Last-Event-ID must be" in response.json()["error"]
    for limit in ("0", "1001", "²", "1_000", "+5", " 5", "1000000000"):
        response = http.get("/runs", params={"limit": limit})
        assert response.status_code == 400, limit
        assert response.json()["error"].startswith("limit must be an integer from 1 to 1000")
    assert http.get("/runs?limit=1000").status_code == 200
    assert http.get("/runs?status=bogus").status_code == 400


def test_database_and_driver_text_never_reaches_a_response(settings: Settings) -> None:
    leaks = {
        "unavailable": StoreUnavailableError(
            'get_run: database unavailable: connection to server at "10.1.2.3" failed: FATAL'
        ),
        "failed": StoreError('list_runs failed: relation "runs_secret" does not exist'),
        "refused": InvalidInputError(
            'admit_run: the database refused a value: invalid input syntax "hunter2"',
            reason="invalid-value",
        ),
    }
    app = create_app(settings)

    def fail(kind: str) -> None:
        raise leaks[kind]

    app.add_api_route("/fail/{kind}", fail)
    server = WebServer.start_app(app)
    try:
        with server.http() as http:
            answers = {kind: http.get(f"/fail/{kind}") for kind in leaks}
    finally:
        server.stop()
    assert {kind: (r.status_code, r.json()) for kind, r in answers.items()} == {
        "unavailable": (
            503,
            {
                "error": "a service turnkeeper depends on is unavailable; retry later",
                "reason": "unavailable",
            },
        ),
        "failed": (500, {"error": "internal error", "reason": "internal-error"}),
        "refused": (400, {"error": "a value was refused by the store", "reason": "invalid-value"}),
    }


def test_the_submit_rate_fails_closed_while_redis_is_away(
    settings: Settings, api_keys: ApiKeys, tmp_path: Path
) -> None:
    """The token bucket lives in Redis. With Redis away a submission is refused with 503
    and admits nothing: failing open would let every key submit without limit exactly
    while the log that its stream needs is unwritable."""
    redis_server = EmbeddedRedis(tmp_path / "redis")
    port = free_port()
    redis_server.start(port)
    own = settings.model_copy(update={"redis_url": redis_server.url(port)})
    server = WebServer.start_app(create_app(own, ping_seconds=0.5))
    try:
        with server.http(api_keys.bob) as bob:
            body = {"agent": "scripted", "prompt": "p"}
            assert bob.post("/runs", json={**body, "run_id": "before"}).status_code == 201
            redis_server.stop(port)
            during = bob.post("/runs", json={**body, "run_id": "during"})
            stream = bob.get("/runs/before/events")
            listed = bob.get("/runs")
    finally:
        server.stop()
        redis_server.stop(port)  # a no-op once stopped
    unavailable = {
        "error": "a service turnkeeper depends on is unavailable; retry later",
        "reason": "unavailable",
    }
    assert (during.status_code, during.json()) == (503, unavailable)
    assert (stream.status_code, stream.json()) == (503, unavailable)
    assert [run["run_id"] for run in listed.json()["runs"]] == ["before"]  # Postgres alone
    with Store(settings.require_database_url(), pool_size=1) as store:
        assert [run.run_id for run in store.list_runs(limit=10)] == ["before"]


def test_max_running_holds_across_web_processes_under_racing_submits(settings: Settings) -> None:
    """Forty-eight submissions of one key (max_running 3) at once through two web apps,
    with a submit rate that lets every one of them reach the admission transaction:
    exactly three runs are admitted, and the rest get 429 ``max-running``."""
    open_rate = settings.model_copy(update={"submit_burst": 1000, "submit_rate": 60_000.0})
    with Store(settings.require_database_url(), pool_size=1) as store:
        key = store.create_key("racer", max_running=3)
    servers = [WebServer.start_app(create_app(open_rate, ping_seconds=0.5)) for _ in range(2)]
    racers = 48
    start = threading.Barrier(racers)

    def submit(n: int) -> tuple[int, str | None]:
        with servers[n % 2].http(key) as client:
            start.wait()
            body = {"agent": "scripted", "prompt": "p", "run_id": f"race-{n}"}
            response = client.post("/runs", json=body)
        return response.status_code, response.json().get("reason")

    try:
        with ThreadPoolExecutor(racers) as pool:
            outcomes = Counter(pool.map(submit, range(racers)))
    finally:
        for server in servers:
            server.stop()
    assert outcomes == Counter({(201, None): 3, (429, "max-running"): racers - 3})
    with Store(settings.require_database_url(), pool_size=1) as store:
        runs = store.list_runs(key_name="racer", limit=100)
    assert sorted(run.status.value for run in runs) == ["queued"] * 3
