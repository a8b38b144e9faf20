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
"""

from __future__ import annotations

from collections.abc import Callable
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


def create_app(settings: Settings) -> Celery:
    """A Celery app for ``settings`` (both service URLs set). Connects nothing yet."""
    broker = settings.effective_broker_url
    app = Celery("turnkeeper", broker=broker, set_as_current=False)
    turns, control = turns_queue(settings), control_queue(settings)
    transport_options: dict[str, Any] = {}
    if broker.startswith(("redis://", "rediss://", "unix://")):
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
        task_queues=(Queue(turns), Queue(control)),
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
    app.send_task(RUN_TURN, args=[run_id], queue=turns_queue(settings))


def enqueue_takeover(
    app: Celery, settings: Settings, run_id: str, attempt_id: str, epoch: int
) -> None:
    """Trigger ``takeover`` for a run the reconciler handed to ``attempt_id``."""
    app.send_task(TAKEOVER, args=[run_id, attempt_id, epoch], queue=turns_queue(settings))


def enqueuers(app: Celery, settings: Settings) -> dict[str, Callable[..., None]]:
    """The reconciler's two triggers, bound to ``app``."""
    return {
        "enqueue_takeover": partial(enqueue_takeover, app, settings),
        "enqueue_run": partial(enqueue_run, app, settings),
    }
