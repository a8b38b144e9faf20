"""What one tenant's key never learns over HTTP: which host and process own a run (its
``owner``, ``host:pid:token``, kept to admin keys), and the session of another tenant's
deleted run whose id it tries (all it learns is that the id is taken)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.web.conftest import ApiKeys, WebServer
from turnkeeper.config import Settings
from turnkeeper.owner import new_owner
from turnkeeper.store.records import RunStatus
from turnkeeper.store.store import Store

AGENT = {"preset": "scripted", "turns": 1}
# What two reads of the same run differ in whatever the key: its clock and its token.
READ_TIME = ("lease_seconds_left", "duration_seconds", "stream_url")


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    with Store(settings.require_database_url(), pool_size=2) as opened:
        yield opened


def _same_read(view: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in view.items() if key not in READ_TIME}


def _ownerless(view: dict[str, Any]) -> dict[str, Any]:
    """``view`` (an admin key's) as a tenant's key gets it: no host, no process."""
    shown = {**_same_read(view), "owner": None}
    if "attempts" in view:
        shown["attempts"] = [{**attempt, "owner": None} for attempt in view["attempts"]]
    return shown


def test_only_an_admin_key_sees_who_owns_a_run(
    bare_web: WebServer, api_keys: ApiKeys, store: Store
) -> None:
    """The run is claimed as a worker claims it (the store's own claim, an owner made as
    a worker makes it): alice, whose run it is, gets every field an admin key gets but
    the run's and its attempts' owner, null, in each place a run is shown."""
    with bare_web.http(api_keys.alice) as alice, bare_web.http(api_keys.admin) as admin:
        body = {"agent": AGENT, "prompt": "p", "run_id": "r1"}
        assert alice.post("/runs", json=body).status_code == 201
        owner = new_owner("host-a")
        claim = store.claim_run("r1", owner, 300.0)
        assert claim is not None

        as_admin = admin.get("/runs/r1").json()
        assert (as_admin["status"], as_admin["owner"]) == ("running", owner)
        assert [attempt["owner"] for attempt in as_admin["attempts"]] == [owner]
        as_alice = alice.get("/runs/r1").json()
        assert _same_read(as_alice) == _ownerless(as_admin)
        assert (as_alice["owner"], as_alice["attempts"][0]["owner"]) == (None, None)

        listed_admin = admin.get("/runs").json()
        assert [run["owner"] for run in listed_admin["runs"]] == [owner]
        listed_alice = alice.get("/runs").json()
        assert [_same_read(run) for run in listed_alice["runs"]] == [
            _ownerless(run) for run in listed_admin["runs"]
        ]
        assert listed_alice["runs"][0]["owner"] is None

        session_admin = admin.get("/sessions/r1").json()
        assert [run["owner"] for run in session_admin["runs"]] == [owner]
        session_alice = alice.get("/sessions/r1").json()
        assert [_same_read(run) for run in session_alice["runs"]] == [
            _ownerless(run) for run in session_admin["runs"]
        ]

        replayed = alice.post("/runs", json=body)  # an identical replay: the run again
        assert replayed.status_code == 201
        assert _same_read(replayed.json()) == _ownerless(_without_attempts(as_admin))
        cancelled = alice.post("/runs/r1/cancel")
        assert cancelled.status_code == 200
        assert cancelled.json()["owner"] is None
        assert cancelled.json()["cancel_requested_at"] is not None
        assert admin.get("/runs/r1").json()["owner"] == owner  # still running, still its


def _without_attempts(view: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in view.items() if key not in ("attempts", "prompt")}


def test_another_tenants_deleted_run_id_is_only_taken(
    settings: Settings, bare_web: WebServer, api_keys: ApiKeys, store: Store
) -> None:
    """Bob tries the id of a run of alice's deleted session: he is told it is taken, as
    for a live run of hers, and never her session's id; alice is told which session."""
    with bare_web.http(api_keys.alice) as alice, bare_web.http(api_keys.bob) as bob:
        body = {"agent": "scripted", "prompt": "p", "run_id": "old", "session_id": "alices"}
        assert alice.post("/runs", json=body).status_code == 201
        live = bob.post("/runs", json={**body, "session_id": "bobs"})
        taken = {
            "error": "run id 'old' is taken; choose another run id",
            "run_id": "old",
            "reason": "run-id-taken",
        }
        assert (live.status_code, live.json()) == (409, taken)
        assert alice.post("/runs/old/cancel").json()["status"] == RunStatus.ABORTED.value
        assert store.delete_session("alices") == 1

        for session_id in ("bobs", "alices"):
            tried = bob.post("/runs", json={**body, "session_id": session_id})
            assert (tried.status_code, tried.json()) == (409, taken)
        again = alice.post("/runs", json=body)
        assert (again.status_code, again.json()) == (
            409,
            {
                "error": "run 'old' belonged to session 'alices', which was deleted; "
                "it will not run again",
                "run_id": "old",
                "reason": "session-deleted",
                "session_id": "alices",
            },
        )
    # A receipt written before receipts named their tenant has none: the trusted
    # caller's, as far as anyone can tell, and so only taken to every key.
    with psycopg.connect(settings.require_database_url()) as conn:
        conn.execute(
            "INSERT INTO run_receipts (run_id, session_id, status) "
            "VALUES ('legacy', 'theirs', 'completed')"
        )
    with bare_web.http(api_keys.alice) as alice:
        tried = alice.post("/runs", json={**body, "run_id": "legacy"})
        assert (tried.status_code, tried.json()) == (
            409,
            {
                "error": "run id 'legacy' is taken; choose another run id",
                "run_id": "legacy",
                "reason": "run-id-taken",
            },
        )
