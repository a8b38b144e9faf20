"""How the store talks to PostgreSQL: pooled statements, transactions, error translation.

The statements themselves are the ``Statement`` constants named in ``sql``;
they run on psycopg connections from psycopg_pool, in psycopg's parameter style, because
SQLAlchemy's per-call bookkeeping was most of the store's overhead on top of the
round trip (bench/store_cycle.py). Single statements run in autocommit (no
BEGIN/COMMIT round trips); the few multi-statement primitives run in a READ
COMMITTED transaction. No caller ever sees a psycopg type: database trouble is
a ``StoreUnavailableError`` (retryable), any other driver failure a ``StoreError``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from functools import cache
from typing import Any, ParamSpec, TypeVar

import psycopg
from psycopg import pq
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from turnkeeper.config import plain_postgres_url
from turnkeeper.errors import (
    InvalidInputError,
    StoreError,
    StoreUnavailableError,
)
from turnkeeper.logconfig import get_logger
from turnkeeper.store import sql
from turnkeeper.store.records import Claim, Verdict
from turnkeeper.store.sql.statement import Statement, pyformat

log = get_logger(__name__)
P = ParamSpec("P")
R = TypeVar("R")

# psycopg_pool's PoolTimeout and PoolClosed are OperationalErrors too.
_UNAVAILABLE = (psycopg.OperationalError, psycopg.InterfaceError)
_DRIVER_ERRORS = (psycopg.Error,)
# A connection the server closed, as opposed to a pool that gave none in time.
_BROKEN = (psycopg.OperationalError, psycopg.InterfaceError)
_POOL_TIMEOUT = 30.0
_RECYCLE = 1800.0
_CONNECT_TIMEOUT = 10
_TUPLES_OK = pq.ExecStatus.TUPLES_OK

Row = dict[str, Any]


# The statements sent in the current context, when someone tallies them (``tally``).
_TALLY: ContextVar[list[str] | None] = ContextVar("turnkeeper_statement_tally", default=None)


@contextmanager
def tally() -> Iterator[list[str]]:
    """Name every statement this thread sends to the database while the block runs, in
    order: a single statement by its operation, each one of a transaction as
    ``operation/statement``, its BEGIN and COMMIT (round trips too) included. Another
    thread's statements (a lease heartbeat's) are not this context's."""
    names: list[str] = []
    token = _TALLY.set(names)
    try:
        yield names
    finally:
        _TALLY.reset(token)


def tallied(task: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A task of one run (its id the first argument) whose statements are tallied and
    then logged (``store.statements``, at debug): what the run's task cost the database,
    named in order."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(function)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            run_id = args[0] if args else kwargs.get("run_id")
            with tally() as names:
                try:
                    return function(*args, **kwargs)
                finally:
                    log.debug(
                        "store.statements",
                        task=task,
                        run_id=run_id,
                        count=len(names),
                        statements=names,
                    )

        return run

    return decorate


def _tallied(name: str) -> None:
    names = _TALLY.get()
    if names is not None:
        names.append(name)


@cache
def _statement_names() -> dict[int, str]:
    return {id(statement): name for name, statement in sql.statements().items()}


def _statement_name(statement: Statement) -> str:
    return _statement_names().get(id(statement), "statement")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def store_error(operation: str, exc: BaseException, fields: Mapping[str, Any]) -> StoreError:
    """The store error a driver exception becomes (raise it ``from exc``)."""
    if isinstance(exc, _UNAVAILABLE):
        return StoreUnavailableError(
            f"{operation}: database unavailable: {_first_line(exc)}",
            reason="unavailable",
            **fields,
        )
    if isinstance(exc, psycopg.DataError):
        return InvalidInputError(
            f"{operation}: the database refused a value: {_first_line(exc)}",
            reason="invalid-value",
            **fields,
        )
    return StoreError(f"{operation} failed: {_first_line(exc)}", reason="database-error", **fields)


@contextmanager
def translated(operation: str, **fields: Any) -> Iterator[None]:
    """Turn driver exceptions into store errors, so no caller sees a psycopg type."""
    try:
        yield
    except _DRIVER_ERRORS as exc:
        raise store_error(operation, exc, fields) from exc


def _fetch(cursor: psycopg.Cursor[DictRow]) -> list[Row]:
    result = cursor.pgresult
    return cursor.fetchall() if result is not None and result.status == _TUPLES_OK else []


class Transaction:
    """The statements of one transaction, each returning plain dict rows."""

    def __init__(self, cursor: psycopg.Cursor[DictRow], operation: str) -> None:
        self._cursor = cursor
        self._operation = operation

    def _execute(self, statement: Statement, params: Mapping[str, Any]) -> None:
        _tallied(f"{self._operation}/{_statement_name(statement)}")
        self._cursor.execute(pyformat(statement), params)

    def rows(self, statement: Statement, params: Mapping[str, Any]) -> list[Row]:
        self._execute(statement, params)
        return _fetch(self._cursor)

    def one(self, statement: Statement, params: Mapping[str, Any]) -> Row | None:
        rows = self.rows(statement, params)
        return rows[0] if rows else None

    def scalar(self, statement: Statement, params: Mapping[str, Any]) -> Any:
        """The first column of the first row, None without a row."""
        row = self.one(statement, params)
        return None if row is None else next(iter(row.values()))

    def rowcount(self, statement: Statement, params: Mapping[str, Any]) -> int:
        self._execute(statement, params)
        return self._cursor.rowcount


class Database:
    """The pool and the two ways to run SQL on it: one statement, or one transaction.

    Connections are autocommit, return dict rows, open lazily up to ``pool_size``
    and are recycled after half an hour; psycopg_pool discards one that broke.
    ``close`` is like an engine's dispose: a later call opens a fresh pool.
    ``application_name`` names its sessions on the server: a worker process's say
    whose they are, which the crash watcher reads as a sign of life (``watcher``).
    """

    def __init__(
        self, database_url: str, *, pool_size: int, application_name: str | None = None
    ) -> None:
        self._conninfo = plain_postgres_url(database_url)
        self._size = pool_size
        self._application_name = application_name
        self._pool: ConnectionPool[psycopg.Connection[DictRow]] | None = None
        self._lock = threading.Lock()

    def _open_pool(self) -> ConnectionPool[psycopg.Connection[DictRow]]:
        with self._lock:
            if self._pool is None:
                self._pool = ConnectionPool(
                    self._conninfo,
                    connection_class=psycopg.Connection[DictRow],
                    kwargs={
                        "autocommit": True,
                        "row_factory": dict_row,
                        "connect_timeout": _CONNECT_TIMEOUT,
                        **(
                            {"application_name": self._application_name[:63]}
                            if self._application_name
                            else {}
                        ),
                    },
                    min_size=0,
                    max_size=self._size,
                    timeout=_POOL_TIMEOUT,
                    max_lifetime=_RECYCLE,
                    name="turnkeeper-store",
                    open=True,
                )
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[DictRow]]:
        pool = self._pool or self._open_pool()
        try:
            with pool.connection() as conn:
                yield conn
        except _BROKEN as exc:
            if isinstance(exc, (PoolTimeout, PoolClosed)):
                raise
            # The server ended this connection (a restart, a failover, an operator's
            # pg_terminate_backend): it usually ended its idle siblings too. Test them
            # now, so that the caller's retry gets a live one rather than the next
            # dead one of the pool, each costing a retry out of the lease.
            self._discard_broken(pool)
            raise

    @staticmethod
    def _discard_broken(pool: ConnectionPool[psycopg.Connection[DictRow]]) -> None:
        # The server may be down: then the next checkout reconnects or times out.
        with suppress(psycopg.Error):
            pool.check()

    def rows(
        self, operation: str, statement: Statement, params: Mapping[str, Any], **fields: Any
    ) -> list[Row]:
        """Run one autocommit statement; its rows (none for a statement without any)."""
        _tallied(operation)
        try:
            with self._connection() as conn:
                return _fetch(conn.execute(pyformat(statement), params))
        except _DRIVER_ERRORS as exc:
            raise store_error(operation, exc, fields) from exc

    def one(
        self, operation: str, statement: Statement, params: Mapping[str, Any], **fields: Any
    ) -> Row | None:
        rows = self.rows(operation, statement, params, **fields)
        return rows[0] if rows else None

    @contextmanager
    def transaction(self, operation: str, **fields: Any) -> Iterator[Transaction]:
        """One READ COMMITTED transaction: committed when the block ends, rolled back
        if it raises."""
        with translated(operation, **fields), self._connection() as conn:
            _tallied(f"{operation}/begin")
            try:
                with conn.transaction(), conn.cursor() as cursor:
                    yield Transaction(cursor, operation)
            except BaseException:
                _tallied(f"{operation}/rollback")
                raise
            _tallied(f"{operation}/commit")


class StoreBase:
    """What every part of ``Store`` shares: the database handle, and owner writes."""

    _db: Database

    def _owner_write(
        self, operation: str, statement: Statement, params: Mapping[str, Any], claim: Claim
    ) -> Verdict:
        """One conditional write of ``claim``'s owner: DONE when its row came back,
        else why it was refused."""
        if self._db.one(operation, statement, params, run_id=claim.run_id) is not None:
            return Verdict.DONE
        return self._refusal(claim)

    def _refusal(self, claim: Claim) -> Verdict:
        """Why a write of ``claim`` was refused.

        Asked after the refusal, and still exact: ownership never comes back once
        lost, so an attempt that owns the run now owned it at the write too, and
        its write was refused for the row's state.
        """
        params = {"run_id": claim.run_id, "attempt_id": claim.attempt_id}
        owned = self._db.one("owns_run", sql.ownership.OWNS_RUN, params, run_id=claim.run_id)
        return Verdict.WRONG_STATE if owned is not None else Verdict.NOT_OWNER
