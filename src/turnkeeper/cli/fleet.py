"""Commands that run the fleet: worker, beat, and the sweeps on demand."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from turnkeeper.cli.context import console, fail, services, settings_from_env

if TYPE_CHECKING:
    from turnkeeper.config import Settings
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


Drain = Annotated[
    bool,
    typer.Option(
        "--drain",
        help="Drain this host's running workers instead: they stop taking runs, finish "
        "theirs or hand them over, and exit; returns once they have.",
    ),
]
HandOverAfter = Annotated[
    float,
    typer.Option(
        "--hand-over-after",
        min=0,
        help="With --drain: seconds a run may take to finish before it is handed over.",
    ),
]


def worker(ctx: typer.Context, drain: Drain = False, hand_over_after: HandOverAfter = 60.0) -> None:
    """Run a Celery worker for turns; Celery's own options pass through (e.g. -c 4)."""
    from turnkeeper.agents.readiness import agent_paths, log_readiness
    from turnkeeper.errors import TurnkeeperError
    from turnkeeper.queues import host_queue, turns_queue
    from turnkeeper.sandbox.readiness import check_provider
    from turnkeeper.secret import ServerSecret, make_undumpable
    from turnkeeper.tasks import create_app
    from turnkeeper.workers.limits import raise_open_files_limit

    settings = settings_from_env(quiet=False)
    if drain:
        drain_host(settings, hand_over_after)
        return
    with services(settings, start=False) as resolved:
        ServerSecret.require(resolved, "to start a worker")
        make_undumpable()
        raise_open_files_limit()  # every live turn holds descriptors (workers/limits.py)
        try:
            check_provider(resolved, agent_paths(resolved))
        except TurnkeeperError as exc:
            raise fail(exc.message) from None
        log_readiness(resolved)  # a warning per problem of an agent; it starts anyway
        app = create_app(resolved)
        defaults = [
            "-Q", f"{turns_queue(resolved)},{host_queue(resolved)}",
            "-n", f"turnkeeper-{os.getpid()}@{resolved.host_id}",
            "--loglevel", resolved.log_level,
        ]  # fmt: skip
        app.worker_main(["worker", *_celery_argv(defaults, list(ctx.args))])


def drain_host(settings: Settings, hand_over_after: float) -> None:
    """Drain the live workers of this host (``TURNKEEPER_HOST_ID``): each is marked
    draining in the store and sent SIGTERM, Celery's warm shutdown (no new messages;
    running tasks go on). Runs that do not finish within ``hand_over_after`` are handed
    over: their leases are let go, and a worker of this host adopts them (their
    sandboxes are on its disk). Returns once every drained worker has exited."""
    from turnkeeper.store.store import Store
    from turnkeeper.workers.beacon import is_worker_command

    with services(settings, start=False) as resolved:
        store = Store(resolved.require_database_url(), pool_size=1)
        try:
            drained = store.drain_workers(
                resolved.host_id, resolved.host_dead_after, hand_over_after
            )
        finally:
            store.close()
    mains = sorted({w.main_pid for w in drained if is_worker_command(w.main_pid)})
    console.print(
        f"draining {len(mains)} worker(s) on host {resolved.host_id}: runs still going in "
        f"{hand_over_after:g}s are handed over",
        highlight=False,
    )
    for pid in mains:  # only pids that still run a worker: a pid may have been reused
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    while alive := [pid for pid in mains if is_worker_command(pid)]:
        time.sleep(0.5)
        mains = alive
    console.print(f"host {resolved.host_id} drained", highlight=False)


def beat(ctx: typer.Context) -> None:
    """Run beat with a control worker (reconcile, reap, prune); Celery's options pass through."""
    from celery.signals import worker_ready

    from turnkeeper.driver.replay import StoredLog
    from turnkeeper.queues import control_queue, enqueuers
    from turnkeeper.secret import ServerSecret, make_undumpable
    from turnkeeper.tasks import create_app
    from turnkeeper.watcher import start_watcher
    from turnkeeper.workers.runtime import runtime_for

    settings = settings_from_env(quiet=False)
    with services(settings, start=False) as resolved:
        ServerSecret.require(resolved, "to start beat")
        make_undumpable()
        app = create_app(resolved, turn_worker=False)
        resolved.data_dir.mkdir(parents=True, exist_ok=True)
        defaults = [
            "-Q", control_queue(resolved),
            "-n", f"turnkeeper-beat-{os.getpid()}@%h",
            "-P", "solo",
            # In memory, each sweep due at start (tasks.SweepScheduler).
            "--scheduler", "turnkeeper.tasks:SweepScheduler",
            "--loglevel", resolved.log_level,
        ]  # fmt: skip

        # The crash watcher is a loop beside the control worker (the solo pool runs tasks
        # in this process), not a task: see docs/architecture.md, "Crash detection". It
        # starts once the worker is ready, after Celery forked the embedded beat, so that
        # no other process shares its connection.
        def watch(**_: object) -> None:
            runtime = runtime_for(resolved, StoredLog)
            triggers = enqueuers(app, resolved, runtime.store)
            start_watcher(resolved, runtime, triggers["enqueue_takeover"])

        worker_ready.connect(
            watch,
            weak=False,
            dispatch_uid="turnkeeper-crash-watcher",
        )
        app.worker_main(["worker", "-B", *_celery_argv(defaults, list(ctx.args))])


Once = Annotated[bool, typer.Option("--once", help="One sweep, then exit.")]


def _sweep(
    name: str,
    once: bool,
    interval: Callable[[Settings], float],
    sweep: Callable[[WorkerRuntime, Settings], object],
) -> None:
    """Run a sweep now and then every ``interval`` (or once), printing what it did."""
    from turnkeeper.driver.replay import StoredLog
    from turnkeeper.workers.runtime import WorkerRuntime

    settings = settings_from_env()
    with services(settings, start=False) as resolved:
        rt = WorkerRuntime.open(resolved, StoredLog)
        try:
            while True:
                report = sweep(rt, resolved)
                fields = getattr(report, "__dict__", None)
                shown = " ".join(f"{k}={v}" for k, v in fields.items()) if fields else report
                console.print(f"{name}: {shown}", highlight=False)
                if once:
                    return
                time.sleep(interval(resolved))
        finally:
            rt.close()


def reconcile(once: Once = False) -> None:
    """Hand runs with expired leases to new attempts; fail exhausted ones; requeue lost ones."""
    from turnkeeper import reconciler
    from turnkeeper.queues import enqueuers
    from turnkeeper.tasks import create_app

    _sweep(
        "reconcile",
        once,
        lambda s: s.reconcile_interval,
        lambda rt, s: reconciler.reconcile(rt, **enqueuers(create_app(s), s, rt.store)),
    )


def reap(once: Once = False) -> None:
    """Destroy sandboxes of settled runs and orphans past their TTL."""
    from turnkeeper import reconciler

    _sweep("reap", once, lambda s: s.reap_interval, lambda rt, _: reconciler.reap(rt))


def prune(once: Once = False) -> None:
    """Delete segments and turn slots of runs settled long ago."""
    from turnkeeper import reconciler

    _sweep("prune", once, lambda s: s.prune_interval, lambda rt, _: reconciler.prune(rt))


def sandbox_fallback(settings: Settings) -> dict[str, str]:
    """For ``dev`` and ``demo``: the local provider, said out loud, when the configured
    jail cannot start here and nobody chose a provider explicitly; nothing otherwise."""
    from turnkeeper.agents.readiness import agent_paths
    from turnkeeper.config import ENV_PREFIX
    from turnkeeper.errors import TurnkeeperError
    from turnkeeper.sandbox.readiness import check_provider

    if f"{ENV_PREFIX}SANDBOX_PROVIDER" in os.environ or settings.sandbox_provider == "local":
        return {}
    try:
        check_provider(settings, agent_paths(settings))
    except TurnkeeperError as exc:
        console.print(
            f"[yellow]sandbox: {exc.message}[/yellow]\n[yellow]sandbox: falling back to the "
            "local provider, which is no security boundary (fine for a demo on your own "
            "machine, never for other people's agents)[/yellow]",
            highlight=False,
        )
        return {f"{ENV_PREFIX}SANDBOX_PROVIDER": "local"}
    return {}


def start_fleet(
    settings: Settings, *, workers: int = 1, web_port: int | None = None
) -> list[subprocess.Popen[bytes]]:
    """Worker and beat processes for ``dev`` and ``demo``, on the given servers; with
    ``web_port``, the web app too, last."""
    env = dict(os.environ)  # the children read the same TURNKEEPER_* settings...
    env.update(  # ... on the servers this process resolved
        TURNKEEPER_DATABASE_URL=settings.require_database_url(),
        TURNKEEPER_REDIS_URL=settings.require_redis_url(),
        TURNKEEPER_DATA_DIR=str(settings.data_dir.resolve()),
        **sandbox_fallback(settings),
    )
    if settings.secret_file is not None:
        env["TURNKEEPER_SECRET_FILE"] = str(settings.secret_file.resolve())
    command = [sys.executable, "-m", "turnkeeper"]

    global _prctl  # noqa: PLW0603 - resolved once, in the parent, before any fork
    _prctl = _prctl or _resolve_prctl()

    # Their banners and logs go to stderr: stdout belongs to the command that started them.
    # Each gets SIGTERM when this process dies, however it dies (a SIGKILL included).
    def start(*args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*command, *args],
            env=env,
            start_new_session=True,
            stdout=sys.stderr,
            preexec_fn=_terminated_with_parent,  # noqa: PLW1509 - a C call, no lock taken
        )

    procs = [*(start("worker", "-c", "2") for _ in range(workers)), start("beat")]
    if web_port is not None:
        procs.append(start("web", "--port", str(web_port)))
    return procs


_PR_SET_PDEATHSIG = 1
_prctl: Callable[..., int] | None = None


def _terminated_with_parent() -> None:
    """In the child, before it runs: the kernel sends it SIGTERM when its parent dies.
    Only a C call on a function resolved before the fork (``_prctl``): the parent may
    have threads, and a child between fork and exec must take no lock they held."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _resolve_prctl() -> Callable[..., int]:
    return cast("Callable[..., int]", ctypes.CDLL(None, use_errno=True).prctl)


def stop_fleet(procs: list[subprocess.Popen[bytes]], data_dir: Path) -> None:
    """Stop what ``dev`` or ``demo`` started: its processes, then the egress proxies its
    workers started under its data dir."""
    from turnkeeper.sandbox.egress import stop_proxies

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
    stop_proxies(data_dir)


def wait_for_signal() -> None:
    stop_signals().wait()


def stop_signals(*more: signal.Signals) -> threading.Event:
    """An event set by SIGINT, SIGTERM (and ``more``) from now on, instead of their
    default of ending the process mid-step."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM, *more):
        signal.signal(signum, lambda *_: stop.set())
    return stop
