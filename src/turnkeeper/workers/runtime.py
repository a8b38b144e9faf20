"""What one worker process holds: the store, the run log and the sandbox providers.

Built lazily, once per process: Celery's prefork pool forks children from a
parent that must not hold connections, so nothing here connects at import or in
the parent; ``runtime_for`` notices a fork (a new pid) and builds afresh.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from turnkeeper.agents.spec import AgentSpec
from turnkeeper.agents.worker_env import worker_values
from turnkeeper.config import Settings
from turnkeeper.envelope import EnvSealer
from turnkeeper.errors import SandboxError
from turnkeeper.log import RunLog
from turnkeeper.log.origin import LogSource
from turnkeeper.log.runlog import LEASE_RENEWALS
from turnkeeper.owner import new_owner
from turnkeeper.sandbox.factory import at_least_as_strong, provider_for
from turnkeeper.sandbox.provider import SandboxProvider
from turnkeeper.secret import ServerSecret
from turnkeeper.store.records import Claim
from turnkeeper.store.session import OwnerLockSession, store_session_name
from turnkeeper.store.store import Store
from turnkeeper.workers.beacon import HostBeacon
from turnkeeper.workers.cancel_listener import CancelListener
from turnkeeper.workers.lease import LeaseKeeper
from turnkeeper.workers.owner_locks import OwnerLocks

log = structlog.get_logger(__name__)


HEARTBEAT_POOL_SIZE = 4
"""Connections of a process's heartbeat store: a beat is two short statements every
``heartbeat_interval`` per turn (200 turns at the default 10 s: 40 a second)."""


@dataclass
class WorkerRuntime:
    settings: Settings
    store: Store
    log: RunLog
    owner: str
    heartbeat_store: Store
    """The store of the lease heartbeats and the host beacon, with a small pool of its
    own: in a process holding many turns (the threads pool), a crowd of turns starting
    at once may hold every connection of ``store``, and a renewal waiting behind them
    until its lease ran out would hand a live run over (docs/architecture.md, "Many
    turns in one worker process")."""
    _providers: dict[str, SandboxProvider] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sealer: EnvSealer | None = None
    hand_over: threading.Event = field(default_factory=threading.Event)
    """Set when this process must hand over the runs it drives (a drain, ``HostBeacon``)."""
    _beacon: HostBeacon | None = None

    def announce(self, main_pid: int) -> None:
        """Start this worker process's host beacon (once): its host is alive from now on."""
        with self._lock:
            if self._beacon is None:
                self._beacon = HostBeacon(
                    self.heartbeat_store,
                    self.settings,
                    self.owner,
                    main_pid=main_pid,
                    hand_over=self.hand_over,
                ).start()

    _owner_locks: OwnerLocks | None = None
    _cancels: CancelListener | None = None

    @property
    def cancels(self) -> CancelListener:
        """This process's cancel wake-ups (``workers/cancel_listener.py``), made once;
        its connection opens with the first run it watches."""
        with self._lock:
            if self._cancels is None:
                self._cancels = CancelListener(
                    self.settings.require_database_url(),
                    application_name=store_session_name(self.owner),
                )
            return self._cancels

    @classmethod
    def open(cls, settings: Settings, log_source: Callable[[Store], LogSource]) -> WorkerRuntime:
        """The runtime of ``settings``; ``log_source`` makes, from its store, what a lost
        run log is rebuilt from (the driver's ``StoredLog``: this layer, below the
        driver, never imports it)."""
        owner = new_owner(settings.host_id)
        # Both pools name their sessions alike: the crash watcher reads any of them as
        # a sign that the process lives (``LIVE_OWNERS``).
        name = store_session_name(owner)
        store = Store(settings.require_database_url(), application_name=name)
        heartbeat_store = Store(
            settings.require_database_url(), pool_size=HEARTBEAT_POOL_SIZE, application_name=name
        )
        run_log = RunLog.from_url(
            settings.require_redis_url(),
            namespace=settings.namespace,
            retention_seconds=settings.log_retention,
            max_chunks=settings.log_max_chunks,
            source=log_source(store),
        )
        log.info("worker.runtime.opened", owner=owner)
        return cls(
            settings=settings,
            store=store,
            log=run_log,
            owner=owner,
            heartbeat_store=heartbeat_store,
        )

    def lease_keeper(self, claim: Claim) -> LeaseKeeper:
        """The heartbeat of ``claim``'s attempt (not started), on the heartbeat store."""
        return LeaseKeeper(
            self.heartbeat_store,
            claim,
            lease_ttl=self.settings.lease_ttl,
            interval=self.settings.heartbeat_interval,
            on_renewed=lambda: self.log.count(LEASE_RENEWALS),
            cancels=self.cancels if self.settings.cancel_listen else None,
        )

    def provider_to_run(self, name: str | None) -> SandboxProvider:
        """The configured provider, or the one a run names if it is at least as strong:
        a run can never leave the jail the operator configured."""
        configured = self.settings.sandbox_provider
        if name is not None and not at_least_as_strong(name, configured):
            raise SandboxError(
                f"the run asks for the {name!r} sandbox, weaker than this worker's {configured!r}",
                reason="provider-refused",
            )
        return self.provider(name)

    def provider(self, name: str | None = None) -> SandboxProvider:
        """A provider by name (the configured one by default), to resume or destroy."""
        key = name or self.settings.sandbox_provider
        with self._lock:
            if key not in self._providers:
                self._providers[key] = provider_for(key, self.settings)
            return self._providers[key]

    def agent_env(self, run_id: str, payload: Any, spec: AgentSpec) -> dict[str, str]:
        """The env a run's agent gets: its sealed values opened, then the variables its
        ``env_from`` and ``env_files`` name, read from this worker's own environment and
        files at spawn time (``agents/worker_env.py``)."""
        env = dict(spec.env)  # a run admitted before env values were sealed
        sealed = payload.get("env") if isinstance(payload, Mapping) else None
        if sealed is not None:
            env.update(self._env_sealer().open(run_id, sealed))
        env.update(worker_values(spec, run_id=run_id))
        return env

    def _env_sealer(self) -> EnvSealer:
        with self._lock:
            if self._sealer is None:
                secret = ServerSecret.require(self.settings, "to open a run's env values")
                self._sealer = EnvSealer(secret)
            return self._sealer

    def owner_locks(self) -> OwnerLocks | None:
        """This process's owner locks (one session for all its runs), None without crash
        detection."""
        if not self.settings.crash_detection:
            return None
        with self._lock:
            if self._owner_locks is None:
                session = OwnerLockSession(
                    self.settings.require_database_url(),
                    owner=self.owner,
                    lease_ttl=self.settings.lease_ttl,
                )
                self._owner_locks = OwnerLocks(self.store, session)
            return self._owner_locks

    def close(self) -> None:
        if self._beacon is not None:
            self._beacon.stop()
        if self._owner_locks is not None:
            self._owner_locks.close()
        if self._cancels is not None:
            self._cancels.close()
        self.store.close()
        self.heartbeat_store.close()
        self.log.client.close()


_runtimes: dict[tuple[int, Settings], WorkerRuntime] = {}
_runtimes_lock = threading.Lock()


def runtime_for(settings: Settings, log_source: Callable[[Store], LogSource]) -> WorkerRuntime:
    """This process's runtime for ``settings``, opened on first use after a fork."""
    key = (os.getpid(), settings)
    with _runtimes_lock:
        runtime = _runtimes.get(key)
        if runtime is None:
            runtime = _runtimes[key] = WorkerRuntime.open(settings, log_source)
        return runtime


def close_runtimes() -> None:
    """Close this process's runtimes (worker shutdown)."""
    with _runtimes_lock:
        for (pid, _), runtime in list(_runtimes.items()):
            if pid == os.getpid():
                runtime.close()
        _runtimes.clear()
