"""The owner locks of one worker process: held while it lives, gone when it dies.

While a worker process drives a run, it holds the run's owner lock, a session-level
advisory lock on one dedicated connection (``store.session.OwnerLockSession``) for
all of its runs. When the process dies, its kernel closes the socket and the server
drops the session and every lock with it; the crash watcher (``turnkeeper.watcher``)
sees the lock free and hands the run over at once (docs/architecture.md, "Crash
detection").

One thread owns the session. ``hold`` and ``release`` only queue a request, so a run
never waits for its lock. The thread takes each lock, marks the attempt as locked in
the store the first time (only then is the run watched), waits on the session's
socket, and when the server ends the session (a restart, an operator's
``pg_terminate_backend``, a blip) connects again at once and takes every lock back:
the watcher waits ``crash_grace`` before it believes a lock that came free, and
checks again inside the handover. A lock another session holds is tried again, soon
at first and then every second.
"""

from __future__ import annotations

import queue
import selectors
import socket
import threading
import time
from contextlib import suppress
from dataclasses import dataclass

import structlog

from turnkeeper.errors import StoreError
from turnkeeper.store.records import Claim, Verdict
from turnkeeper.store.session import OwnerLockSession
from turnkeeper.store.store import Store

log = structlog.get_logger(__name__)

_RETRY = (0.02, 0.05, 0.1, 0.2, 0.5)
"""Waits before a lock or a connection is tried again; then every ``_RETRY_CAP``."""
_RETRY_CAP = 1.0
_IDLE = 30.0


@dataclass(frozen=True)
class _Hold:
    claim: Claim


@dataclass(frozen=True)
class _Release:
    claim: Claim


class OwnerLocks:
    """The owner locks of this process's runs, kept by a thread of their own."""

    def __init__(self, store: Store, session: OwnerLockSession) -> None:
        self._store = store
        self._session = session
        self._requests: queue.SimpleQueue[_Hold | _Release | None] = queue.SimpleQueue()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wanted: dict[str, Claim] = {}
        self._held: set[str] = set()
        self._held_now: frozenset[str] = frozenset()
        self._unmarked: set[str] = set()
        self._failures = 0
        self._retry_at: float | None = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="owner-locks", daemon=True)
        self._thread.start()

    # --- what other threads call --------------------------------------------------------

    def hold(self, claim: Claim) -> None:
        """Hold ``claim``'s run's owner lock from now on (soon, not before returning)."""
        self._request(_Hold(claim))

    def release(self, claim: Claim) -> None:
        """Give the lock back once ``claim``'s attempt stopped driving its run."""
        self._request(_Release(claim))

    def close(self) -> None:
        """Stop the thread and end the session (its locks go with it)."""
        if not self._closed.is_set():
            self._request(None)
            self._thread.join(timeout=5)

    def held(self) -> frozenset[str]:
        """The runs whose lock this process's session holds, as the lock thread knows it:
        a lock is in it once taken, and out of it once released or its session lost."""
        return self._held_now

    def _request(self, request: _Hold | _Release | None) -> None:
        self._requests.put(request)
        with suppress(OSError):  # closed: the thread is gone
            self._wake_write.send(b"\0")

    # --- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._serve_requests_safely():
                try:
                    self._keep()
                    self._held_now = frozenset(self._held)
                    self._wait()
                except Exception:  # a bug must not end crash detection for this process
                    log.exception("owner_lock.thread_failed", runs=len(self._wanted))
                    self._session.close()
                    self._session_lost()
                    self._held_now = frozenset()
                    time.sleep(_RETRY_CAP)
        finally:
            self._session.close()
            self._closed.set()
            self._wake_read.close()
            self._wake_write.close()

    def _serve_requests_safely(self) -> bool:
        try:
            return self._serve_requests()
        except Exception:
            log.exception("owner_lock.thread_failed", runs=len(self._wanted))
            self._session.close()
            self._session_lost()
            return True

    def _serve_requests(self) -> bool:
        while True:
            try:
                request = self._requests.get_nowait()
            except queue.Empty:
                return True
            if request is None:
                return False
            if isinstance(request, _Hold):
                self._wanted[request.claim.run_id] = request.claim
                self._unmarked.add(request.claim.run_id)
                self._retry_at = 0.0
            else:
                self._let_go(request.claim)

    def _let_go(self, claim: Claim) -> None:
        # A newer attempt of the same run in this process keeps the lock it shares.
        if self._wanted.get(claim.run_id) != claim:
            return
        del self._wanted[claim.run_id]
        self._unmarked.discard(claim.run_id)
        if claim.run_id in self._held:
            self._held.discard(claim.run_id)
            self._held_now = frozenset(self._held)
            try:
                self._session.release(claim.run_id)
            except StoreError as exc:
                # The session broke: this lock went with it, and so did every other.
                log.warning("owner_lock.release_failed", run_id=claim.run_id, error=str(exc))
                if not self._session.connected:
                    self._session_lost()
        if not self._wanted:
            self._retry_at = None

    def _keep(self) -> None:
        """Take what is missing when it is due, and mark what was taken."""
        if self._retry_at is None or time.monotonic() < self._retry_at:
            return
        generation = self._session.generation
        missing = [claim for run_id, claim in self._wanted.items() if run_id not in self._held]
        try:
            taken = self._session.take(missing)
        except StoreError as exc:
            if not self._session.connected:
                self._held.clear()  # the session ended, and its locks with it
                self._held_now = frozenset()
            self._schedule_retry()
            if self._failures == 1:
                log.warning("owner_lock.session_lost", error=str(exc), runs=len(self._wanted))
            return
        if self._session.generation != generation and generation:
            # A new session: whatever the old one held went with it, and was just retaken.
            log.info("owner_lock.reconnected", runs=len(self._wanted), taken=len(taken))
        self._held |= taken
        self._held_now = frozenset(self._held)  # before the marks make it visible
        self._mark(taken)
        if self._held >= set(self._wanted) and not self._unmarked:
            self._failures, self._retry_at = 0, None
        else:
            self._schedule_retry()

    def _mark(self, taken: set[str]) -> None:
        for run_id in sorted(self._unmarked & self._held):
            claim = self._wanted[run_id]
            try:
                verdict = self._store.mark_owner_locked(claim)
            except StoreError as exc:
                log.warning("owner_lock.mark_deferred", run_id=run_id, error=str(exc))
                continue
            self._unmarked.discard(run_id)
            if verdict is Verdict.NOT_OWNER:
                continue  # the run moved on; its attempt's release follows
            log.debug("owner_lock.held", run_id=run_id, attempt_id=claim.attempt_id)
        for run_id in taken - self._unmarked:
            log.debug("owner_lock.taken", run_id=run_id)

    def _schedule_retry(self) -> None:
        delay = _RETRY[self._failures] if self._failures < len(_RETRY) else _RETRY_CAP
        self._failures += 1
        self._retry_at = time.monotonic() + delay

    def _wait(self) -> None:
        """Until a request, the server speaking on the idle session, or a retry is due."""
        timeout = _IDLE if self._retry_at is None else max(0.0, self._retry_at - time.monotonic())
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_read, selectors.EVENT_READ)
            fd = self._session.fileno()
            if fd is not None:
                selector.register(fd, selectors.EVENT_READ)
            ready = {key.fd for key, _ in selector.select(timeout)}
        if self._wake_read.fileno() in ready:
            with suppress(BlockingIOError):
                while self._wake_read.recv(4096):
                    pass
        if fd is not None and fd in ready and not self._session.alive():
            self._session_lost()
            log.warning("owner_lock.session_ended", runs=len(self._wanted))

    def _session_lost(self) -> None:
        """The session ended, and every lock it held with it: take them all back now."""
        self._held.clear()
        self._held_now = frozenset()
        self._failures, self._retry_at = 0, 0.0 if self._wanted else None
