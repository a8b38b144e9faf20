"""The queues of hosts, on the real broker, with no worker consuming them: what the
reconciler and beat's ``reap`` leave in a host's queue once the host is dead.

A host's liveness comes from its rows in ``workers``; a host dies here by not
beating for ``host_dead_after`` (a second).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis

from turnkeeper import reconciler
from turnkeeper.config import Settings
from turnkeeper.driver.replay import StoredLog
from turnkeeper.queues import REAP, TAKEOVER, enqueuers, host_queue, turns_queue
from turnkeeper.store.records import Verdict
from turnkeeper.tasks import create_app
from turnkeeper.workers.runtime import WorkerRuntime

HOST = "host-a"
DEAD_AFTER = 1.0


@pytest.fixture
def runtime(settings: Settings) -> Iterator[WorkerRuntime]:
    # Beat runs elsewhere: this process is no host the test's runs are on.
    update = {"host_id": "beat-host", "host_dead_after": DEAD_AFTER}
    rt = WorkerRuntime.open(settings.model_copy(update=update), StoredLog)
    yield rt
    rt.close()


def _messages(settings: Settings, queue: str) -> list[tuple[str, str]]:
    """(task, argsrepr) of every message waiting in ``queue``, all priority steps."""
    client = redis.Redis.from_url(settings.require_redis_url())
    try:
        found = []
        for key in client.scan_iter(match=f"{settings.namespace}:celery:{queue}*"):
            name = key.decode()[len(f"{settings.namespace}:celery:") :]
            if name.split("\x06\x16")[0] != queue:
                continue
            for raw in client.lrange(key, 0, -1):
                headers = json.loads(raw)["headers"]
                found.append((headers["task"], headers["argsrepr"]))
        return sorted(found)
    finally:
        client.close()


def _run_on_host(rt: WorkerRuntime, run_id: str) -> None:
    """A running run whose sandbox is on ``HOST``'s disk, its lease already run out."""
    rt.store.admit_run(
        run_id, run_id, {"agent": "scripted", "prompt": ""}, max_attempts=5, deadline=None
    )
    claim = rt.store.claim_run(run_id, f"{HOST}:1", 0.05)
    assert claim is not None
    placement = {
        "sandbox": {"provider": "local", "id": "s1", "root": "/nowhere/s1"},
        "journals": [],
        "host": HOST,
    }
    assert rt.store.record_sandbox(claim, placement) is Verdict.DONE
    time.sleep(0.1)


def _host_dies(rt: WorkerRuntime) -> None:
    while rt.store.host_alive(HOST, DEAD_AFTER):
        time.sleep(0.1)


def test_a_dead_hosts_queue_is_emptied_once_its_takeovers_are_sent_on(
    settings: Settings, runtime: WorkerRuntime
) -> None:
    """A takeover sent to host A's queue while A was alive, and the ``reap_host`` beat
    sent it, stay in its queue forever once A is dead: nobody consumes that queue, and
    an expired message is only dropped when a worker takes it. Once A's takeovers went
    on to the turns queue, beat's ``reap`` empties A's queue."""
    settings = runtime.settings
    app = create_app(settings, turn_worker=False)
    triggers = enqueuers(app, settings, runtime.store)
    runtime.store.start_worker(f"{HOST}:1", HOST, 1, 1)
    _run_on_host(runtime, "r1")

    reconciler.reconcile(runtime, **triggers)
    app.tasks[REAP]()  # A is alive: its share of the reaping goes to its queue
    run = runtime.store.get_run("r1")
    assert run is not None
    takeover = (TAKEOVER, repr([run.run_id, run.attempt_id, run.epoch]))
    assert [task for task, _ in _messages(settings, host_queue(settings, HOST))] == sorted(
        [TAKEOVER, "turnkeeper.reap_host"]
    )

    _host_dies(runtime)
    reconciler.reconcile(runtime, **triggers)
    assert _messages(settings, turns_queue(settings)) == [takeover], "sent on"
    app.tasks[REAP]()
    assert _messages(settings, host_queue(settings, HOST)) == [], "nothing left behind"
    assert _messages(settings, turns_queue(settings)) == [takeover]
