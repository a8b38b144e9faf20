"""The egress proxy: an HTTP proxy on a unix socket that lets jailed agents reach only
the ``host:port`` pairs of an allowlist.

One request per client connection. ``CONNECT host:port`` opens a byte tunnel (TLS to a
model API); an absolute-form request (``GET http://host:port/path``) is rebuilt from the
parsed URL, hop-by-hop headers dropped, and forwarded over a fresh upstream connection,
its response ending with ``Connection: close``. The allowlist is checked on the request
line, before any DNS lookup or dial. h11 parses and frames both sides, so a request h11
would not accept never reaches an upstream, and bodies stream in bounded chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus

import h11
import structlog

from turnkeeper.errors import EgressRefusedError
from turnkeeper.sandbox.egress.target import (
    BLOCKED,
    MALFORMED,
    Allowlist,
    Destination,
    blocked,
    connect_destination,
    forward_destination,
    has_control_characters,
    reachable_by_name,
)

log = structlog.get_logger(__name__)

HEALTH_PATH = b"/.turnkeeper/egress-health"
BLOCKED_ADDRESS = "blocked-address"
_CHUNK = 64 * 1024
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"upgrade",
        b"host",
        b"expect",
    }
)


@dataclass(frozen=True)
class Limits:
    """Bounds on what one proxy holds: connections, head size, and how long it waits."""

    max_connections: int = 512
    max_head_bytes: int = 32 * 1024
    head_timeout: float = 30.0
    idle_timeout: float = 600.0
    connect_timeout: float = 10.0


def forwarded_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Headers without the hop-by-hop ones (and those a ``Connection`` header names)."""
    pairs = list(headers)
    named = {
        token.strip().lower()
        for name, value in pairs
        if name == b"connection"
        for token in value.split(b",")
    }
    drop = _HOP_BY_HOP | named
    if any(name == b"transfer-encoding" for name, _ in pairs):
        drop |= {b"content-length"}  # chunked wins; never send both framings upstream
    return [(name, value) for name, value in pairs if name not in drop]


def _refusal_of(raw: bytes, exc: h11.RemoteProtocolError) -> EgressRefusedError:
    """The reply to a request h11 refused: 403 when the target hides control characters."""
    parts = raw.split(b"\n", 1)[0].rstrip(b"\r").split(b" ")
    if len(parts) == 3 and has_control_characters(parts[1]):
        return blocked("control-characters", parts[1].decode("latin-1"))
    status = exc.error_status_hint
    reason = "head-too-large" if status == 431 else MALFORMED
    return EgressRefusedError(status, reason, f"malformed request: {exc}")


async def _reply(
    writer: asyncio.StreamWriter, status: int, error: str | None, message: str
) -> None:
    body = (message + "\n").encode()
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
    if error:
        head.append(f"X-Proxy-Error: {error}")
    head += [
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    await writer.drain()


class EgressProxy:
    """Serves proxy requests on a listening unix socket until cancelled."""

    def __init__(self, allowlist: Allowlist, limits: Limits) -> None:
        self.allowlist = allowlist
        self.limits = limits
        self._active = 0

    async def serve(self, sock: socket.socket) -> None:
        server = await asyncio.start_unix_server(self._accept, sock=sock)
        async with server:
            await server.serve_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self._active >= self.limits.max_connections:
                log.warning("egress.overloaded", active=self._active)
                await _reply(writer, 503, "too-many-connections", "the egress proxy is busy")
                return
            self._active += 1
            try:
                await self._serve(reader, writer)
            finally:
                self._active -= 1
        except (OSError, TimeoutError, h11.ProtocolError) as exc:
            log.debug("egress.aborted", error=repr(exc))
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_head_bytes)
        method = "?"
        try:
            try:
                request = await asyncio.wait_for(
                    self._read_head(reader, client), self.limits.head_timeout
                )
            except TimeoutError:
                raise EgressRefusedError(408, "head-timeout", "no request head in time") from None
            if request is None:
                return
            method = request.method.decode("ascii")
            if request.target == HEALTH_PATH and method == "GET":
                await _reply(writer, 200, None, "ok")
                return
            destination = self._destination(request)
            self.allowlist.check(destination)
            log.info("egress.allowed", host=destination.host, port=destination.port, method=method)
            upstream_reader, upstream_writer = await self._dial(destination)
        except EgressRefusedError as exc:
            await self._refuse(writer, exc, method)
            return
        exchange = _Exchange(
            idle_timeout=self.limits.idle_timeout,
            client=client,
            reader=reader,
            writer=writer,
            upstream_reader=upstream_reader,
            upstream_writer=upstream_writer,
        )
        watchdog = asyncio.create_task(exchange.watch(destination))
        try:
            if method == "CONNECT":
                await exchange.tunnel()
            else:
                await exchange.forward(request, destination)
        finally:
            watchdog.cancel()
            upstream_writer.close()

    async def _read_head(
        self, reader: asyncio.StreamReader, client: h11.Connection
    ) -> h11.Request | None:
        """The request head; h11 bounds a head that arrives in pieces, this one in one read."""
        limit = self.limits.max_head_bytes
        start = bytearray()  # the head's first bytes: its size and what h11 refused
        while True:
            try:
                event = client.next_event()
            except h11.RemoteProtocolError as exc:
                raise _refusal_of(bytes(start), exc) from exc
            if event is not h11.NEED_DATA:
                if isinstance(event, h11.Request) and not _HEAD_END.search(start):
                    raise EgressRefusedError(431, "head-too-large", "the request head is too large")
                return event if isinstance(event, h11.Request) else None
            data = await reader.read(_CHUNK)
            start += data[: max(0, limit - len(start))]
            client.receive_data(data)

    @staticmethod
    def _destination(request: h11.Request) -> Destination:
        if request.method != b"CONNECT":
            return forward_destination(request.target)
        destination = connect_destination(request.target)
        if any(name in {b"content-length", b"transfer-encoding"} for name, _ in request.headers):
            raise EgressRefusedError(400, MALFORMED, "a CONNECT request has no body")
        return destination

    @staticmethod
    async def _refuse(writer: asyncio.StreamWriter, exc: EgressRefusedError, method: str) -> None:
        reason = exc.reason or MALFORMED
        if exc.status == 403:
            log.info("egress.blocked", reason=reason, method=method, **exc.fields)
        elif exc.status != 502:  # a failed dial was logged where it failed
            log.info("egress.refused", status=exc.status, reason=reason, method=method)
        header = BLOCKED if exc.status == 403 and reason != BLOCKED_ADDRESS else reason
        await _reply(writer, exc.status, header, exc.message)

    async def _dial(
        self, destination: Destination
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = destination.host, destination.port
        failure: Exception | None = None
        try:
            for address in await self._addresses(destination):
                try:
                    return await asyncio.wait_for(
                        asyncio.open_connection(address, port), self.limits.connect_timeout
                    )
                except (OSError, TimeoutError) as exc:
                    failure = exc
        except OSError as exc:  # the name did not resolve
            failure = exc
        log.warning("egress.dial_failed", host=host, port=port, error=repr(failure))
        message = f"cannot reach {host}:{port}"
        raise EgressRefusedError(502, "dial-failed", message, host=host, port=port)

    @staticmethod
    async def _addresses(destination: Destination) -> list[str]:
        host, port = destination.host, destination.port
        if destination.is_address:
            return [host.strip("[]")]
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        allowed = [address for address in addresses if reachable_by_name(address)]
        if not allowed:
            message = f"{host} resolves only to addresses the proxy never dials"
            raise EgressRefusedError(
                403, BLOCKED_ADDRESS, message, host=host, port=port, addresses=addresses
            )
        return allowed


class _Exchange:
    """One allowed request's bytes: the client's side, the upstream's, and their idleness."""

    def __init__(
        self,
        *,
        idle_timeout: float,
        client: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream_reader: asyncio.StreamReader,
        upstream_writer: asyncio.StreamWriter,
    ) -> None:
        self.idle_timeout = idle_timeout
        self.client = client
        self.reader, self.writer = reader, writer
        self.upstream_reader, self.upstream_writer = upstream_reader, upstream_writer
        self.last_activity = asyncio.get_running_loop().time()

    async def watch(self, destination: Destination) -> None:
        """Cuts both connections once no byte moved either way for the idle timeout."""
        loop = asyncio.get_running_loop()
        while (remaining := self.last_activity + self.idle_timeout - loop.time()) > 0:
            await asyncio.sleep(remaining)
        log.info("egress.idle", host=destination.host, port=destination.port)
        self.writer.transport.abort()
        self.upstream_writer.transport.abort()

    async def _read(self, source: asyncio.StreamReader) -> bytes:
        data = await source.read(_CHUNK)
        self.last_activity = asyncio.get_running_loop().time()
        return data

    async def tunnel(self) -> None:
        while self.client.next_event() is not h11.PAUSED:  # the CONNECT's empty body
            pass
        self.writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        early, _ = self.client.trailing_data  # what the client sent right after its request
        self.upstream_writer.write(early)
        pipes = [
            asyncio.create_task(self._pipe(self.reader, self.upstream_writer)),
            asyncio.create_task(self._pipe(self.upstream_reader, self.writer)),
        ]
        try:
            for pipe in asyncio.as_completed(pipes):
                await pipe  # an error or idleness in either direction ends both
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while data := await self._read(source):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()  # half-close: the other direction may still carry a reply

    async def forward(self, request: h11.Request, destination: Destination) -> None:
        upstream = h11.Connection(h11.CLIENT)
        headers = [
            (b"host", destination.host_header.encode()),
            *forwarded_headers(request.headers),
            (b"connection", b"close"),
        ]
        rebuilt = h11.Request(method=request.method, target=destination.path, headers=headers)
        self.upstream_writer.write(upstream.send(rebuilt) or b"")
        if self.client.they_are_waiting_for_100_continue:
            self.writer.write(
                self.client.send(h11.InformationalResponse(status_code=100, headers=[])) or b""
            )
        upload = asyncio.create_task(self._upload(upstream))
        try:
            await self._relay_response(upstream)
        finally:
            upload.cancel()
            await asyncio.gather(upload, return_exceptions=True)

    async def _upload(self, upstream: h11.Connection) -> None:
        """Streams the request body upstream; on any failure, cuts the upstream connection."""
        try:
            while True:
                event = self.client.next_event()
                if event is h11.NEED_DATA:
                    self.client.receive_data(await self._read(self.reader))
                    continue
                if not isinstance(event, h11.Data | h11.EndOfMessage):
                    raise h11.RemoteProtocolError("the client closed mid-request")
                outgoing = h11.Data(data=event.data) if isinstance(event, h11.Data) else event
                self.upstream_writer.write(upstream.send(outgoing) or b"")
                await self.upstream_writer.drain()
                if isinstance(event, h11.EndOfMessage):
                    return
        except (OSError, h11.ProtocolError):
            self.upstream_writer.transport.abort()

    async def _relay_response(self, upstream: h11.Connection) -> None:
        """Sends the upstream response to the client; a 502 if none arrives."""
        head_sent = False
        pending = bytearray()  # what one read yields goes out in one write
        try:
            while True:
                event = upstream.next_event()
                if event is h11.NEED_DATA:
                    if pending:
                        self.writer.write(pending)
                        pending = bytearray()
                        await self.writer.drain()
                    upstream.receive_data(await self._read(self.upstream_reader))
                    continue
                outgoing = self._relayed(event)
                if outgoing is not None:
                    pending += self.client.send(outgoing) or b""
                head_sent = head_sent or isinstance(event, h11.Response)
                if isinstance(event, h11.EndOfMessage):
                    self.writer.write(pending)
                    await self.writer.drain()
                    return
        except (OSError, h11.ProtocolError) as exc:
            if head_sent:
                raise
            log.warning("egress.bad_upstream", error=repr(exc))
            await _reply(self.writer, 502, "bad-upstream-response", "the upstream response failed")

    @staticmethod
    def _relayed(event: object) -> h11.Event | None:
        """What the client gets for one upstream event, with its hop-by-hop headers dropped."""
        if isinstance(event, h11.InformationalResponse):
            if event.status_code == 101:  # no Upgrade was forwarded, so none is relayed
                return None
            headers = forwarded_headers(event.headers)
            return h11.InformationalResponse(
                status_code=event.status_code, headers=headers, reason=event.reason
            )
        if isinstance(event, h11.Response):
            headers = [*forwarded_headers(event.headers), (b"connection", b"close")]
            return h11.Response(status_code=event.status_code, headers=headers, reason=event.reason)
        if isinstance(event, h11.Data):
            return h11.Data(data=event.data)
        if isinstance(event, h11.EndOfMessage):
            return h11.EndOfMessage()
        raise h11.RemoteProtocolError("the upstream closed before its response ended")
