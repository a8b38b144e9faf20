"""The egress proxy's bounds: concurrent connections, a slow request head, idle tunnels.

Each test starts the daemon directly with small limits (the options ``ensure_proxy``
leaves at their defaults) and waits for the proxy to act, with no bound on how fast.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.sandbox.egress_support import (
    EchoServer,
    ProxyLog,
    parse_reply,
    paths_for,
    read_all,
    serving,
    settings_for,
    short_data_dir,
    stop_daemon,
)
from turnkeeper.sandbox.egress import ProxyPaths
from turnkeeper.sandbox.egress.host import connect_unix

StartProxy = Callable[..., ProxyPaths]


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    with serving(server):
        yield server


@pytest.fixture
def start_proxy(echo: EchoServer) -> Iterator[StartProxy]:
    """Starts a daemon allowing the echo server, with the given limit options."""
    with ExitStack() as stack:

        def start(*options: str) -> ProxyPaths:
            data_dir = stack.enter_context(short_data_dir())
            paths = paths_for(settings_for(data_dir, f"127.0.0.1:{echo.port}"))
            paths.socket.parent.mkdir(parents=True)
            stack.callback(stop_daemon, paths)
            argv = [sys.executable, "-m", "turnkeeper.sandbox.egress"]
            argv += ["--socket", str(paths.socket), "--pidfile", str(paths.pidfile)]
            argv += ["--log", str(paths.log), "--allow", f"127.0.0.1:{echo.port}", *options]
            subprocess.run(argv, check=True, timeout=60)
            return paths

        yield start


def open_tunnel(socket_path: Path, port: int) -> socket.socket:
    sock = connect_unix(socket_path, timeout=60)
    sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += sock.recv(1)
    assert head == b"HTTP/1.1 200 Connection established\r\n\r\n"
    sock.sendall(b"ping")
    assert sock.recv(4) == b"ping"
    return sock


def test_connections_past_the_limit_get_503(start_proxy: StartProxy, echo: EchoServer) -> None:
    paths = start_proxy("--max-connections", "2")
    first, second = open_tunnel(paths.socket, echo.port), open_tunnel(paths.socket, echo.port)
    with connect_unix(paths.socket, timeout=60) as third:
        reply = parse_reply(read_all(third))
    assert (reply.status, reply.headers["x-proxy-error"]) == (503, "too-many-connections")
    assert echo.accepted == 2
    first.close()
    for _ in range(600):  # hang guard while the proxy notices the first one closed
        with connect_unix(paths.socket, timeout=60) as probe:
            probe.sendall(f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            if probe.recv(12) == b"HTTP/1.1 200":
                break
        time.sleep(0.05)
    else:
        pytest.fail("a freed connection slot never became usable")
    second.sendall(b"still open")  # the limit never touched an established tunnel
    assert second.recv(10) == b"still open"
    second.close()
    events = [event["event"] for event in ProxyLog(paths.log).events()]
    assert events[:4] == ["egress.started", "egress.allowed", "egress.allowed", "egress.overloaded"]


def test_a_request_head_that_never_completes_gets_408(start_proxy: StartProxy) -> None:
    paths = start_proxy("--head-timeout", "0.5")
    with connect_unix(paths.socket, timeout=60) as sock:
        sock.sendall(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: x\r\n")  # no blank line, ever
        reply = parse_reply(read_all(sock))
    assert (reply.status, reply.headers["x-proxy-error"]) == (408, "head-timeout")


def test_an_idle_tunnel_is_closed_on_both_sides(start_proxy: StartProxy, echo: EchoServer) -> None:
    paths = start_proxy("--idle-timeout", "0.5")
    with open_tunnel(paths.socket, echo.port) as tunnel:
        assert tunnel.recv(1) == b""  # the proxy closed it: nothing moved for the idle timeout
    events = [(e["event"], e.get("port")) for e in ProxyLog(paths.log).events()]
    assert events == [
        ("egress.started", None),
        ("egress.allowed", echo.port),
        ("egress.idle", echo.port),
    ]
