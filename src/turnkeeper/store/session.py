"""Dedicated sessions: one long-lived connection whose advisory locks live as long as it.

A pooled connection is no place for a session-level advisory lock: the pool may close
it, recycle it or hand it to another thread. Crash detection (docs/architecture.md,
"Crash detection") needs sessions the server ends the moment their process dies, and
that their process keeps while it lives:

- ``OwnerLockSession``: one per worker process, holding the owner lock of every run the
  process drives;
- ``WatchSession``: the crash watcher's own, whose continuity says that the server
  (and so every lock it reports) stayed the same between two sweeps.

Neither is thread-safe: each belongs to one thread. Database trouble is a
``StoreUnavailableError`` and closes the session (its locks are gone with it); the next
call connects again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row

from turnkeeper.config import plain_postgres_url
from turnkeeper.errors import StoreError, StoreUnavailableError
from turnkeeper.owner import APPLICATION_NAME_BYTES, session_name
from turnkeeper.store import sql
from turnkeeper.store.database import _CONNECT_TIMEOUT, Row, _fetch, store_error
from turnkeeper.store.records import Claim, check_limit
from turnkeeper.store.sql.statement import pyformat


class LockSession:
    """One autocommit connection, opened on first use and again after it broke."""

    def __init__(self, database_url: str, *, application_name: str, **options: Any) -> None:
        self._conninfo = plain_postgres_url(database_url)
        self._kwargs: dict[str, Any] = {
            "autocommit": True,
            "row_factory": dict_row,
            "connect_timeout": _CONNECT_TIMEOUT,
            "application_name": application_name[:APPLICATION_NAME_BYTES],
            **options,
        }
        self._conn: psycopg.Connection[DictRow] | None = None
        self.generation = 0
        """How many times this session connected: a change means every lock it held is gone."""

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def fileno(self) -> int | None:
        """The socket, to wait on for the server ending the session; None when closed."""
        if not self.connected or self._conn is None:
            return None
        try:
            return self._conn.fileno()
        except psycopg.Error:
            self.close()
            return None

    def connect(self) -> None:
        if self.connected:
            return
        try:
            self._conn = psycopg.Connection[DictRow].connect(self._conninfo, **self._kwargs)
        except psycopg.Error as exc:
            raise store_error("lock_session.connect", exc, {}) from exc
        self.generation += 1

    def rows(
        self,
        operation: str,
        statement: sql.statement.Statement,
        params: Mapping[str, Any],
        *,
        reconnect: bool = True,
        **fields: Any,
    ) -> list[Row]:
        """One statement's rows; ``reconnect=False`` refuses to run it in a new session."""
        if reconnect:
            self.connect()
        if self._conn is None or self._conn.closed:
            raise StoreUnavailableError(
                f"{operation}: the session ended", reason="session-ended", **fields
            )
        try:
            return _fetch(self._conn.execute(pyformat(statement), params))
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
                self.close()
            raise store_error(operation, exc, fields) from exc

    def alive(self) -> bool:
        """Whether the session is still up, asked when its socket spoke while idle (the
        server ends a session with a message, then closes it). Closes a dead session."""
        if not self.connected:
            return False
        try:
            self.rows("lock_session.alive", sql.hosts.NOW, {}, reconnect=False)
        except StoreError:
            self.close()
        return self.connected

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _keepalives(lease_ttl: float) -> dict[str, Any]:
    """TCP keepalives on both ends of an owner lock session.

    The server keeps a session (and its locks) until it notices its client is gone: a
    host that vanished without a FIN would hold its runs' locks for the kernel's
    default two hours, and no successor could take them. The server's probes give up
    after ``interval * count`` seconds of silence, which is longer than the lease, so a
    live owner cut off from the database is always handed over by its lease, never by
    a lock that came free while its lease still ran.
    """
    interval = math.ceil(lease_ttl / 3) + 1
    # An idle session is this one's normal state: a server-wide idle_session_timeout
    # must not end it (and free every lock it holds) every few minutes.
    server = (
        f"-c idle_session_timeout=0 -c tcp_keepalives_idle=10 -c tcp_keepalives_interval={interval}"
    )
    return {
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": interval,
        "keepalives_count": 3,
        "options": f"{server} -c tcp_keepalives_count=3",
    }


def store_session_name(owner: str) -> str:
    """The application name of the store sessions of the worker process ``owner``."""
    return session_name(sql.statement.STORE_SESSION_PREFIX, owner)


class OwnerLockSession(LockSession):
    """The owner locks of one worker process."""

    def __init__(self, database_url: str, *, owner: str, lease_ttl: float) -> None:
        super().__init__(
            database_url,
            application_name=session_name(sql.statement.LOCKS_SESSION_PREFIX, owner),
            **_keepalives(lease_ttl),
        )

    def take(self, claims: Iterable[Claim]) -> set[str]:
        """Take the owner lock of each run its claim still owns; the run ids taken.

        A lock held by another session (a frozen predecessor, a run sharing its key,
        the watcher looking at it this instant) is not taken, and is tried again later.
        """
        claims = list(claims)
        if not claims:
            return set()
        params = {
            "run_ids": [c.run_id for c in claims],
            "attempt_ids": [c.attempt_id for c in claims],
        }
        return {
            r["run_id"]
            for r in self.rows("take_owner_locks", sql.owner_locks.TAKE_OWNER_LOCKS, params)
        }

    def release(self, run_id: str) -> None:
        self.rows(
            "release_owner_lock",
            sql.owner_locks.RELEASE_OWNER_LOCK,
            {"run_id": run_id},
            run_id=run_id,
        )


@dataclass(frozen=True)
class WatchedOwner:
    """A running run whose attempt's owner took the owner lock, and whether it holds it."""

    run_id: str
    attempt_id: str
    seq: int
    held: bool


class WatchSession(LockSession):
    """The crash watcher's session: it looks at owner locks and hands over the runs of
    owners that are gone."""

    def __init__(self, database_url: str) -> None:
        super().__init__(database_url, application_name="turnkeeper-crash-watcher")
        self._leading = 0
        """The generation of this session that holds the watcher's leader lock; 0: none."""

    def lead(self) -> bool:
        """Whether this session is the one watcher of the database, taking the leader
        lock if it is free (``LEAD_WATCHERS``). One watcher only: a sweep takes every
        free owner lock for an instant, so a second watcher's sweep would read a lock
        the first is probing as held, and arm a run whose owner may be gone."""
        if self._leading and self._leading == self.generation and self.connected:
            return True
        rows = self.rows("lead_watchers", sql.owner_locks.LEAD_WATCHERS, {})
        self._leading = self.generation if rows and rows[0]["leading"] else 0
        return bool(self._leading)

    def watched(self, batch: int) -> list[WatchedOwner]:
        """Every watched run, a page of ``batch`` per statement, in admission order."""
        found: list[WatchedOwner] = []
        after = 0
        while True:
            params = {"after_seq": after, "limit": check_limit(batch)}
            page = self.rows("watched_owners", sql.owner_locks.WATCHED_OWNERS, params)
            found += [WatchedOwner(r["run_id"], r["attempt_id"], r["seq"], r["held"]) for r in page]
            if len(page) < batch:
                return found
            after = page[-1]["seq"]

    def live_owners(self, owners: Iterable[WatchedOwner]) -> set[str]:
        """The runs, of ``owners``, whose owner process still has a session on the server
        (``LIVE_OWNERS``): its lock came free because that one session ended, not the
        process. Only in the session that saw the locks held, like the handover."""
        owners = list(owners)
        params = {
            "run_ids": [o.run_id for o in owners],
            "attempt_ids": [o.attempt_id for o in owners],
        }
        rows = self.rows("live_owners", sql.owner_locks.LIVE_OWNERS, params, reconnect=False)
        return {r["run_id"] for r in rows}

    def hand_over_absent(self, owners: Iterable[WatchedOwner]) -> list[Claim]:
        """Hand each run over whose attempt is still the one given and whose owner lock
        is still free, in one statement; the new attempts, awaiting adoption.

        Only in the session that saw the locks held and then free: after a reconnect
        the server may be a new one (a restart, a failover), where every lock is free
        because every session is new, so this refuses (``StoreUnavailableError``).
        """
        owners = list(owners)
        params = {
            "run_ids": [o.run_id for o in owners],
            "attempt_ids": [o.attempt_id for o in owners],
            "cause": "crash",
        }
        rows = self.rows(
            "hand_over_absent", sql.owner_locks.HAND_OVER_ABSENT, params, reconnect=False
        )
        return [Claim.from_row(r) for r in rows]
