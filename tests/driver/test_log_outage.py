"""The log's Redis down (not flushed) for several seconds: mid-run, and at settle.

The log lives on a Redis of the test's own (the broker stays on the shared one), which
is shut down and started again. A run whose owner is healthy and whose lease is held
rides the outage out: it finishes with the attempt it had, and its log, read once Redis
is back, is the oracle, element by element.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.driver.fleet import Fleet
from tests.driver.test_takeover import (
    AGENT,
    PROMPT,
    _assert_log_is_oracle,
    _assert_transcript_once,
    _attempts,
)
from turnkeeper.config import Settings
from turnkeeper.embedded.ports import free_port
from turnkeeper.embedded.redis import EmbeddedRedis
from turnkeeper.store.records import RunStatus
from turnkeeper.workers.failpoints import marker

OUTAGE = 6.0  # seconds: three leases of the test fleet (``FAST``)


class LogRedis:
    def __init__(self, tmp_path: Path) -> None:
        self.server = EmbeddedRedis(tmp_path / "log-redis")
        self.port = free_port()
        self.server.start(self.port)

    @property
    def url(self) -> str:
        return self.server.url(self.port)

    def outage(self, seconds: float, *, comes_back_empty: bool = False) -> None:
        """Shut Redis down for ``seconds``; back empty, as after a restart without
        persistence, when asked."""
        self.server.stop(self.port)
        if comes_back_empty:
            for path in self.server.dir.iterdir():
                if path.name.startswith(("appendonly", "dump")):
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
        time.sleep(seconds)
        self.server.start(self.port)


@pytest.fixture
def log_redis(tmp_path: Path) -> Iterator[LogRedis]:
    server = LogRedis(tmp_path)
    try:
        yield server
    finally:
        server.server.stop(server.port)


def _fleet(settings: Settings, log_redis: LogRedis, tmp_path: Path, **overrides: object) -> Fleet:
    apart = settings.model_copy(
        update={"redis_url": log_redis.url, "broker_url": settings.require_redis_url()}
    )
    return Fleet.create(apart, tmp_path / "logs", **overrides)


@pytest.mark.parametrize("comes_back_empty", [False, True], ids=["persisted", "empty"])
def test_redis_down_mid_run_costs_no_attempt(
    settings: Settings,
    log_redis: LogRedis,
    database_url: str,
    tmp_path: Path,
    comes_back_empty: bool,
) -> None:
    fleet = _fleet(settings, log_redis, tmp_path)
    try:
        fleet.start_worker()
        fleet.start_worker()
        fleet.start_beat()
        run = fleet.client.submit(AGENT, PROMPT)
        while len(fleet.log_of(run.run_id)) < 8:
            time.sleep(0.02)
        log_redis.outage(OUTAGE, comes_back_empty=comes_back_empty)
        done = fleet.wait_settled(run.run_id, timeout=180)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert (done.epoch, done.attempt_count) == (1, 1), fleet.dump_logs()
        assert _attempts(database_url, run.run_id) == [(1, "completed")]
        _assert_log_is_oracle(fleet, done, tmp_path)
        _assert_transcript_once(fleet, done)
    finally:
        fleet.stop()


@pytest.mark.slow
def test_redis_down_at_settle_with_the_owner_killed(
    settings: Settings, log_redis: LogRedis, tmp_path: Path
) -> None:
    """The owner settled the run and died before the final chunk, while the log's Redis
    was down: once Redis is back, the log is closed with that chunk, nothing doubled."""
    fleet = _fleet(settings, log_redis, tmp_path, failpoints="settled")
    try:
        fleet.start_worker()
        fleet.start_beat()
        run = fleet.client.submit(AGENT, PROMPT)
        reached = marker(fleet.settings, "settled")
        while not reached.exists():
            time.sleep(0.05)
        owned = fleet.client.require(run.run_id)
        assert owned.status is RunStatus.COMPLETED
        before = fleet.log_of(run.run_id)
        log_redis.server.stop(log_redis.port)
        fleet.signal_worker_of(owned, signal.SIGKILL)
        time.sleep(OUTAGE)  # reaps meanwhile fail against the missing Redis
        log_redis.server.start(log_redis.port)
        done = fleet.wait_settled(run.run_id, timeout=180)
        assert (done.status, done.epoch, done.attempt_count) == (RunStatus.COMPLETED, 1, 1)
        stored = fleet.log_of(run.run_id)
        assert stored[: len(before)] == before
        assert len(stored) == len(before) + 1
        _assert_log_is_oracle(fleet, done, tmp_path)
        _assert_transcript_once(fleet, done)
    finally:
        fleet.stop()
