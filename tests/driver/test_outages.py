"""Outages mid-turn: the database connection dropped, the broker restarted, RabbitMQ."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
import redis
from kombu import Connection

from tests.driver.fleet import Fleet, expected_log
from tests.driver.test_takeover import AGENT, PROMPT, _assert_log_is_oracle
from turnkeeper.config import Settings
from turnkeeper.embedded.ports import free_port
from turnkeeper.embedded.redis import EmbeddedRedis
from turnkeeper.queues import control_queue, turns_queue
from turnkeeper.store.records import RunStatus


def test_dropped_database_connections_are_retried_not_fatal(
    fleet: Fleet, admin_database_url: str, database_url: str, tmp_path: Path
) -> None:
    fleet.start_worker()
    fleet.start_beat()
    slow = {**AGENT, "pace": 0.1}
    run = fleet.client.submit(slow, PROMPT)
    database = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
    killed = 0
    with psycopg.connect(admin_database_url, autocommit=True) as admin:
        for _ in range(3):
            while len(fleet.log_of(run.run_id)) < 6 + 8 * killed:
                time.sleep(0.02)
            rows = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            ).fetchall()
            killed += 1
            assert rows, "the worker held connections to drop"
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.COMPLETED, fleet.dump_logs()
    assert done.epoch == 1, "a dropped connection is not a lost lease"
    oracle = expected_log(run.run_id, run.session_id, slow, PROMPT, tmp_path / "oracle")
    assert [chunk for _, chunk in fleet.log_of(run.run_id)] == oracle


@pytest.mark.slow
def test_the_broker_restarted_mid_turn(settings: Settings, tmp_path: Path) -> None:
    broker = EmbeddedRedis(tmp_path / "broker")
    port = free_port()
    broker.start(port)
    fleet = Fleet.create(settings, tmp_path / "logs", broker_url=broker.url(port))
    try:
        fleet.start_worker()
        fleet.start_beat()
        slow = {**AGENT, "pace": 0.1}
        first = fleet.client.submit(slow, PROMPT)
        while len(fleet.log_of(first.run_id)) < 5:
            time.sleep(0.02)
        broker.stop(port)
        time.sleep(1.0)
        broker.start(port)
        done = fleet.wait_settled(first.run_id)
        assert done.status is RunStatus.COMPLETED
        _assert_log_is_oracle(fleet, done, tmp_path / "first")
        second = fleet.client.submit(slow, PROMPT)  # workers and beat reconnected
        assert fleet.wait_settled(second.run_id).status is RunStatus.COMPLETED
        _assert_log_is_oracle(fleet, fleet.client.require(second.run_id), tmp_path / "second")
    finally:
        fleet.stop()
        broker.stop(port)


RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"


def test_rabbitmq_as_the_broker(settings: Settings, tmp_path: Path) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs", broker_url=RABBITMQ)
    try:
        fleet.start_worker()
        fleet.start_beat()
        run = fleet.client.submit(AGENT, PROMPT)
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.COMPLETED, fleet.dump_logs()
        _assert_log_is_oracle(fleet, done, tmp_path)
    finally:
        fleet.stop()
        with Connection(RABBITMQ) as conn:
            channel = conn.default_channel
            for queue in (turns_queue(fleet.settings), control_queue(fleet.settings)):
                channel.queue_delete(queue)


def test_redis_broker_keys_stay_in_the_namespace(fleet: Fleet, redis_url: str) -> None:
    fleet.start_worker()
    run = fleet.client.submit(AGENT, PROMPT)
    fleet.wait_settled(run.run_id)
    client = redis.Redis.from_url(redis_url)
    try:
        ours = {key.decode() for key in client.scan_iter(match=f"{fleet.settings.namespace}:*")}
    finally:
        client.close()
    assert any(key.startswith(f"{fleet.settings.namespace}:celery:") for key in ours)
    assert any(key.startswith(f"{fleet.settings.namespace}:log:") for key in ours)
