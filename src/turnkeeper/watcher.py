"""The crash watcher: a run whose owner's process died is handed over within a second.

A loop in beat's control worker (``turnkeeper beat``; docs/architecture.md, "Crash
detection"). Every ``crash_sweep_interval`` it reads, on a session of its own, every
watched run (running, and its attempt's owner took the run's owner lock) with
whether the lock is held now: one statement per ``BATCH`` runs, so the load stays
flat while nothing dies. A run is handed over when:

1. the watcher saw its owner lock held, for the same attempt, earlier in this same
   session (a lock is free in a new session after a restart or a failover, where
   every owner reconnects; seeing it held first means the server is the one whose
   sessions hold the locks);
2. it sees the lock free now;
3. ``crash_grace`` later, its owner process has no session left on the server
   (``LIVE_OWNERS``): a process's death ends all of its sessions, while a blip that
   ended only the lock session of a process too slow to connect again leaves the
   others; such a run stays armed and is looked at again at the next sweep;
4. the handover statement finds the lock still free (it takes the lock for its own
   transaction, so the owner cannot take it back meanwhile) and the run still under
   that attempt.

The handover is the lease expiry's (epoch + 1, the log fenced, a takeover message
through ``reconciler.send_takeovers``); only its cause differs, ``crash``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from turnkeeper.config import Settings
from turnkeeper.errors import TurnkeeperError
from turnkeeper.reconciler import send_takeovers
from turnkeeper.store.records import Claim
from turnkeeper.store.session import WatchSession
from turnkeeper.workers.failpoints import failpoint
from turnkeeper.workers.runtime import WorkerRuntime

log = structlog.get_logger(__name__)

BATCH = 2000
"""Watched runs per statement: up to this many running runs, a sweep is one statement."""
_BACKOFF = 1.0
"""The wait after a sweep failed for a reason that is no service's."""


class CrashWatcher:
    def __init__(
        self,
        rt: WorkerRuntime,
        session: WatchSession,
        *,
        enqueue_takeover: Callable[[str, str, int], None],
        grace: float,
        batch: int = BATCH,
    ) -> None:
        self._rt = rt
        self._session = session
        self._enqueue_takeover = enqueue_takeover
        self._grace = grace
        self._batch = batch
        self._armed: dict[str, str] = {}
        """Run id -> the attempt whose owner this session saw holding the run's lock."""
        self._generation = 0
        self._leading: bool | None = None
        self._stop = threading.Event()

    def sweep(self) -> list[Claim]:
        """Look at every watched run once; hand over those whose owner is gone. Only
        the one watcher of the database does (``WatchSession.lead``); another stands by
        until that one's session ends, and then starts from nothing."""
        leading = self._session.lead()
        if leading != self._leading:
            self._leading = leading
            log.info("crash.watcher_leading" if leading else "crash.watcher_standby")
        if not leading:
            self._armed = {}
            return []
        owners = self._session.watched(self._batch)
        if self._session.generation != self._generation:
            # A new session: nothing it saw before counts (the server may be new).
            self._generation, self._armed = self._session.generation, {}
        absent = [o for o in owners if not o.held and self._armed.get(o.run_id) == o.attempt_id]
        armed = {o.run_id: o.attempt_id for o in owners if o.held}
        handed: list[Claim] = []
        if absent:
            log.info("crash.suspected", runs=[o.run_id for o in absent])
            if self._stop.wait(self._grace):
                return []
            alive = self._session.live_owners(absent)
            dead = [o for o in absent if o.run_id not in alive]
            handed = self._session.hand_over_absent(dead) if dead else []
            for claim in handed[:1]:
                failpoint(self._rt.settings, "crash-handed", claim.run_id)
            send_takeovers(self._rt, handed, enqueue_takeover=self._enqueue_takeover, cause="crash")
            gone = {claim.run_id for claim in handed}
            for owner in absent:
                if owner.run_id in alive:
                    # Only its lock session ended, and the process has not connected
                    # again yet (frozen, starved): it stays armed, and is looked at
                    # again at the next sweep, until it takes its lock back or dies.
                    armed[owner.run_id] = owner.attempt_id
                    log.info("crash.owner_alive", run_id=owner.run_id, attempt_id=owner.attempt_id)
                elif owner.run_id not in gone:
                    # Its owner took the lock back (it is armed again when the next sweep
                    # sees it held), or the run may not be taken over (out of attempts,
                    # cancelled: settled when its lease runs out), or another
                    # transaction held its row: left to its lease.
                    log.info("crash.refuted", run_id=owner.run_id, attempt_id=owner.attempt_id)
        self._armed = armed
        return handed

    def run(self, interval: float) -> None:
        """Sweep every ``interval`` seconds until ``stop``."""
        log.info("crash.watcher_started", interval=interval, grace=self._grace)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sweep()
            except TurnkeeperError as exc:  # the database or the broker: the next sweep
                log.warning("crash.sweep_failed", error=str(exc))
                self._session.close()
            except Exception:  # a bug must not end crash detection for the fleet's life
                log.exception("crash.sweep_failed")
                self._session.close()
                self._stop.wait(_BACKOFF)
            self._stop.wait(max(0.0, interval - (time.monotonic() - started)))
        self._session.close()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """End the watcher's session (``run`` does when it stops)."""
        self._session.close()

    @property
    def armed(self) -> dict[str, str]:
        return dict(self._armed)


def start_watcher(
    settings: Settings,
    rt: WorkerRuntime,
    enqueue_takeover: Callable[[str, str, int], None],
) -> CrashWatcher | None:
    """Start the watcher's thread in this process (beat's control worker); None with
    crash detection off."""
    if not settings.crash_detection:
        return None
    watcher = CrashWatcher(
        rt,
        WatchSession(settings.require_database_url()),
        enqueue_takeover=enqueue_takeover,
        grace=settings.crash_grace,
    )
    threading.Thread(
        target=watcher.run, args=(settings.crash_sweep_interval,), name="crash-watcher", daemon=True
    ).start()
    return watcher
