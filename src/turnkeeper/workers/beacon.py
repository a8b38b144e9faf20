"""The host beacon: a worker process says, every few seconds, that its host is alive.

One thread per worker process (started after the fork, with the process's own store
connections). Each beat upserts the process's row in ``workers`` on the database
clock and reads back its drain orders: ``draining`` (the process's Celery worker was
asked to stop taking runs) and ``hand_over`` (the time to hand over the runs it still
drives has come; ``Attempt`` lets their leases go). A beat that cannot reach the
database is retried at the next one: a host is only thought dead after
``host_dead_after`` without any of its processes' beats (docs/architecture.md, "Hosts").
"""

from __future__ import annotations

import os
import threading

import psutil
import structlog

from turnkeeper.config import Settings
from turnkeeper.errors import TurnkeeperError
from turnkeeper.store.store import Store

log = structlog.get_logger(__name__)


def main_process_pid() -> int | None:
    """The ``turnkeeper worker`` process this process serves: its parent, for a pool
    process of the prefork pool; itself, for the solo pool. None in any other process
    (a test's in-process Celery worker), which then says nothing for its host."""
    for pid in (os.getppid(), os.getpid()):
        if is_worker_command(pid):
            return pid
    return None


def is_worker_command(pid: int) -> bool:
    """Whether process ``pid`` runs ``turnkeeper worker``."""
    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return "worker" in argv and any(part.endswith("turnkeeper") for part in argv)


class HostBeacon:
    def __init__(
        self,
        store: Store,
        settings: Settings,
        worker_id: str,
        *,
        main_pid: int,
        hand_over: threading.Event,
    ) -> None:
        self.store = store
        self.settings = settings
        self.worker_id = worker_id
        self.main_pid = main_pid
        self.draining = threading.Event()
        self.hand_over = hand_over
        """Set once this process must hand over the runs it drives (a drain's deadline)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-beacon", daemon=True)

    def start(self) -> HostBeacon:
        """Start the thread, which announces the process first. Nothing here waits for
        the database: this runs while the pool process starts (``worker_process_init``),
        and Celery kills a pool process that is not up within
        ``worker_proc_alive_timeout`` (4 s), less than a slow connection may take."""
        self._thread.start()
        return self

    def announce(self) -> None:
        try:
            self.store.start_worker(
                self.worker_id, self.settings.host_id, os.getpid(), self.main_pid
            )
        except TurnkeeperError as exc:  # the next beats insert the row
            log.warning("host.announce_failed", error=str(exc))
            return
        log.info("host.announced", host=self.settings.host_id, worker=self.worker_id)

    def beat(self) -> None:
        orders = self.store.beat_worker(
            self.worker_id, self.settings.host_id, os.getpid(), self.main_pid
        )
        if orders.draining and not self.draining.is_set():
            log.info("worker.draining", worker=self.worker_id)
            self.draining.set()
        if orders.hand_over_due and not self.hand_over.is_set():
            log.info("worker.handing_over", worker=self.worker_id)
            self.hand_over.set()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            self.announce()
        except Exception:  # a dead beacon would make a live host look dead
            log.exception("host.announce_failed")
        while not self._stop.wait(self.settings.host_beacon_interval):
            try:
                self.beat()
            except TurnkeeperError as exc:
                log.warning("host.beat_failed", error=str(exc))
            except Exception:  # a dead beacon would make a live host look dead
                log.exception("host.beat_failed")
