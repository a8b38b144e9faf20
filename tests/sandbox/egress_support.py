"""Real servers and a raw client for the egress proxy tests.

Upstreams are loopback servers in threads that count every connection they accept, so a
test can prove that a refused request never dialled. The client speaks raw bytes over the
proxy's unix socket, so a test sees exactly what the proxy answers.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import signal
import socket
import socketserver
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from turnkeeper.config import Settings
from turnkeeper.sandbox.egress import (
    ProxyPaths,
    jail_bind_args,
    lock_holder,
    proxy_paths,
    with_forwarder,
)
from turnkeeper.sandbox.egress.host import connect_unix

CHUNK = 64 * 1024


@functools.lru_cache(maxsize=8)
def pattern(size: int) -> bytes:
    """``size`` deterministic, non-repeating-looking bytes."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(counter.to_bytes(8, "big")).digest()
        counter += 1
    return bytes(out[:size])


class _Counting:
    """Counts accepted connections (mixed into socketserver servers)."""

    accepted: int

    def get_request(self) -> tuple[socket.socket, Any]:
        request: tuple[socket.socket, Any] = super().get_request()  # type: ignore[misc]
        with self.lock:
            self.accepted += 1
        return request

    lock = threading.Lock()


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(CHUNK):
            self.request.sendall(data)
        self.request.shutdown(socket.SHUT_WR)


class EchoServer(_Counting, socketserver.ThreadingTCPServer):
    """Echoes every byte back until the client half-closes, then half-closes too."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.accepted = 0
        super().__init__(("127.0.0.1", 0), _EchoHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


@dataclass
class SeenRequest:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body_sha256: str = ""
    body_length: int = 0


class _UpstreamHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: UpstreamServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = bytearray()
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in {b"\r\n", b"\n", b""}:
                pass
            return bytes(body)
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def _record(self, body: bytes = b"") -> None:
        self.server.seen.append(
            SeenRequest(
                method=self.command,
                path=self.path,
                headers=[(name.lower(), value) for name, value in self.headers.items()],
                body_sha256=hashlib.sha256(body).hexdigest(),
                body_length=len(body),
            )
        )

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._record()
        kind, _, size = urlsplit(self.path).path.strip("/").partition("/")
        if kind == "small":
            self._send(200, b"hello through the proxy\n", {"X-Upstream": "small"})
        elif kind == "large":
            self.send_response(200)
            self.send_header("Content-Length", size)
            self.end_headers()
            body = pattern(int(size))
            for start in range(0, len(body), CHUNK):
                self.wfile.write(body[start : start + CHUNK])
        elif kind == "chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            body = pattern(int(size))
            for start in range(0, len(body), CHUNK):
                piece = body[start : start + CHUNK]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self._send(404, b"no such path\n")

    def do_POST(self) -> None:
        body = self._read_body()
        self._record(body)
        self._send(201, body, {"Content-Type": "application/octet-stream"})


class UpstreamServer(_Counting, ThreadingHTTPServer):
    """``GET /small``, ``GET /large/N`` (Content-Length), ``GET /chunked/N``, ``POST /echo``."""

    daemon_threads = True

    def __init__(self) -> None:
        self.accepted = 0
        self.seen: list[SeenRequest] = []
        super().__init__(("127.0.0.1", 0), _UpstreamHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


@contextlib.contextmanager
def serving(server: socketserver.BaseServer) -> Iterator[None]:
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def free_port() -> int:
    """A loopback port nothing listens on (bound and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    head: bytes = b""


def _dechunk(data: bytes) -> bytes:
    body = bytearray()
    position = 0
    while True:
        line_end = data.index(b"\r\n", position)
        size = int(data[position:line_end].split(b";")[0], 16)
        if size == 0:
            return bytes(body)
        body += data[line_end + 2 : line_end + 2 + size]
        position = line_end + 2 + size + 2


def parse_reply(raw: bytes) -> Reply:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunk(body)
    return Reply(status=int(lines[0].split(" ")[1]), headers=headers, body=body, head=head)


def read_all(sock: socket.socket) -> bytes:
    out = bytearray()
    while data := sock.recv(CHUNK):
        out += data
    return bytes(out)


def ask(socket_path: Path, request: bytes, body: bytes = b"") -> Reply:
    """Sends one raw request (and body) through the proxy and reads the whole reply."""
    with connect_unix(socket_path, timeout=60) as sock:
        sock.sendall(request)
        if body:
            sender = threading.Thread(target=sock.sendall, args=(body,))
            sender.start()
            raw = read_all(sock)
            sender.join()
        else:
            raw = read_all(sock)
    return parse_reply(raw)


@contextlib.contextmanager
def short_data_dir() -> Iterator[Path]:
    """A data dir under /tmp that other uids may traverse (as a jail's bwrap must)."""
    path = Path(tempfile.mkdtemp(prefix="tk-egress-", dir="/tmp"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class ProxyLog:
    """The daemon's decisions, read from its JSON log file."""

    path: Path
    offset: int = field(default=0)

    def mark(self) -> None:
        self.offset = self.path.stat().st_size

    def events(self) -> list[dict[str, Any]]:
        """Every line logged since ``mark()``, without timestamp and level."""
        with self.path.open("rb") as file:
            file.seek(self.offset)
            lines = file.read().decode().splitlines()
        events = [json.loads(line) for line in lines]
        for event in events:
            event.pop("timestamp", None)
            event.pop("level", None)
        return events


def stop_daemon(paths: ProxyPaths) -> None:
    """SIGKILLs the proxy of ``paths`` if one runs, and waits until it is gone."""
    pid = lock_holder(paths.pidfile)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    for _ in range(600):  # hang guard: the kernel drops the lock as the process exits
        if lock_holder(paths.pidfile) is None:
            return
        time.sleep(0.05)
    raise AssertionError(f"the proxy {pid} still holds {paths.pidfile}")


def daemons_for(paths: ProxyPaths) -> list[int]:
    """Pids of every running proxy daemon serving this socket path."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "turnkeeper.sandbox.egress" in cmdline and str(paths.socket) in cmdline:
            found.append(proc.info["pid"])
    return sorted(found)


def settings_for(data_dir: Path, *entries: str) -> Settings:
    return Settings(data_dir=data_dir, sandbox_egress=",".join(entries))


def paths_for(settings: Settings, jail_gid: int | None = None) -> ProxyPaths:
    return proxy_paths(settings, jail_gid=jail_gid)


def _jail_base() -> list[str]:
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    argv += ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if Path(top).is_symlink():
            argv += ["--symlink", str(Path(top).readlink()), top]
        elif Path(top).is_dir():
            argv += ["--ro-bind", top, top]
    return argv


def jail_argv(socket_path: Path, command: list[str], env: dict[str, str]) -> list[str]:
    """A minimal jail as an unprivileged uid: /usr read-only, no network, the proxy bound in.

    The shape of the jail the bwrap provider builds; here only to carry the forwarder and
    a client, so the egress path is tested through a real network namespace.
    """
    argv = [*_jail_base(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    argv += [*jail_bind_args(socket_path), "--clearenv"]
    for name, value in {"PATH": "/usr/bin:/bin", **env}.items():
        argv += ["--setenv", name, value]
    return [*argv, "--", *with_forwarder(command)]


def jail_unavailable() -> str | None:
    """Why the jail tests cannot run here, or None."""
    for tool in ("bwrap", "socat", "curl", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/system-deps installs bubblewrap and socat)"
    if os.geteuid() != 0:
        return "running the jail as another uid (setpriv) needs root"
    probe = subprocess.run(
        [*_jail_base(), "--", "true"], capture_output=True, text=True, check=False, timeout=60
    )
    if probe.returncode != 0:
        return f"bwrap cannot create a jail here: {probe.stderr.strip()}"
    return None
