"""``GET /fleet``, what the fleet page shows: an admin key's only; the workers with
their slots and the runs they own, the queues' depths, the last minutes' activity and
the open event streams, read from the real store, broker and web process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psutil
import pytest

from tests.driver.fleet import Fleet
from tests.web.conftest import ApiKeys, WebServer
from turnkeeper.queues import control_queue, host_queue, turns_queue
from turnkeeper.store.fleet import LATENCY_BOUNDS

SLOW = {"preset": "scripted", "turns": 6, "pace": 0.2, "seed": 2}


@pytest.fixture
def admin(web: WebServer, api_keys: ApiKeys) -> Iterator[httpx.Client]:
    with web.http(api_keys.admin) as client:
        yield client


def _until(
    read: Callable[[], dict[str, Any]], done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Read until ``done`` holds (a hang guard, not a timing assertion)."""
    deadline = time.monotonic() + 90
    while not done(body := read()):
        assert time.monotonic() < deadline, body
        time.sleep(0.1)
    return body


def test_only_an_admin_key_reads_the_fleet(bare_web: WebServer, api_keys: ApiKeys) -> None:
    with bare_web.http() as anonymous:
        refused = anonymous.get("/fleet")
        assert (refused.status_code, refused.json()["reason"]) == (401, "missing-key")
    with bare_web.http("tk_not-a-key") as wrong:
        assert wrong.get("/fleet").status_code == 401
    for tenant in (api_keys.alice, api_keys.bob):
        with bare_web.http(tenant) as client:
            refused = client.get("/fleet")
            assert (refused.status_code, refused.json()) == (
                403,
                {"error": "/fleet needs an admin key", "reason": "admin-only"},
            )
    with bare_web.http(api_keys.admin) as admin:
        for wrong_minutes in ("0", "1441", "-5", "abc", "1.5", " 60", "\uff16\uff10"):
            answer = admin.get("/fleet", params={"minutes": wrong_minutes})
            assert (answer.status_code, answer.json()["reason"]) == (400, "invalid-minutes")


def test_without_workers_the_fleet_shows_queued_runs_waiting_and_the_open_streams(
    bare_web: WebServer, api_keys: ApiKeys
) -> None:
    with bare_web.http(api_keys.alice) as alice, bare_web.http(api_keys.admin) as admin:
        stream_urls = []
        for n in range(3):
            body = {"agent": "scripted", "prompt": "hi", "run_id": f"q{n}"}
            response = alice.post("/runs", json=body)
            assert response.status_code == 201, response.text
            stream_urls.append(response.json()["stream_url"])
        body = admin.get("/fleet", params={"minutes": "5"}).json()
        assert body["workers"] == []
        assert body["awaiting_adoption"] == []
        assert body["broker"] == "ok"
        assert [(q["kind"], q["depth"]) for q in body["queues"]] == [
            ("turns", 3),
            ("control", 0),  # on Redis a queue is its lists: an empty one is 0, never None
        ]
        assert body["runs_by_status"] == {"queued": 3}
        assert body["takeovers_by_cause"] == {}
        assert [(m["started"], m["settled"], m["takeovers"]) for m in body["activity"]] == [
            (0, {}, {})
        ] * 5
        assert body["takeover_latency"] == {
            "buckets": [{"le": b, "count": 0} for b in (*LATENCY_BOUNDS, None)],
            "count": 0,
            "p50": None,
            "p95": None,
            "max": None,
        }
        assert body["open_streams"]["now"] == 0
        assert [m["peak"] for m in body["open_streams"]["per_minute"]] == [0] * 5

        # A queued run's stream stays open, waiting: the web process counts it.
        opened = threading.Event()
        stop = threading.Event()

        def follow() -> None:
            with (
                httpx.Client(base_url=bare_web.base_url, timeout=60) as client,
                client.stream("GET", stream_urls[0]) as stream,
            ):
                opened.set()
                for _ in stream.iter_lines():
                    if stop.is_set():
                        return

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        assert opened.wait(60)

        def fleet() -> dict[str, Any]:
            return admin.get("/fleet", params={"minutes": "5"}).json()  # type: ignore[no-any-return]

        body = _until(fleet, lambda b: b["open_streams"]["now"] == 1)
        assert body["open_streams"]["per_minute"][-1]["peak"] == 1
        stop.set()
        alice.post("/runs/q0/cancel")  # the stream ends with the run
        reader.join(60)
        body = _until(fleet, lambda b: b["open_streams"]["now"] == 0)
        assert body["open_streams"]["per_minute"][-1]["peak"] >= 1


@pytest.mark.slow
def test_the_fleet_shows_each_worker_with_its_slots_and_the_runs_they_own(
    fleet: Fleet, web: WebServer, admin: httpx.Client, http: httpx.Client
) -> None:
    settings = fleet.settings
    response = http.post("/runs", json={"agent": SLOW, "prompt": "tidy up", "run_id": "f1"})
    assert response.status_code == 201, response.text
    run = fleet.wait("f1", lambda r: r.owner is not None and r.status.value == "running")

    def read() -> dict[str, Any]:
        answer = admin.get("/fleet")
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]

    # Both pool processes announced themselves.
    body = _until(read, lambda b: len(b["workers"]) == 1 and len(b["workers"][0]["slots"]) == 2)
    (worker,) = body["workers"]
    main = psutil.Process(fleet.procs[0].pid)
    assert (worker["host_id"], worker["main_pid"], worker["alive"]) == (
        settings.host_id,
        main.pid,
        True,
    )
    assert sorted(slot["pid"] for slot in worker["slots"]) == sorted(
        child.pid for child in main.children()
    )
    owned = {slot["worker_id"]: [r["run_id"] for r in slot["runs"]] for slot in worker["slots"]}
    assert owned[run.owner] == ["f1"]
    assert [ids for owner, ids in owned.items() if owner != run.owner] == [[]]
    (f1,) = owned_runs = [r for slot in worker["slots"] for r in slot["runs"]]
    assert owned_runs == [f1]
    assert f1["epoch"] == run.epoch
    assert f1["held_seconds"] >= 0
    assert 0 < f1["lease_seconds_left"] <= settings.lease_ttl
    assert [(q["name"], q["kind"], q["host_id"]) for q in body["queues"]] == [
        (turns_queue(settings), "turns", None),
        (control_queue(settings), "control", None),
        (host_queue(settings), "host", settings.host_id),
    ]
    assert body["lease_ttl"] == settings.lease_ttl

    fleet.wait_settled("f1")
    # Every message consumed, the reconciler's repeats of a run's trigger on a loaded
    # machine included (each is a no-op once the run started).
    body = _until(read, lambda b: [q["depth"] for q in b["queues"]] == [0, 0, 0])
    assert [r for slot in body["workers"][0]["slots"] for r in slot["runs"]] == []
    assert sum(m["started"] for m in body["activity"]) == 1
    assert [m["settled"] for m in body["activity"] if m["settled"]] == [{"completed": 1}]
    assert body["runs_by_status"] == {"completed": 1}
