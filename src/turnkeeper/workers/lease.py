"""The lease heartbeat: renew the owner's lease, and notice loss and cancellation.

A thread per driven run. It renews every ``heartbeat_interval`` on the database
clock; when a renewal is refused, ownership is gone and ``lost`` is set at once,
so the driver stops writing. Each beat also reads the run: a cancel request sets
``cancelled``, a deadline passed (on the database clock) sets ``past_deadline``.
A cancel announced for the run (``workers/cancel_listener.py``) pokes the heartbeat,
which beats at once instead of at its next interval.
Transient database errors are retried until the lease would have run out; after
that the lease is treated as lost (someone else may own the run by then). That wait
is measured on ``lease_clock``, which goes on while the machine is suspended: the
lease in the store runs on the database's clock whatever this machine does.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import structlog

from turnkeeper.errors import StoreUnavailableError
from turnkeeper.store.records import Claim, Verdict
from turnkeeper.store.store import Store
from turnkeeper.workers.cancel_listener import CancelListener

log = structlog.get_logger(__name__)

LEASE_CLOCK = time.CLOCK_BOOTTIME if sys.platform == "linux" else time.CLOCK_MONOTONIC
"""The clock a lease's age is read on here. Linux stops ``CLOCK_MONOTONIC`` while the
machine is suspended and counts the suspend in ``CLOCK_BOOTTIME`` (clock_gettime(2)):
a worker woken from a suspend longer than its lease must know that the lease may be
gone. Elsewhere, the monotonic clock (docs/architecture.md, "Lease time on a paused
machine")."""


def lease_clock() -> float:
    """Seconds on ``LEASE_CLOCK``."""
    return time.clock_gettime(LEASE_CLOCK)


class LeaseKeeper:
    def __init__(
        self,
        store: Store,
        claim: Claim,
        *,
        lease_ttl: float,
        interval: float,
        on_renewed: Callable[[], None] = lambda: None,
        cancels: CancelListener | None = None,
        clock: Callable[[], float] = lease_clock,
    ) -> None:
        """``clock``: what the lease's age is read on (``lease_clock``; a test's own)."""
        self.store = store
        self._clock = clock
        self._cancels = cancels
        self.on_renewed = on_renewed
        self.claim = claim
        self.lease_ttl = lease_ttl
        self.interval = interval
        self.lost = threading.Event()
        self.cancelled = threading.Event()
        self.past_deadline = threading.Event()
        self.changed = threading.Event()
        """Set with ``lost`` or ``cancelled``, so a waiting driver wakes up."""
        self.renewals = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        """Set by ``stop`` and ``poke``: the thread waits on it between beats."""
        self._thread = threading.Thread(
            target=self._run, name=f"lease-{claim.run_id[:32]}", daemon=True
        )
        self._last_renewed = clock()
        """When the last renewal that went through came back (at first, about when the
        claim or the adoption set the lease)."""
        self._retrying = False
        self._log = log.bind(run_id=claim.run_id, attempt_id=claim.attempt_id, epoch=claim.epoch)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        if self._cancels is not None:
            self._cancels.watch(self.claim.run_id, self.poke)
        return self

    def poke(self) -> None:
        """Beat now, not at the next interval (a cancel was announced)."""
        self._wake.set()

    def stop(self) -> None:
        if self._cancels is not None:
            self._cancels.unwatch(self.claim.run_id, self.poke)
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval + 5)

    def beat(self) -> None:
        """One renewal and cancel check, now (the thread calls it every interval)."""
        try:
            renewed = self.store.renew_lease(self.claim, self.lease_ttl) is Verdict.DONE
            run = self.store.get_run(self.claim.run_id) if renewed else None
        except StoreUnavailableError as exc:
            self._retrying = True
            if self._clock() - self._last_renewed >= self.lease_ttl:
                self._log.warning("lease.expired_unreachable", error=str(exc))
                self._mark(self.lost)
            else:
                self._log.warning("lease.renew_retrying", error=str(exc))
            return
        if not renewed:
            self._mark(self.lost)
            return
        self._retrying = False
        self.renewals += 1
        self.on_renewed()
        self._last_renewed = self._clock()
        if run is None:
            return
        if run.cancel_requested_at is not None:
            self._mark(self.cancelled)
        # The renewal just set the lease to the database's now() + ttl: the deadline is
        # compared on the database clock, never this worker's.
        if (
            run.deadline is not None
            and run.lease_expires_at is not None
            and run.deadline <= run.lease_expires_at - timedelta(seconds=self.lease_ttl)
        ):
            self._mark(self.past_deadline)

    def _mark(self, event: threading.Event) -> None:
        if not event.is_set():
            names = {id(self.lost): "lease.lost", id(self.cancelled): "run.cancel_noticed"}
            self._log.info(names.get(id(event), "run.deadline_passed"))
        event.set()
        self.changed.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._wait_time())
            self._wake.clear()
            if self._stop.is_set():
                return
            self.beat()
            if self.lost.is_set():
                return

    def _wait_time(self) -> float:
        """Beat every interval; retry sooner while the database is unreachable."""
        return min(self.interval, 0.5) if self._retrying else self.interval
