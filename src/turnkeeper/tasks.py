"""The Celery app and its thin tasks; the logic lives in driver, reconciler and workers.

Acknowledgement is early (Celery's default, ``task_acks_late=False``), on purpose:
a delivery is only a trigger, ownership lives in the store. If a worker dies
mid-turn, redelivering its message would achieve nothing (the run is
``running`` and nobody else may claim it); the reconciler notices the expired
lease and hands the run to a new attempt. A message lost before it ran leaves a
``queued`` run that the reconciler enqueues again. Late acknowledgement would add
redeliveries after every crash (and, on the Redis transport, after the visibility
timeout of every turn longer than it) without making anything safer.

The queues, their priorities and every send are ``turnkeeper.queues``.
"""

from __future__ import annotations

import os
from typing import Any

import structlog
from celery import Celery, beat, concurrency
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.concurrency.solo import TaskPool as SoloPool
from celery.signals import (
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
)
from kombu import Queue

from turnkeeper import reconciler
from turnkeeper.config import Settings
from turnkeeper.driver import attempt
from turnkeeper.driver.replay import StoredLog
from turnkeeper.errors import TurnkeeperError
from turnkeeper.hosts import route_takeover, run_host
from turnkeeper.queues import (
    PRUNE,
    REAP,
    REAP_HOST,
    RECONCILE,
    RUN_TURN,
    TAKEOVER,
    broker_app,
    enqueue_run,
    enqueuers,
    host_queue,
    send_prioritised,
    send_run,
    send_takeover,
)
from turnkeeper.secret import make_undumpable
from turnkeeper.store.database import tallied
from turnkeeper.store.store import Store
from turnkeeper.workers.beacon import is_worker_command, main_process_pid
from turnkeeper.workers.runtime import close_runtimes, runtime_for

log = structlog.get_logger(__name__)


class SweepScheduler(beat.Scheduler):
    """Beat's schedule, kept in memory: no file that two beats of one data directory
    could share (one beat's rewrite of a shared shelve crashed the other's scheduler).
    Every sweep is due as soon as beat starts, since each is idempotent and cheap: a
    beat that restarts often still runs the ones of a long interval (prune, every ten
    minutes by default), which a schedule made afresh would put off a whole interval."""

    def setup_schedule(self) -> None:
        super().setup_schedule()
        for entry in self.schedule.values():
            every = getattr(entry.schedule, "run_every", None)
            if every is not None:
                entry.last_run_at = entry.default_now() - every


def create_app(settings: Settings, *, turn_worker: bool = True) -> Celery:
    """The Celery app of a worker or beat for ``settings``: ``queues.broker_app`` with
    the tasks registered. Connects nothing yet.

    ``turn_worker``: its pool processes announce their host (``HostBeacon``); beat's
    control worker, which serves no host's queue, passes False so it never makes a
    host look alive."""
    app = broker_app(settings)
    _register_tasks(app, settings, announce=turn_worker)
    return app


def _register_tasks(app: Celery, settings: Settings, *, announce: bool) -> None:
    @app.task(name=RUN_TURN, shared=False)
    @tallied(RUN_TURN)
    def run_turn(run_id: str) -> None:
        runtime = runtime_for(settings, StoredLog)
        # A run of a session whose workspace is on another live host goes on there.
        host = run_host(runtime.store, settings, run_id)
        if host is not None and host != settings.host_id:
            log.info("run.forwarded", run_id=run_id, host=host)
            send_run(app, settings, run_id, host=host)
            return
        try:
            attempt.run_turn(runtime, run_id)
        finally:
            start_next_in_session(app, settings, runtime.store, run_id)

    @app.task(name=TAKEOVER, shared=False)
    @tallied(TAKEOVER)
    def takeover(run_id: str, attempt_id: str, epoch: int) -> None:
        runtime = runtime_for(settings, StoredLog)
        # A message on the wrong queue (sent before the host of the run's sandbox was
        # known to be alive, or by an older sender) goes on to that host's queue.
        host = route_takeover(runtime.store, settings, run_id)
        if host is not None and host != settings.host_id:
            log.info("takeover.forwarded", run_id=run_id, epoch=epoch, host=host)
            send_takeover(app, settings, run_id, attempt_id, epoch, host=host)
            return
        try:
            attempt.take_over(runtime, run_id, attempt_id, epoch)
        finally:
            start_next_in_session(app, settings, runtime.store, run_id)

    @app.task(name=RECONCILE, shared=False)
    def reconcile() -> None:
        runtime = runtime_for(settings, StoredLog)
        reconciler.reconcile(runtime, **enqueuers(app, settings, runtime.store))

    @app.task(name=REAP, shared=False)
    def reap() -> None:
        """The fleet's share here, then each live host its own, on its queue; and the
        queues of dead hosts emptied."""
        runtime = runtime_for(settings, StoredLog)
        reconciler.reap_fleet(runtime)
        for host in runtime.store.live_hosts(settings.host_dead_after):
            send_prioritised(
                app,
                settings,
                REAP_HOST,
                [host],
                host_queue(settings, host),
                expires=settings.reap_interval * 2,
            )
        for host in runtime.store.dead_hosts(settings.host_dead_after, reconciler.BATCH):
            _empty_dead_host_queue(app, settings, host)

    @app.task(name=REAP_HOST, shared=False)
    def reap_host(host_id: str) -> None:
        if host_id != settings.host_id:  # a queue only this host's workers consume
            log.warning("reap.wrong_host", host=host_id, here=settings.host_id)
            return
        reconciler.reap_host(runtime_for(settings, StoredLog))

    @app.task(name=PRUNE, shared=False)
    def prune() -> None:
        reconciler.prune(runtime_for(settings, StoredLog))

    _open_runtimes_in_task_processes(app, settings, announce=announce)


def _open_runtimes_in_task_processes(app: Celery, settings: Settings, *, announce: bool) -> None:
    """Open the runtime (and start the host beacon) in whichever process runs tasks."""

    def open_runtime(*, main_pid: int | None) -> None:
        make_undumpable()  # inherited from the parent already; said again for any pool kind
        # Connections belong to the process that runs the tasks, opened there; its
        # beacon says its host is alive, and carries drain orders for its worker.
        runtime = runtime_for(settings, StoredLog)
        if main_pid is None or not announce:
            return
        if not serves_host_queue(app, settings):
            # A takeover routed to this host waits for a worker of its queue: one that
            # consumes only the turns queue (``-Q`` given without it) must not make the
            # host look alive, or such takeovers would wait for good.
            log.warning("host.not_announced", host=settings.host_id, queue=host_queue(settings))
            return
        runtime.announce(main_pid=main_pid)

    def open_after_fork(**_: Any) -> None:
        """In a pool process of the prefork pool (and in the solo pool's own process)."""
        open_runtime(main_pid=main_process_pid())

    def open_in_worker(sender: Any = None, **_: Any) -> None:
        """In the worker process itself, when its pool runs tasks there (threads,
        gevent, eventlet): no pool process starts, so ``worker_process_init`` never
        comes, and without this the process would never announce its host."""
        if sender is None or runs_tasks_in_pool_processes(sender.pool_cls):
            return
        open_runtime(main_pid=os.getpid() if is_worker_command(os.getpid()) else None)

    # Signals are process-wide: one handler per distinct settings, however many apps.
    uid = f"{hash(settings)}-{announce}"
    worker_process_init.connect(open_after_fork, weak=False, dispatch_uid=f"turnkeeper-open-{uid}")
    worker_init.connect(open_in_worker, weak=False, dispatch_uid=f"turnkeeper-open-main-{uid}")
    worker_process_shutdown.connect(close_on_shutdown, weak=False, dispatch_uid="turnkeeper-close")
    worker_shutdown.connect(close_in_worker, weak=False, dispatch_uid="turnkeeper-close-main")


def runs_tasks_in_pool_processes(pool_cls: Any) -> bool:
    """Whether a Celery pool (a class, or its name as ``-P`` gives it) runs its tasks in
    processes of its own (prefork), each sent ``worker_process_init``; the solo pool
    sends it to the worker process itself, so it counts here too."""
    implementation = concurrency.get_implementation(pool_cls)
    return issubclass(implementation, PreforkPool | SoloPool)


def _empty_dead_host_queue(app: Celery, settings: Settings, host: str) -> None:
    """Drop what waits in a dead host's queue: nobody consumes it, and a broker keeps an
    expired message until a consumer takes it, so without this every host that ever
    died would hold its last messages for good. Each was only a trigger: its takeovers
    are sent on by the reconciler (``takeovers_of_dead_hosts``), whatever the queue
    holds, and a host that comes back is sent its next ``reap_host``."""
    queue = host_queue(settings, host)
    with app.connection_for_write() as conn:
        try:
            dropped = Queue(queue).bind(conn.default_channel).purge()
        except (*conn.connection_errors, *conn.channel_errors) as exc:  # none declared yet
            log.info("host.queue_not_emptied", host=host, error=str(exc))
            return
    if dropped:
        log.info("host.queue_emptied", host=host, messages=dropped)


def serves_host_queue(app: Celery, settings: Settings) -> bool:
    """Whether this worker consumes its host's queue (the queues its ``-Q`` selected,
    which the pool processes inherit from the main process)."""
    consumed = app.amqp.queues.consume_from
    return consumed is None or host_queue(settings) in consumed


def close_on_shutdown(**_: Any) -> None:
    close_runtimes()


def close_in_worker(sender: Any = None, **_: Any) -> None:
    """Close the worker process's own runtime once its pool stopped (its turns ended),
    when that pool ran the tasks there (threads): no ``worker_process_shutdown`` comes."""
    if sender is not None and not runs_tasks_in_pool_processes(sender.pool_cls):
        close_runtimes()


def start_next_in_session(app: Celery, settings: Settings, store: Store, run_id: str) -> None:
    """Once ``run_id`` settled, start the run of its session queued behind it at once
    (one run of a session runs at a time; a claim refuses a run that does not lead).
    A worker that dies first leaves it to the reconciler's stale sweep, which picks a
    queued run up once it leads its session."""
    try:
        successor = store.next_in_session(run_id)
        if successor is None:
            return
        enqueue_run(app, settings, successor, store=store)
        store.mark_dispatched(successor)
    except TurnkeeperError as exc:
        log.warning("run.next_deferred", run_id=run_id, error=str(exc))
        return
    log.info("run.next_in_session", run_id=successor, after=run_id)
