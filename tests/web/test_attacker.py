"""An attacker against a real `turnkeeper web` process, with real workers and beat.

Every route is tried with no key, a wrong key, a revoked key and another tenant's
key; then the catalog's and the settings' limits, the edge checks (Host, Origin,
body size, numbers) and the quotas. Each refusal has its exact status code, and
the store is the same after every refused request as before it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from psycopg import sql

from tests.driver.fleet import Fleet
from tests.web.conftest import ApiKeys
from tests.web.sse_client import Event, iter_events
from turnkeeper.config import plain_postgres_url
from turnkeeper.store.store import Store
from turnkeeper.web.serve import free_port

CATALOG = """
[agents.strict]
command = ["sh", "-c", "echo strict"]
format = "text"
provider = "bwrap"
timeout = 60
max_attempts = 2
env = { MODE = "strict" }

[agents.keyed]
command = ["sh", "-c", "echo keyed"]
format = "text"
env_from = ["LANG"]
"""
BURST = 4
STREAM_CAP = 2
SLOW: dict[str, Any] = {"preset": "scripted", "turns": 200, "pace": 0.2, "seed": 1}
VICTIM = "victim run"
VICTIM_SESSION = "victim session"


@dataclass
class Target:
    """The web process under attack, its log, and the keys of its database."""

    base_url: str
    log: Path
    keys: ApiKeys
    revoked: str
    carol: str  # --max-running 1
    dave: str  # for the submit rate
    database_url: str

    def http(self, key: str | None = None, **headers: str) -> httpx.Client:
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=60.0)


@pytest.fixture
def target(fleet: Fleet, api_keys: ApiKeys, tmp_path: Path, database_url: str) -> Iterator[Target]:
    with Store(database_url, pool_size=1) as store:
        revoked = store.create_key("mallory", allow_commands=True, admin=True)
        store.revoke_key("mallory")
        carol = store.create_key("carol", max_running=1, allow_commands=True)
        dave = store.create_key("dave")
    catalog = tmp_path / "agents.toml"
    catalog.write_text(CATALOG)
    port = free_port()
    env = {
        **fleet.env,
        "TURNKEEPER_WEB_PORT": str(port),
        "TURNKEEPER_AGENTS_FILE": str(catalog),
        "TURNKEEPER_SUBMIT_BURST": str(BURST),
        "TURNKEEPER_SUBMIT_RATE": "1",
        "TURNKEEPER_MAX_STREAMS_PER_KEY": str(STREAM_CAP),
        "TURNKEEPER_LOG_FORMAT": "console",
    }
    log = tmp_path / "web.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnkeeper", "web"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base_url, proc, log)
        yield Target(base_url, log, api_keys, revoked, carol, dave, database_url)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _wait_healthy(base_url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60  # a hang guard
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"turnkeeper web exited:\n{log.read_text()}")
        try:
            if httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"turnkeeper web never answered:\n{log.read_text()}")


# Bookkeeping that moves by itself: leases, the reaper's sandbox references, a key's
# last use, a session's leaf as its runs commit turns.
_VOLATILE = {
    "runs": ("updated_at", "lease_expires_at", "sandbox_ref", "dispatched_at", "started_at",
             "finished_at", "owner", "attempt_id", "sandbox_host", "lock_attempt_id",
             "agent_session_id"),
    # What a worker records of the session's workspace when it places a run.
    "sessions": ("updated_at", "leaf_id", "version", "workspace", "workspace_host"),
    "api_keys": ("last_used_at",),
}  # fmt: skip
_FLEET_TABLES = {"alembic_version", "workers", "sweeps"}
"""Left out whole: the schema's version, the worker processes that announce
themselves (a pool process starting, or beating) and the sweeps beat records,
whatever a request does."""
_UNSETTLED = "SELECT 1 FROM runs u WHERE u.run_id = t.run_id AND u.status IN ('queued', 'running')"


def snapshot(database_url: str) -> dict[str, list[str]]:
    """Every table of the store, row by row: what a refused request must not change.
    Rows of other tables that belong to an unsettled run move with it, so they are left
    out while it runs (its own row stays in, without its bookkeeping)."""
    with psycopg.connect(plain_postgres_url(database_url)) as conn:
        columns: dict[str, set[str]] = {}
        for table, column in conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema()"
        ).fetchall():
            if table not in _FLEET_TABLES:
                columns.setdefault(table, set()).add(column)
        assert {"runs", "sessions", "api_keys", "transcript_entries", "turn_slots"} <= set(columns)
        tables = {}
        for table, names in sorted(columns.items()):
            row = sql.SQL("to_jsonb(t)")
            for name in _VOLATILE.get(table, ()):
                row = sql.SQL("{} - {}").format(row, sql.Literal(name))
            where = sql.SQL(" WHERE NOT EXISTS ({})").format(sql.SQL(_UNSETTLED))
            query = sql.SQL("SELECT ({})::text FROM {} t{} ORDER BY 1").format(
                row,
                sql.Identifier(table),
                where if table != "runs" and "run_id" in names else sql.SQL(""),
            )
            tables[table] = [str(r[0]) for r in conn.execute(query).fetchall()]
        return tables


def refused(
    target: Target, client: httpx.Client, method: str, url: str, status: int, **kwargs: Any
) -> httpx.Response:
    """The request gets ``status`` and leaves the store as it was."""
    before = snapshot(target.database_url)
    response = client.request(method, url, **kwargs)
    assert response.status_code == status, (method, url, response.status_code, response.text)
    assert snapshot(target.database_url) == before, (method, url)
    return response


def _victim(target: Target, fleet: Fleet) -> dict[str, Any]:
    with target.http(target.keys.alice) as alice:
        body = {"agent": "scripted", "prompt": "my secret plan", "run_id": VICTIM}
        response = alice.post("/runs", json={**body, "session_id": VICTIM_SESSION})
    assert response.status_code == 201, response.text
    fleet.wait_settled(VICTIM)
    view: dict[str, Any] = response.json()
    return view


V = quote(VICTIM, safe="")
KEYED_ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/runs", None),
    ("POST", "/runs", {"agent": "scripted", "prompt": "x", "run_id": "attack"}),
    ("GET", f"/runs/{V}", None),
    ("POST", f"/runs/{V}/cancel", None),
    ("GET", f"/runs/{V}/events", None),
    ("GET", f"/sessions/{quote(VICTIM_SESSION, safe='')}/transcript", None),
    ("GET", f"/sessions/{quote(VICTIM_SESSION, safe='')}", None),
    (
        "POST",
        f"/sessions/{quote(VICTIM_SESSION, safe='')}/runs",
        {"agent": "scripted", "prompt": "x"},
    ),
    ("GET", "/metrics", None),
    ("GET", "/fleet/hosts", None),
    ("GET", "/fleet", None),
    ("GET", "/fleet?minutes=5", None),
    ("GET", "/key", None),
    ("GET", "/openapi.json", None),
]


def test_every_route_needs_a_live_key(target: Target, fleet: Fleet) -> None:
    _victim(target, fleet)
    credentials = {
        "none": None,
        "wrong": "Bearer tk_" + "A" * 43,
        "not a key": "Bearer hunter2",
        "revoked": f"Bearer {target.revoked}",
        "another scheme": f"Basic {target.keys.alice}",
    }
    reasons, challenges = {}, {}
    for name, header in credentials.items():
        headers = {} if header is None else {"Authorization": header}
        with target.http(**headers) as client:
            for method, url, body in KEYED_ROUTES:
                response = refused(target, client, method, url, 401, json=body)
                challenges[name, url] = response.headers["www-authenticate"]
                reasons[name, url] = response.json()["reason"]
    assert {r for (name, _), r in reasons.items() if name == "none"} == {"missing-key", "missing"}
    assert {r for (name, _), r in reasons.items() if name in ("wrong", "revoked")} == {
        "invalid-key"
    }
    malformed = {r for (name, _), r in reasons.items() if name in ("not a key", "another scheme")}
    assert malformed == {"malformed-key"}
    # RFC 6750 §3.1: no error code without a credential, invalid_request for a malformed one.
    assert {(name, c) for (name, _), c in challenges.items()} == {
        ("none", 'Bearer realm="turnkeeper"'),
        ("wrong", 'Bearer realm="turnkeeper", error="invalid_token"'),
        ("not a key", 'Bearer realm="turnkeeper", error="invalid_token"'),
        ("revoked", 'Bearer realm="turnkeeper", error="invalid_token"'),
        ("another scheme", 'Bearer realm="turnkeeper", error="invalid_request"'),
    }
    # What needs no key: the health check and the dashboard's pages, which hold no data.
    with target.http() as anonymous:
        pages = (f"/ui/runs/{V}", f"/ui/sessions/{V}", "/static/session.js", "/ui/fleet")
        pages += ("/static/fleet.js", "/static/charts.js", "/static/fleet.css")
        for url in ("/healthz", "/", "/login", "/static/common.js", *pages):
            assert anonymous.get(url).status_code == 200, url


def test_another_tenant_is_told_nothing_exists(target: Target, fleet: Fleet) -> None:
    victim = _victim(target, fleet)
    with target.http(target.keys.bob) as bob:
        hidden = refused(target, bob, "GET", f"/runs/{V}", 404)
        unknown = bob.get("/runs/no-such-run")
        assert unknown.status_code == 404
        assert hidden.json() == {"error": f"no run has the id {VICTIM!r}", "run_id": VICTIM}
        assert unknown.json() == {
            "error": "no run has the id 'no-such-run'",
            "run_id": "no-such-run",
        }
        refused(target, bob, "POST", f"/runs/{V}/cancel", 404)
        refused(target, bob, "GET", f"/runs/{V}/events", 404)
        refused(target, bob, "GET", f"/runs/{V}/events?offset=0", 404)
        session = quote(VICTIM_SESSION, safe="")
        transcript = refused(target, bob, "GET", f"/sessions/{session}/transcript", 404)
        assert transcript.json()["error"] == f"no session has the id {VICTIM_SESSION!r}"
        tree = refused(target, bob, "GET", f"/sessions/{session}", 404)
        assert tree.json()["error"] == f"no session has the id {VICTIM_SESSION!r}"
        sent = refused(
            target, bob, "POST", f"/sessions/{session}/runs", 404,
            json={"agent": "scripted", "prompt": "my secret plan"},
        )  # fmt: skip
        assert sent.json()["error"] == f"no session has the id {VICTIM_SESSION!r}"
        assert bob.get("/runs").json()["runs"] == []
        assert bob.get("/runs", params={"session_id": VICTIM_SESSION}).json()["runs"] == []
        # Ids are global: another tenant learns that one is taken, and nothing else.
        taken = refused(
            target, bob, "POST", "/runs", 409,
            json={"agent": "scripted", "prompt": "my secret plan", "run_id": VICTIM},
        )  # fmt: skip
        assert taken.json()["reason"] == "run-id-taken"
        joined = refused(
            target, bob, "POST", "/runs", 409,
            json={"agent": "scripted", "prompt": "let me in", "session_id": VICTIM_SESSION},
        )  # fmt: skip
        assert joined.json()["reason"] == "session-taken"
        assert "my secret plan" not in taken.text + joined.text
        assert refused(target, bob, "GET", "/metrics", 403).json()["reason"] == "admin-only"
        hosts = refused(target, bob, "GET", "/fleet/hosts", 403)  # hosts, pids, other runs' ids
        assert hosts.json()["reason"] == "admin-only"
        fleet_page = refused(target, bob, "GET", "/fleet", 403)  # every worker and run
        assert fleet_page.json()["reason"] == "admin-only"
    # Its owner and an admin key see it; the stream token opens it for anyone holding it.
    with target.http(target.keys.alice) as alice:
        assert [r["run_id"] for r in alice.get("/runs").json()["runs"]] == [VICTIM]
    with target.http(target.keys.admin) as admin:
        assert admin.get(f"/runs/{V}").json()["status"] == "completed"
        assert admin.get("/metrics").status_code == 200
    with target.http() as anonymous:
        assert anonymous.get(victim["stream_url"]).status_code == 200
        # Revoking a key cuts off the stream URLs it was given, at once.
        with Store(target.database_url, pool_size=1) as store:
            store.revoke_key("alice")
        cut = refused(target, anonymous, "GET", victim["stream_url"], 401)
        assert cut.json()["reason"] == "revoked-key"


def test_the_catalog_and_the_settings_only_tighten(target: Target, fleet: Fleet) -> None:
    inline = {"command": ["sh", "-c", "cat /etc/passwd"], "format": "text"}
    with target.http(target.keys.bob) as bob:
        no_leave = refused(target, bob, "POST", "/runs", 403, json={"agent": inline, "prompt": "p"})
        assert no_leave.json()["reason"] == "inline-agent"
        assert "claude-code, codex, keyed, scripted, strict" in no_leave.json()["error"]
        assert "--allow-commands" in no_leave.json()["error"]
        options = {"preset": "claude-code", "args": ["--settings", "/tmp/hooks.json"]}
        refused(target, bob, "POST", "/runs", 403, json={"agent": options, "prompt": "p"})
        cases: list[tuple[dict[str, Any], int, str]] = [
            ({"agent": "strict", "provider": "local"}, 403, "provider-downgrade"),
            ({"agent": "strict", "provider": "ssh"}, 403, "provider-downgrade"),
            ({"agent": "strict", "timeout": 61}, 400, "timeout-out-of-range"),
            ({"agent": "scripted", "timeout": 11_000_000_000.0}, 400, "timeout-out-of-range"),
            ({"agent": "strict", "max_attempts": 3}, 400, "attempts-out-of-range"),
            ({"agent": "scripted", "max_attempts": 100}, 400, "attempts-out-of-range"),
            ({"agent": "strict", "env": {"MODE": "lax"}}, 403, "env-fixed"),
            ({"agent": "keyed", "env": {"ANTHROPIC_BASE_URL": "http://x"}}, 403, "env-not-listed"),
            ({"agent": "nope"}, 400, "unknown-agent"),
            ({"agent": "scripted", "max_attempts": 0}, 400, "invalid-request"),
            ({"agent": "scripted", "timeout": -1}, 400, "invalid-request"),
        ]
        for extra, status, reason in cases:
            response = refused(target, bob, "POST", "/runs", status, json={"prompt": "p", **extra})
            assert response.json()["reason"] == reason, extra
        # Tightening is accepted, and what is stored is what was asked (and the
        # snapshot sees it: it is not blind to what a request writes).
        before = snapshot(target.database_url)
        ok = bob.post(
            "/runs",
            json={"agent": "strict", "prompt": "p", "run_id": "tight", "provider": "bwrap",
                  "timeout": 30, "max_attempts": 1},
        )  # fmt: skip
        assert ok.status_code == 201, ok.text
        assert snapshot(target.database_url) != before
        assert bob.post(f"/runs/{quote('tight')}/cancel").status_code == 200
    run = fleet.wait_settled("tight")  # the store holds still while the next one is refused
    assert (run.max_attempts, run.key_name, run.payload["provider"]) == (1, "bob", "bwrap")
    assert 29 <= (run.deadline - run.created_at).total_seconds() <= 30  # type: ignore[operator]
    with target.http(target.keys.alice) as alice:
        passes = {"command": ["true"], "format": "text", "env_from": ["TURNKEEPER_SECRET"]}
        response = refused(
            target, alice, "POST", "/runs", 403, json={"agent": passes, "prompt": "p"}
        )
        assert response.json()["reason"] == "env-from"


def test_the_edge_refuses_cross_site_foreign_hosts_big_bodies_and_odd_numbers(
    target: Target, fleet: Fleet
) -> None:
    _victim(target, fleet)
    form = {
        "content": b"agent=scripted&prompt=x",
        "headers": {
            "content-type": "application/x-www-form-urlencoded",
            "origin": "https://evil.example",
        },
    }
    with target.http(target.keys.alice) as alice:
        assert (
            refused(target, alice, "POST", "/runs", 403, **form).json()["reason"] == "cross-origin"
        )
        refused(target, alice, "POST", f"/runs/{V}/cancel", 403, headers={"origin": "null"})
        # Without Origin, Referer stands in for it; a sibling subdomain is another origin.
        for headers in (
            {"referer": "https://evil.example/page"},
            {"referer": f"{target.base_url}.evil.example/"},
            {"sec-fetch-site": "same-site"},
        ):
            response = refused(target, alice, "POST", f"/runs/{V}/cancel", 403, headers=headers)
            assert response.json()["reason"] == "cross-origin", headers
        refused(
            target, alice, "POST", "/runs", 403,
            json={"agent": "scripted", "prompt": "x"}, headers={"sec-fetch-site": "cross-site"},
        )  # fmt: skip
        # The CORS-simple trick: JSON sent as text/plain is not read as JSON.
        simple = refused(
            target, alice, "POST", "/runs", 415,
            content=b'{"agent": "scripted", "prompt": "x"}', headers={"content-type": "text/plain"},
        )  # fmt: skip
        assert simple.json()["reason"] == "unsupported-media-type"
        # Every route, keyed or not, behind a foreign Host header; every state-changing
        # one from another origin's form and with a body over the limit.
        public = [("GET", url, None) for url in ("/healthz", "/", "/login", "/static/common.js")]
        for method, url, body in KEYED_ROUTES + public:
            response = refused(
                target, alice, method, url, 400, json=body, headers={"host": "evil.example:80"}
            )
            assert response.json() == {
                "error": "the Host header names no host this server answers to",
                "reason": "invalid-host",
            }, url
            if method == "POST":
                refused(target, alice, method, url, 403, **form)
                refused(
                    target, alice, method, url, 413,
                    json={"agent": "scripted", "prompt": "x" * (1024 * 1024)},
                )  # fmt: skip
        big = {"agent": "scripted", "prompt": "x" * (1024 * 1024)}
        too_large = refused(target, alice, "POST", "/runs", 413, json=big)
        assert too_large.json()["reason"] == "body-too-large"

        def chunks() -> Iterator[bytes]:
            yield b'{"agent": "scripted", "prompt": "'
            for _ in range(64):
                yield b"x" * 32768
            yield b'"}'

        refused(
            target, alice, "POST", "/runs", 413,
            content=chunks(), headers={"content-type": "application/json"},
        )  # fmt: skip
        # JSON's escapes of lone surrogates, which no UTF-8 store can hold, anywhere in a body.
        lone = "a\ud800"
        for body in (
            {"agent": "scripted", "prompt": lone},
            {"agent": "scripted", "prompt": "p", "run_id": lone},
            {"agent": "scripted", "prompt": "p", "session_id": lone},
            {"agent": "scripted", "prompt": "p", "env": {"CANARY": lone}},
            {"agent": {"command": ["echo", lone], "format": "text"}, "prompt": "p"},
        ):
            raw = json.dumps(body).encode()  # ASCII: the surrogate is a \ud800 escape
            response = refused(
                target, alice, "POST", "/runs", 400,
                content=raw, headers={"content-type": "application/json"},
            )  # fmt: skip
            assert response.json() == {
                "error": "a string of the body holds a lone UTF-16 surrogate",
                "reason": "invalid-request",
            }
        # Errors of the framework itself have the same shape as ours.
        assert refused(target, alice, "DELETE", "/runs", 405).json() == {
            "error": "Method Not Allowed",
            "reason": "method-not-allowed",
        }
        assert refused(target, alice, "GET", "/nowhere", 404).json()["reason"] == "not-found"
        unparsable = refused(
            target, alice, "POST", "/runs", 400,
            content=b'{"agent": "scripted", "prompt": "\xff"}',
            headers={"content-type": "application/json"},
        )  # fmt: skip
        assert unparsable.json()["reason"] == "invalid-request"
        # A same-origin browser request passes the Origin check, and so does its Referer.
        same = alice.post(f"/runs/{V}/cancel", headers={"origin": target.base_url})
        assert same.status_code == 200
        same = alice.post(
            f"/runs/{V}/cancel",
            headers={"referer": f"{target.base_url}/ui/runs/{V}", "sec-fetch-site": "same-origin"},
        )
        assert same.status_code == 200
    with target.http(target.keys.alice) as alice:
        for response in (alice.get("/"), alice.get("/runs"), too_large):
            assert response.headers["x-content-type-options"] == "nosniff"
            assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
            assert "default-src 'self'" in response.headers["content-security-policy"]
            assert response.headers["referrer-policy"] == "no-referrer"


def test_quotas_per_key(target: Target, fleet: Fleet) -> None:
    with target.http(target.carol) as carol:
        first = carol.post("/runs", json={"agent": SLOW, "prompt": "p", "run_id": "c1"})
        assert first.status_code == 201
        fleet.wait("c1", lambda run: run.status.value == "running")
        full = refused(
            target, carol, "POST", "/runs", 429, json={"agent": "scripted", "prompt": "p"}
        )
        assert (full.json()["reason"], full.headers["retry-after"]) == ("max-running", "10")
        # An identical replay of the run it has is not a new run: it passes.
        again = carol.post("/runs", json={"agent": SLOW, "prompt": "p", "run_id": "c1"})
        assert again.status_code == 201
        assert carol.post("/runs/c1/cancel").status_code == 200
        fleet.wait_settled("c1")
        assert carol.post("/runs", json={"agent": "scripted", "prompt": "p"}).status_code == 201
    with target.http(target.dave) as dave:
        for n in range(BURST):
            response = dave.post(
                "/runs", json={"agent": "scripted", "prompt": "p", "run_id": f"d{n}"}
            )
            assert response.status_code == 201, response.text
        for n in range(BURST):
            fleet.wait_settled(f"d{n}")  # the store holds still while the next one is refused
        fast = refused(
            target, dave, "POST", "/runs", 429, json={"agent": "scripted", "prompt": "p"}
        )
        assert fast.json()["reason"] == "submit-rate"
        assert 1 <= int(fast.headers["retry-after"]) <= 60  # one a minute
    # Open streams: at most STREAM_CAP per key, counted for the key that opens them
    # (or, with a stream token, for the run's owner).
    with target.http(target.keys.alice) as alice:
        slow = alice.post("/runs", json={"agent": SLOW, "prompt": "p", "run_id": "slow"}).json()
        url = slow["stream_url"]
        with alice.stream("GET", url) as one, alice.stream("GET", url) as two:
            assert (one.status_code, two.status_code) == (200, 200)
            over = alice.get(url)
            assert (over.status_code, over.json()["reason"]) == (429, "open-streams")
            with target.http() as anonymous:
                assert anonymous.get(url).status_code == 429  # charged to alice, the owner
        _open_when_freed(alice, url)  # closing them freed their slots
        assert alice.post("/runs/slow/cancel").status_code == 200
    with target.http(target.keys.bob) as bob, bob.stream("GET", url) as other:
        assert other.status_code == 404


def test_the_access_log_has_no_query_strings(target: Target, fleet: Fleet) -> None:
    victim = _victim(target, fleet)
    token = victim["stream_url"].split("token=", 1)[1]
    with target.http() as anonymous:
        assert anonymous.get(victim["stream_url"]).status_code == 200
        # Revoking a key cuts off the stream URLs it was given, at once.
        with Store(target.database_url, pool_size=1) as store:
            store.revoke_key("alice")
        cut = refused(target, anonymous, "GET", victim["stream_url"], 401)
        assert cut.json()["reason"] == "revoked-key"
        assert anonymous.get("/runs?limit=5&secret=hunter2").status_code == 401
    deadline = time.monotonic() + 30  # a hang guard: the log line is written after the response
    while "/events?…" not in target.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = target.log.read_text()
    assert f"/runs/{V}/events?…" in log
    assert "/runs?…" in log
    assert token.split(".")[1] not in log
    assert "hunter2" not in log
    assert target.keys.alice not in log


def _open_when_freed(client: httpx.Client, url: str) -> None:
    """A stream opens once the server has noticed a closed one (a hang guard, no timing)."""
    deadline = time.monotonic() + 30
    while True:
        with client.stream("GET", url) as response:
            if response.status_code == 200:
                return
            assert response.status_code == 429
        assert time.monotonic() < deadline, "a closed stream never freed its slot"
        time.sleep(0.1)


def test_revoking_a_key_ends_the_streams_it_has_open(target: Target, fleet: Fleet) -> None:
    """Open streams are cut when their key is revoked, not when their run ends: one opened
    with the key, one with the stream token it was given (counted for the run's owner)."""
    with target.http(target.keys.alice) as alice, target.http() as anonymous:
        slow = alice.post("/runs", json={"agent": SLOW, "prompt": "p", "run_id": "slow"})
        assert slow.status_code == 201, slow.text
        streams = [
            iter_events(alice, "/runs/slow/events"),
            iter_events(anonymous, slow.json()["stream_url"]),
        ]
        firsts = [_next_event(stream) for stream in streams]
        assert [(e.id, e.chunk["type"]) for e in firsts] == [("1", "RUN_STARTED")] * 2
        with Store(target.database_url, pool_size=1) as store:
            store.revoke_key("alice")
        for stream in streams:
            last = _next_event(stream)
            while last.event == "message":
                last = _next_event(stream)
            assert (last.event, json.loads(last.data)) == (
                "log-error",
                {
                    "message": "the key 'alice' this stream counts against was revoked",
                    "reason": "revoked-key",
                    "status": 401,
                },
            )
            assert list(stream) == []  # and the response ends there
        # Cut while the run goes on (it has 200 turns to go): not a stream that simply ended.
        assert fleet.client.require("slow").status.value == "running"
        resumed = alice.get("/runs/slow/events", headers={"last-event-id": "1"})
        assert (resumed.status_code, resumed.json()["reason"]) == (401, "invalid-key")
    with target.http(target.keys.admin) as admin:
        assert admin.post("/runs/slow/cancel").status_code == 200


def test_numbers_are_ascii_digits_only_and_bounded(target: Target, fleet: Fleet) -> None:
    """Every number a request carries: ``limit``, ``offset`` (of a keyed stream and of a
    token's), ``Last-Event-ID``, ``Content-Length``."""
    victim = _victim(target, fleet)
    with target.http(target.keys.alice) as alice:
        for limit in ("1000000000", "1001", "0", "²", "\u0661\u0660", "1_000", "+5", "-1"):
            response = refused(target, alice, "GET", "/runs", 400, params={"limit": limit})
            assert response.json()["reason"] == "invalid-limit", limit
        assert alice.get("/runs", params={"limit": "1000"}).status_code == 200
        other_digits = (
            "²",
            "\u0661",
            "\u06f1",
            "\uff11",
            "\u0967",
            "\u2460",
        )  # superscript, Arabic-Indic, Persian, fullwidth, Devanagari, circled
        for offset in (*other_digits, "1.0", "0x1", "-1", "+1", "1_0", str(2**53 + 1)):
            for url in (victim["stream_url"], f"/runs/{V}/events"):
                response = refused(target, alice, "GET", url, 400, params={"offset": offset})
                assert response.json()["reason"] == "invalid-offset", offset
            header = {"last-event-id": offset.encode()}
            response = refused(target, alice, "GET", victim["stream_url"], 400, headers=header)
            assert response.json()["reason"] == "invalid-offset", offset
        for limit in other_digits:
            response = refused(target, alice, "GET", "/runs", 400, params={"limit": limit})
            assert response.json()["reason"] == "invalid-limit", limit
        # A Content-Length that lies (says 40, sends 2 MB) or is not ASCII digits: HTTP
        # itself refuses it; nothing reaches the store.
        before = snapshot(target.database_url)
        for length, body in ((b"40", b'{"prompt": "' + b"x" * 2_000_000), ("¹⁰".encode(), b"{}")):
            status_line = _raw_post(target, alice_key=target.keys.alice, length=length, body=body)
            assert status_line == b"HTTP/1.1 400 Bad Request", length
        assert snapshot(target.database_url) == before


def _raw_post(target: Target, *, alice_key: str, length: bytes, body: bytes) -> bytes:
    """POST /runs over a bare socket with the given Content-Length; the status line."""
    host, port = target.base_url.removeprefix("http://").split(":")
    head = (
        f"POST /runs HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {alice_key}\r\n"
        "Content-Type: application/json\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        # The server may answer and close before the body is all sent.
        with contextlib.suppress(OSError):
            conn.sendall(head + b"Content-Length: " + length + b"\r\n\r\n" + body)
        answer = b""
        while b"\r\n" not in answer:
            part = conn.recv(4096)
            if not part:
                break
            answer += part
    return answer.split(b"\r\n", 1)[0]


def _next_event(stream: Iterator[Event | str]) -> Event:
    for item in stream:
        if isinstance(item, Event):
            return item
    raise AssertionError("the stream ended without another event")


def test_max_running_holds_under_racing_submits(target: Target, fleet: Fleet) -> None:
    """Sixteen submissions of one key at once (max_running 1): one run, and 429s with
    Retry-After for the rest (the submit rate's burst of BURST lets BURST of them race
    to the admission transaction)."""
    racers = 16
    start = threading.Barrier(racers)

    def submit(n: int) -> tuple[int, str, str]:
        with target.http(target.carol) as carol:
            start.wait()
            response = carol.post(
                "/runs", json={"agent": SLOW, "prompt": "p", "run_id": f"race-{n}"}
            )
        if response.status_code == 201:
            return 201, "admitted", ""
        reason = response.json()["reason"]
        retry_after = response.headers["retry-after"]
        # The rate's wait is the bucket's refill time (a minute for one), to the second.
        return (
            429,
            reason,
            "1..60" if 1 <= int(retry_after) <= 60 and reason == "submit-rate" else retry_after,
        )

    before = snapshot(target.database_url)
    with ThreadPoolExecutor(racers) as pool:
        outcomes = Counter(pool.map(submit, range(racers)))
    assert outcomes == Counter(
        {
            (201, "admitted", ""): 1,
            (429, "max-running", "10"): BURST - 1,
            (429, "submit-rate", "1..60"): racers - BURST,
        }
    )
    assert snapshot(target.database_url) != before
    runs = fleet.client.list_runs(key_name="carol", limit=100)
    assert [run.run_id.startswith("race-") for run in runs] == [True]
    with target.http(target.keys.admin) as admin:
        assert admin.post(f"/runs/{runs[0].run_id}/cancel").status_code == 200
