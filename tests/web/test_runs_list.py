"""``GET /runs`` with the runs page's filters: status, agent, session, key (an admin
key's), a search of run ids, and pages; every bad value a 400, tenants unchanged."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import httpx
import psycopg

from tests.web.conftest import ApiKeys, WebServer
from turnkeeper.config import Settings
from turnkeeper.store.store import Store

ECHO: dict[str, Any] = {"command": ["/bin/echo", "hi"], "format": "text"}


def _ids(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [run["run_id"] for run in response.json()["runs"]]


def _submit(client: httpx.Client, run_id: str, session: str, agent: Any = "scripted") -> None:
    body = {"agent": agent, "prompt": f"prompt of {run_id}", "run_id": run_id}
    response = client.post("/runs", json={**body, "session_id": session})
    assert response.status_code == 201, response.text


def test_the_runs_list_filters_searches_and_pages(bare_web: WebServer, api_keys: ApiKeys) -> None:
    with (
        bare_web.http(api_keys.alice) as alice,
        bare_web.http(api_keys.bob) as bob,
        bare_web.http(api_keys.admin) as admin,
    ):
        _submit(alice, "alpha-1", "s-a")
        _submit(alice, "alpha-2", "s-a2", ECHO)
        _submit(alice, "Beta-3", "s-b")
        _submit(bob, "bob-1", "s-bob")
        assert alice.post("/runs/alpha-1/cancel").status_code == 200  # queued: aborted at once

        everything = alice.get("/runs")
        assert _ids(everything) == ["Beta-3", "alpha-2", "alpha-1"]  # alice's own, newest first
        body = everything.json()
        assert (body["total"], body["total_exact"], body["offset"], body["limit"]) == (
            3,
            True,
            0,
            50,
        )
        assert [run["agent"] for run in body["runs"]] == ["scripted", "/bin/echo", "scripted"]
        assert [run["status"] for run in body["runs"]] == ["queued", "queued", "aborted"]

        assert _ids(alice.get("/runs", params={"status": "aborted"})) == ["alpha-1"]
        assert _ids(alice.get("/runs", params={"status": "queued"})) == ["Beta-3", "alpha-2"]
        assert _ids(alice.get("/runs", params={"agent": "scripted"})) == ["Beta-3", "alpha-1"]
        assert _ids(alice.get("/runs", params={"agent": "/bin/echo"})) == ["alpha-2"]
        assert _ids(alice.get("/runs", params={"session_id": "s-b"})) == ["Beta-3"]
        assert _ids(alice.get("/runs", params={"search": "ALPHA"})) == ["alpha-2", "alpha-1"]
        assert _ids(alice.get("/runs", params={"search": "a-3"})) == ["Beta-3"]
        assert _ids(alice.get("/runs", params={"search": "bob"})) == []  # bob's stays unseen
        both = {"agent": "scripted", "search": "alpha", "status": "aborted"}
        assert _ids(alice.get("/runs", params=both)) == ["alpha-1"]

        page = alice.get("/runs", params={"limit": "2", "offset": "2"})
        assert _ids(page) == ["alpha-1"]
        assert (page.json()["total"], page.json()["offset"]) == (3, 2)
        assert _ids(alice.get("/runs", params={"limit": "1", "offset": "1"})) == ["alpha-2"]
        beyond = alice.get("/runs", params={"offset": "3"})
        assert (_ids(beyond), beyond.json()["total"]) == ([], 3)
        searched = alice.get("/runs", params={"search": "alpha", "limit": "1"})
        assert (_ids(searched), searched.json()["total"]) == (["alpha-2"], 2)

        # The key filter: an admin key's; a tenant may name only itself.
        assert _ids(alice.get("/runs", params={"key": "alice"})) == ["Beta-3", "alpha-2", "alpha-1"]
        refused = alice.get("/runs", params={"key": "bob"})
        assert refused.status_code == 403
        assert refused.json()["reason"] == "admin-only"
        assert _ids(bob.get("/runs")) == ["bob-1"]
        assert _ids(admin.get("/runs", params={"key": "bob"})) == ["bob-1"]
        assert _ids(admin.get("/runs", params={"key": "alice", "search": "beta"})) == ["Beta-3"]
        assert _ids(admin.get("/runs")) == ["bob-1", "Beta-3", "alpha-2", "alpha-1"]
        assert _ids(admin.get("/runs", params={"key": "nobody"})) == []

        bad: list[tuple[dict[str, str], str]] = [
            *(({"offset": v}, "invalid-offset") for v in ("-1", "abc", "1.5", "²", "1_0", " 1")),
            ({"offset": "99999999"}, "invalid-offset"),
            ({"status": "bogus"}, "invalid-status"),
            ({"key": "not a key!"}, "invalid-key-name"),
            ({"search": ""}, "invalid-search"),
            ({"search": "x" * 256}, "invalid-search"),
            ({"agent": "a\u0001b"}, "invalid-agent"),
            ({"session_id": ""}, "invalid-session-id"),
        ]
        for params, reason in bad:
            response = admin.get("/runs", params=params)
            assert (response.status_code, response.json().get("reason")) == (400, reason), params


def test_a_run_describes_its_prompt_and_its_attempts(
    bare_web: WebServer, api_keys: ApiKeys
) -> None:
    with bare_web.http(api_keys.alice) as alice:
        _submit(alice, "described", "s-d")
        body = alice.get("/runs/described").json()
        assert (body["prompt"], body["agent"], body["attempts"]) == (
            "prompt of described",
            "scripted",
            [],
        )


def test_the_runs_count_stops_at_its_cap(
    bare_web: WebServer, api_keys: ApiKeys, settings: Settings
) -> None:
    """The count a dashboard refreshes every few seconds reads at most ``most`` rows."""
    with bare_web.http(api_keys.alice) as alice:
        for number in range(3):
            _submit(alice, f"counted-{number}", f"s-{number}")
    with Store(settings.require_database_url(), pool_size=1) as store:
        counts = [store.count_runs(key_name="alice", most=most) for most in (1, 2, 3, 50)]
        assert counts == [1, 2, 3, 3]
        assert store.count_runs(key_name="alice", search="counted-1", most=50) == 1


def test_the_runs_list_filters_by_when_runs_were_created_and_finished(
    bare_web: WebServer, api_keys: ApiKeys, settings: Settings
) -> None:
    """Each bound is optional, ``since`` included and ``until`` not, so that a chart's
    minute (``finished_since`` its start, ``finished_until`` the next minute's) lists
    exactly its runs; a time without its zone is refused."""
    with bare_web.http(api_keys.alice) as alice:
        for run_id in ("old", "middle", "new"):
            _submit(alice, run_id, f"s-{run_id}")
        for run_id in ("old", "middle"):
            assert alice.post(f"/runs/{run_id}/cancel").status_code == 200
        with psycopg.connect(settings.require_database_url()) as conn:
            row = conn.execute("SELECT date_trunc('minute', now())").fetchone()
            assert row is not None
            minute: datetime = row[0]
            for run_id, created, finished in (("old", 180, 179), ("middle", 60, 58)):
                times = (minute - timedelta(minutes=created), minute - timedelta(minutes=finished))
                conn.execute(
                    "UPDATE runs SET created_at = %s, finished_at = %s WHERE run_id = %s",
                    (*times, run_id),
                )

        def listed(**params: datetime) -> list[str]:
            return _ids(alice.get("/runs", params={k: v.isoformat() for k, v in params.items()}))

        hour = timedelta(minutes=60)
        assert listed() == ["new", "middle", "old"]
        assert listed(created_since=minute - 2 * hour) == ["new", "middle"]
        assert listed(created_since=minute - hour) == ["new", "middle"]  # included
        assert listed(created_until=minute - hour) == ["old"]  # not included
        assert listed(created_since=minute - 4 * hour, created_until=minute - 2 * hour) == ["old"]
        # The failures bar of the minute "middle" finished in, and the one after it.
        finished = minute - timedelta(minutes=58)
        after = finished + timedelta(minutes=1)
        assert listed(finished_since=finished, finished_until=after) == ["middle"]
        assert listed(finished_since=after, finished_until=after + timedelta(minutes=1)) == []
        assert listed(finished_until=minute) == ["middle", "old"]  # "new" has not finished
        zoned = alice.get("/runs", params={"created_since": "2000-01-01T00:00:00+05:30"})
        assert _ids(zoned) == ["new", "middle", "old"]
        assert (
            alice.get("/runs", params={"finished_since": finished.isoformat()}).json()["total"] == 1
        )

        for name in ("created_since", "created_until", "finished_since", "finished_until"):
            for wrong in ("yesterday", "2026-01-01T00:00:00", "", "2026-13-01T00:00Z", "9" * 50):
                response = alice.get("/runs", params={name: wrong})
                reason = f"invalid-{name.replace('_', '-')}"
                assert (response.status_code, response.json()["reason"]) == (400, reason), wrong


def test_a_listed_run_says_how_long_it_ran_and_how_its_prompt_starts(
    bare_web: WebServer, api_keys: ApiKeys, settings: Settings
) -> None:
    prompt = "Fix the flaky test\nin tests/web, then run it twice\n" + "x" * 600
    with bare_web.http(api_keys.alice) as alice:
        body = {"agent": "scripted", "prompt": prompt, "run_id": "long-prompt"}
        assert alice.post("/runs", json=body).status_code == 201
        _submit(alice, "queued", "s-q")
        assert alice.post("/runs/long-prompt/cancel").status_code == 200
        with psycopg.connect(settings.require_database_url()) as conn:
            conn.execute(
                "UPDATE runs SET started_at = finished_at - interval '83.25 s'"
                " WHERE run_id = 'long-prompt'"
            )
        runs = {run["run_id"]: run for run in alice.get("/runs").json()["runs"]}
        assert runs["long-prompt"]["prompt_preview"] == prompt[:500]
        assert runs["long-prompt"]["duration_seconds"] == 83.25
        assert (runs["queued"]["prompt_preview"], runs["queued"]["duration_seconds"]) == (
            "prompt of queued",
            None,  # not started
        )
