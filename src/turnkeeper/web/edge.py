"""What every request passes before a route sees it, and what every response carries.

Pure ASGI middleware (event streams pass through untouched):

- ``SecurityHeaders``: a strict CSP (the dashboard loads only its own files),
  no sniffing, no framing, no referrer;
- ``OriginCheck``: a state-changing request from a browser page of another
  origin (a cross-site form post, say) is refused with 403 before anything runs;
- ``BodyLimit``: a body over the limit is refused with 413 before the app reads it.

- ``TrustedHosts``: a ``Host`` the server does not answer to is refused with 400.

``RedactQuery`` keeps query strings (stream tokens) out of uvicorn's access log.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from urllib.parse import urlsplit

import orjson
from starlette.datastructures import Headers
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
_SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
)
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_SAME_ORIGIN_FETCHES = frozenset({"same-origin", "none"})


async def _refuse(send: Send, status: int, message: str, reason: str) -> None:
    body = orjson.dumps({"error": message, "reason": reason})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in _SECURITY_HEADERS if k not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


class OriginCheck:
    """Browsers send ``Origin`` (and ``Sec-Fetch-Site``) with every state-changing
    request; one from a page that is not this server's own is refused. Where a
    browser or a privacy tool left ``Origin`` out, ``Referer`` stands in for it, and
    ``Sec-Fetch-Site`` passes only ``same-origin`` and ``none`` (a sibling subdomain
    is ``same-site``, another origin). Clients that are not browsers send none of
    these and pass (they still need an API key)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in _SAFE_METHODS:
            headers = Headers(scope=scope)
            origin = headers.get("origin", headers.get("referer"))
            fetch_site = headers.get("sec-fetch-site")
            if (fetch_site is not None and fetch_site not in _SAME_ORIGIN_FETCHES) or (
                origin is not None and not _same_origin(origin, headers.get("host"))
            ):
                await _refuse(send, 403, "a cross-origin request was refused", "cross-origin")
                return
        await self.app(scope, receive, send)


def _same_origin(origin: str, host: str | None) -> bool:
    try:
        netloc = urlsplit(origin).netloc.lower()
    except ValueError:
        return False
    return bool(host) and netloc == str(host).lower()


class TrustedHosts:
    """Starlette's ``TrustedHostMiddleware`` (its Host matching, wildcards and the
    ``www.`` redirect included), refusing a foreign Host with the JSON error body every
    other error has instead of its plain text."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str]) -> None:
        self.app = app
        self.allowed_hosts = list(allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def admitted(scope: Scope, receive: Receive, _: Send) -> None:
            await self.app(scope, receive, send)  # the app answers on the real send

        replaced = False

        async def answered(message: Message) -> None:
            # Only the check's own answer comes here: a refusal (400), or a redirect.
            nonlocal replaced
            if message["type"] == "http.response.start" and message["status"] == 400:
                replaced = True
                text = "the Host header names no host this server answers to"
                await _refuse(send, 400, text, "invalid-host")
            elif not replaced:
                await send(message)

        check = TrustedHostMiddleware(admitted, self.allowed_hosts)
        await check(scope, receive, answered)


class BodyLimit:
    """Requests with a body are read (up to the limit) before the app runs, so an
    oversized one is refused whole; requests without one (event streams) pass
    untouched and keep their disconnect notices."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        if declared is None and "transfer-encoding" not in headers:
            await self.app(scope, receive, send)
            return
        too_large = f"the request body is larger than {self.max_bytes} bytes"
        if declared is not None and (
            not declared.isascii() or not declared.isdigit() or int(declared) > self.max_bytes
        ):
            await _refuse(send, 413, too_large, "body-too-large")
            return
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away mid-body
            part = message.get("body", b"")
            size += len(part)
            if size > self.max_bytes:
                await _refuse(send, 413, too_large, "body-too-large")
                return
            parts.append(part)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(parts), "more_body": False}

        await self.app(scope, replay, send)


class RedactQuery(logging.Filter):
    """Drops the query string from uvicorn's access log lines: it carries stream tokens."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            path, sep, _ = args[2].partition("?")
            record.args = (args[0], args[1], path + ("?…" if sep else ""), args[3], args[4])
        return True


def redact_access_log() -> None:
    """Install ``RedactQuery`` on uvicorn's access logger (once per process)."""
    logger = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQuery) for f in logger.filters):
        logger.addFilter(RedactQuery())
