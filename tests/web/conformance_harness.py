"""A test-only front for the Durable Streams conformance suite: streams it can create.

``@durable-streams/server-conformance-tests`` makes every stream it reads itself, with
``PUT`` and ``POST`` on ``/v1/stream/<name>``, and sends no credentials. Run streams
are read-only and need a key, so this ASGI app (in tests only: production has no
such route) stands in front of the real one:

- ``PUT /v1/stream/<name>`` submits a run ``<name>`` for the tenant's key (it stays
  queued: no workers) and fences its log; ``POST`` appends the JSON messages of its body
  as chunks, with ``RunLog.append`` as the driver does; ``Stream-Closed: true`` closes
  the log (``RunLog.close``). Bodies of other content types are not stored: a run's
  log holds JSON objects only.
- Every other request (``GET``, ``HEAD``, ``DELETE``...) is the real app's, at
  ``/streams/runs/<name>``, with the tenant's key added. Responses pass through as
  they are.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, unquote

import anyio.to_thread
from starlette.types import ASGIApp, Receive, Scope, Send

from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.errors import LogClosedError
from turnkeeper.log import RunLog
from turnkeeper.web.durable import format_offset

PREFIX = "/v1/stream/"


class ConformanceHarness:
    def __init__(self, app: ASGIApp, settings: Settings, *, key: str, key_name: str) -> None:
        self.app = app
        self.settings = settings
        self.key = key
        self.key_name = key_name
        self.log = RunLog.from_url(settings.require_redis_url(), namespace=settings.namespace)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        name = unquote(scope["path"][len(PREFIX) :])
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if scope["method"] in {"PUT", "POST"}:
            body = await _body(receive)
            status, extra = await anyio.to_thread.run_sync(
                self._write, scope["method"], name, headers, body
            )
            await _answer(send, status, extra)
            return
        path = f"/streams/runs/{quote(name, safe='')}"
        forwarded = [(k, v) for k, v in scope["headers"] if k.lower() != b"authorization"] + [
            (b"authorization", f"Bearer {self.key}".encode())
        ]
        inner = {**scope, "path": path, "raw_path": path.encode(), "headers": forwarded}
        await self.app(inner, receive, send)

    def _write(
        self, method: str, name: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str]]:
        closing = headers.get("stream-closed", "").lower() == "true"
        is_json = (
            headers.get("content-type", "").split(";")[0].strip().lower() == "application/json"
        )
        try:
            messages = _messages(body, creating=method == "PUT") if is_json and body else []
        except ValueError:
            return 400, {}
        state = self.log.state(name)
        if method == "PUT":
            created = not state.exists
            if created:
                self._submit(name)
                self.log.fence(name, 1)
        elif not state.exists:
            return 404, {}
        elif not body and not closing:
            return 400, {}
        next_seq = self.log.state(name).next_seq
        try:
            if messages:
                next_seq = self.log.append(name, 1, next_seq, messages) + 1
            if closing:
                self.log.close(name, 1)
        except LogClosedError:
            return 409, {"Stream-Closed": "true", "Stream-Next-Offset": format_offset(next_seq - 1)}
        extra = {
            "Stream-Next-Offset": format_offset(next_seq - 1),
            "Content-Type": "application/json",
        }
        if closing or self.log.state(name).closed:
            extra["Stream-Closed"] = "true"
        if method == "PUT":
            return (201 if created else 200), extra
        return 204, extra

    def _submit(self, run_id: str) -> None:
        from turnkeeper.client import Client  # noqa: PLC0415 - one per stream is plenty

        with Client.from_settings(self.settings) as client:
            client.submit("scripted", "conformance", run_id=run_id, key_name=self.key_name)


def _messages(body: bytes, *, creating: bool) -> list[Chunk]:
    """The messages of a JSON-mode body: an array is flattened one level (the protocol's
    batch); each message must be an object, as every chunk is."""
    value: Any = json.loads(body)
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not items and not creating:
        raise ValueError("an empty array appends nothing")
    if not all(isinstance(item, dict) for item in items):
        raise ValueError("a run's chunks are JSON objects")
    return list(items)


async def _body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


async def _answer(send: Send, status: int, headers: dict[str, str]) -> None:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    raw.append((b"x-content-type-options", b"nosniff"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": b""})
