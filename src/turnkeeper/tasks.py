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

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown
from kombu import Queue

from turnkeeper import driver, reconciler
from turnkeeper.config import Settings
from turnkeeper.secret import make_undumpable
from turnkeeper.workers.runtime import close_runtimes, runtime_for

RUN_TURN = "turnkeeper.run_turn"
TAKEOVER = "turnkeeper.takeover"
RECONCILE = "turnkeeper.reconcile"
REAP = "turnkeeper.reap"
PRUNE = "turnkeeper.prune"


def turns_queue(settings: Settings) -> str:
    return f"{settings.namespace}.turns"


def control_queue(settings: Settings) -> str:
    return f"{settings.namespace}.control"


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


def create_app(settings: Settings) -> Celery:
    """A Celery app for ``settings`` (both service URLs set). Connects nothing yet."""
    broker = settings.effective_broker_url
    app = Celery("turnkeeper", broker=broker, set_as_current=False)
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
            Queue(turns, queue_arguments=priorities.queue_arguments),
            Queue(control),
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
    _register_tasks(app, settings)
    return app


def _register_tasks(app: Celery, settings: Settings) -> None:
    @app.task(name=RUN_TURN, shared=False)
    def run_turn(run_id: str) -> None:
        driver.run_turn(runtime_for(settings), run_id)

    @app.task(name=TAKEOVER, shared=False)
    def takeover(run_id: str, attempt_id: str, epoch: int) -> None:
        driver.take_over(runtime_for(settings), run_id, attempt_id, epoch)

    @app.task(name=RECONCILE, shared=False)
    def reconcile() -> None:
        reconciler.reconcile(runtime_for(settings), **enqueuers(app, settings))

    @app.task(name=REAP, shared=False)
    def reap() -> None:
        reconciler.reap(runtime_for(settings))

    @app.task(name=PRUNE, shared=False)
    def prune() -> None:
        reconciler.prune(runtime_for(settings))

    def open_after_fork(**_: Any) -> None:
        make_undumpable()  # inherited from the parent already; said again for any pool kind
        runtime_for(settings)  # connections belong to the child, opened after the fork

    # Signals are process-wide: one handler per distinct settings, however many apps.
    worker_process_init.connect(
        open_after_fork, weak=False, dispatch_uid=f"turnkeeper-open-{hash(settings)}"
    )
    worker_process_shutdown.connect(close_on_shutdown, weak=False, dispatch_uid="turnkeeper-close")


def close_on_shutdown(**_: Any) -> None:
    close_runtimes()


def enqueue_run(app: Celery, settings: Settings, run_id: str) -> None:
    """Trigger ``run_turn`` for an admitted run (losing this message loses nothing)."""
    priority = TurnPriorities.for_broker(settings.effective_broker_url).run
    app.send_task(RUN_TURN, args=[run_id], queue=turns_queue(settings), priority=priority)


def enqueue_takeover(
    app: Celery, settings: Settings, run_id: str, attempt_id: str, epoch: int
) -> None:
    """Trigger ``takeover`` for a run the reconciler handed to ``attempt_id``: served
    before any new run (losing or repeating this message loses nothing either)."""
    priority = TurnPriorities.for_broker(settings.effective_broker_url).takeover
    app.send_task(
        TAKEOVER, args=[run_id, attempt_id, epoch], queue=turns_queue(settings), priority=priority
    )


def enqueuers(app: Celery, settings: Settings) -> dict[str, Callable[..., None]]:
    """The reconciler's two triggers, bound to ``app``."""
    return {
        "enqueue_takeover": partial(enqueue_takeover, app, settings),
        "enqueue_run": partial(enqueue_run, app, settings),
    }
