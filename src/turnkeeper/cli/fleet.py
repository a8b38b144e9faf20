"""Commands that run the fleet: worker, beat, and the sweeps on demand."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Annotated

import typer

from turnkeeper import reconciler
from turnkeeper.cli.context import console, services, settings_from_env
from turnkeeper.config import Settings
from turnkeeper.tasks import control_queue, create_app, enqueue_run, turns_queue
from turnkeeper.workers.runtime import WorkerRuntime

PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def _celery_argv(defaults: list[str], given: list[str]) -> list[str]:
    """Our defaults, minus any option the operator gave (Celery's options pass through)."""
    argv: list[str] = []
    options = iter(defaults)
    for option in options:
        value = next(options)
        if option not in given:
            argv += [option, value]
    return argv + given


def worker(ctx: typer.Context) -> None:
    """Run a Celery worker for turns; Celery's own options pass through (e.g. -c 4)."""
    settings = settings_from_env(quiet=False)
    with services(settings, start=False) as resolved:
        app = create_app(resolved)
        defaults = [
            "-Q", turns_queue(resolved),
            "-n", f"turnkeeper-{os.getpid()}@%h",
            "--loglevel", resolved.log_level,
        ]  # fmt: skip
        app.worker_main(["worker", *_celery_argv(defaults, list(ctx.args))])


def beat(ctx: typer.Context) -> None:
    """Run beat with a control worker (reconcile, reap, prune); Celery's options pass through."""
    settings = settings_from_env(quiet=False)
    with services(settings, start=False) as resolved:
        app = create_app(resolved)
        resolved.data_dir.mkdir(parents=True, exist_ok=True)
        defaults = [
            "-Q", control_queue(resolved),
            "-n", f"turnkeeper-beat-{os.getpid()}@%h",
            "-P", "solo",
            "-s", str(resolved.data_dir / "beat-schedule"),
            "--loglevel", resolved.log_level,
        ]  # fmt: skip
        app.worker_main(["worker", "-B", *_celery_argv(defaults, list(ctx.args))])


def _sweep_loop(name: str, once: bool, interval: float, sweep: Callable[[], object]) -> None:
    while True:
        result = sweep()
        console.print(f"{name}: {result}", highlight=False)
        if once:
            return
        time.sleep(interval)


def reconcile(
    once: Annotated[bool, typer.Option("--once", help="One sweep, then exit.")] = False,
) -> None:
    """Hand runs with expired leases to new attempts; fail exhausted ones; requeue lost ones."""
    settings = settings_from_env()
    with services(settings, start=False) as resolved:
        rt = WorkerRuntime.open(resolved)
        app = create_app(resolved)

        def takeover(run_id: str, attempt_id: str, epoch: int) -> None:
            app.send_task(
                "turnkeeper.takeover", args=[run_id, attempt_id, epoch], queue=turns_queue(resolved)
            )

        def sweep() -> object:
            return reconciler.reconcile(
                rt,
                enqueue_takeover=takeover,
                enqueue_run=lambda run_id: enqueue_run(app, resolved, run_id),
            )

        try:
            _sweep_loop("reconcile", once, resolved.reconcile_interval, sweep)
        finally:
            rt.close()


def reap(
    once: Annotated[bool, typer.Option("--once", help="One sweep, then exit.")] = False,
) -> None:
    """Destroy sandboxes of settled runs and orphans past their TTL."""
    settings = settings_from_env()
    with services(settings, start=False) as resolved:
        rt = WorkerRuntime.open(resolved)
        try:
            _sweep_loop("reap", once, resolved.reap_interval, lambda: reconciler.reap(rt))
        finally:
            rt.close()


def prune(
    once: Annotated[bool, typer.Option("--once", help="One sweep, then exit.")] = False,
) -> None:
    """Delete segments and journal slots of runs settled long ago."""
    settings = settings_from_env()
    with services(settings, start=False) as resolved:
        rt = WorkerRuntime.open(resolved)
        try:
            _sweep_loop("prune", once, resolved.prune_interval, lambda: reconciler.prune(rt))
        finally:
            rt.close()


def start_fleet(settings: Settings, *, workers: int = 1) -> list[subprocess.Popen[bytes]]:
    """Worker and beat processes for ``dev`` and ``demo``, on the given servers."""
    env = dict(os.environ)  # the children read the same TURNKEEPER_* settings...
    env.update(  # ... on the servers this process resolved
        TURNKEEPER_DATABASE_URL=settings.require_database_url(),
        TURNKEEPER_REDIS_URL=settings.require_redis_url(),
        TURNKEEPER_DATA_DIR=str(settings.data_dir.resolve()),
    )
    command = [sys.executable, "-m", "turnkeeper"]
    # Their banners and logs go to stderr: stdout belongs to the command that started them.
    def start(*args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*command, *args], env=env, start_new_session=True, stdout=sys.stderr
        )

    return [*(start("worker", "-c", "2") for _ in range(workers)), start("beat")]


def stop_fleet(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_for_signal() -> None:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
