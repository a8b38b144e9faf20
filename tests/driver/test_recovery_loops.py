"""The recovery loops under faults: the crash watcher, the owner locks and the host
beacon go on through a broker or database error, and a drain costs no attempt."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg
import pytest

from tests.driver.fleet import DEFAULT_TIMING, Fleet, host_fleet
from tests.driver.test_crash_attacks import _held_flags
from tests.driver.test_crash_takeover import attempts, handed_over_at, mid_run
from tests.driver.test_crash_watcher import _running, _wait
from tests.driver.test_hosts import LONG, _assert_oracle
from tests.driver.test_hosts import PROMPT as HOST_PROMPT
from tests.driver.test_takeover import AGENT, PROMPT, _assert_log_is_oracle
from turnkeeper import driver
from turnkeeper.config import Settings
from turnkeeper.driver import attempt as attempt_module
from turnkeeper.driver.replay import StoredLog
from turnkeeper.embedded.ports import free_port
from turnkeeper.embedded.redis import EmbeddedRedis
from turnkeeper.errors import ServiceError
from turnkeeper.owner import owner_pid
from turnkeeper.store.records import RunStatus
from turnkeeper.store.session import OwnerLockSession, WatchSession, store_session_name
from turnkeeper.store.sql.owner_locks import CANCEL_CHANNEL
from turnkeeper.watcher import CrashWatcher
from turnkeeper.workers.cancel_listener import CancelListener
from turnkeeper.workers.owner_locks import OwnerLocks
from turnkeeper.workers.runtime import WorkerRuntime

SLOW = {**AGENT, "pace": 0.1}


@pytest.mark.slow
def test_a_crash_while_the_broker_is_down_leaves_crash_detection_running(
    settings: Settings, tmp_path: Path
) -> None:
    """The watcher hands over a run whose owner died while the broker is down: its
    takeover message cannot be sent. The watcher goes on (the reconciler sends the
    message again once the broker is back), so a later crash is a crash takeover too,
    not one left to its 30 s lease."""
    broker = EmbeddedRedis(tmp_path / "broker")
    port = free_port()
    broker.start(port)
    fleet = Fleet.create(
        settings,
        tmp_path / "logs",
        broker_url=broker.url(port),
        lease_ttl=30.0,
        heartbeat_interval=10.0,
    )
    try:
        fleet.start_pair()
        fleet.wait_ready()
        first = fleet.client.submit(SLOW, PROMPT)
        owned = mid_run(fleet, first.run_id, chunks=6)
        broker.stop(port)
        fleet.signal_worker_of(owned, signal.SIGKILL)
        fleet.wait_events("crash.sweep_failed", files="beat-*.log")
        broker.start(port)
        done = fleet.wait_settled(first.run_id)
        assert done.status is RunStatus.COMPLETED, fleet.dump_logs()
        assert attempts(fleet, first.run_id) == [(1, "superseded", "crash"), (2, "completed", None)]
        _assert_log_is_oracle(fleet, done, tmp_path / "first")

        fleet.start_worker()
        fleet.wait_ready()
        second = fleet.client.submit(SLOW, PROMPT)
        owned = mid_run(fleet, second.run_id, chunks=6)
        fleet.signal_worker_of(owned, signal.SIGKILL)
        done = fleet.wait_settled(second.run_id)
        assert done.status is RunStatus.COMPLETED, fleet.dump_logs()
        assert attempts(fleet, second.run_id) == [
            (1, "superseded", "crash"),
            (2, "completed", None),
        ], fleet.dump_logs()
        _assert_log_is_oracle(fleet, done, tmp_path / "second")
    finally:
        fleet.stop()
        broker.stop(port)


def _attempt_count(fleet: Fleet, run_id: str) -> int:
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        row = conn.execute("SELECT attempt_count FROM runs WHERE run_id = %s", (run_id,)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.slow
def test_a_drain_costs_no_attempt_even_on_the_last_one(settings: Settings, tmp_path: Path) -> None:
    """A drain is the operator's choice, not the run's failure: a run on its last
    attempt (here its only one) is handed over by a drain, adopted by the redeployed
    worker of its host, and completes, with the attempts it had before the drain."""
    host = host_fleet(settings, tmp_path / "hosts", "host-a")
    try:
        drained = host.start_worker()
        host.start_beat()
        host.wait_ready()
        agent = {**LONG, "seed": 31}
        run = host.client.submit(agent, HOST_PROMPT, max_attempts=1)
        owned = mid_run(host, run.run_id, chunks=10)
        assert _attempt_count(host, run.run_id) == 1
        drain = host.run_cli("worker", "--drain", "--hand-over-after", "1")
        assert drain.returncode == 0, (drain.stdout, drain.stderr, host.dump_logs())
        assert drained.poll() is not None, "the drained worker exited"
        host.start_worker()  # the redeploy
        done = host.wait_settled(run.run_id, timeout=240)
        assert done.status is RunStatus.COMPLETED, (done.error, host.dump_logs())
        assert done.attempt_id != owned.attempt_id
        assert [(e, outcome) for e, outcome, _ in attempts(host, run.run_id)] == [
            (1, "superseded"),
            (2, "completed"),
        ]
        assert _attempt_count(host, run.run_id) == 1, "the drained attempt was given back"
        _assert_oracle(host, done, agent, HOST_PROMPT, tmp_path / "oracle")
    finally:
        host.stop()


def test_a_long_host_id_still_tells_its_processes_apart(settings: Settings, tmp_path: Path) -> None:
    """A 60-character host id: the server keeps 63 bytes of an application name, so a
    name of prefix and owner would end inside the host id and every process of the
    host would look alike. A SIGKILLed owner must still be a crash takeover while its
    siblings (the other worker, beat) live on."""
    fleet = Fleet.create(settings, tmp_path / "logs", **DEFAULT_TIMING, host_id="h" * 60)
    try:
        fleet.start_pair()
        fleet.wait_ready()
        run = fleet.client.submit(AGENT, PROMPT)
        owned = mid_run(fleet, run.run_id)
        assert owned.lease_expires_at is not None
        fleet.signal_worker_of(owned, signal.SIGKILL)
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert attempts(fleet, run.run_id) == [
            (1, "superseded", "crash"),
            (2, "completed", None),
        ], fleet.dump_logs()
        assert handed_over_at(fleet, run.run_id, 1) < owned.lease_expires_at
        _assert_log_is_oracle(fleet, done, tmp_path)
    finally:
        fleet.stop()


class PostgresLink:
    """A TCP proxy to Postgres that can be slow to connect (``connect_delay``: a server
    under load, a failover in progress), and whose cut ends every server session at
    once but tells its clients nothing until they next write: a link that died quietly
    (a NAT's state gone, a proxy restarted), which a client learns of only at its next
    statement. Its ``silence`` is worse: the links made so far stay open and carry
    nothing either way, so a client waits for every reply forever (a middlebox that
    hangs)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._links: list[tuple[socket.socket, threading.Event]] = []
        self._clients: list[socket.socket] = []
        self._silenced: set[socket.socket] = set()
        self.connect_delay = 0.0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._clients.append(client)
            threading.Thread(target=self._open, args=(client,), daemon=True).start()

    def _open(self, client: socket.socket) -> None:
        time.sleep(self.connect_delay)
        server = socket.create_connection(self._upstream)
        cut = threading.Event()
        self._links.append((server, cut))
        threading.Thread(target=self._up, args=(client, server, cut), daemon=True).start()
        threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, cut: threading.Event) -> None:
        with suppress(OSError):
            while data := client.recv(65536):
                if cut.is_set():
                    break  # the client spoke into the dead link: it learns now
                if client not in self._silenced:
                    server.sendall(data)
        client.close()
        _end(server)  # the client left: so does its server session

    def _down(self, server: socket.socket, client: socket.socket) -> None:
        with suppress(OSError):
            while data := server.recv(65536):
                if client not in self._silenced:
                    client.sendall(data)

    def clients(self) -> list[socket.socket]:
        """Every link a client opened, in order."""
        return list(self._clients)

    def silence(self) -> None:
        """From now on, the links made so far carry nothing, and stay open."""
        self._silenced.update(self._clients)

    def cut(self) -> None:
        """End every server session made so far; their clients hear nothing yet."""
        for server, cut in self._links:
            cut.set()
            _end(server)
        self._links.clear()

    def close(self) -> None:
        """Stop accepting and end every session still open, so no socket outlives the
        test (a leaked one warns in whichever later test the collector runs)."""
        self._listener.close()
        self.cut()
        for client in self._clients:
            _end(client)


def _end(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@pytest.fixture
def runtime(settings: Settings) -> Iterator[WorkerRuntime]:
    rt = WorkerRuntime.open(settings, StoredLog)
    yield rt
    rt.close()


def _through(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}@127.0.0.1:{port}"))


def test_a_release_on_a_dead_session_takes_the_other_locks_back(
    runtime: WorkerRuntime,
) -> None:
    """The lock session's link died without a word (no FIN): the server ended the
    session and freed both runs' locks, and the lock thread learns of it only when one
    run's release fails. The other run's lock must be taken back, in a new session."""
    url = runtime.settings.require_database_url()
    parts = urlsplit(url)
    proxy = PostgresLink((parts.hostname or "127.0.0.1", parts.port or 5432))
    ending, staying = _running(runtime, "ending-1"), _running(runtime, "staying-1")
    session = OwnerLockSession(_through(url, proxy.port), owner=runtime.owner, lease_ttl=30.0)
    locks = OwnerLocks(runtime.store, session)
    try:
        locks.hold(ending)
        locks.hold(staying)
        _wait(lambda: _held_flags(runtime) == {"ending-1": True, "staying-1": True})
        generation = session.generation
        proxy.cut()
        _wait(lambda: _held_flags(runtime) == {"ending-1": False, "staying-1": False})
        locks.release(ending)
        # The server's locks and the thread's account of them, which it updates right
        # after taking a lock (a moment after the server shows it).
        _wait(
            lambda: (
                _held_flags(runtime) == {"ending-1": False, "staying-1": True}
                and locks.held() == {"staying-1"}
            )
        )
        assert session.generation == generation + 1
    finally:
        locks.close()
        proxy.close()


def _lease_state(rt: WorkerRuntime, run_id: str) -> tuple[bool, int, str | None]:
    """Whether the run's lease has run out on the database clock, its attempt count and
    its current attempt."""
    with psycopg.connect(rt.settings.require_database_url()) as conn:
        row = conn.execute(
            "SELECT lease_expires_at < now(), attempt_count, attempt_id FROM runs"
            " WHERE run_id = %s",
            (run_id,),
        ).fetchone()
    assert row is not None
    return bool(row[0]), int(row[1]), row[2]


def test_an_attempt_given_up_after_its_retries_lets_its_lease_go(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run log's Redis is unreachable for longer than the service retries last (cut
    to 1 s here): the attempt gives up without failing the run. Its process lives on,
    so its sessions say its owner is alive and no crash handover comes: the attempt must
    let its lease go itself, or the run waits a whole lease for nothing. A give-up is no
    drain: the attempt it spent stays spent."""
    monkeypatch.setattr(attempt_module, "SERVICE_RETRY_BUDGET", 1.0)
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    rt = WorkerRuntime.open(settings.model_copy(update={"redis_url": unreachable}), StoredLog)
    try:
        run, _ = rt.store.admit_run(
            "given-up-1",
            "given-up-1",
            {"agent": AGENT, "prompt": PROMPT},
            max_attempts=3,
            deadline=None,
        )
        with pytest.raises(ServiceError):
            driver.run_turn(rt, run.run_id)
        expired, attempt_count, attempt_id = _lease_state(rt, run.run_id)
        assert (expired, attempt_count) == (True, 1)
        assert attempt_id is not None
    finally:
        rt.close()


def test_a_cancel_listener_whose_link_went_silent_connects_again_and_pokes_its_runs(
    settings: Settings,
) -> None:
    """The listener's link hangs: nothing it sends reaches the server, no notification
    reaches it, and nothing is closed. A cancel announced then is lost with the link,
    so the listener must notice (its question after a quiet wait goes unanswered), cut
    the link, connect again, and poke every run it watches."""
    url = settings.require_database_url()
    parts = urlsplit(url)
    proxy = PostgresLink((parts.hostname or "127.0.0.1", parts.port or 5432))
    listener = CancelListener(_through(url, proxy.port), application_name="silent-link")
    poked = threading.Event()
    try:
        listener.watch("run-1", poked.set)
        _wait(poked.is_set)  # each (re)connect pokes every watched run
        poked.clear()
        proxy.silence()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, 'run-1')", (CANCEL_CHANNEL,))
        _wait(poked.is_set)  # a hang guard: without the question, it waits forever
        assert len(proxy.clients()) == 2  # the silent link, then a new one
    finally:
        listener.close()
        proxy.close()


def test_a_pool_process_comes_up_while_postgres_is_slow_to_connect(
    settings: Settings, tmp_path: Path
) -> None:
    """A pool process dies (OOM, a bug) while every new connection to Postgres takes
    6 s: longer than Celery waits for the process forked in its place to come up
    (``worker_proc_alive_timeout``, 4 s). The beacon's first write must not hold that
    process's start, or Celery kills it and forks another, which waits again."""
    url = settings.require_database_url()
    parts = urlsplit(url)
    link = PostgresLink((parts.hostname or "127.0.0.1", parts.port or 5432))
    fleet = Fleet.create(
        settings.model_copy(update={"database_url": _through(url, link.port)}), tmp_path / "logs"
    )
    try:
        worker = fleet.start_worker()
        fleet.wait_ready()
        (first,) = fleet.wait_events("host.announced")
        link.connect_delay = 6.0
        os.kill(owner_pid(first["worker"]), signal.SIGKILL)
        announced = fleet.wait_events("host.announced", count=2)
        link.connect_delay = 0.0
        log = (tmp_path / "logs" / "worker-0.log").read_text()
        assert "Timed out waiting for UP message" not in log, log[-4000:]
        (pool,) = psutil.Process(worker.pid).children()
        assert [owner_pid(event["worker"]) for event in announced] == [
            owner_pid(first["worker"]),
            pool.pid,
        ]
        run = fleet.client.submit(AGENT, PROMPT)
        assert fleet.wait_settled(run.run_id).status is RunStatus.COMPLETED, fleet.dump_logs()
    finally:
        fleet.stop()
        link.close()


def test_an_owner_whose_sessions_come_back_before_the_handover_keeps_its_run(
    runtime: WorkerRuntime,
) -> None:
    """The watcher saw the lock free and no session of its owner (``live_owners``); the
    owner's store connects again before the handover statement runs (the owner lived:
    a blip ended every session of its process). The handover must look again, in its
    own statement, and leave the run to its owner."""
    url = runtime.settings.require_database_url()
    claim = _running(runtime, "back-1")
    owner = OwnerLockSession(url, owner="owner", lease_ttl=30.0)
    watch = WatchSession(url)
    try:
        assert owner.take([claim]) == {claim.run_id}
        runtime.store.mark_owner_locked(claim)
        assert [o.held for o in watch.watched(10)] == [True]
        owner.close()  # the server frees the lock soon after, not at once
        _wait(lambda: [o.held for o in watch.watched(10)] == [False])
        seen = watch.watched(10)
        assert [(o.run_id, o.held) for o in seen] == [("back-1", False)]
        assert watch.live_owners(seen) == set()
        with psycopg.connect(url, application_name=store_session_name("owner")):
            assert watch.hand_over_absent(seen) == []
        assert attempts_of(runtime, "back-1") == [(1, None, None)]
    finally:
        watch.close()
        owner.close()


def attempts_of(rt: WorkerRuntime, run_id: str) -> list[tuple[int, str | None, str | None]]:
    with psycopg.connect(rt.settings.require_database_url()) as conn:
        rows = conn.execute(
            "SELECT epoch, outcome, handover_cause FROM attempts WHERE run_id = %s ORDER BY epoch",
            (run_id,),
        ).fetchall()
    return [(row[0], row[1], row[2]) for row in rows]


def test_one_watcher_sweeps_and_a_second_stands_by_until_it_is_gone(
    runtime: WorkerRuntime,
) -> None:
    """Two beats, two watchers: a sweep takes every free owner lock for an instant, so
    each watcher could read a lock the other is probing as held, and arm a run whose
    owner is gone (after a failover, one not yet back). Only one watcher sweeps; the
    other takes over when the first's session ends, and starts from nothing."""
    url = runtime.settings.require_database_url()
    claim = _running(runtime, "watched-1")
    owner = OwnerLockSession(url, owner="owner", lease_ttl=30.0)
    sent: list[tuple[str, str, int]] = []
    first, second = (
        CrashWatcher(
            runtime, WatchSession(url), enqueue_takeover=lambda *m: sent.append(m), grace=0.0
        )
        for _ in range(2)
    )
    try:
        assert owner.take([claim]) == {claim.run_id}
        runtime.store.mark_owner_locked(claim)
        assert (first.sweep(), second.sweep()) == ([], [])
        assert (first.armed, second.armed) == ({"watched-1": claim.attempt_id}, {})
        first.close()  # the server frees its leader lock soon after, not at once
        _wait(lambda: second.sweep() == [] and second.armed == {"watched-1": claim.attempt_id})
        owner.close()
        _wait(lambda: _held_flags(runtime) == {"watched-1": False})
        handed = second.sweep()
        assert [c.run_id for c in handed] == ["watched-1"]
        assert [m[0] for m in sent] == ["watched-1"]
        assert attempts_of(runtime, "watched-1") == [(1, "superseded", "crash")]
    finally:
        first.close()
        second.close()
        owner.close()


def _seen_after(fleet: Fleet, worker_id: str, since: object) -> bool:
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        row = conn.execute(
            "SELECT last_seen > %s FROM workers WHERE worker_id = %s", (since, worker_id)
        ).fetchone()
    return bool(row and row[0])


def test_the_beacon_beats_on_through_a_dead_database_link(
    settings: Settings, tmp_path: Path
) -> None:
    """Every connection of the worker to Postgres dies without a word: the beacon's
    next beat fails, and the beats after it, on new connections, keep the host alive."""
    url = settings.require_database_url()
    parts = urlsplit(url)
    link = PostgresLink((parts.hostname or "127.0.0.1", parts.port or 5432))
    fleet = Fleet.create(
        settings.model_copy(update={"database_url": _through(url, link.port)}), tmp_path / "logs"
    )
    try:
        fleet.start_worker()
        fleet.wait_ready()
        (announced,) = fleet.wait_events("host.announced")
        link.cut()
        fleet.wait_events("host.beat_failed")
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        _wait(lambda: _seen_after(fleet, announced["worker"], row[0]))
        run = fleet.client.submit(AGENT, PROMPT)
        assert fleet.wait_settled(run.run_id).status is RunStatus.COMPLETED, fleet.dump_logs()
    finally:
        fleet.stop()
        link.close()
