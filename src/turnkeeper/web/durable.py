"""A run's log as a read-only Durable Stream (the protocol's PROTOCOL.md v1.0, read side).

``/streams/runs/{run_id}`` is the stream of one run: ``HEAD`` for its tail and
whether it is closed, ``GET`` to read it in catch-up (``?offset=``), long-poll
(``&live=long-poll``) or SSE (``&live=sse``) mode. The stream is in JSON mode
(``application/json``): a read answers a JSON array of chunks, one message per
chunk. Every write (``PUT``, ``POST``, ``DELETE``, ``PATCH``) is 405: only the
run's driver appends to its log, and it closes the stream when the run settles.

Offsets: the offset after seq ``n`` is ``n`` as 16 zero-padded decimal digits
(``0000000000000000`` is the start of an empty log), so offsets sort as strings
in log order; ``-1`` (the start) and ``now`` (the tail) are the protocol's
sentinels. Anything else is 400, an offset past the tail is 400, and one whose
next chunk retention removed is 410.

Access is the event stream's (``web.auth.authorize_stream``): a key that may see
the run, or the run's stream token as ``?token=``; another tenant's run is 404.
Responses are ``Cache-Control: no-store`` (a run's output is its tenant's). Live
reads count against the key's open streams, as SSE streams do.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import re
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import anyio
import orjson
import structlog
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from turnkeeper.chunks import Chunk
from turnkeeper.errors import (
    AuthenticationError,
    InvalidInputError,
    LogError,
    LogOffsetError,
    MethodNotAllowedError,
    TurnkeeperError,
)
from turnkeeper.log import AsyncRunLog, LogState
from turnkeeper.log.quota import STREAM_RENEW_SECONDS
from turnkeeper.store.records import Run, check_id
from turnkeeper.web import sse
from turnkeeper.web.auth import Principal, authorize_stream
from turnkeeper.web.fanout import FanOut

if TYPE_CHECKING:
    from turnkeeper.web.state import WebState

log = structlog.get_logger(__name__)

STREAM_PATH: Final = "/streams/runs/{run_id:path}"
CONTENT_TYPE: Final = "application/json"
OFFSET_DIGITS: Final = 16  # 2**53 has 16 digits: every seq a JavaScript client can hold
START: Final = "-1"
NOW: Final = "now"
MAX_PAGE_CHUNKS: Final = 1_000
MAX_PAGE_BYTES: Final = 1 << 20
"""A read answers at most this many chunks or (about) this many bytes of them; the
rest is the next read's, from its ``Stream-Next-Offset``."""
DEFAULT_LONG_POLL_SECONDS: Final = 20.0
DEFAULT_SSE_SECONDS: Final = 60.0
READ_BLOCK_MS: Final = 2_000  # well under redis-py's socket timeout
CURSOR_EPOCH: Final = 1_728_432_000  # 2024-10-09T00:00:00Z, the protocol's default
CURSOR_INTERVAL: Final = 20
MAX_CURSOR_JITTER: Final = 3_600
WRITE_METHODS: Final = ["PUT", "POST", "DELETE", "PATCH"]
ALLOWED: Final = "GET, HEAD"

_OFFSET = re.compile(rf"[0-9]{{{OFFSET_DIGITS}}}")
_CURSOR = re.compile(r"[0-9]{1,16}")
_LIVE_MODES: Final = frozenset({"long-poll", "sse"})
_HEADERS: Final = {
    "Cache-Control": "no-store",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def format_offset(seq: int) -> str:
    """The protocol offset after chunk ``seq`` (0: before the first chunk)."""
    return f"{seq:0{OFFSET_DIGITS}d}"


def parse_offset(raw: str | None) -> int | None:
    """The seq an ``offset`` reads after; None for ``now`` (the tail, once known).

    Exactly the offsets this module hands out, or a sentinel: no signs, no spaces,
    no other scripts' digits, no shorter or longer forms of the same number.
    """
    if raw is None or raw == START:
        return 0
    if raw == NOW:
        return None
    if _OFFSET.fullmatch(raw) is None or int(raw) > sse.MAX_OFFSET:
        raise InvalidInputError(
            f"offset must be -1, now, or an offset this server returned, got {raw[:40]!r}",
            reason="invalid-offset",
        )
    return int(raw)


def response_cursor(client_cursor: str | None, *, now: float | None = None) -> str:
    """The ``Stream-Cursor`` of a live answer: the current 20 s interval since the
    protocol's epoch, and always past the one the client echoed (by 1 s to an hour of
    jitter), so a CDN never hands the same cached answer back forever. A cursor this
    server did not mint (not 1 to 16 ASCII digits) is ignored."""
    current = int(((time.time() if now is None else now) - CURSOR_EPOCH) // CURSOR_INTERVAL)
    if client_cursor is None or _CURSOR.fullmatch(client_cursor) is None:
        return str(current)
    echoed = int(client_cursor)
    if echoed < current:
        return str(current)
    jitter = 1 + secrets.randbelow(MAX_CURSOR_JITTER)
    return str(echoed + max(1, math.ceil(jitter / CURSOR_INTERVAL)))


def _live_mode(raw: str | None, offset: str | None) -> str | None:
    if raw is None:
        return None
    if raw not in _LIVE_MODES:
        raise InvalidInputError(
            f"live must be long-poll or sse, got {raw[:40]!r}", reason="invalid-live"
        )
    if offset is None:
        raise InvalidInputError(f"live={raw} needs an offset", reason="missing-offset")
    return raw


@dataclass(frozen=True)
class Page:
    """What one read answers: chunks after ``after``, and where the log stood."""

    after: int
    chunks: list[tuple[int, Chunk]]
    tail: int
    closed: bool

    @property
    def next_seq(self) -> int:
        return self.chunks[-1][0] if self.chunks else self.after

    @property
    def up_to_date(self) -> bool:
        return self.next_seq >= self.tail

    @property
    def at_end(self) -> bool:
        """The log is closed and this page reaches its last chunk: EOF."""
        return self.closed and self.up_to_date

    def body(self) -> bytes:
        return orjson.dumps([chunk for _seq, chunk in self.chunks])

    def headers(self) -> dict[str, str]:
        headers = {**_HEADERS, "Stream-Next-Offset": format_offset(self.next_seq)}
        if self.up_to_date:
            headers["Stream-Up-To-Date"] = "true"
        if self.at_end:
            headers["Stream-Closed"] = "true"
        return headers

    def etag(self, run_id: str) -> str:
        # The run id is hashed: an id may hold characters an entity tag cannot.
        stream = hashlib.sha256(run_id.encode()).hexdigest()[:16]
        span = f"{format_offset(self.after)}:{format_offset(self.next_seq)}"
        return f'"{stream}:{span}{":c" if self.at_end else ""}"'

    def control(self, cursor: str) -> dict[str, Any]:
        """The SSE ``control`` event that follows this page."""
        event: dict[str, Any] = {"streamNextOffset": format_offset(self.next_seq)}
        if self.at_end:
            event["streamClosed"] = True
            event["upToDate"] = True
            return event
        event["streamCursor"] = cursor
        if self.up_to_date:
            event["upToDate"] = True
        return event


async def read_page(run_log: AsyncRunLog, run_id: str, after: int, state: LogState) -> Page:
    """The chunks stored after ``after`` up to the tail ``state`` saw, a page at most.

    Never parks: every seq up to that tail is in the log, or retention removed it
    (LogGoneError, 410).
    """
    tail = max(state.last_seq, after) if state.exists else after
    chunks: list[tuple[int, Chunk]] = []
    if tail > after:
        size = 0
        async with _reading(run_log, run_id, after) as reader:
            async for seq, chunk in reader:
                chunks.append((seq, chunk))
                size += len(orjson.dumps(chunk))
                if seq >= tail or len(chunks) >= MAX_PAGE_CHUNKS or size >= MAX_PAGE_BYTES:
                    break
    return Page(after, chunks, tail, state.exists and state.closed)


@contextlib.asynccontextmanager
async def _reading(
    run_log: AsyncRunLog, run_id: str, after: int
) -> AsyncIterator[AsyncIterator[tuple[int, Chunk]]]:
    """``run_log.read`` from ``after``, closed (its Redis connection given back) on exit."""
    reader = run_log.read(run_id, after, block_ms=READ_BLOCK_MS)
    try:
        yield reader
    finally:
        close = getattr(reader, "aclose", None)
        if close is not None:
            await close()


def _start(run: Run, state: LogState, offset: int | None) -> int:
    """The seq a read starts after: the tail for ``now``; refused (400, 410) as the
    event stream refuses a resume its log cannot serve."""
    after = (state.last_seq if state.exists else 0) if offset is None else offset
    try:
        sse.check_start(run, state, after)
    except LogOffsetError as exc:
        raise InvalidInputError(exc.message, run_id=run.run_id, reason="offset-ahead") from exc
    return after


class StreamSlot:
    """The open-stream slot a live read holds, renewed while it lasts (``log.quota``)."""

    def __init__(self, state: WebState, key_name: str | None) -> None:
        self._state = state
        self.key_name = key_name
        self._slot: str | None = None
        self._renewer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> StreamSlot:
        if self.key_name is not None:
            self._slot = await self._state.stream_slots.acquire(self.key_name)
            self._renewer = asyncio.create_task(self._renew(self.key_name, self._slot))
        return self

    async def _renew(self, key_name: str, slot: str) -> None:
        while True:
            await asyncio.sleep(STREAM_RENEW_SECONDS)
            await self._state.stream_slots.renew(key_name, slot)

    async def __aexit__(self, *_: object) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        if self.key_name is None or self._slot is None:
            return
        # Shielded: a client that went away cancels the read, and this is its cleanup.
        with anyio.CancelScope(shield=True):
            try:
                await self._state.stream_slots.release(self.key_name, self._slot)
            except TurnkeeperError as exc:  # the slot lapses on its own within a minute
                log.warning("durable.slot.release_failed", key_name=self.key_name, error=str(exc))


def _charged(run: Run, principal: Principal | None) -> str | None:
    """The key a live read counts against: the caller's, or the run owner's for a token."""
    return principal.name if principal is not None else run.key_name


def durable_router(
    *,
    ping_seconds: float,
    long_poll_seconds: float = DEFAULT_LONG_POLL_SECONDS,
    sse_seconds: float = DEFAULT_SSE_SECONDS,
) -> APIRouter:
    """The routes of run streams. ``long_poll_seconds``: how long a long-poll waits
    before 204; ``sse_seconds``: how long an SSE response lasts before the server ends
    it (the client reconnects from its last offset)."""
    router = APIRouter(tags=["durable streams"])

    @router.head(STREAM_PATH)
    async def stream_metadata(run_id: str, request: Request, token: str | None = None) -> Response:
        """The stream's tail offset and whether it is closed."""
        state = _web(request)
        check_id(run_id, "run_id")
        run, _ = await authorize_stream(request, run_id, token)
        log_state = await state.run_log.state(run_id)
        tail = _start(run, log_state, None)
        headers = {**_HEADERS, "Content-Type": CONTENT_TYPE}
        headers["Stream-Next-Offset"] = format_offset(tail)
        if log_state.exists and log_state.closed:
            headers["Stream-Closed"] = "true"
        return Response(status_code=200, headers=headers)

    @router.get(STREAM_PATH, response_model=None)
    async def read_stream(
        run_id: str,
        request: Request,
        *,
        offset: str | None = None,
        live: str | None = None,
        cursor: str | None = None,
        token: str | None = None,
    ) -> Response:
        """The run's chunks after ``offset`` as a JSON array (catch-up), waiting for
        the next ones (``live=long-poll``), or as SSE ``data``/``control`` events
        (``live=sse``)."""
        state = _web(request)
        check_id(run_id, "run_id")
        run, principal = await authorize_stream(request, run_id, token)
        mode = _live_mode(live, offset)
        wanted = parse_offset(offset)
        log_state = await state.run_log.state(run_id)
        after = _start(run, log_state, wanted)
        if mode == "sse":
            return await _sse(
                state,
                run,
                principal,
                after,
                client_cursor=cursor,
                ping_seconds=ping_seconds,
                seconds=sse_seconds,
            )
        if mode == "long-poll":
            charged = _charged(run, principal)
            async with StreamSlot(state, charged):
                return await _long_poll(
                    state,
                    run_id,
                    after,
                    log_state=log_state,
                    charged=charged,
                    client_cursor=cursor,
                    seconds=long_poll_seconds,
                )
        if wanted is None:  # offset=now: the tail, no data, never cached (no ETag)
            page = Page(after, [], after, log_state.exists and log_state.closed)
            return Response(b"[]", media_type=CONTENT_TYPE, headers=page.headers())
        page = await read_page(state.run_log, run_id, after, log_state)
        return _answer(request, run_id, page)

    @router.api_route(STREAM_PATH, methods=WRITE_METHODS, include_in_schema=False)
    async def refuse_write(run_id: str, request: Request, token: str | None = None) -> Response:
        """Run streams are read-only: only the run's driver appends to its log."""
        check_id(run_id, "run_id")
        await authorize_stream(request, run_id, token)
        raise MethodNotAllowedError(
            f"a run's stream is read-only: {request.method} is not allowed",
            run_id=run_id,
            reason="read-only-stream",
            allow=ALLOWED,
        )

    return router


def _web(request: Request) -> WebState:
    state: WebState = request.app.state.web
    return state


def _answer(request: Request, run_id: str, page: Page, cursor: str | None = None) -> Response:
    """A read's 200 (or 304 when the client holds this very page)."""
    headers = page.headers()
    etag = page.etag(run_id)
    headers["ETag"] = etag
    if cursor is not None:
        headers["Stream-Cursor"] = cursor
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(page.body(), media_type=CONTENT_TYPE, headers=headers)


async def _long_poll(
    state: WebState,
    run_id: str,
    after: int,
    *,
    log_state: LogState,
    charged: str | None,
    client_cursor: str | None,
    seconds: float,
) -> Response:
    """What is stored after ``after`` at once; else the next chunks within ``seconds``;
    else 204. A closed log at its tail is 204 at once, with ``Stream-Closed``.

    A wait the key ``charged`` is revoked during ends in 401: what was stored after
    the revocation is no longer that key's to read."""
    request_page = await read_page(state.run_log, run_id, after, log_state)
    if not request_page.chunks and not request_page.closed:
        with _revocation(state, charged) as revoked:
            await _wait_or_revoked(state.fanout, run_id, after, seconds, revoked)
        # Checked in Postgres, not by the watch alone: it may not have seen it yet.
        if charged is not None and not await run_in_threadpool(
            state.client.store.key_is_live, charged
        ):
            raise AuthenticationError(
                "the key this long-poll counts against was revoked while it waited",
                run_id=run_id,
                reason="revoked-key",
            )
        request_page = await read_page(
            state.run_log, run_id, after, await state.run_log.state(run_id)
        )
    cursor = response_cursor(client_cursor)
    if not request_page.chunks:
        headers = request_page.headers()
        if not request_page.at_end:
            headers["Stream-Cursor"] = cursor
        return Response(status_code=204, headers=headers)
    response = Response(
        request_page.body(), media_type=CONTENT_TYPE, headers=request_page.headers()
    )
    response.headers["ETag"] = request_page.etag(run_id)
    response.headers["Stream-Cursor"] = cursor
    return response


async def _sse(
    state: WebState,
    run: Run,
    principal: Principal | None,
    after: int,
    *,
    client_cursor: str | None,
    ping_seconds: float,
    seconds: float,
) -> StreamingResponse:
    charged = _charged(run, principal)
    slot = StreamSlot(state, charged)
    await slot.__aenter__()  # a 429 before the response starts

    async def frames() -> AsyncIterator[bytes]:
        try:
            with _revocation(state, charged) as revoked:
                async for frame in sse_frames(
                    state.run_log,
                    state.fanout,
                    run.run_id,
                    after,
                    client_cursor=client_cursor,
                    seconds=seconds,
                    ping_seconds=ping_seconds,
                    revoked=revoked,
                ):
                    yield frame
        finally:
            await slot.__aexit__()

    # The protocol's exact media type (no charset parameter), and no caching anywhere.
    headers = {
        **_HEADERS,
        "Content-Type": "text/event-stream",
        "Cache-Control": "no-cache, no-store",
        "X-Accel-Buffering": "no",
    }
    return StreamingResponse(frames(), headers=headers)


@contextlib.contextmanager
def _revocation(state: WebState, key_name: str | None) -> Iterator[asyncio.Event]:
    if key_name is None:
        yield asyncio.Event()  # never set: a trusted client's run counts against no key
        return
    with state.revocations.watch(key_name) as revoked:
        yield revoked


def sse_frame(event: str, data: bytes) -> bytes:
    """One SSE event. ``data`` is compact JSON: it holds no line break, so a chunk can
    never end an event early or inject one."""
    return b"event: " + event.encode() + b"\ndata:" + data + b"\n\n"


PING: Final = b": ping\n\n"


async def sse_frames(
    run_log: AsyncRunLog,
    fanout: FanOut,
    run_id: str,
    after: int,
    *,
    client_cursor: str | None,
    seconds: float,
    ping_seconds: float,
    revoked: asyncio.Event,
) -> AsyncIterator[bytes]:
    """``data`` events (a JSON array of chunks each), each followed by its ``control``
    event, from ``after``; until the log is closed (a last control with
    ``streamClosed``), the response has lasted ``seconds``, or the key it counts
    against is revoked (the stream just ends: the client's reconnect is refused), or
    the server shuts down (the client reconnects to another).
    A comment every ``ping_seconds`` of silence keeps proxies from cutting it. Waits
    for chunks go through the run's feed (``FanOut.wait_past``)."""
    deadline = anyio.current_time() + seconds
    cursor = response_cursor(client_cursor)
    position = after
    announced = False
    try:
        while not revoked.is_set():
            page = await read_page(run_log, run_id, position, await run_log.state(run_id))
            if page.chunks:
                position = page.next_seq
                yield sse_frame("data", page.body())
                yield sse_frame("control", orjson.dumps(page.control(cursor)))
                if page.at_end or anyio.current_time() >= deadline:
                    return
                announced = page.up_to_date
                continue
            if page.closed or not announced:
                yield sse_frame("control", orjson.dumps(page.control(cursor)))
                if page.closed:
                    return
                announced = True
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                return
            if not await _wait_or_revoked(
                fanout, run_id, position, min(remaining, ping_seconds), revoked
            ):
                if fanout.closed:
                    return
                yield PING
    except LogError as exc:
        # Retention removed the range under the reader, or Redis failed: the protocol
        # has no error event, so the response ends and the client's reconnect from
        # its last offset gets the status (410, 503).
        log.warning("durable.sse.failed", run_id=run_id, offset=position, error=str(exc))


async def _wait_or_revoked(
    fanout: FanOut, run_id: str, after: int, seconds: float, revoked: asyncio.Event
) -> bool:
    """Whether a chunk came (or the log closed, or the key was revoked) within ``seconds``."""
    woken = False

    async with anyio.create_task_group() as group:

        async def wait_chunk() -> None:
            nonlocal woken
            woken = await fanout.wait_past(run_id, after, seconds) or woken
            group.cancel_scope.cancel()

        async def wait_revoked() -> None:
            nonlocal woken
            await revoked.wait()
            woken = True
            group.cancel_scope.cancel()

        group.start_soon(wait_chunk)
        group.start_soon(wait_revoked)
    return woken
