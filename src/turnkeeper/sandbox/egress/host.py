"""The egress proxy as workers see it: one daemon per host and allowlist, found by path.

Agents outlive the worker that started them, so the proxy cannot live in a worker: the
first worker that needs it starts a detached daemon (``python -m
turnkeeper.sandbox.egress``), and every later one finds it under the data dir:

    DATA_DIR/egress/                 0711, owned by the fleet's uid
        KEY/proxy.sock               the socket, alone in its directory (the jail binds it)
        KEY.lock KEY.pid KEY.log     start lock, the daemon's lifetime lock, its log (0600)

``KEY`` is derived from the allowlist (and the jail's group), so a changed
``TURNKEEPER_SANDBOX_EGRESS`` gets a proxy of its own and applies to new sandboxes. A
file lock makes concurrent workers start exactly one daemon; the daemon holds an
exclusive lock on its pidfile for its whole life, so "is it alive" never trusts a
recycled pid. A daemon that died is replaced on the same socket path.

Started by root, the daemon runs as ``proxy_uid(jail_gid)`` once its socket is bound.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import filelock
import structlog

import turnkeeper
from turnkeeper.config import Settings
from turnkeeper.errors import EgressProxyError
from turnkeeper.sandbox.egress.proxy import HEALTH_PATH

log = structlog.get_logger(__name__)

SOCKET_NAME = "proxy.sock"
_START_TIMEOUT = 30.0
_HEALTH_TIMEOUT = 5.0
_POLL_INTERVAL = 0.05
_STDERR_TAIL = 2000
# The daemon's whole environment: nothing of the fleet, no TURNKEEPER_* and no secret.
_DAEMON_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NOBODY = 65534


@dataclass(frozen=True)
class ProxyPaths:
    """Where one proxy daemon keeps its socket, locks and log."""

    socket: Path
    pidfile: Path
    lockfile: Path
    log: Path
    stderr: Path


def proxy_paths(settings: Settings, *, jail_gid: int | None = None) -> ProxyPaths:
    """The paths of the proxy for this allowlist and jail group (nothing is created)."""
    identity = "\n".join([*sorted(settings.sandbox_egress), f"gid={jail_gid}"])
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    root = settings.data_dir.resolve() / "egress"
    return ProxyPaths(
        socket=root / key / SOCKET_NAME,
        pidfile=root / f"{key}.pid",
        lockfile=root / f"{key}.lock",
        log=root / f"{key}.log",
        stderr=root / f"{key}.stderr",
    )


def ensure_proxy(settings: Settings, *, jail_gid: int | None = None) -> Path:
    """The socket of this host's egress proxy for ``settings.sandbox_egress``, started if needed.

    With ``jail_gid``, the socket directory and socket belong to that group (0710, 0660):
    only the fleet's uid and jailed agents running with that group can connect. Without
    it they are 0711 and 0666, reachable by any uid that can traverse the data dir.
    """
    paths = proxy_paths(settings, jail_gid=jail_gid)
    if answers(paths.socket):
        return paths.socket
    _prepare_directories(settings.data_dir, paths, jail_gid)
    try:
        with filelock.FileLock(paths.lockfile, mode=0o600, timeout=3 * _START_TIMEOUT):
            if not answers(paths.socket):
                _stop_unresponsive(paths.pidfile)
                _start(paths, settings.sandbox_egress, jail_gid)
    except filelock.Timeout:
        raise EgressProxyError(
            "another worker holds the egress proxy's start lock for too long",
            reason="egress-proxy-lock",
            lockfile=str(paths.lockfile),
        ) from None
    return paths.socket


@contextlib.contextmanager
def short_path(path: Path) -> Iterator[str]:
    """A name for ``path`` that fits a unix socket address (108 bytes), however deep it is."""
    dir_fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{dir_fd}/{path.name}"
    finally:
        os.close(dir_fd)


def connect_unix(path: Path, timeout: float) -> socket.socket:
    """A connected stream socket to the unix socket at ``path``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        with short_path(path) as address:
            sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def answers(path: Path) -> bool:
    """True when a proxy listens at ``path`` and answers a health request."""
    request = b"GET " + HEALTH_PATH + b" HTTP/1.1\r\nHost: egress\r\n\r\n"
    try:
        with connect_unix(path, _HEALTH_TIMEOUT) as sock:
            sock.sendall(request)
            return sock.recv(64).startswith(b"HTTP/1.1 ")  # busy (503) is alive too
    except OSError:
        return False


def lock_holder(pidfile: Path) -> int | None:
    """The pid of the live daemon holding ``pidfile``, or None when no daemon holds it."""
    try:
        fd = os.open(pidfile, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        else:
            return None
        for _ in range(200):  # a daemon writes its pid right after it takes the lock
            file.seek(0)
            text = file.read().strip()
            if text.isdigit():
                return int(text)
            time.sleep(_POLL_INTERVAL / 5)
    raise EgressProxyError(f"{pidfile} is locked but names no process", reason="egress-pidfile")


def stop_proxies(data_dir: Path) -> int:
    """SIGTERM every proxy daemon of this data dir (``dev`` and ``demo`` own theirs, and
    stop them with the stack); how many were running."""
    stopped = 0
    for pidfile in sorted((data_dir.resolve() / "egress").glob("*.pid")):
        pid = lock_holder(pidfile)
        if pid is None:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            stopped += 1
        deadline = time.monotonic() + _START_TIMEOUT
        while lock_holder(pidfile) is not None and time.monotonic() < deadline:
            time.sleep(_POLL_INTERVAL)
    return stopped


def _own_directory(path: Path, mode: int, gid: int | None = None) -> None:
    """Creates ``path`` or checks it: a real directory of ours, with exactly ``mode``."""
    try:
        path.mkdir(mode=mode, exist_ok=True)
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise EgressProxyError(
                f"{path} must be a directory owned by uid {os.geteuid()}",
                reason="egress-directory",
            )
        if gid is not None and info.st_gid != gid:
            os.chown(path, -1, gid)
        if stat.S_IMODE(info.st_mode) != mode:
            path.chmod(mode)
    except OSError as exc:
        raise EgressProxyError(
            f"cannot prepare the egress directory {path}: {exc}", reason="egress-directory"
        ) from exc


def _prepare_directories(data_dir: Path, paths: ProxyPaths, jail_gid: int | None) -> None:
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EgressProxyError(
            f"cannot create {data_dir}: {exc}", reason="egress-directory"
        ) from exc
    _own_directory(paths.socket.parent.parent, 0o711)
    _own_directory(paths.socket.parent, 0o711 if jail_gid is None else 0o710, jail_gid)


def _stop_unresponsive(pidfile: Path) -> None:
    """Kills a daemon that holds its lock but does not answer, and waits until it is gone."""
    pid = lock_holder(pidfile)
    if pid is None:
        return
    log.warning("egress.proxy_unresponsive", pid=pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + _START_TIMEOUT
    while lock_holder(pidfile) is not None:
        if time.monotonic() > deadline:
            raise EgressProxyError("an unresponsive egress proxy did not exit", pid=pid)
        time.sleep(_POLL_INTERVAL)


def _daemon_environment() -> dict[str, str]:
    package_root = Path(turnkeeper.__file__).resolve().parent.parent
    return {"PATH": _DAEMON_PATH, "LC_ALL": "C.UTF-8", "PYTHONPATH": str(package_root)}


def proxy_uid(jail_gid: int | None) -> int | None:
    """The uid (and gid) a daemon started by root becomes once it listens; None when its
    starter is not root and there is nothing to drop.

    With a jail group, that group's number: the first id of ``TURNKEEPER_SANDBOX_UIDS``,
    which the range sets aside and no sandbox gets as its uid, so the proxy shares its uid
    with no agent (none can signal or trace it) and with nothing else on the host.
    Without one (a root starter that jails nobody by uid: the ssh host logged in as root,
    tests) ``nobody``.
    """
    if os.geteuid() != 0:
        return None
    return NOBODY if jail_gid is None else jail_gid


def _start(paths: ProxyPaths, allowlist: tuple[str, ...], jail_gid: int | None) -> None:
    """Starts the daemon and returns once it answers; its starter exits as soon as it listens."""
    argv = [
        sys.executable, "-P", "-m", "turnkeeper.sandbox.egress",
        "--socket", str(paths.socket),
        "--pidfile", str(paths.pidfile),
        "--log", str(paths.log),
        "--allow", ",".join(allowlist),
    ]  # fmt: skip
    if jail_gid is not None:
        argv += ["--group", str(jail_gid)]
    uid = proxy_uid(jail_gid)
    if uid is not None:
        argv += ["--user", str(uid)]
    stderr_fd = os.open(paths.stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        starter = subprocess.run(
            argv,
            env=_daemon_environment(),
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr_fd,
            timeout=_START_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        starter = None
    finally:
        os.close(stderr_fd)
    if starter is None or starter.returncode != 0 or not answers(paths.socket):
        tail = paths.stderr.read_text(errors="replace")[-_STDERR_TAIL:].strip()
        raise EgressProxyError(
            f"the egress proxy did not start: {tail or 'no output'}",
            reason="egress-proxy-start",
            socket=str(paths.socket),
        )
    log.info("egress.proxy_started", socket=str(paths.socket), pid=lock_holder(paths.pidfile))
