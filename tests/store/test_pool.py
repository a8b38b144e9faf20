"""The store's connection pool: bounded, thread-safe, and rid of broken connections."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from tests.store.conftest import admit
from turnkeeper.config import plain_postgres_url
from turnkeeper.errors import RunConflictError, StoreUnavailableError
from turnkeeper.store import Store
from turnkeeper.store.sql.statement import Statement


def _backends(database_url: str) -> list[int]:
    """The pids of the other sessions connected to this test's database."""
    with psycopg.connect(plain_postgres_url(database_url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY pid"
        ).fetchall()
    return [int(r[0]) for r in rows]


def _settled_backends(database_url: str, wanted: Callable[[list[int]], bool]) -> list[int]:
    """The backends once ``wanted`` holds: a server process leaves pg_stat_activity a
    moment after its client hangs up. The deadline is only a hang guard."""
    deadline = time.monotonic() + 30
    while not wanted(backends := _backends(database_url)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return backends


def test_eight_threads_share_at_most_pool_size_connections(database_url: str) -> None:
    with Store(database_url, pool_size=2) as store:
        admit(store, "r1")
        results: list[str | None] = []
        lock = threading.Lock()
        start = threading.Barrier(8)

        def reader() -> None:
            start.wait()
            for _ in range(50):
                run = store.get_run("r1")
                with lock:
                    results.append(None if run is None else run.run_id)

        threads = [threading.Thread(target=reader) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert results == ["r1"] * 400
        assert len(_backends(database_url)) == 2
    assert _settled_backends(database_url, lambda b: b == []) == []  # close() closed all


def test_a_connection_killed_by_the_server_is_replaced(database_url: str) -> None:
    with Store(database_url, pool_size=1) as store:
        admit(store, "r1")
        (backend,) = _backends(database_url)
        with psycopg.connect(plain_postgres_url(database_url), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
        outcomes: list[str] = []
        for _ in range(2):
            try:
                run = store.get_run("r1")
            except StoreUnavailableError:
                outcomes.append("unavailable")
            else:
                outcomes.append("ok" if run is not None and run.run_id == "r1" else "wrong")
        # The dead connection fails its one statement as retryable, then is discarded.
        assert outcomes == ["unavailable", "ok"]
        (replacement,) = _settled_backends(database_url, lambda b: backend not in b)
        assert replacement != backend


def test_when_the_server_ends_every_connection_one_call_fails_not_one_per_connection(
    database_url: str,
) -> None:
    """A restart or an operator's terminate ends all of the pool's connections at once:
    the first call that meets a dead one fails (retryable), and the pool tests the
    rest right then, so the retry runs on a live connection, not on the next corpse."""
    with Store(database_url, pool_size=4) as store:
        admit(store, "r1")
        start = threading.Barrier(4)

        def hold() -> None:  # four calls at once make the pool open four connections
            start.wait()
            with store._db.transaction("hold") as tx:
                tx.scalar(Statement("SELECT pg_sleep(0.3)"), {})

        threads = [threading.Thread(target=hold) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        backends = _backends(database_url)
        assert len(backends) == 4
        with psycopg.connect(plain_postgres_url(database_url), autocommit=True) as admin:
            for backend in backends:
                admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
        _settled_backends(database_url, lambda b: not set(b) & set(backends))
        outcomes: list[str] = []
        for _ in range(4):
            try:
                run = store.get_run("r1")
            except StoreUnavailableError:
                outcomes.append("unavailable")
            else:
                outcomes.append("ok" if run is not None and run.run_id == "r1" else "wrong")
        assert outcomes == ["unavailable", "ok", "ok", "ok"]


def test_a_failed_statement_leaves_the_connection_usable(database_url: str) -> None:
    with Store(database_url, pool_size=1) as store:
        admit(store, "r1", "s1")
        (backend,) = _backends(database_url)
        # A refused transaction (the same run id with another payload) rolls back ...
        with pytest.raises(RunConflictError):
            store.admit_run("r1", "s1", {"other": True}, max_attempts=1, deadline=None)
        # ... and the same connection serves the next call, outside any transaction.
        assert store.get_run("r1") is not None
        # The first look's own session leaves pg_stat_activity a moment after it ends.
        assert _settled_backends(database_url, lambda b: b == [backend]) == [backend]


def test_a_closed_store_reopens_like_a_disposed_engine(database_url: str) -> None:
    store = Store(database_url, pool_size=1)
    admit(store, "r1")
    store.close()
    assert _settled_backends(database_url, lambda b: b == []) == []
    try:
        assert store.get_run("r1") is not None
    finally:
        store.close()
