"""The Celery app and its thin tasks; the logic lives in driver, reconciler and workers.

Acknowledgement is early (Celery's default, ``task_acks_late=False``), on purpose:
a delivery is only a trigger, ownership lives in the store. If a worker dies
mid-turn, redelivering its message would achieve nothing (the run is
``running`` and nobody else may claim it); the reconciler notices the expired
lease and hands the run to a new attempt. A message lost before it ran leaves a
``queued`` run that the reconciler enqueues again. Late acknowledgement would add
redeliveries after every crash (and, on the Redis transport, after the visibility
timeout of every turn longer than it) without making anything safer.

Prefetch is disabled, so a worker whose processes are busy with long turns does
not hold messages that an idle worker could run now.

Two queues, so that control work never waits behind turns: ``<ns>.turns`` (long
``run_turn`` and ``takeover`` tasks) and ``<ns>.control`` (``reconcile``, ``reap``,
``prune``), served by ``turnkeeper worker`` and ``turnkeeper beat`` respectively.
A third per host, ``<ns>.host.<host_id>``, which every worker of that host consumes
besides the turns queue: the takeover of a run whose sandbox is on that host's disk
(``hosts.route_takeover`` decides, for every sender), and that host's share of the
reaping (``reap_host``), which beat's ``reap`` sends each live host
(docs/architecture.md, "Hosts").

Takeovers are served before new runs, by message priority within the turns queue
(``TurnPriorities``): a run already started waits for a slot only behind other
takeovers. The two brokers spell priority in opposite directions. On Redis, kombu
keeps one list per step of ``priority_steps`` and pops them in that order with one
BRPOP, so priority 0 is served first, whatever ``queue_order_strategy`` (that only
orders queues within one step); with ``worker_disable_prefetch`` a busy worker takes
no message at all, so every waiting message is still ordered. On RabbitMQ the queue
is declared with ``x-max-priority`` and the higher number wins; Celery ignores
``worker_disable_prefetch`` there, so each busy worker process may hold one message
it was already given (early acknowledgement frees its prefetch slot), which a
takeover then waits behind.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

import structlog
from celery import Celery, concurrency
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.concurrency.solo import TaskPool as SoloPool
from celery.signals import (
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
)
from kombu import Queue
from kombu.exceptions import OperationalError as KombuOperationalError

from turnkeeper import driver, reconciler
from turnkeeper.config import Settings
from turnkeeper.errors import BrokerUnavailableError, TurnkeeperError
from turnkeeper.hosts import route_takeover, run_host
from turnkeeper.secret import make_undumpable
from turnkeeper.store.database import tallied
from turnkeeper.store.store import Store
from turnkeeper.workers.beacon import is_worker_command, main_process_pid
from turnkeeper.workers.runtime import close_runtimes, runtime_for

log = structlog.get_logger(__name__)

RUN_TURN = "turnkeeper.run_turn"
TAKEOVER = "turnkeeper.takeover"
RECONCILE = "turnkeeper.reconcile"
REAP = "turnkeeper.reap"
REAP_HOST = "turnkeeper.reap_host"
PRUNE = "turnkeeper.prune"


def turns_queue(settings: Settings) -> str:
    return f"{settings.namespace}.turns"


def control_queue(settings: Settings) -> str:
    return f"{settings.namespace}.control"


def host_queue(settings: Settings, host_id: str | None = None) -> str:
    """The queue of one host's workers (this worker's host by default)."""
    return f"{settings.namespace}.host.{host_id or settings.host_id}"


def _priority_queue(settings: Settings, name: str) -> Queue:
    """A queue carrying takeovers, declared alike by its consumers and every sender (on
    RabbitMQ a queue redeclared with other arguments is refused)."""
    priorities = TurnPriorities.for_broker(settings.effective_broker_url)
    return Queue(name, queue_arguments=priorities.queue_arguments)


@dataclass(frozen=True)
class TurnPriorities:
    """The message priorities of the turns queue on one broker."""

    takeover: int
    run: int
    queue_arguments: dict[str, Any] | None = None
    transport_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_broker(cls, broker_url: str) -> TurnPriorities:
        if _is_redis(broker_url):
            # Two steps (lists) are all the turns queue needs; lower is served first.
            return cls(takeover=0, run=9, transport_options={"priority_steps": [0, 9]})
        return cls(takeover=1, run=0, queue_arguments={"x-max-priority": 1})


def _is_redis(broker_url: str) -> bool:
    return broker_url.startswith(("redis://", "rediss://", "unix://"))


def create_app(settings: Settings, *, turn_worker: bool = True) -> Celery:
    """A Celery app for ``settings`` (both service URLs set). Connects nothing yet.

    ``turn_worker``: its pool processes announce their host (``HostBeacon``); beat's
    control worker, which serves no host's queue, passes False so it never makes a
    host look alive."""
    broker = settings.effective_broker_url
    # No fixups: with DJANGO_SETTINGS_MODULE in its environment (a Django shop's hosts),
    # Celery would set that project up inside every turnkeeper worker, and a worker
    # where it is not importable would not start at all.
    app = Celery("turnkeeper", broker=broker, set_as_current=False, fixups=[])
    turns, control = turns_queue(settings), control_queue(settings)
    priorities = TurnPriorities.for_broker(broker)
    transport_options: dict[str, Any] = dict(priorities.transport_options)
    if _is_redis(broker):
        # Every kombu key under the namespace: fleets (and tests) sharing a Redis stay apart.
        transport_options["global_keyprefix"] = f"{settings.namespace}:celery:"
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=False,
        worker_disable_prefetch=True,
        worker_prefetch_multiplier=1,
        task_queues=(
            _priority_queue(settings, turns),
            Queue(control),
            _priority_queue(settings, host_queue(settings)),
        ),
        task_default_queue=control,
        task_routes={
            RUN_TURN: {"queue": turns},
            TAKEOVER: {"queue": turns},
            RECONCILE: {"queue": control},
            REAP: {"queue": control},
            PRUNE: {"queue": control},
        },
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        beat_schedule={
            "reconcile": {
                "task": RECONCILE,
                "schedule": timedelta(seconds=settings.reconcile_interval),
                "options": {"expires": settings.reconcile_interval * 2},
            },
            "reap": {"task": REAP, "schedule": timedelta(seconds=settings.reap_interval)},
            "prune": {"task": PRUNE, "schedule": timedelta(seconds=settings.prune_interval)},
        },
    )
    _register_tasks(app, settings, announce=turn_worker)
    return app


def _register_tasks(app: Celery, settings: Settings, *, announce: bool) -> None:
    @app.task(name=RUN_TURN, shared=False)
    @tallied(RUN_TURN)
    def run_turn(run_id: str) -> None:
        runtime = runtime_for(settings)
        # A run of a session whose workspace is on another live host goes on there.
        host = run_host(runtime.store, settings, run_id)
        if host is not None and host != settings.host_id:
            log.info("run.forwarded", run_id=run_id, host=host)
            _send_run(app, settings, run_id, host=host)
            return
        try:
            driver.run_turn(runtime, run_id)
        finally:
            start_next_in_session(app, settings, runtime.store, run_id)

    @app.task(name=TAKEOVER, shared=False)
    @tallied(TAKEOVER)
    def takeover(run_id: str, attempt_id: str, epoch: int) -> None:
        runtime = runtime_for(settings)
        # A message on the wrong queue (sent before the host of the run's sandbox was
        # known to be alive, or by an older sender) goes on to that host's queue.
        host = route_takeover(runtime.store, settings, run_id)
        if host is not None and host != settings.host_id:
            log.info("takeover.forwarded", run_id=run_id, epoch=epoch, host=host)
            _send_takeover(app, settings, run_id, attempt_id, epoch, host=host)
            return
        try:
            driver.take_over(runtime, run_id, attempt_id, epoch)
        finally:
            start_next_in_session(app, settings, runtime.store, run_id)

    @app.task(name=RECONCILE, shared=False)
    def reconcile() -> None:
        runtime = runtime_for(settings)
        reconciler.reconcile(runtime, **enqueuers(app, settings, runtime.store))

    @app.task(name=REAP, shared=False)
    def reap() -> None:
        """The fleet's share here, then each live host its own, on its queue; and the
        queues of dead hosts emptied."""
        runtime = runtime_for(settings)
        reconciler.reap_fleet(runtime)
        for host in runtime.store.live_hosts(settings.host_dead_after):
            _send_prioritised(
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
        reconciler.reap_host(runtime_for(settings))

    @app.task(name=PRUNE, shared=False)
    def prune() -> None:
        reconciler.prune(runtime_for(settings))

    _open_runtimes_in_task_processes(app, settings, announce=announce)


def _open_runtimes_in_task_processes(app: Celery, settings: Settings, *, announce: bool) -> None:
    """Open the runtime (and start the host beacon) in whichever process runs tasks."""

    def open_runtime(*, main_pid: int | None) -> None:
        make_undumpable()  # inherited from the parent already; said again for any pool kind
        # Connections belong to the process that runs the tasks, opened there; its
        # beacon says its host is alive, and carries drain orders for its worker.
        runtime = runtime_for(settings)
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


def queue_depths(app: Celery, names: list[str]) -> dict[str, int | None]:
    """The messages waiting in each named queue, by a queue declare, which creates
    nothing: on RabbitMQ a passive one (None for a queue nobody declared yet, and each on
    a channel of its own, as a refused one closes its channel); on Redis, where a queue
    is only its lists (one per priority step, summed) and a declare without bindings
    writes nothing, a plain one (an empty list does not exist, so passive would refuse
    every empty queue)."""
    passive = not _is_redis(str(app.conf.broker_url))
    depths: dict[str, int | None] = {}
    unreachable = "queue depths: the broker is unreachable"
    try:
        pool: Any = app.pool  # a kombu ConnectionPool (celery's stubs say Producer)
        with pool.acquire(block=True, timeout=10) as conn:
            try:
                for name in names:
                    depths[name] = _depth(conn, name, passive=passive)
            except conn.connection_errors as exc:
                raise BrokerUnavailableError(unreachable, reason="broker") from exc
    except (KombuOperationalError, OSError) as exc:
        raise BrokerUnavailableError(unreachable, reason="broker") from exc
    return depths


def _depth(conn: Any, name: str, *, passive: bool) -> int | None:
    channel = conn.channel()
    try:
        return int(channel.queue_declare(queue=name, passive=passive)[1])
    except conn.channel_errors:
        return None
    finally:
        with contextlib.suppress(*conn.channel_errors, *conn.connection_errors):
            channel.close()


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


def enqueue_run(
    app: Celery, settings: Settings, run_id: str, *, store: Store | None = None
) -> None:
    """Trigger ``run_turn`` for an admitted run (losing this message loses nothing), on
    the queue ``hosts.run_host`` names: the host holding its session's workspace while
    it is alive, else the shared turns queue."""
    host = run_host(store or runtime_for(settings).store, settings, run_id)
    _send_run(app, settings, run_id, host=host)


def _send_run(app: Celery, settings: Settings, run_id: str, *, host: str | None) -> None:
    priority = TurnPriorities.for_broker(settings.effective_broker_url).run
    if host is None:
        _send(app, RUN_TURN, args=[run_id], queue=turns_queue(settings), priority=priority)
        return
    # Celery takes a Queue here (routes.expand_destination), not only a name.
    queue = _priority_queue(settings, host_queue(settings, host))
    _send(app, RUN_TURN, args=[run_id], queue=queue, priority=priority)


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


def enqueue_takeover(
    app: Celery,
    settings: Settings,
    run_id: str,
    attempt_id: str,
    epoch: int,
    *,
    store: Store | None = None,
) -> None:
    """Trigger ``takeover`` for a run handed to ``attempt_id``: served before any new
    run (losing or repeating this message loses nothing either), on the queue
    ``hosts.route_takeover`` names: the host holding the run's sandbox while it is
    alive, else the shared turns queue."""
    host = route_takeover(store or runtime_for(settings).store, settings, run_id)
    _send_takeover(app, settings, run_id, attempt_id, epoch, host=host)


def _send_takeover(
    app: Celery, settings: Settings, run_id: str, attempt_id: str, epoch: int, *, host: str | None
) -> None:
    queue = turns_queue(settings) if host is None else host_queue(settings, host)
    _send_prioritised(app, settings, TAKEOVER, [run_id, attempt_id, epoch], queue)


def _send_prioritised(
    app: Celery, settings: Settings, task: str, args: list[Any], queue: str, **options: Any
) -> None:
    """Send ``task`` at the takeover priority to ``queue``, declared as its consumers
    declare it (``_priority_queue``), whether or not this app consumes it."""
    _send(
        app,
        task,
        args=args,
        queue=_priority_queue(settings, queue),
        priority=TurnPriorities.for_broker(settings.effective_broker_url).takeover,
        **options,
    )


def _send(app: Celery, task: str, **options: Any) -> None:
    """``app.send_task``, with the broker's own errors (kombu's, once its publish retries
    ran out) as a ``BrokerUnavailableError``: no caller catches a kombu type."""
    try:
        app.send_task(task, **options)
    except (KombuOperationalError, OSError) as exc:
        raise BrokerUnavailableError(f"{task}: the broker is unreachable", reason="broker") from exc


def enqueuers(
    app: Celery, settings: Settings, store: Store | None = None
) -> dict[str, Callable[..., None]]:
    """The reconciler's two triggers, bound to ``app`` (and to ``store``, which routes
    takeovers; this process's runtime's by default)."""
    return {
        "enqueue_takeover": partial(enqueue_takeover, app, settings, store=store),
        "enqueue_run": partial(enqueue_run, app, settings, store=store),
    }
