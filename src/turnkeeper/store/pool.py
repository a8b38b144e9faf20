"""A small thread-safe pool of autocommit psycopg connections returning dict rows.

The store's statements are short, so checking a connection out and back in is a
visible part of every call: this pool does it with one lock and a list (about a
microsecond), where a general-purpose pool's events and wrappers cost several
(bench/store_cycle.py). Connections are opened lazily, up to ``size``, and a
connection that is broken, older than ``recycle`` seconds or left inside a
transaction is closed instead of being reused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import pq
from psycopg.rows import DictRow, dict_row

Connection = psycopg.Connection[DictRow]
_IDLE = pq.TransactionStatus.IDLE


class PoolTimeoutError(Exception):
    """No connection became free in time; the store reports it as unavailable."""


class ConnectionPool:
    """At most ``size`` connections; a caller waits up to ``timeout`` seconds for one."""

    def __init__(
        self,
        conninfo: str,
        *,
        size: int,
        timeout: float = 30.0,
        recycle: float = 1800.0,
        connect_timeout: int = 10,
    ) -> None:
        self._conninfo = conninfo
        self._size = size
        self._timeout = timeout
        self._recycle = recycle
        self._connect_timeout = connect_timeout
        self._idle: list[tuple[Connection, float]] = []
        self._opened = 0  # connections checked out or idle
        self._closed_at = -1.0  # connections born before this are closed on return
        self._cond = threading.Condition(threading.Lock())

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """Check a connection out; it goes back to the pool when the block ends."""
        conn, born = self.checkout()
        try:
            yield conn
        finally:
            self.checkin(conn, born)

    def close(self) -> None:
        """Close the idle connections now and the checked-out ones when they return.

        Like an engine's dispose: a later call opens fresh connections.
        """
        with self._cond:
            self._closed_at = time.monotonic()
            idle, self._idle = self._idle, []
            self._opened -= len(idle)
            self._cond.notify_all()
        for conn, _born in idle:
            conn.close()

    def checkout(self) -> tuple[Connection, float]:
        """A connection and its birth time, which ``checkin`` needs back."""
        with self._cond:
            while True:
                if self._idle:
                    return self._idle.pop()
                if self._opened < self._size:
                    self._opened += 1  # reserve the slot; connect outside the lock
                    break
                if not self._cond.wait(self._timeout):
                    raise PoolTimeoutError(f"no free connection within {self._timeout}s")
        try:
            conn = psycopg.connect(
                self._conninfo,
                autocommit=True,
                connect_timeout=self._connect_timeout,
                row_factory=dict_row,
            )
        except BaseException:
            self._release_slot()
            raise
        return conn, time.monotonic()

    def checkin(self, conn: Connection, born: float) -> None:
        # A failed statement leaves an autocommit connection idle and reusable; a lost
        # server, an interrupted query or an unfinished transaction does not.
        reusable = (
            born > self._closed_at
            and not conn.broken
            and conn.pgconn.transaction_status == _IDLE
            and time.monotonic() - born < self._recycle
        )
        if not reusable:
            conn.close()
            self._release_slot()
            return
        with self._cond:
            self._idle.append((conn, born))
            self._cond.notify()

    def _release_slot(self) -> None:
        with self._cond:
            self._opened -= 1
            self._cond.notify()
