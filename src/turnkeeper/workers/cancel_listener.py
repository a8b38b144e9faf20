"""Cancel wake-ups: a worker process hears a cancel the moment it commits.

A cancel is a fact in the store (``runs.cancel_requested_at``), which each run's lease
heartbeat reads at every beat (``workers/lease.py``). Waiting for that beat makes a
Stop button take up to ``heartbeat_interval``. So the cancel statement also announces
the run id on a Postgres channel (``NOTIFY``, delivered only once the cancel commits),
and this process listens on one dedicated connection: a notification for a run it
drives pokes that run's heartbeat, which beats at once and so reads the cancel from
the store, as a scheduled beat would (docs/architecture.md, "Cancelling a run").

The notification is only a wake-up: the store stays the truth, and the heartbeat's
own beat the fallback. A notification sent while this connection was down is lost, so
every run watched is poked after each (re)connect; a connection that cannot be made is
tried again with backoff, while the heartbeats go on as before. A connection that died
without a word (no FIN, no reset: a NAT's state dropped, a proxy that hangs) would never
end a wait for notifications, so after each quiet wait the thread asks the server for a
reply, and cuts the link if none comes within ``_PATIENCE``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable

import psycopg
import structlog

from turnkeeper.config import plain_postgres_url
from turnkeeper.owner import APPLICATION_NAME_BYTES
from turnkeeper.store.sql.owner_locks import LISTEN_CANCELS, PROBE_LISTENER

log = structlog.get_logger(__name__)

_CONNECT_TIMEOUT = 5
_RETRY = (0.1, 0.5, 1.0, 2.0, 5.0)
"""Waits before connecting again after a failure; the last one repeats."""
_IDLE = 5.0
"""Seconds one wait for notifications lasts before the thread looks at ``close`` and
asks the server whether the link still carries anything."""
_PATIENCE = 5.0
"""Seconds that question may go unanswered before the link counts as dead."""
_UNWATCHED_FOR = 60.0
"""Seconds a cancel heard for a run nobody here watched yet is remembered for its watch."""

Poke = Callable[[], None]


class CancelListener:
    """One LISTEN connection and thread per worker process, started by the first watch."""

    def __init__(self, database_url: str, *, application_name: str) -> None:
        self._conninfo = plain_postgres_url(database_url)
        self._application_name = application_name[:APPLICATION_NAME_BYTES]
        self._watched: dict[str, set[Poke]] = {}
        self._unwatched: dict[str, float] = {}
        """Runs a cancel was heard for while nobody here watched them, and when (oldest
        first): a worker claims a run before its heartbeat watches it, and a cancel that
        commits in between is read by neither the claim nor a beat until the next one."""
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._since = 0.0
        """When the connection last started listening."""
        self.connected = threading.Event()
        """Set while the connection listens (tests wait for it before they cancel)."""

    def watch(self, run_id: str, poke: Poke) -> None:
        """Call ``poke`` whenever a cancel of ``run_id`` is announced, until unwatched."""
        with self._lock:
            self._watched.setdefault(run_id, set()).add(poke)
            heard_before = self._unwatched.pop(run_id, None) is not None
            if self._thread is None and not self._closed.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="cancel-listener", daemon=True
                )
                self._thread.start()
        if heard_before:
            poke()

    def unwatch(self, run_id: str, poke: Poke) -> None:
        with self._lock:
            pokes = self._watched.get(run_id)
            if pokes is not None:
                pokes.discard(poke)
                if not pokes:
                    del self._watched[run_id]

    def close(self) -> None:
        self._closed.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=_IDLE + _PATIENCE + _CONNECT_TIMEOUT + 1)

    # --- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._closed.is_set():
            try:
                self._listen()
                failures = 0
            except psycopg.Error as exc:
                # A connection that listened a while ends an outage: its loss is a new
                # one, retried at once, not after the longest wait that outage ran up.
                if self.connected.is_set() and time.monotonic() - self._since >= _RETRY[-1]:
                    failures = 0
                self.connected.clear()
                wait = _RETRY[min(failures, len(_RETRY) - 1)]
                failures += 1
                log.warning("cancel_listener.disconnected", error=str(exc), retry_in=wait)
                self._closed.wait(wait)
            finally:
                self._disconnect()

    def _listen(self) -> None:
        """Connect, listen, poke every watched run (a cancel may have come while this
        connection was down), then hand each notification to its run's pokes."""
        conn = psycopg.Connection.connect(
            self._conninfo,
            autocommit=True,
            connect_timeout=_CONNECT_TIMEOUT,
            application_name=self._application_name,
        )
        self._conn = conn
        conn.execute(LISTEN_CANCELS)
        self._since = time.monotonic()
        self.connected.set()
        self._poke(None)
        while not self._closed.is_set():
            for notice in conn.notifies(timeout=_IDLE):
                self._poke(notice.payload)
            _probe(conn)

    def _poke(self, run_id: str | None) -> None:
        """The pokes of ``run_id`` (of every watched run for None), each called once."""
        with self._lock:
            if run_id is None:
                pokes = [poke for group in self._watched.values() for poke in group]
            else:
                pokes = list(self._watched.get(run_id, ()))
                if not pokes:  # perhaps ours, claimed and not watched yet (or another's)
                    self._remember_unwatched(run_id)
        if run_id is not None and pokes:
            log.info("run.cancel_heard", run_id=run_id)
        for poke in pokes:
            poke()

    def _remember_unwatched(self, run_id: str) -> None:
        """Under the lock: remember ``run_id`` for a while, forgetting what is older (every
        worker hears every cancel, so most are of runs other workers drive)."""
        now = time.monotonic()
        self._unwatched.pop(run_id, None)
        self._unwatched[run_id] = now
        while (oldest := next(iter(self._unwatched))) != run_id:
            if now - self._unwatched[oldest] < _UNWATCHED_FOR:
                break
            del self._unwatched[oldest]

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        self.connected.clear()
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()


def _probe(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """A round trip to the server; a link that carries no reply within ``_PATIENCE`` is
    shut (both ways, at the socket: the blocked read ends and psycopg raises), so the
    thread connects again and pokes every watched run. The shutdown goes through a
    duplicate of the connection's descriptor, made here: whatever becomes of the
    connection's own descriptor meanwhile, it can only ever end this connection."""
    with socket.socket(fileno=os.dup(conn.fileno())) as link:
        cut = threading.Timer(_PATIENCE, _shut, args=(link,))
        cut.start()
        try:
            conn.execute(PROBE_LISTENER)
        finally:
            cut.cancel()
            cut.join()  # a shutdown under way ends before its descriptor is closed


def _shut(link: socket.socket) -> None:
    log.warning("cancel_listener.silent", patience=_PATIENCE)
    with contextlib.suppress(OSError):
        link.shutdown(socket.SHUT_RDWR)
