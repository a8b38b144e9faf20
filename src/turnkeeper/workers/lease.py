"""The lease heartbeat: renew the owner's lease, and notice loss and cancellation.

A thread per driven run. It renews every ``heartbeat_interval`` on the database
clock; when a renewal is refused, ownership is gone and ``lost`` is set at once,
so the driver stops writing. Each beat also reads the run: a cancel request sets
``cancelled``, a deadline passed (on the database clock) sets ``past_deadline``.
Transient database errors are retried until the lease would have run out; after
that the lease is treated as lost (someone else may own the run by then).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import structlog

from turnkeeper.errors import StoreUnavailableError
from turnkeeper.store.records import Claim, Verdict
from turnkeeper.store.store import Store

log = structlog.get_logger(__name__)


class LeaseKeeper:
    def __init__(
        self,
        store: Store,
        claim: Claim,
        *,
        lease_ttl: float,
        interval: float,
        on_renewed: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
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
        self._thread = threading.Thread(
            target=self._run, name=f"lease-{claim.run_id[:32]}", daemon=True
        )
        self._last_renewed = time.monotonic()
        self._held_from = self._last_renewed
        """When the last renewal that went through was sent (at first, about when the
        claim or the adoption set the lease): the lease lasts ``lease_ttl`` from then."""
        self._retrying = False
        self._log = log.bind(run_id=claim.run_id, attempt_id=claim.attempt_id, epoch=claim.epoch)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval + 5)

    def beat(self) -> None:
        """One renewal and cancel check, now (the thread calls it every interval)."""
        sent = time.monotonic()
        try:
            renewed = self.store.renew_lease(self.claim, self.lease_ttl) is Verdict.DONE
            run = self.store.get_run(self.claim.run_id) if renewed else None
        except StoreUnavailableError as exc:
            self._retrying = True
            if time.monotonic() - self._last_renewed >= self.lease_ttl:
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
        self._last_renewed = time.monotonic()
        self._held_from = sent
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

    def known_left(self) -> float:
        """Seconds the lease is known to last from now, by this process's clock (0 once
        lost): ``lease_ttl`` from when the last renewal that went through was sent. Past
        that, only the store knows: a process frozen and woken, or a heartbeat starved,
        may have lost its run to a successor before its next beat says so."""
        if self.lost.is_set():
            return 0.0
        return max(0.0, self._held_from + self.lease_ttl - time.monotonic())

    def _mark(self, event: threading.Event) -> None:
        if not event.is_set():
            names = {id(self.lost): "lease.lost", id(self.cancelled): "run.cancel_noticed"}
            self._log.info(names.get(id(event), "run.deadline_passed"))
        event.set()
        self.changed.set()

    def _run(self) -> None:
        while not self._stop.wait(self._wait_time()):
            self.beat()
            if self.lost.is_set():
                return

    def _wait_time(self) -> float:
        """Beat every interval; retry sooner while the database is unreachable."""
        return min(self.interval, 0.5) if self._retrying else self.interval
