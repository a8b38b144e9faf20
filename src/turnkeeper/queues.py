"""The queues turnkeeper's messages travel on, and the sending side of them.

Everything a process that only enqueues needs (the web app, the client, ``turnkeeper
submit``): the Celery app configured for the broker, with no task registered
(``broker_app``), the queue names, the priorities, and the sends. The tasks that
consume these messages, and the worker's runtime behind them, are ``turnkeeper.tasks``:
loading them costs an enqueuer a tenth of a second it never needs.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

from celery import Celery
from kombu import Queue
from kombu.exceptions import OperationalError as KombuOperationalError

from turnkeeper.config import Settings
from turnkeeper.errors import BrokerUnavailableError
from turnkeeper.hosts import route_takeover, run_host
from turnkeeper.store.store import Store

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


def broker_app(settings: Settings) -> Celery:
    """A Celery app for ``settings`` (both service URLs set), configured as every
    sender and consumer needs it, with no task registered (``tasks.create_app`` adds
    them). Connects nothing yet."""
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
    return app


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


def enqueue_run(app: Celery, settings: Settings, run_id: str, *, store: Store) -> None:
    """Trigger ``run_turn`` for an admitted run (losing this message loses nothing), on
    the queue ``hosts.run_host`` names: the host holding its session's workspace while
    it is alive, else the shared turns queue."""
    host = run_host(store, settings, run_id)
    send_run(app, settings, run_id, host=host)


def send_run(app: Celery, settings: Settings, run_id: str, *, host: str | None) -> None:
    priority = TurnPriorities.for_broker(settings.effective_broker_url).run
    if host is None:
        _send(app, RUN_TURN, args=[run_id], queue=turns_queue(settings), priority=priority)
        return
    # Celery takes a Queue here (routes.expand_destination), not only a name.
    queue = _priority_queue(settings, host_queue(settings, host))
    _send(app, RUN_TURN, args=[run_id], queue=queue, priority=priority)


def enqueue_takeover(
    app: Celery, settings: Settings, run_id: str, attempt_id: str, epoch: int, *, store: Store
) -> None:
    """Trigger ``takeover`` for a run handed to ``attempt_id``: served before any new
    run (losing or repeating this message loses nothing either), on the queue
    ``hosts.route_takeover`` names: the host holding the run's sandbox while it is
    alive, else the shared turns queue."""
    host = route_takeover(store, settings, run_id)
    send_takeover(app, settings, run_id, attempt_id, epoch, host=host)


def send_takeover(
    app: Celery, settings: Settings, run_id: str, attempt_id: str, epoch: int, *, host: str | None
) -> None:
    queue = turns_queue(settings) if host is None else host_queue(settings, host)
    send_prioritised(app, settings, TAKEOVER, [run_id, attempt_id, epoch], queue)


def send_prioritised(
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


def enqueuers(app: Celery, settings: Settings, store: Store) -> dict[str, Callable[..., None]]:
    """The reconciler's two triggers, bound to ``app`` and to ``store`` (which routes
    them)."""
    return {
        "enqueue_takeover": partial(enqueue_takeover, app, settings, store=store),
        "enqueue_run": partial(enqueue_run, app, settings, store=store),
    }
