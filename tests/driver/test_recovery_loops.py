"""The recovery loops under faults: the crash watcher, the owner locks and the host
beacon go on through a broker or database error, and a drain costs no attempt."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.driver.fleet import Fleet
from tests.driver.test_crash_takeover import attempts, mid_run
from tests.driver.test_takeover import AGENT, PROMPT, _assert_log_is_oracle
from turnkeeper.config import Settings
from turnkeeper.embedded.ports import free_port
from turnkeeper.embedded.redis import EmbeddedRedis
from turnkeeper.store.records import RunStatus

SLOW = {**AGENT, "pace": 0.1}


def test_a_crash_while_the_broker_is_down_leaves_crash_detection_running(
    settings: Settings, tmp_path: Path
) -> None:
    """The watcher hands over a run whose owner died while the broker is down: its
    takeover message cannot be sent. The watcher goes on (the reconciler sends the
    message again once the broker is back), so a later crash is a crash takeover too,
    not one left to its 30 s lease."""
    broker = EmbeddedRedis(tmp_path / "broker")
    port = free_port()
    broker.start(port)
    fleet = Fleet.create(
        settings,
        tmp_path / "logs",
        broker_url=broker.url(port),
        lease_ttl=30.0,
        heartbeat_interval=10.0,
    )
    try:
        fleet.start_pair()
        fleet.wait_ready()
        first = fleet.client.submit(SLOW, PROMPT)
        owned = mid_run(fleet, first.run_id, chunks=6)
        broker.stop(port)
        fleet.signal_worker_of(owned, signal.SIGKILL)
        fleet.wait_events("crash.sweep_failed", files="beat-*.log")
        broker.start(port)
        done = fleet.wait_settled(first.run_id)
        assert done.status is RunStatus.COMPLETED, fleet.dump_logs()
        assert attempts(fleet, first.run_id) == [(1, "superseded", "crash"), (2, "completed", None)]
        _assert_log_is_oracle(fleet, done, tmp_path / "first")

        fleet.start_worker()
        fleet.wait_ready()
        second = fleet.client.submit(SLOW, PROMPT)
        owned = mid_run(fleet, second.run_id, chunks=6)
        fleet.signal_worker_of(owned, signal.SIGKILL)
        done = fleet.wait_settled(second.run_id)
        assert done.status is RunStatus.COMPLETED, fleet.dump_logs()
        assert attempts(fleet, second.run_id) == [
            (1, "superseded", "crash"),
            (2, "completed", None),
        ], fleet.dump_logs()
        _assert_log_is_oracle(fleet, done, tmp_path / "second")
    finally:
        fleet.stop()
        broker.stop(port)
