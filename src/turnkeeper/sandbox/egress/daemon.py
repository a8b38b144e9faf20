"""The egress proxy daemon: ``python -m turnkeeper.sandbox.egress --socket ... --allow ...``.

Started by ``ensure_proxy`` with a minimal environment. The process it starts forks the
daemon (a new session, reparented away from the worker) and exits once the daemon
listens, or with 1 if it failed, so its starter never polls and never leaves a zombie.
The daemon makes itself non-dumpable, holds an exclusive lock on its pidfile for its
whole life, replaces a dead predecessor's socket, and logs JSON lines to a rotating file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import fcntl
import logging
import os
import signal
import socket
import sys
from logging.handlers import RotatingFileHandler
from pathlib import Path

import structlog

from turnkeeper.config import parse_egress_allowlist
from turnkeeper.sandbox.egress.host import short_path
from turnkeeper.sandbox.egress.proxy import EgressProxy, Limits
from turnkeeper.sandbox.egress.target import Allowlist

log = structlog.get_logger(__name__)

_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4
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
    parser.add_argument("--max-connections", type=int, default=defaults.max_connections)
    parser.add_argument("--max-head-bytes", type=int, default=defaults.max_head_bytes)
    parser.add_argument("--head-timeout", type=float, default=defaults.head_timeout)
    parser.add_argument("--idle-timeout", type=float, default=defaults.idle_timeout)
    parser.add_argument("--connect-timeout", type=float, default=defaults.connect_timeout)
    return parser


def _configure_logging(path: Path) -> None:
    handler = RotatingFileHandler(path, maxBytes=_LOG_BYTES, backupCount=_LOG_BACKUPS)
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


async def _serve(proxy: EgressProxy, sock: socket.socket, path: Path) -> None:
    serving = asyncio.ensure_future(proxy.serve(sock))
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, serving.cancel)
    watch = asyncio.ensure_future(_stop_when_unreachable(path, serving))
    with contextlib.suppress(asyncio.CancelledError):
        await serving
    watch.cancel()


async def _stop_when_unreachable(path: Path, serving: asyncio.Future[None]) -> None:
    """Stop once no new connection can reach this daemon: its socket file is gone (its
    data directory was removed) or is another daemon's now. Without this, a host whose
    data directory went (a test's, a bench's, a reinstall) kept the daemon for good."""
    bound = path.stat().st_ino
    while True:
        await asyncio.sleep(_WATCH_SECONDS)
        try:
            if path.stat().st_ino == bound:
                continue
        except OSError:
            pass
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
    _configure_logging(args.log)
    sock = _listen(args.socket, args.group)
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
    )
    os.write(ready_fd, b"ok")
    os.close(ready_fd)
    bound = args.socket.stat().st_ino
    asyncio.run(_serve(EgressProxy(Allowlist(allowlist), limits), sock, args.socket))
    with contextlib.suppress(FileNotFoundError):
        if args.socket.stat().st_ino == bound:  # still ours: no successor replaced it
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
