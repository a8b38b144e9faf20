"""The resumable SSE stream of a run's log (docs/architecture.md, "Invariants", 4; docs/api.md).

Each chunk is one event whose ``id:`` is its seq and whose data is the chunk's
JSON, so a reconnecting EventSource resumes with ``Last-Event-ID`` and sees
every chunk once. The stream ends with an ``end`` event when the log is closed
(a browser's EventSource would otherwise reconnect forever). Everything that
can be refused with a status code (unknown run, offset removed by retention,
offset past the end) is checked before the response starts; a log that
retention removes under a parked reader ends the stream with a ``log-error``
event (``error`` is taken by EventSource for network errors), and so does the
revocation of the key the stream counts against (status 401,
``turnkeeper.web.revocation``).

The route serves every stream of a run from one reader (``turnkeeper.web.fanout``),
its frames encoded once; ``events`` is the same stream read by one client alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from typing import Any, TypeVar

import anyio
import orjson
import structlog
from sse_starlette import EventSourceResponse
from starlette.types import Receive, Scope, Send

from turnkeeper.errors import InvalidInputError, LogError, LogGoneError, LogOffsetError
from turnkeeper.log import AsyncRunLog, LogState
from turnkeeper.store.records import Run

log = structlog.get_logger(__name__)

MAX_OFFSET = 2**53

Event = TypeVar("Event")


def parse_offset(last_event_id: str | None, offset: str | None) -> int:
    """The seq to resume after: ``Last-Event-ID`` wins (a reconnect), then ``?offset=``."""
    for name, raw in (("Last-Event-ID", last_event_id), ("offset", offset)):
        if raw is None or raw == "":
            continue
        # ASCII digits only: str.isdigit alone passes '²', which int() refuses.
        if not raw.isascii() or not raw.isdigit() or int(raw) > MAX_OFFSET:
            raise InvalidInputError(
                f"{name} must be a non-negative integer seq, got {raw[:40]!r}",
                reason="invalid-offset",
            )
        return int(raw)
    return 0


def check_start(run: Run, state: LogState, after: int) -> None:
    """Refuse, before any byte is sent, a resume the log cannot serve.

    LogGoneError (410) when retention removed the log or the chunks right after
    ``after``; LogOffsetError (400) for an offset past the end of the log.
    """
    if not state.exists:
        if after > 0 or run.status.is_terminal:
            # A settled run whose log is gone would park a reader forever.
            raise LogGoneError(
                "the run's log was removed by retention",
                run_id=run.run_id,
                reason="expired",
                offset=after,
            )
        return
    if after > state.last_seq:
        raise LogOffsetError(
            f"offset {after} is past the last seq {state.last_seq}",
            run_id=run.run_id,
            reason="offset-ahead",
            offset=after,
        )
    if state.first_seq > after + 1:
        raise LogGoneError(
            f"chunks before seq {state.first_seq} were removed by retention",
            run_id=run.run_id,
            reason="trimmed",
            offset=after,
        )


async def events(
    run_log: AsyncRunLog,
    run_id: str,
    after: int,
    *,
    on_first_event: Callable[[float], None] | None = None,
    block_ms: int = 2_000,  # well under redis-py's default 5 s socket timeout
) -> AsyncGenerator[dict[str, Any], None]:
    """Server-sent events (as sse-starlette dicts) for the chunks after seq ``after``."""
    opened = time.monotonic()
    first = True
    last = after
    try:
        async for seq, chunk in run_log.read(run_id, after, block_ms=block_ms):
            if first and on_first_event is not None:
                on_first_event(time.monotonic() - opened)
            first = False
            last = seq
            yield {"id": str(seq), "data": orjson.dumps(chunk).decode()}
    except LogError as exc:
        log.warning("sse.stream.failed", run_id=run_id, offset=last, error=str(exc))
        status = 410 if isinstance(exc, LogGoneError) else 503
        body = {"message": exc.message, "reason": exc.reason, "status": status}
        yield {"event": "log-error", "data": orjson.dumps(body).decode()}
        return
    yield {"event": "end", "data": orjson.dumps({"last_seq": last}).decode()}


async def until_revoked(
    source: AsyncGenerator[Event, None], revoked: asyncio.Event, key_name: str
) -> AsyncGenerator[Event | dict[str, Any], None]:
    """``source``'s events until ``revoked`` is set; then a ``log-error`` of status 401.

    A read parked in Redis is cancelled, not waited for: the stream ends as soon as
    the revocation is seen.
    """
    stop = asyncio.ensure_future(revoked.wait())
    step: asyncio.Future[Event] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(source))
            await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await step
                body = {
                    "message": f"the key {key_name!r} this stream counts against was revoked",
                    "reason": "revoked-key",
                    "status": 401,
                }
                yield {"event": "log-error", "data": orjson.dumps(body).decode()}
                return
            try:
                event = step.result()
            except StopAsyncIteration:
                return
            yield event
    finally:
        # Shielded: a client that went away cancels the stream, and anyio delivers that
        # cancellation again at every await of this cleanup, which must still see the
        # pending read finish before the source can be closed.
        with anyio.CancelScope(shield=True):
            stop.cancel()
            if step is not None and not step.done():
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await step
            await source.aclose()


class CuttableEventSourceResponse(EventSourceResponse):
    """An event stream that is cut when ``cut`` is set: the connection is closed
    without the body's end, so the client sees a broken stream and reconnects with
    ``Last-Event-ID``. A client that stopped reading parks the response in a send
    that never returns; only cancelling it frees the stream (uvicorn then closes the
    connection, and logs that the response was not completed)."""

    def __init__(self, *args: Any, cut: asyncio.Event, **kwargs: Any) -> None:
        # LF line ends (sse-starlette's default is CRLF), as the fan-out's frames have.
        super().__init__(*args, **{"sep": "\n", **kwargs})
        self.cut = cut

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def cut_when_told() -> None:
                await self.cut.wait()
                group.cancel_scope.cancel()

            group.start_soon(cut_when_told)
            await super().__call__(scope, receive, send)
            group.cancel_scope.cancel()


def parse_stream(lines: Iterable[str]) -> Iterator[tuple[str | None, str, str]]:
    """``(id, event, data)`` per event of an SSE byte stream's lines; comments are skipped.

    For our own clients (the demo, the benchmark); browsers have EventSource.
    """
    fields: dict[str, str] = {}
    data: list[str] = []
    for line in lines:
        if line.startswith(":"):
            continue
        if line == "":
            if data or fields:
                yield fields.get("id"), fields.get("event", "message"), "\n".join(data)
            fields, data = {}, []
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        else:
            fields[name] = value
