"""The egress proxy daemon: ``python -m turnkeeper.sandbox.egress --socket ... --allow ...``.

Started by ``ensure_proxy`` with a minimal environment. The process it starts forks the
daemon (a new session, reparented away from the worker) and exits once the daemon
listens, or with 1 if it failed, so its starter never polls and never leaves a zombie.
The daemon makes itself non-dumpable, holds an exclusive lock on its pidfile for its
whole life, replaces a dead predecessor's socket, and logs JSON lines to a rotating file.
Started by root, it binds its socket and opens its files as root, then becomes ``--user``
for good (``drop_privileges``) before it reads a byte of any agent's HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures.thread  # noqa: F401 - see below
import contextlib
import ctypes
import encodings.idna
import encodings.unicode_escape  # noqa: F401 - see below
import fcntl
import logging
import os
import signal
import socket
import sys
from pathlib import Path

import structlog

from turnkeeper.config import parse_egress_allowlist
from turnkeeper.sandbox.egress.host import short_path
from turnkeeper.sandbox.egress.proxy import EgressProxy, Limits
from turnkeeper.sandbox.egress.target import Allowlist

# Modules the proxy would load lazily (the resolver's executor, the codec of every name
# lookup, the one a refused host is logged in) are loaded here: after the drop the daemon
# may not be able to read its interpreter's files (a pyenv under /root).

log = structlog.get_logger(__name__)

_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_CAPABILITY_VERSION_3 = 0x20080522
_LOG_BYTES = 8 * 1024 * 1024
_LOG_BACKUPS = 2
_BACKLOG = 1024
_WATCH_SECONDS = 2.0  # how often the daemon checks that its socket is still its own


def make_non_dumpable() -> None:
    """No core dumps, no ptrace and no ``/proc/<pid>/mem`` for same-uid processes (Linux)."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


def drop_privileges(uid: int) -> None:
    """Become ``uid`` (and its own number as the only group) for good, Linux only.

    The proxy parses HTTP written by hostile agents: a flaw there must not hand anyone
    root. So nothing of root is kept: no supplementary group, an empty bounding set (no
    exec can gain a capability back), real, effective and saved ids all ``uid`` (no
    way back by ``setuid``), the inheritable set cleared, ``no_new_privs`` (no setuid
    binary), and non-dumpable again, as changing uid may have reset it.
    """
    os.setgroups([])
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    # A root without CAP_SETPCAP (some containers') cannot: no_new_privs closes exec anyway.
    with contextlib.suppress(PermissionError):
        for capability in range(last + 1):  # while CAP_SETPCAP is still ours
            _prctl(_PR_CAPBSET_DROP, capability)
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # clears the permitted, effective and ambient sets
    none = (_CapData * 2)()
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.capset(ctypes.byref(header), none) != 0:
        raise OSError(ctypes.get_errno(), "capset (clearing the inheritable set) failed")
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    make_non_dumpable()
    if os.getresuid() != (uid,) * 3 or os.getresgid() != (uid,) * 3 or os.getgroups():
        raise OSError(f"the egress proxy could not become uid {uid}")


def is_dumpable() -> bool:
    if sys.platform != "linux":
        return True
    return bool(ctypes.CDLL(None).prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0))


def _parser() -> argparse.ArgumentParser:
    defaults = Limits()
    parser = argparse.ArgumentParser(prog="python -m turnkeeper.sandbox.egress")
    parser.add_argument("--socket", type=Path, required=True, help="unix socket to listen on")
    parser.add_argument("--pidfile", type=Path, required=True, help="held locked while alive")
    parser.add_argument("--log", type=Path, required=True, help="JSON log file (rotated)")
    parser.add_argument("--allow", required=True, help="comma-separated host:port entries")
    parser.add_argument("--group", type=int, help="gid that may connect (else: everyone)")
    parser.add_argument("--user", type=int, help="uid (and gid) to become once listening")
    parser.add_argument("--log-max-bytes", type=int, default=_LOG_BYTES, help="then rotate")
    parser.add_argument("--max-connections", type=int, default=defaults.max_connections)
    parser.add_argument("--max-head-bytes", type=int, default=defaults.max_head_bytes)
    parser.add_argument("--head-timeout", type=float, default=defaults.head_timeout)
    parser.add_argument("--idle-timeout", type=float, default=defaults.idle_timeout)
    parser.add_argument("--connect-timeout", type=float, default=defaults.connect_timeout)
    return parser


class HeldRotatingHandler(logging.Handler):
    """RotatingFileHandler's policy (``max_bytes`` a file, ``backups`` older files) over
    files opened once, as root, before the daemon drops its privileges: a rollover copies
    each file one generation down and empties the live one, where RotatingFileHandler
    renames files in the fleet's egress directory, which the daemon can no longer write."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        names = [path, *(Path(f"{path}.{n}") for n in range(1, backups + 1))]
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        self.fds = [os.open(name, flags, 0o600) for name in names]
        """The live log first, then ever older generations."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = f"{self.format(record)}\n".encode()
            live = self.fds[0]
            if os.fstat(live).st_size + len(line) > self.max_bytes:
                self._roll()
            os.write(live, line)
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)

    def _roll(self) -> None:
        for newer, older in reversed(list(zip(self.fds, self.fds[1:], strict=False))):
            os.ftruncate(older, 0)
            offset = 0
            while chunk := os.pread(newer, 1024 * 1024, offset):
                os.write(older, chunk)
                offset += len(chunk)
        os.ftruncate(self.fds[0], 0)

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        super().close()


def _configure_logging(path: Path, max_bytes: int = _LOG_BYTES) -> None:
    handler = HeldRotatingHandler(path, max_bytes, _LOG_BACKUPS)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )


def _hold_pidfile(path: Path) -> int | None:
    """The pidfile's descriptor, locked for this process's life; None if another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _listen(path: Path, group: int | None) -> socket.socket:
    """A listening socket at ``path``, replacing a dead daemon's (the pidfile lock says so)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with short_path(path) as address:
        alias = Path(address)
        alias.unlink(missing_ok=True)
        sock.bind(address)  # 0600 under our umask until the mode below is set
        if group is not None:
            os.chown(alias, -1, group)
        alias.chmod(0o666 if group is None else 0o660)
    sock.listen(_BACKLOG)
    sock.setblocking(False)
    return sock


async def _serve(proxy: EgressProxy, sock: socket.socket, path: Path, socket_fd: int) -> None:
    serving = asyncio.ensure_future(proxy.serve(sock))
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, serving.cancel)
    watch = asyncio.ensure_future(_stop_when_unreachable(path, socket_fd, serving))
    with contextlib.suppress(asyncio.CancelledError):
        await serving
    watch.cancel()


def _still_linked(socket_fd: int) -> bool:
    """Whether the socket file this daemon bound still has a name: once it was unlinked
    (its data directory removed, or another daemon bound the path anew) nothing can
    connect to it. Asked of a descriptor, not the path: after the drop the daemon may
    not traverse the fleet's directories."""
    return os.fstat(socket_fd).st_nlink > 0


async def _stop_when_unreachable(path: Path, socket_fd: int, serving: asyncio.Future[None]) -> None:
    """Stop once no new connection can reach this daemon. Without this, a host whose
    data directory went (a test's, a bench's, a reinstall) kept the daemon for good."""
    while True:
        await asyncio.sleep(_WATCH_SECONDS)
        if _still_linked(socket_fd):
            continue
        log.info("egress.unreachable", socket=str(path))
        serving.cancel()
        return


def _run(args: argparse.Namespace, ready_fd: int) -> int:
    """The daemon's life; writes ``ok`` (listening) or ``running`` (another one is) to ready."""
    os.setsid()
    os.umask(0o077)
    make_non_dumpable()
    allowlist = parse_egress_allowlist(args.allow)
    if _hold_pidfile(args.pidfile) is None:
        os.write(ready_fd, b"running")
        return 0
    _configure_logging(args.log, args.log_max_bytes)
    sock = _listen(args.socket, args.group)
    socket_fd = os.open(args.socket, os.O_PATH | os.O_CLOEXEC)
    if args.user is not None:
        socket.getaddrinfo("localhost", None)  # the resolver's libraries, loaded while root
        drop_privileges(args.user)
    limits = Limits(
        max_connections=args.max_connections,
        max_head_bytes=args.max_head_bytes,
        head_timeout=args.head_timeout,
        idle_timeout=args.idle_timeout,
        connect_timeout=args.connect_timeout,
    )
    log.info(
        "egress.started",
        pid=os.getpid(),
        socket=str(args.socket),
        allow=list(allowlist),
        dumpable=is_dumpable(),
        uid=os.getuid(),
    )
    os.write(ready_fd, b"ok")
    os.close(ready_fd)
    asyncio.run(_serve(EgressProxy(Allowlist(allowlist), limits), sock, args.socket, socket_fd))
    # Still ours (no successor bound the path anew): remove it, if this uid still may.
    with contextlib.suppress(FileNotFoundError, PermissionError):
        if _still_linked(socket_fd) and args.socket.stat().st_ino == os.fstat(socket_fd).st_ino:
            args.socket.unlink()
    log.info("egress.stopped", pid=os.getpid())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    ready_read, ready_write = os.pipe()
    if os.fork() > 0:
        os.close(ready_write)
        with os.fdopen(ready_read, "rb") as ready:
            answer = ready.read()
        return 0 if answer in {b"ok", b"running"} else 1
    os.close(ready_read)
    return _run(args, ready_write)  # a failure's traceback goes to stderr, KEY.stderr
