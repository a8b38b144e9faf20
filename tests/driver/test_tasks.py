"""The Celery app in-process, with Celery's own test worker (celery.contrib.testing).

Crash behaviour needs real worker processes (test_takeover, test_chaos); these
check the app itself: serialization, routing, and the tasks driving a run.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from celery.contrib.testing.worker import start_worker

from tests.driver.fleet import Fleet, expected_log
from turnkeeper.client import Client
from turnkeeper.config import Settings
from turnkeeper.driver.placement import Placement
from turnkeeper.queues import (
    PRUNE,
    REAP,
    REAP_HOST,
    RECONCILE,
    RUN_TURN,
    TAKEOVER,
    TurnPriorities,
    control_queue,
    host_queue,
    turns_queue,
)
from turnkeeper.store.records import RunStatus
from turnkeeper.tasks import create_app
from turnkeeper.workers.runtime import close_runtimes

AGENT = {"preset": "scripted", "turns": 1, "pace": 0.0, "seed": 9}


def test_the_app_routes_turns_and_control_apart(settings: Settings) -> None:
    app = create_app(settings)
    conf = app.conf
    assert conf.task_serializer == "json"
    assert conf.accept_content == ["json"]
    assert conf.task_acks_late is False
    assert conf.task_ignore_result is True
    assert conf.worker_disable_prefetch is True
    routes = {
        name: app.amqp.router.route({}, name)["queue"].name
        for name in (RUN_TURN, TAKEOVER, RECONCILE, REAP, PRUNE)
    }
    assert routes == {
        RUN_TURN: turns_queue(settings),
        TAKEOVER: turns_queue(settings),
        RECONCILE: control_queue(settings),
        REAP: control_queue(settings),
        PRUNE: control_queue(settings),
    }
    assert turns_queue(settings) == f"{settings.namespace}.turns"
    schedule = conf.beat_schedule
    assert {entry["task"] for entry in schedule.values()} == {RECONCILE, REAP, PRUNE}
    assert schedule["reconcile"]["schedule"].total_seconds() == settings.reconcile_interval


def test_takeovers_outrank_new_runs_on_either_broker(settings: Settings) -> None:
    """Redis pops priority 0 first (kombu's steps); RabbitMQ serves the higher number."""
    redis_app = create_app(settings)
    assert redis_app.conf.broker_transport_options["priority_steps"] == [0, 9]
    assert TurnPriorities.for_broker("redis://r:6379/0") == TurnPriorities(
        takeover=0, run=9, transport_options={"priority_steps": [0, 9]}
    )
    amqp = settings.model_copy(update={"broker_url": "amqp://guest:guest@mq:5672//"})
    queues = {queue.name: queue for queue in create_app(amqp).conf.task_queues}
    assert queues[turns_queue(amqp)].queue_arguments == {"x-max-priority": 1}
    assert queues[control_queue(amqp)].queue_arguments is None
    assert TurnPriorities.for_broker("amqp://mq//").takeover == 1
    assert TurnPriorities.for_broker("amqp://mq//").run == 0


def test_a_run_through_celerys_in_process_worker(settings: Settings, tmp_path: Path) -> None:
    app = create_app(settings)
    client = Client.from_settings(settings)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
            run = client.submit(AGENT, "in process")
            events = list(client.events(run.run_id))  # ends when the log closes
        done = client.require(run.run_id)
        assert done.status is RunStatus.COMPLETED
        oracle = expected_log(run.run_id, run.session_id, AGENT, "in process", tmp_path / "o")
        assert [chunk for _, chunk in events] == oracle
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
            app.send_task(RECONCILE, queue=control_queue(settings))
            app.send_task(REAP, queue=control_queue(settings))
            # A process of a `turnkeeper worker` says its host is alive and beat's reap
            # sends the host its share; this in-process worker says nothing, so the
            # share is sent here, to the host queue it consumes too.
            app.send_task(REAP_HOST, args=[settings.host_id], queue=host_queue(settings))
            deadline = time.monotonic() + 60  # a hang guard, not a timing assertion
            # The reaper forgets the sandbox; the journals stay, for a rebuild of the log.
            while Placement.of(client.require(run.run_id)).sandbox is not None:
                assert time.monotonic() < deadline, "the reap task never ran"
                time.sleep(0.05)
    finally:
        client.close()
        close_runtimes()  # the tasks ran here: their runtime, its cancel listener with it


def test_a_worker_ignores_a_django_projects_settings(settings: Settings, tmp_path: Path) -> None:
    """A host of a Django shop has DJANGO_SETTINGS_MODULE set; Celery's Django fixup
    would set that project up in our worker (and not start where it is not importable).
    turnkeeper's app has no fixups: the worker starts and runs the run."""
    fleet = Fleet.create(settings, tmp_path / "logs")
    fleet.env["DJANGO_SETTINGS_MODULE"] = "no_such_project.settings"
    try:
        fleet.start_worker()
        run = fleet.client.submit(AGENT, "hello")
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        oracle = expected_log(run.run_id, run.session_id, AGENT, "hello", tmp_path / "oracle")
        assert [chunk for _, chunk in fleet.log_of(run.run_id)] == oracle
    finally:
        fleet.stop()


def test_beat_runs_every_sweep_as_it_starts(settings: Settings, tmp_path: Path) -> None:
    """Sweeps of an hour's interval run when beat starts, and again when it restarts:
    a beat restarted more often than its prune interval still prunes (its schedule is in
    memory, made afresh at each start). And it writes no schedule file anywhere."""
    hour = 3600.0
    fleet = Fleet.create(settings, tmp_path / "logs", reap_interval=hour, prune_interval=hour)
    store = fleet.client.store
    try:
        for _start in range(2):
            before = {sweep.name: sweep.finished_at for sweep in store.sweeps()}
            beat = fleet.start_beat()
            deadline = time.monotonic() + 120  # a hang guard
            while True:
                swept = {sweep.name: sweep.finished_at for sweep in store.sweeps()}
                fresh = {name for name, at in swept.items() if before.get(name) != at}
                if {"reconcile", "reap", "prune"} <= fresh:
                    break
                assert time.monotonic() < deadline, (swept, fleet.dump_logs())
                time.sleep(0.1)
            os.killpg(beat.pid, signal.SIGKILL)  # its embedded beat process too
            beat.wait()
    finally:
        fleet.stop()
    assert sorted(p.name for p in settings.data_dir.iterdir() if "schedule" in p.name) == []
    assert sorted(p.name for p in Path.cwd().iterdir() if "schedule" in p.name) == []
