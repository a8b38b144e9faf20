"""The embedded stack: one PostgreSQL and one Redis under the data directory.

Starting is idempotent and safe across processes: a file lock serializes
starters, a server already running on the data directory is reused, and the
chosen ports are remembered in ``stack.json`` so that the URLs stay the same
from one start to the next. The URLs carry each server's password (``passwords.py``),
which only the data directory's owner can read; a data directory made before the
servers had passwords is upgraded on its first start (``postgres.py``, ``redis.py``),
keeping its data and its ports.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from filelock import FileLock, Timeout

from turnkeeper.config import Settings
from turnkeeper.embedded.passwords import keep_private
from turnkeeper.embedded.ports import free_port, port_in_use
from turnkeeper.embedded.postgres import EmbeddedPostgres
from turnkeeper.embedded.redis import EmbeddedRedis
from turnkeeper.errors import ConfigError, EmbeddedStackError
from turnkeeper.secret import dev_secret_file

log = structlog.get_logger(__name__)

_LOCK_TIMEOUT = 180.0


@dataclass(frozen=True)
class StackUrls:
    database_url: str
    redis_url: str
    started: frozenset[str] = field(default_factory=frozenset)
    """Which servers this call started (the others were already running)."""


class EmbeddedStack:
    """PostgreSQL and Redis from pip packages, living in ``data_dir``."""

    def __init__(self, data_dir: Path, *, postgres_port: int = 0, redis_port: int = 0) -> None:
        self.data_dir = data_dir
        self.postgres = EmbeddedPostgres(data_dir)
        self.redis = EmbeddedRedis(data_dir)
        self._wanted_ports = {"postgres": postgres_port, "redis": redis_port}

    @classmethod
    def from_settings(cls, settings: Settings) -> EmbeddedStack:
        return cls(
            settings.data_dir,
            postgres_port=settings.embedded_postgres_port,
            redis_port=settings.embedded_redis_port,
        )

    @property
    def _state_file(self) -> Path:
        return self.data_dir / "stack.json"

    def _lock(self) -> FileLock:
        return FileLock(self.data_dir / "stack.lock", mode=0o600, timeout=_LOCK_TIMEOUT)

    def start(self) -> StackUrls:
        """Start whatever is not running yet and return the URLs of both servers."""
        self._prepare_data_dir()
        try:
            with self._lock():
                return self._start_locked()
        except Timeout as exc:
            raise EmbeddedStackError(
                f"another process holds {self.data_dir / 'stack.lock'} for too long",
                reason="lock-timeout",
            ) from exc

    def running(self) -> StackUrls | None:
        """The URLs when both servers are up, else None. Starts nothing."""
        ports = self._remembered_ports()
        pg_port = self.postgres.running_port()
        redis_port = self.redis.running_port(ports.get("redis"))
        if pg_port is None or redis_port is None:
            return None
        return StackUrls(self.postgres.url(pg_port), self.redis.url(redis_port))

    def stop(self, only: frozenset[str] | None = None) -> None:
        """Stop both servers (or only those named), cleanly."""
        if not self.data_dir.exists():
            return
        with self._lock():
            self._stop_locked(only)

    def _stop_locked(self, only: frozenset[str] | None) -> None:
        if only is None or "redis" in only:
            self.redis.stop(self._remembered_ports().get("redis"))
        if only is None or "postgres" in only:
            self.postgres.stop()

    def _start_locked(self) -> StackUrls:
        ports = self._remembered_ports()
        started: set[str] = set()
        try:
            return self._start_each(ports, started)
        except BaseException:
            self._stop_locked(frozenset(started))  # leave nothing half-started behind
            raise

    def _start_each(self, ports: dict[str, int], started: set[str]) -> StackUrls:
        pg_port = self.postgres.running_port()
        if pg_port is None:
            self.postgres.stop()  # one without a password may run: its port is taken again
            pg_port = self._choose_port("postgres", ports)
            self.postgres.start(pg_port)
            started.add("postgres")
        ports["postgres"] = pg_port

        redis_port = self.redis.running_port(ports.get("redis"))
        if redis_port is None:
            self.redis.stop(ports.get("redis"))  # as above
            redis_port = self._choose_port("redis", ports)
            self.redis.start(redis_port)
            started.add("redis")
        ports["redis"] = redis_port

        fd = os.open(self._state_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as state:
            state.write(json.dumps(ports))
        keep_private(self._state_file)
        log.info("embedded.stack.ready", started=sorted(started), **ports)
        return StackUrls(self.postgres.url(pg_port), self.redis.url(redis_port), frozenset(started))

    def _choose_port(self, server: str, remembered: dict[str, int]) -> int:
        wanted = self._wanted_ports[server]
        if wanted:
            if port_in_use(wanted):
                raise ConfigError(
                    f"TURNKEEPER_EMBEDDED_{server.upper()}_PORT: port {wanted} is already in "
                    "use; choose a free port or 0 to pick one",
                    reason="port-in-use",
                )
            return wanted
        previous = remembered.get(server)
        if previous and not port_in_use(previous):
            return previous
        return free_port()

    def _remembered_ports(self) -> dict[str, int]:
        try:
            data = json.loads(self._state_file.read_text())
        except (OSError, ValueError):
            return {}
        return {k: int(v) for k, v in data.items() if k in {"postgres", "redis"}}

    def _prepare_data_dir(self) -> None:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"TURNKEEPER_DATA_DIR: cannot create {self.data_dir}: {exc.strerror}; "
                "point it at a writable directory",
                reason="data-dir",
            ) from exc
        if not os.access(self.data_dir, os.W_OK | os.X_OK):
            raise ConfigError(
                f"TURNKEEPER_DATA_DIR: {self.data_dir} is not writable; "
                "point it at a writable directory",
                reason="data-dir",
            )
        keep_private(self.data_dir / "stack.lock")  # made 0644 before


def resolve_services(settings: Settings, *, start: bool) -> tuple[Settings, StackUrls | None]:
    """Settings with both service URLs set: the configured ones, else the embedded servers.

    With ``start`` the embedded servers are started when needed; without it they
    are only looked up, and a ConfigError says how to start them.
    """
    if not settings.uses_embedded:
        return settings, None
    stack = EmbeddedStack.from_settings(settings)
    urls = stack.start() if start else stack.running()
    if urls is None:
        raise ConfigError(
            "TURNKEEPER_DATABASE_URL and TURNKEEPER_REDIS_URL are unset and the embedded "
            f"servers in {settings.data_dir} are not running; start them with `turnkeeper dev` "
            "or set the URLs",
            reason="no-services",
        )
    resolved = settings.with_services(
        database_url=settings.database_url or urls.database_url,
        redis_url=settings.redis_url or urls.redis_url,
    )
    dev_secret = dev_secret_file(settings.data_dir)
    if settings.secret is None and settings.secret_file is None and dev_secret.is_file():
        # The embedded servers are a dev stack: its processes share the secret dev made.
        resolved = resolved.model_copy(update={"secret_file": dev_secret})
    return resolved, urls
