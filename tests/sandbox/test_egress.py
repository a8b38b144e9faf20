"""The egress proxy over real sockets: tunnels, forwarding, refusals, and what it logs.

One daemon (started by ``ensure_proxy``) serves the module; upstreams are real loopback
servers that count their connections, so "refused" also means "never dialled".
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.sandbox.egress_support import (
    EchoServer,
    ProxyLog,
    UpstreamServer,
    ask,
    free_port,
    paths_for,
    pattern,
    read_all,
    serving,
    settings_for,
    short_data_dir,
    stop_daemon,
)
from turnkeeper.sandbox.egress import ensure_proxy
from turnkeeper.sandbox.egress.host import connect_unix

BLOCKED_BODY = b"egress to %s is not allowed\n"


@dataclass
class World:
    socket: Path
    log: ProxyLog
    http: UpstreamServer
    echo: EchoServer
    decoy: EchoServer  # listening, never listed: a dial to it would show
    dead_port: int  # listed, nothing listens

    def accepted(self) -> tuple[int, int, int]:
        return self.http.accepted, self.echo.accepted, self.decoy.accepted


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    http, echo, decoy = UpstreamServer(), EchoServer(), EchoServer()
    dead_port = free_port()
    with serving(http), serving(echo), serving(decoy), short_data_dir() as data_dir:
        settings = settings_for(
            data_dir, f"127.0.0.1:{http.port}", f"127.0.0.1:{echo.port}", f"127.0.0.1:{dead_port}"
        )
        paths = paths_for(settings)
        try:
            socket_path = ensure_proxy(settings)
            yield World(socket_path, ProxyLog(paths.log), http, echo, decoy, dead_port)
        finally:
            stop_daemon(paths)


@pytest.fixture
def fresh(world: World) -> World:
    """The world with its log marked and its upstream's records cleared."""
    world.log.mark()
    world.http.seen.clear()
    return world


def connect_request(authority: str) -> bytes:
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode("latin-1")


def get_request(url: str, host: str = "ignored.example") -> bytes:
    return f"GET {url} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode("latin-1")


def test_connect_tunnels_bytes_exactly_both_ways(fresh: World) -> None:
    payload = pattern(3 * 1024 * 1024 + 17)
    authority = f"127.0.0.1:{fresh.echo.port}"
    before = fresh.accepted()
    with connect_unix(fresh.socket, timeout=60) as sock:
        # The first tunnelled bytes ride in the same write as the request head.
        sock.sendall(connect_request(authority) + payload[:1000])
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += sock.recv(1)
        assert head == b"HTTP/1.1 200 Connection established\r\n\r\n"
        sock.sendall(payload[1000:])
        sock.shutdown(socket.SHUT_WR)
        echoed = read_all(sock)
    assert len(echoed) == len(payload)
    assert echoed == payload
    assert fresh.accepted() == (before[0], before[1] + 1, before[2])
    assert fresh.log.events() == [
        {
            "event": "egress.allowed",
            "host": "127.0.0.1",
            "port": fresh.echo.port,
            "method": "CONNECT",
        }
    ]


def test_forwarding_rebuilds_the_request_from_its_url(fresh: World) -> None:
    port = fresh.http.port
    request = (
        f"GET http://127.0.0.1:{port}/small?x=1&y=%20 HTTP/1.1\r\n"
        "Host: somewhere-else.example\r\n"
        "Proxy-Authorization: Basic c2VjcmV0\r\n"
        "Proxy-Connection: keep-alive\r\n"
        "Connection: keep-alive, X-Hop\r\n"
        "Keep-Alive: timeout=5\r\n"
        "X-Hop: dropped because Connection names it\r\n"
        "TE: trailers\r\n"
        "Upgrade: websocket\r\n"
        "X-Kept: yes\r\n"
        "\r\n"
    ).encode()
    reply = ask(fresh.socket, request)
    assert reply.status == 200
    assert reply.body == b"hello through the proxy\n"
    assert reply.headers["x-upstream"] == "small"
    assert reply.headers["connection"] == "close"
    assert reply.headers["content-length"] == str(len(reply.body))
    assert [(seen.method, seen.path, seen.headers) for seen in fresh.http.seen] == [
        (
            "GET",
            "/small?x=1&y=%20",
            [("host", f"127.0.0.1:{port}"), ("x-kept", "yes"), ("connection", "close")],
        )
    ]
    assert fresh.log.events() == [
        {"event": "egress.allowed", "host": "127.0.0.1", "port": port, "method": "GET"}
    ]


def test_the_host_is_matched_without_case_or_a_trailing_dot(fresh: World) -> None:
    port = fresh.http.port
    for spelling in (f"127.0.0.1.:{port}", f"127.0.0.1:{port}"):
        reply = ask(fresh.socket, get_request(f"HTTP://{spelling}/small"))
        assert reply.status == 200, spelling
    assert [seen.path for seen in fresh.http.seen] == ["/small", "/small"]


@pytest.mark.parametrize("kind", ["large", "chunked"])
def test_large_response_streams_through_intact(fresh: World, kind: str) -> None:
    size = 24 * 1024 * 1024 + 3
    reply = ask(fresh.socket, get_request(f"http://127.0.0.1:{fresh.http.port}/{kind}/{size}"))
    assert reply.status == 200
    assert len(reply.body) == size
    assert hashlib.sha256(reply.body).digest() == hashlib.sha256(pattern(size)).digest()


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_large_request_body_streams_through_intact(fresh: World, framing: str) -> None:
    body = pattern(12 * 1024 * 1024 + 5)
    url = f"http://127.0.0.1:{fresh.http.port}/echo"
    if framing == "content-length":
        head = f"POST {url} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        sent = body
    else:
        head = f"POST {url} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        pieces = [body[i : i + 100_000] for i in range(0, len(body), 100_000)]
        sent = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"
    reply = ask(fresh.socket, head.encode(), sent)
    assert reply.status == 201
    assert reply.body == body
    [seen] = fresh.http.seen
    assert (seen.method, seen.path, seen.body_length) == ("POST", "/echo", len(body))
    assert seen.body_sha256 == hashlib.sha256(body).hexdigest()
    framing_headers = [
        (n, v) for n, v in seen.headers if n in {"content-length", "transfer-encoding"}
    ]
    expected = (
        [("content-length", str(len(body)))]
        if framing == "content-length"
        else [("transfer-encoding", "chunked")]
    )
    assert framing_headers == expected


def test_expect_100_continue_is_answered_by_the_proxy(fresh: World) -> None:
    body = b"x" * 1000
    url = f"http://127.0.0.1:{fresh.http.port}/echo"
    head = (
        f"POST {url} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        "Expect: 100-continue\r\n\r\n"
    ).encode()
    with connect_unix(fresh.socket, timeout=60) as sock:
        sock.sendall(head)
        interim = b""
        while not interim.endswith(b"\r\n\r\n"):
            interim += sock.recv(1)
        assert interim == b"HTTP/1.1 100 \r\n\r\n"
        sock.sendall(body)
        raw = read_all(sock)
    assert raw.startswith(b"HTTP/1.1 201 Created\r\n")
    assert raw.endswith(b"\r\n\r\n" + body)
    [seen] = fresh.http.seen
    assert "expect" not in dict(seen.headers)


def _refusal_cases(http_port: int, decoy_port: int) -> list[tuple[bytes, str, object, object]]:
    """(request, logged reason, logged host, logged port) for every refused spelling."""
    p = http_port
    cases: list[tuple[bytes, str, object, object]] = []
    for host in (
        "localhost",
        "LocalHost",
        "127.1",
        "0x7f.1",
        "0x7f000001",
        "2130706433",
        "017700000001",
        "127.0.0.01",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "::ffff:127.0.0.1",
        "127.0.0.1%00",
        "127.0.0.1..",
    ):
        logged = host.lower().removesuffix(".")
        cases.append((connect_request(f"{host}:{p}"), "not-allowlisted", logged, p))
        cases.append((get_request(f"http://{host}:{p}/small"), "not-allowlisted", logged, p))
    for userinfo in ("user@", "user:secret@"):
        cases.append((connect_request(f"{userinfo}127.0.0.1:{p}"), "userinfo", "127.0.0.1", p))
        cases.append(
            (get_request(f"http://{userinfo}127.0.0.1:{p}/small"), "userinfo", "127.0.0.1", p)
        )
    cases.append(
        (connect_request(f"127.0.0.1:{decoy_port}"), "not-allowlisted", "127.0.0.1", decoy_port)
    )
    cases.append(
        (get_request(f"http://127.0.0.1:{decoy_port}/"), "not-allowlisted", "127.0.0.1", decoy_port)
    )
    for raw_host, shown in (
        ("127.0.0.1\x01", "127.0.0.1\\x01"),
        ("127.0.0.1\x7f", "127.0.0.1\\x7f"),
    ):
        cases.append(
            (connect_request(f"{raw_host}:{p}"), "control-characters", f"{shown}:{p}", None)
        )
        cases.append(
            (
                get_request(f"http://{raw_host}:{p}/small"),
                "control-characters",
                f"http://{shown}:{p}/small",
                None,
            )
        )
    return cases


def test_every_other_spelling_is_refused_before_any_dial(fresh: World) -> None:
    cases = _refusal_cases(fresh.http.port, fresh.decoy.port)
    before = fresh.accepted()
    expected_log = []
    for request, reason, host, port in cases:
        reply = ask(fresh.socket, request)
        assert (reply.status, reply.headers["x-proxy-error"]) == (403, "blocked-by-allowlist"), (
            request
        )
        where = host if port is None else f"{host}:{port}"
        assert reply.body == BLOCKED_BODY % str(where).encode(), request
        method = request.split(b" ")[0].decode() if reason != "control-characters" else "?"
        expected_log.append(
            {
                "event": "egress.blocked",
                "reason": reason,
                "method": method,
                "host": host,
                "port": port,
            }
        )
    assert fresh.accepted() == before  # not one dial, to the listed server or the decoy
    assert fresh.log.events() == expected_log


@pytest.mark.parametrize(("service", "port"), [("postgres", 5432), ("redis", 6379)])
def test_postgres_and_redis_are_unreachable_when_not_listed(
    fresh: World, service: str, port: int
) -> None:
    for request in (connect_request(f"127.0.0.1:{port}"), get_request(f"http://127.0.0.1:{port}/")):
        reply = ask(fresh.socket, request)
        assert (reply.status, reply.headers["x-proxy-error"]) == (403, "blocked-by-allowlist")
        assert reply.body == f"egress to 127.0.0.1:{port} is not allowed\n".encode()
    assert [(e["event"], e["host"], e["port"]) for e in fresh.log.events()] == [
        ("egress.blocked", "127.0.0.1", port),
        ("egress.blocked", "127.0.0.1", port),
    ], service


def _malformed_cases(port: int) -> list[tuple[bytes, int, str]]:
    listed = f"127.0.0.1:{port}"
    return [
        (b"HELLO\r\n\r\n", 400, "malformed-request"),
        (b"GET http://127.0.0.1/ HTTP/1.1\r\nno colon here\r\n\r\n", 400, "malformed-request"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, "malformed-request"),
        (f"GET http://{listed}/ HTTP/1.1\r\n\r\n".encode(), 400, "malformed-request"),  # no Host
        (b"CONNECT 127.0.0.1 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed-request"),
        (b"CONNECT 127.0.0.1: HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed-request"),
        (b"CONNECT 127.0.0.1:0 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed-request"),
        (b"CONNECT 127.0.0.1:65536 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed-request"),
        (b"CONNECT :443 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed-request"),
        (
            f"CONNECT {listed} HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc".encode(),
            400,
            "malformed-request",
        ),
        (f"GET /small HTTP/1.1\r\nHost: {listed}\r\n\r\n".encode(), 400, "malformed-request"),
        (f"GET https://{listed}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode(), 400, "malformed-request"),
        (b"GET http:///small HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed-request"),
        (b"GET http://127.0.0.1:http/ HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed-request"),
        (
            f"GET http://{listed}/ HTTP/1.1\r\nHost: x\r\nX-Big: {'a' * 40_000}\r\n\r\n".encode(),
            431,
            "head-too-large",
        ),
    ]


def test_malformed_requests_get_400_and_no_dial(fresh: World) -> None:
    before = fresh.accepted()
    for request, status, error in _malformed_cases(fresh.http.port):
        reply = ask(fresh.socket, request)
        assert (reply.status, reply.headers["x-proxy-error"]) == (status, error), request[:80]
    assert fresh.accepted() == before
    assert [(e["event"], e["status"]) for e in fresh.log.events()] == [
        ("egress.refused", status) for _, status, _ in _malformed_cases(fresh.http.port)
    ]


def test_a_failed_dial_is_502(fresh: World) -> None:
    for request in (
        connect_request(f"127.0.0.1:{fresh.dead_port}"),
        get_request(f"http://127.0.0.1:{fresh.dead_port}/"),
    ):
        reply = ask(fresh.socket, request)
        assert (reply.status, reply.headers["x-proxy-error"]) == (502, "dial-failed")
        assert reply.body == f"cannot reach 127.0.0.1:{fresh.dead_port}\n".encode()
    events = [(e["event"], e.get("host"), e.get("port")) for e in fresh.log.events()]
    assert (
        events
        == [
            ("egress.allowed", "127.0.0.1", fresh.dead_port),
            ("egress.dial_failed", "127.0.0.1", fresh.dead_port),
        ]
        * 2
    )


def test_the_health_request_is_answered_without_a_dial(fresh: World) -> None:
    before = fresh.accepted()
    reply = ask(fresh.socket, b"GET /.turnkeeper/egress-health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (reply.status, reply.body, "x-proxy-error" in reply.headers) == (200, b"ok\n", False)
    assert fresh.accepted() == before
    assert fresh.log.events() == []
