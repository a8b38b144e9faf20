"""Env values never rest in plaintext: not in any table, not in Redis, not in a log line;
the agent gets them, and ``env_from`` variables and ``env_files`` files come from the
worker's own environment and files."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from tests.driver.fleet import Fleet
from tests.web.conftest import ApiKeys, WebServer
from turnkeeper.config import Settings, plain_postgres_url
from turnkeeper.web import create_app

REQUEST_VALUE = f"sk-request-{uuid.uuid4().hex}"
WORKER_VALUE = f"sk-worker-{uuid.uuid4().hex}"
CATALOG_VALUE = f"catalog-{uuid.uuid4().hex}"
FILE_VALUE = f"sk-file-{uuid.uuid4().hex}"
CATALOG = f"""
[agents.keyed]
command = ["sh", "-c", '''for v in "$MODEL_API_KEY" "$TK_TEST_WORKER_KEY" "$FIXED" "$FILED"; do
  printf %s "$v" | sha256sum | cut -c1-64
done''']
format = "text"
env = {{ FIXED = "{CATALOG_VALUE}" }}
env_from = ["TK_TEST_WORKER_KEY"]
env_files = {{ FILED = "@KEY_FILE@" }}
request_env = ["MODEL_API_KEY"]

[agents.unset]
command = ["true"]
format = "text"
env_from = ["TK_TEST_ABSENT_KEY"]

[agents.unreadable]
command = ["true"]
format = "text"
env_files = {{ FILED = "@MISSING_FILE@" }}
"""
PLAINTEXTS = (REQUEST_VALUE, WORKER_VALUE, CATALOG_VALUE, FILE_VALUE)


@pytest.fixture
def stack(
    settings: Settings, api_keys: ApiKeys, tmp_path: Path
) -> Iterator[tuple[Fleet, WebServer]]:
    key_file = tmp_path / "model.key"
    key_file.write_text(FILE_VALUE + "\n")  # the trailing newline is not the value's
    catalog = tmp_path / "agents.toml"
    text = CATALOG.replace("@KEY_FILE@", str(key_file))
    catalog.write_text(text.replace("@MISSING_FILE@", str(tmp_path / "missing.key")))
    fleet = Fleet.create(settings, tmp_path / "logs")
    fleet.env["TK_TEST_WORKER_KEY"] = WORKER_VALUE  # the worker's own, never the store's
    web = WebServer.start_app(
        create_app(fleet.settings.model_copy(update={"agents_file": catalog}))
    )
    try:
        fleet.start_worker(concurrency=2)
        fleet.start_beat()
        yield fleet, web
    finally:
        web.stop()
        fleet.stop()


def everything_stored(database_url: str, redis_url: str, namespace: str) -> list[bytes]:
    """Every value of every table, and every Redis value under the test's namespace."""
    found: list[bytes] = []
    with psycopg.connect(plain_postgres_url(database_url)) as conn:
        tables = [
            str(row[0])
            for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        ]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):  # noqa: S608 - catalog names
                found.extend(v if isinstance(v, bytes) else str(v).encode() for v in row)
    client = redis.Redis.from_url(redis_url)
    try:
        for key in client.scan_iter(match=f"{namespace}:*"):
            kind = client.type(key)
            if kind == b"stream":
                found.append(str(client.xrange(key)).encode())
            elif kind == b"hash":
                found.append(str(client.hgetall(key)).encode())
            elif kind == b"string":
                found.append(client.get(key) or b"")
            else:
                found.append(str(client.dump(key)).encode())
    finally:
        client.close()
    assert len(tables) >= 9
    return found


def assert_no_plaintext(where: list[bytes]) -> None:
    for plaintext in PLAINTEXTS:
        assert not any(plaintext.encode() in value for value in where), plaintext


def test_env_values_are_sealed_at_rest_and_reach_the_agent(
    stack: tuple[Fleet, WebServer], api_keys: ApiKeys, settings: Settings
) -> None:
    fleet, web = stack
    with web.http(api_keys.bob) as bob:
        body: dict[str, Any] = {
            "agent": "keyed",
            "prompt": "p",
            "run_id": "keyed",
            "env": {"MODEL_API_KEY": REQUEST_VALUE},
        }
        response = bob.post("/runs", json=body)
        assert response.status_code == 201, response.text
        assert_no_plaintext([response.content])
        stored = everything_stored(
            settings.require_database_url(), settings.require_redis_url(), settings.namespace
        )
        assert_no_plaintext(stored)
        run = fleet.wait_settled("keyed")
        assert run.status.value == "completed", run.error
        # The same request again is the same run (the sealed env compares by its digest).
        assert bob.post("/runs", json=body).status_code == 201
        views = [response.content, bob.get("/runs/keyed").content, bob.get("/runs").content]
        transcript = bob.get(f"/sessions/{run.session_id}/transcript")
        assert transcript.status_code == 200
        views.append(transcript.content)
    said = "".join(
        str(chunk.get("delta", ""))
        for _, chunk in fleet.log_of("keyed")
        if chunk["type"] == "TEXT_MESSAGE_CONTENT"
    )
    assert said.split() == [hashlib.sha256(v.encode()).hexdigest() for v in PLAINTEXTS]
    assert "sealed" not in run.payload["env"]  # deleted when the run settled
    stored = everything_stored(
        settings.require_database_url(), settings.require_redis_url(), settings.namespace
    )
    assert_no_plaintext(stored + views)
    logs = [path.read_bytes() for path in fleet.logs.glob("*.log")]
    assert logs
    assert_no_plaintext(logs)


def test_a_missing_worker_variable_fails_the_run_with_the_reason(
    stack: tuple[Fleet, WebServer], api_keys: ApiKeys
) -> None:
    fleet, web = stack
    with web.http(api_keys.bob) as bob:
        response = bob.post("/runs", json={"agent": "unset", "prompt": "p", "run_id": "unset"})
        assert response.status_code == 201, response.text
    run = fleet.wait_settled("unset")
    assert run.status.value == "failed"
    assert run.error["reason"] == "missing-env"
    assert "TK_TEST_ABSENT_KEY" in run.error["message"]
    last = fleet.log_of("unset")[-1][1]
    assert (last["type"], last["code"]) == ("RUN_ERROR", "missing-env")


def test_an_unreadable_key_file_fails_the_run_naming_the_file(
    stack: tuple[Fleet, WebServer], api_keys: ApiKeys, tmp_path: Path
) -> None:
    fleet, web = stack
    with web.http(api_keys.bob) as bob:
        body = {"agent": "unreadable", "prompt": "p", "run_id": "unreadable"}
        response = bob.post("/runs", json=body)
        assert response.status_code == 201, response.text
    run = fleet.wait_settled("unreadable")
    assert run.status.value == "failed"
    assert run.error["reason"] == "env-file"
    assert run.error["message"] == (
        f"cannot read {tmp_path / 'missing.key'}, the file env_files names for FILED: "
        "No such file or directory"
    )
