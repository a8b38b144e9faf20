"""The per-host egress daemon: one per allowlist, started once, outliving its starter,
restarted on the same path, holding nothing of the fleet, reachable only where it should be.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

import turnkeeper
from tests.sandbox.conftest import TEST_UIDS
from tests.sandbox.egress_support import (
    EchoServer,
    ProxyLog,
    UpstreamServer,
    ask,
    daemons_for,
    paths_for,
    serving,
    settings_for,
    short_data_dir,
    stop_daemon,
)
from tests.unavailable import skip_or_fail
from turnkeeper.errors import EgressProxyError
from turnkeeper.sandbox.egress import ProxyPaths, answers, ensure_proxy, lock_holder
from turnkeeper.sandbox.egress.host import connect_unix

# A stand-in worker: imports first, then waits at a gate so that starters race on
# ensure_proxy itself; prints the socket path; with a second argument, lingers.
STARTER = """
import sys, time
from pathlib import Path
from turnkeeper.config import load_settings
from turnkeeper.logconfig import configure_logging
from turnkeeper.sandbox.egress import ensure_proxy
configure_logging()
settings = load_settings()
gate = Path(sys.argv[1])
while not gate.exists():
    time.sleep(0.001)
print(ensure_proxy(settings), flush=True)
if len(sys.argv) > 2:
    time.sleep(3600)
"""
FLEET_SECRET = "fleet-secret-that-no-agent-may-see-0123456789"  # noqa: S105 - a marker


@pytest.fixture
def data_dir() -> Iterator[Path]:
    with short_data_dir() as path:
        yield path


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    server = UpstreamServer()
    with serving(server):
        yield server


@pytest.fixture
def stopped_after() -> Iterator[Callable[[ProxyPaths], ProxyPaths]]:
    """Registers proxies to SIGKILL at the end of the test."""
    started: list[ProxyPaths] = []
    yield lambda paths: started.append(paths) or paths
    for paths in started:
        stop_daemon(paths)


def small(upstream: UpstreamServer) -> bytes:
    return f"GET http://127.0.0.1:{upstream.port}/small HTTP/1.1\r\nHost: x\r\n\r\n".encode()


def starter_env(data_dir: Path, allow: str) -> dict[str, str]:
    return {
        **os.environ,
        "TURNKEEPER_DATA_DIR": str(data_dir),
        "TURNKEEPER_SANDBOX_EGRESS": allow,
        "TURNKEEPER_SECRET": FLEET_SECRET,
    }


def test_concurrent_workers_start_exactly_one_daemon(
    data_dir: Path, upstream: UpstreamServer, stopped_after: Callable[[ProxyPaths], ProxyPaths]
) -> None:
    allow = f"127.0.0.1:{upstream.port}"
    paths = stopped_after(paths_for(settings_for(data_dir, allow)))
    gate = data_dir / "go"
    starters = [
        subprocess.Popen(
            [sys.executable, "-c", STARTER, str(gate)],
            env=starter_env(data_dir, allow),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    gate.touch()
    outputs = [starter.communicate(timeout=120)[0] for starter in starters]
    assert [starter.returncode for starter in starters] == [0, 0, 0, 0]
    assert outputs == [f"{paths.socket}\n"] * 4
    assert daemons_for(paths) == [lock_holder(paths.pidfile)]
    assert [event["event"] for event in ProxyLog(paths.log).events()] == ["egress.started"]
    assert ask(paths.socket, small(upstream)).status == 200


def test_the_daemon_outlives_its_starter_killed(
    data_dir: Path, upstream: UpstreamServer, stopped_after: Callable[[ProxyPaths], ProxyPaths]
) -> None:
    allow = f"127.0.0.1:{upstream.port}"
    paths = stopped_after(paths_for(settings_for(data_dir, allow)))
    gate = data_dir / "go"
    gate.touch()
    with subprocess.Popen(
        [sys.executable, "-c", STARTER, str(gate), "linger"],
        env=starter_env(data_dir, allow),
        stdout=subprocess.PIPE,
        text=True,
    ) as starter:
        try:
            assert starter.stdout is not None
            assert starter.stdout.readline() == f"{paths.socket}\n"
            pid = lock_holder(paths.pidfile)
            assert pid is not None
        finally:
            starter.kill()
        assert starter.wait(timeout=30) == -signal.SIGKILL
    daemon = psutil.Process(pid)
    assert daemon.is_running()
    assert daemon.ppid() not in {starter.pid, os.getpid()}  # detached: not the worker's child
    assert os.getsid(pid) == pid  # a session of its own
    assert daemons_for(paths) == [pid]
    assert ask(paths.socket, small(upstream)).status == 200


def test_a_killed_daemon_is_restarted_on_the_same_path(
    data_dir: Path, upstream: UpstreamServer, stopped_after: Callable[[ProxyPaths], ProxyPaths]
) -> None:
    settings = settings_for(data_dir, f"127.0.0.1:{upstream.port}")
    paths = stopped_after(paths_for(settings))
    socket_path = ensure_proxy(settings)
    first = lock_holder(paths.pidfile)
    assert first is not None
    stop_daemon(paths)  # SIGKILL: the dead daemon's socket file stays behind
    assert socket_path.exists()
    assert not answers(socket_path)
    assert ensure_proxy(settings) == socket_path
    second = lock_holder(paths.pidfile)
    assert second not in {None, first}
    assert daemons_for(paths) == [second]
    assert ask(socket_path, small(upstream)).status == 200
    started = [e for e in ProxyLog(paths.log).events() if e["event"] == "egress.started"]
    assert [event["pid"] for event in started] == [first, second]


def test_a_frozen_daemon_is_replaced(
    data_dir: Path, upstream: UpstreamServer, stopped_after: Callable[[ProxyPaths], ProxyPaths]
) -> None:
    settings = settings_for(data_dir, f"127.0.0.1:{upstream.port}")
    paths = stopped_after(paths_for(settings))
    ensure_proxy(settings)
    frozen = lock_holder(paths.pidfile)
    assert frozen is not None
    os.kill(frozen, signal.SIGSTOP)  # it still accepts connections (the kernel's backlog)
    try:
        ensure_proxy(settings)
    finally:
        if psutil.pid_exists(frozen):
            os.kill(frozen, signal.SIGCONT)
    replacement = lock_holder(paths.pidfile)
    assert replacement not in {None, frozen}
    assert daemons_for(paths) == [replacement]
    assert ask(paths.socket, small(upstream)).status == 200


def test_the_daemon_holds_nothing_of_the_fleet(
    data_dir: Path,
    upstream: UpstreamServer,
    stopped_after: Callable[[ProxyPaths], ProxyPaths],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TURNKEEPER_SECRET", FLEET_SECRET)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-of-the-fleet")
    settings = settings_for(data_dir, f"127.0.0.1:{upstream.port}")
    paths = stopped_after(paths_for(settings))
    ensure_proxy(settings)
    pid = lock_holder(paths.pidfile)
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert dict(item.split("=", 1) for item in environ.decode().split("\0") if item) == {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": str(Path(turnkeeper.__file__).resolve().parent.parent),
    }
    assert b"TURNKEEPER_" not in environ
    assert FLEET_SECRET.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    [started] = ProxyLog(paths.log).events()
    assert started == {
        "event": "egress.started",
        "pid": pid,
        "socket": str(paths.socket),
        "allow": [f"127.0.0.1:{upstream.port}"],
        "dumpable": False,
        "uid": 65534 if os.geteuid() == 0 else os.geteuid(),  # a root starter's drops
    }


def test_each_allowlist_gets_its_own_proxy(
    data_dir: Path, upstream: UpstreamServer, stopped_after: Callable[[ProxyPaths], ProxyPaths]
) -> None:
    echo = EchoServer()
    with serving(echo):
        first = settings_for(data_dir, f"127.0.0.1:{upstream.port}")
        second = settings_for(data_dir, f"127.0.0.1:{echo.port}")
        stopped_after(paths_for(first))
        stopped_after(paths_for(second))
        first_socket, second_socket = ensure_proxy(first), ensure_proxy(second)
        assert first_socket != second_socket
        assert first_socket.parent.parent == second_socket.parent.parent
        assert lock_holder(paths_for(first).pidfile) != lock_holder(paths_for(second).pidfile)
        assert ask(first_socket, small(upstream)).status == 200
        assert ask(second_socket, small(upstream)).status == 403
        # The same entries in another order are the same allowlist.
        reordered = settings_for(data_dir, f"127.0.0.1:{echo.port}", f"127.0.0.1:{upstream.port}")
        both = settings_for(data_dir, f"127.0.0.1:{upstream.port}", f"127.0.0.1:{echo.port}")
        assert paths_for(reordered) == paths_for(both)


def _mode(path: Path) -> tuple[str, int]:
    info = path.stat()
    return oct(info.st_mode & 0o7777), info.st_gid


def test_socket_permissions_without_and_with_a_jail_group(
    data_dir: Path, upstream: UpstreamServer, stopped_after: Callable[[ProxyPaths], ProxyPaths]
) -> None:
    settings = settings_for(data_dir, f"127.0.0.1:{upstream.port}")
    open_paths = stopped_after(paths_for(settings))
    open_socket = ensure_proxy(settings)
    gid = os.getegid()
    assert _mode(open_socket.parent.parent) == ("0o711", gid)
    assert _mode(open_socket.parent) == ("0o711", gid)
    assert _mode(open_socket) == ("0o666", gid)
    for private in (open_paths.pidfile, open_paths.lockfile, open_paths.log, open_paths.stderr):
        assert _mode(private) == ("0o600", gid), private
    if os.geteuid() != 0:
        pytest.skip("giving the socket to another group needs root")
    jail_socket = ensure_proxy(settings, jail_gid=65534)
    stopped_after(paths_for(settings, jail_gid=65534))
    assert jail_socket.parent != open_socket.parent
    assert _mode(jail_socket.parent) == ("0o710", 65534)
    assert _mode(jail_socket) == ("0o660", 65534)


def _connects_as(uid: int, gid: int, socket_path: Path) -> str:
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "except OSError as exc:\n"
        "    print(type(exc).__name__)\n"
        "else:\n"
        "    print('connected')\n"
    )
    argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    argv += ["/usr/bin/python3", "-I", "-c", probe, str(socket_path)]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")
def test_only_the_jail_group_reaches_a_group_socket(
    data_dir: Path, upstream: UpstreamServer, stopped_after: Callable[[ProxyPaths], ProxyPaths]
) -> None:
    if shutil.which("setpriv") is None:
        skip_or_fail("setpriv (util-linux) is missing")
    settings = settings_for(data_dir, f"127.0.0.1:{upstream.port}")
    stopped_after(paths_for(settings, jail_gid=65534))
    socket_path = ensure_proxy(settings, jail_gid=65534)
    assert _connects_as(65534, 65534, socket_path) == "connected\n"
    assert _connects_as(65533, 65533, socket_path) == "PermissionError\n"
    assert _connects_as(65534, 65533, socket_path) == "PermissionError\n"
    # Without a group, any uid that can traverse the data dir connects.
    stopped_after(paths_for(settings))
    assert _connects_as(65533, 65533, ensure_proxy(settings)) == "connected\n"


def test_a_socket_path_longer_than_sun_path_works(
    upstream: UpstreamServer,
    stopped_after: Callable[[ProxyPaths], ProxyPaths],
    tmp_path: Path,
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    settings = settings_for(deep, f"127.0.0.1:{upstream.port}")
    paths = stopped_after(paths_for(settings))
    assert len(str(paths.socket)) > 108
    assert ensure_proxy(settings) == paths.socket
    assert ask(paths.socket, small(upstream)).status == 200


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory to another uid needs root")
def test_an_egress_directory_of_another_uid_is_refused(data_dir: Path) -> None:
    settings = settings_for(data_dir, "api.anthropic.com:443")
    root = paths_for(settings).socket.parent.parent
    root.mkdir()
    os.chown(root, 65534, 65534)
    with pytest.raises(EgressProxyError) as caught:
        ensure_proxy(settings)
    assert caught.value.reason == "egress-directory"
    assert str(root) in caught.value.message


def test_a_daemon_that_cannot_start_is_one_clear_error(data_dir: Path) -> None:
    settings = settings_for(data_dir, "api.anthropic.com:443")
    paths = paths_for(settings)
    paths.pidfile.parent.mkdir(mode=0o711)
    paths.log.mkdir()  # the daemon cannot open its log
    with pytest.raises(EgressProxyError) as caught:
        ensure_proxy(settings)
    assert caught.value.reason == "egress-proxy-start"
    assert "IsADirectoryError" in caught.value.message
    assert daemons_for(paths) == []


def test_a_daemon_whose_data_dir_is_removed_exits(upstream: UpstreamServer) -> None:
    """Its socket is gone with the directory, so nothing can reach it any more: it exits
    (a test's or a bench's temporary data dir no longer leaves a daemon behind)."""
    with short_data_dir() as data_dir:
        settings = settings_for(data_dir, f"127.0.0.1:{upstream.port}")
        paths = paths_for(settings)
        socket_path = ensure_proxy(settings)
        pid = lock_holder(paths.pidfile)
        assert pid is not None
        assert ask(socket_path, small(upstream)).status == 200
        shutil.rmtree(data_dir / "egress")
        process = psutil.Process(pid)
        try:
            process.wait(timeout=60)  # a hang guard: it looks every couple of seconds
        except psutil.TimeoutExpired:
            process.kill()  # its pidfile went with the directory
            raise
        assert daemons_for(paths) == []


_PRIVILEGE_FIELDS = (
    "Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs",
)  # fmt: skip
NO_CAPABILITY = "0000000000000000"


def _privileges(pid: int) -> dict[str, str]:
    """What /proc says the process may do: its ids, groups, capability sets, no_new_privs."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in _PRIVILEGE_FIELDS:
            fields[name] = value.strip()
    return fields


def _unprivileged(uid: int) -> dict[str, str]:
    ids = "\t".join([str(uid)] * 4)  # real, effective, saved, filesystem
    capabilities = dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"), NO_CAPABILITY)
    return {"Uid": ids, "Gid": ids, "Groups": "", **capabilities, "NoNewPrivs": "1"}


@pytest.mark.skipif(os.geteuid() != 0, reason="only a daemon started by root has rights to drop")
@pytest.mark.parametrize(
    ("jail_gid", "runs_as"),
    [(None, 65534), (TEST_UIDS[0], TEST_UIDS[0])],
    ids=["no-jail-group", "jail-group"],
)
def test_a_root_daemon_parses_requests_unprivileged(
    data_dir: Path,
    upstream: UpstreamServer,
    stopped_after: Callable[[ProxyPaths], ProxyPaths],
    jail_gid: int | None,
    runs_as: int,
) -> None:
    """The proxy parses hostile agents' HTTP: once its socket is bound it is a uid of no
    one (the uid range's first id, which no sandbox gets; nobody without a range), with no
    group, no capability in any set and no way back through an exec."""
    settings = settings_for(data_dir, f"127.0.0.1:{upstream.port}")
    paths = stopped_after(paths_for(settings, jail_gid=jail_gid))
    socket_path = ensure_proxy(settings, jail_gid=jail_gid)
    pid = lock_holder(paths.pidfile)
    assert pid is not None
    assert _privileges(pid) == _unprivileged(runs_as)
    assert ask(socket_path, small(upstream)).status == 200
    connect = f"CONNECT 127.0.0.1:{upstream.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    with connect_unix(socket_path, timeout=60) as tunnel:
        tunnel.sendall(connect)
        assert tunnel.recv(12) == b"HTTP/1.1 200"
    # What it made as root stays the fleet's: the socket's group, its files' modes.
    assert _mode(socket_path) == (("0o666", 0) if jail_gid is None else ("0o660", jail_gid))
    for private in (paths.pidfile, paths.log, paths.stderr):
        assert (oct(private.stat().st_mode & 0o7777), private.stat().st_uid) == ("0o600", 0)
    # Both requests went into the log it opened as root and still writes.
    assert [e["event"] for e in ProxyLog(paths.log).events()] == [
        "egress.started", "egress.allowed", "egress.allowed",
    ]  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0, reason="only a daemon started by root has rights to drop")
def test_an_unprivileged_daemon_still_resolves_names(
    data_dir: Path, stopped_after: Callable[[ProxyPaths], ProxyPaths]
) -> None:
    """A name's lookup runs in a thread of the executor, with the IDNA codec: modules the
    daemon loads before it drops, since its interpreter may live where its uid cannot read
    (a pyenv under /root)."""
    name = socket.gethostname()
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)}
    except OSError:
        pytest.skip(f"this host's name {name} does not resolve")
    if not all(ipaddress.ip_address(address).is_loopback for address in addresses):
        pytest.skip(f"this host's name {name} does not resolve to loopback alone")
    settings = settings_for(data_dir, f"{name}:80")
    paths = stopped_after(paths_for(settings))
    socket_path = ensure_proxy(settings)
    pid = lock_holder(paths.pidfile)
    assert pid is not None
    assert _privileges(pid) == _unprivileged(65534)
    reply = ask(socket_path, f"GET http://{name}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert (reply.status, reply.headers["x-proxy-error"]) == (403, "blocked-address")


@pytest.mark.skipif(os.geteuid() != 0, reason="only a daemon started by root has rights to drop")
def test_an_unprivileged_daemon_rotates_the_log_it_opened_as_root(
    data_dir: Path, upstream: UpstreamServer, stopped_after: Callable[[ProxyPaths], ProxyPaths]
) -> None:
    """The log's rotation renamed files in the fleet's egress directory, which the daemon
    can no longer write: it now copies between the files it opened before it dropped."""
    settings = settings_for(data_dir, f"127.0.0.1:{upstream.port}")
    paths = stopped_after(paths_for(settings))
    paths.pidfile.parent.mkdir(mode=0o711)
    allow = f"127.0.0.1:{upstream.port}"
    argv = [
        sys.executable, "-m", "turnkeeper.sandbox.egress", "--socket", str(paths.socket),
        "--pidfile", str(paths.pidfile), "--log", str(paths.log), "--allow", allow,
        "--user", "65534", "--log-max-bytes", "2000",
    ]  # fmt: skip
    paths.socket.parent.mkdir(mode=0o711)
    subprocess.run(argv, check=True, timeout=60)
    requests = 80
    for _ in range(requests):
        assert ask(paths.socket, small(upstream)).status == 200
    generations = [Path(f"{paths.log}.2"), Path(f"{paths.log}.1"), paths.log]
    allowed = {"event": "egress.allowed", "host": "127.0.0.1", "port": upstream.port}
    events = [e for path in generations for e in ProxyLog(path).events()]
    # The start rotated out long ago: every line kept is a request's, each one whole.
    assert events == [{**allowed, "method": "GET"}] * len(events)
    # Each older file was full when it rolled: the line after it did not fit.
    texts = [path.read_bytes() for path in generations]
    for older, newer in itertools.pairwise(texts):
        next_line = newer.split(b"\n", 1)[0] + b"\n"
        assert len(older) <= 2000 < len(older) + len(next_line)


@pytest.mark.skipif(os.geteuid() != 0, reason="only a daemon started by root has rights to drop")
def test_a_root_without_setpcap_still_drops_its_uid(
    data_dir: Path, upstream: UpstreamServer, stopped_after: Callable[[ProxyPaths], ProxyPaths]
) -> None:
    """Some containers' root may not empty its bounding set: the daemon becomes its uid
    all the same, with no capability it could use and no_new_privs against any exec."""
    settings = settings_for(data_dir, f"127.0.0.1:{upstream.port}")
    paths = stopped_after(paths_for(settings))
    paths.socket.parent.mkdir(parents=True, mode=0o711)
    argv = [
        "setpriv", "--bounding-set=-setpcap", "--",
        sys.executable, "-m", "turnkeeper.sandbox.egress", "--socket", str(paths.socket),
        "--pidfile", str(paths.pidfile), "--log", str(paths.log),
        "--allow", f"127.0.0.1:{upstream.port}", "--user", "65534",
    ]  # fmt: skip
    subprocess.run(argv, check=True, timeout=60)
    pid = lock_holder(paths.pidfile)
    assert pid is not None
    privileges = _privileges(pid)
    assert int(privileges.pop("CapBnd"), 16) & (1 << 8) == 0  # CAP_SETPCAP, as it was given
    expected = _unprivileged(65534)
    del expected["CapBnd"]
    assert privileges == expected
    assert ask(paths.socket, small(upstream)).status == 200
