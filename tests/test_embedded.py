"""The embedded stack: real PostgreSQL and Redis from pip packages, started on demand."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from turnkeeper.embedded import EmbeddedStack
from turnkeeper.errors import ConfigError


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[EmbeddedStack]:
    stack = EmbeddedStack(tmp_path / "data")
    yield stack
    stack.stop()


def _query(url: str, sql: str) -> object:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    return row[0] if row else None


def test_cold_start_then_reuse_then_stop(stack: EmbeddedStack) -> None:
    first = stack.start()
    assert first.started == {"postgres", "redis"}
    assert _query(first.database_url, "SELECT current_database()") == "turnkeeper"
    client = redis.Redis.from_url(first.redis_url)
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    client.close()

    again = stack.start()
    assert again.started == frozenset()
    assert (again.database_url, again.redis_url) == (first.database_url, first.redis_url)
    assert stack.running() is not None

    stack.stop()
    assert stack.running() is None


def test_data_survives_a_restart(stack: EmbeddedStack) -> None:
    urls = stack.start()
    with psycopg.connect(urls.database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v text)")
        conn.execute("INSERT INTO kept VALUES ('pg')")
    client = redis.Redis.from_url(urls.redis_url)
    client.set("kept", b"redis")
    client.close()

    stack.stop()
    restarted = stack.start()
    assert restarted.started == {"postgres", "redis"}
    assert restarted.database_url == urls.database_url, "the port is remembered"
    assert _query(restarted.database_url, "SELECT v FROM kept") == "pg"
    client = redis.Redis.from_url(restarted.redis_url)
    assert client.get("kept") == b"redis"
    client.close()


def test_a_dead_server_is_started_again(stack: EmbeddedStack) -> None:
    urls = stack.start()
    pid = int((stack.data_dir / "redis" / "redis.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)
    again = stack.start()
    assert again.started == {"redis"}
    assert redis.Redis.from_url(again.redis_url).ping()
    assert again.database_url == urls.database_url


Outcome = tuple[str, str, list[str]]


def _start_in_process(data_dir: str, results: multiprocessing.Queue[Outcome]) -> None:
    urls = EmbeddedStack(Path(data_dir)).start()
    results.put((urls.database_url, urls.redis_url, sorted(urls.started)))


def test_two_processes_starting_at_once_share_one_stack(stack: EmbeddedStack) -> None:
    ctx = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[Outcome] = ctx.Queue()
    procs = [
        ctx.Process(target=_start_in_process, args=(str(stack.data_dir), results)) for _ in range(3)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0
    outcomes = [results.get(timeout=5) for _ in procs]
    assert len({(db, rd) for db, rd, _ in outcomes}) == 1
    started = sorted(server for *_, servers in outcomes for server in servers)
    assert started == ["postgres", "redis"], "each server started exactly once"
    assert _query(outcomes[0][0], "SELECT 1") == 1


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        stack = EmbeddedStack(tmp_path / "data", redis_port=port)
        with pytest.raises(ConfigError, match="TURNKEEPER_EMBEDDED_REDIS_PORT"):
            stack.start()
    assert stack.running() is None
    assert stack.postgres.running_port() is None, "nothing is left half-started"


def test_an_unusable_data_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="TURNKEEPER_DATA_DIR"):
        EmbeddedStack(blocker / "data").start()


def _wait_gone(pid: int) -> None:
    """Wait until the killed server's pid is gone (it is not our child: no waitpid)."""
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
