"""One reader per run per web process, feeding every SSE stream of that run.

A ``RunFeed`` parks one ``XREAD BLOCK`` on its run's stream (on the fan-out's own
Redis client, so connections grow with the runs watched, not with the clients) and
encodes each chunk to its SSE frame once; every ``Subscription`` of the run gets
the same bytes. A subscription has a bounded buffer: one whose client stops reading
falls behind, is dropped (``cut`` is set, and its response is cut), and its
client reconnects with ``Last-Event-ID`` to resume where it was; nobody else waits
for it.

A subscription that starts behind its run's feed (a resume, a late joiner) reads
the stored chunks itself, one ``XRANGE`` page at a time and at its client's pace,
until the feed's recent frames (``FanOutLimits.backlog_frames``) cover its cursor;
then it joins. A feed starts where its first subscriber caught up to the end of
what is stored, so a feed is always near the live end, and it stops when its last
subscriber leaves. A feed reads on at the pace of its fastest subscriber: when
every buffer is over half full, it waits for one to drain (so a burst of stored
chunks is not thrown at everyone at once). The design is in
``docs/architecture.md`` ("Fan-out of the event streams").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Final

import orjson
import structlog

from turnkeeper.chunks import Chunk
from turnkeeper.errors import ConfigError, LogError, LogGoneError
from turnkeeper.log import AsyncRunLog

log = structlog.get_logger(__name__)

FEED_BLOCK_MS: Final = 2_000  # a parked read looks at the log's state this often
DRAIN_GRACE_SECONDS: Final = 5.0


def chunk_frame(seq: int, chunk: Chunk) -> bytes:
    """The SSE frame of one chunk, byte for byte what sse-starlette makes of
    ``{"id": seq, "data": json}`` with ``sep="\\n"`` (JSON has no raw newline, so one
    ``data:`` line). Lines end in LF, as on every stream of ours (docs/api.md)."""
    return b"id: %d\ndata: %s\n\n" % (seq, orjson.dumps(chunk))


def event_frame(event: str, body: object) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (event.encode(), orjson.dumps(body))


def is_chunk_frame(frame: bytes) -> bool:
    return frame.startswith(b"id: ")


def error_frame(exc: LogError) -> bytes:
    """The ``log-error`` event a stream ends with when its log fails under it."""
    status = 410 if isinstance(exc, LogGoneError) else 503
    return event_frame(
        "log-error", {"message": exc.message, "reason": exc.reason, "status": status}
    )


@dataclass(frozen=True, slots=True)
class FanOutLimits:
    """How far a subscriber may fall behind, and how much a feed keeps for joiners."""

    max_frames: int = 2_048
    max_bytes: int = 8 << 20
    backlog_frames: int = 256
    backlog_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if min(self.max_frames, self.max_bytes, self.backlog_frames, self.backlog_bytes) < 1:
            raise ConfigError("fan-out limits must be positive", reason="invalid-fanout-limits")
        if self.backlog_frames > self.max_frames or self.backlog_bytes > self.max_bytes:
            # A joiner is handed the backlog at once: it must fit its buffer.
            raise ConfigError(
                "a feed's backlog must fit a subscriber's buffer", reason="invalid-fanout-limits"
            )


@dataclass(frozen=True, slots=True)
class _Ending:
    """How a subscription's stream ends once its buffer is sent."""

    frame: bytes | None  # None: the end event (its last_seq is the subscriber's own)
    final: bool = True  # False: no event at all (shutdown; the client resumes elsewhere)


_ENDED: Final = _Ending(None)
_SHUT_DOWN: Final = _Ending(None, final=False)
_DROPPED: Final = _Ending(None, final=False)
"""Fell too far behind: its response is cut (``cut``), never ended."""


class Subscription:
    """One SSE stream's view of its run: frames after ``cursor``, through its run's feed."""

    def __init__(
        self,
        fanout: FanOut,
        run_id: str,
        after: int,
        on_first_event: Callable[[float], None] | None = None,
    ) -> None:
        self.run_id = run_id
        self.cursor = after
        """The last seq handed to this subscription (queued or sent)."""
        self.cut = asyncio.Event()
        """Set when the response must be cut: the subscriber fell too far behind, or it
        did not take its last frames within the shutdown's grace."""
        self._fanout = fanout
        self._on_first_event = on_first_event
        self._buffer: deque[bytes] = deque()
        self._buffered_bytes = 0
        self._wake = asyncio.Event()
        self._ending: _Ending | None = None
        self._feed: RunFeed | None = None

    def offer(self, seq: int, frame: bytes) -> None:
        """Queue the frame of chunk ``seq`` (the feed's call); drop a subscriber that is full."""
        if seq <= self.cursor or self._ending is not None:
            return
        limits = self._fanout.limits
        # An empty buffer takes any frame: a chunk bigger than ``max_bytes`` is no sign
        # of a slow client (dropping on it would cut every stream of the run, each time).
        if self._buffer and (
            len(self._buffer) >= limits.max_frames
            or self._buffered_bytes + len(frame) > limits.max_bytes
        ):
            self._drop()
            return
        self._buffer.append(frame)
        self._buffered_bytes += len(frame)
        self.cursor = seq
        self._wake.set()

    @property
    def has_room(self) -> bool:
        """Under half full: its run's feed may read on."""
        limits = self._fanout.limits
        return (
            len(self._buffer) * 2 < limits.max_frames
            and self._buffered_bytes * 2 < limits.max_bytes
        )

    @property
    def ended(self) -> bool:
        return self._ending is not None

    def finish(self, ending: _Ending) -> None:
        if self._ending is None:
            self._ending = ending
        self._feed = None
        self._wake.set()

    def _drop(self) -> None:
        log.info("sse.subscriber.dropped", run_id=self.run_id, offset=self.cursor)
        self._fanout.dropped += 1
        if self._fanout.on_drop is not None:
            self._fanout.on_drop()
        self._leave()
        self._buffer.clear()
        self._buffered_bytes = 0
        self.finish(_DROPPED)
        self.cut.set()

    def _leave(self) -> None:
        feed, self._feed = self._feed, None
        if feed is not None:
            feed.detach(self)

    async def frames(self) -> AsyncGenerator[bytes, None]:
        """The stream's frames: the chunks after ``cursor``, then its end (or error) event."""
        opened = time.monotonic()
        first = self._on_first_event
        self._fanout.live.add(self)
        try:
            async for frame in self._catch_up():
                if first is not None:
                    first(time.monotonic() - opened)
                    first = None
                yield frame
            while True:
                while self._buffer:
                    frame = self._buffer.popleft()
                    self._buffered_bytes -= len(frame)
                    feed = self._feed
                    if feed is not None and self.has_room:
                        feed.room.set()
                    if first is not None:
                        first(time.monotonic() - opened)
                        first = None
                    yield frame
                ending = self._ending
                if ending is _DROPPED:
                    # Wait for the cut to cancel this stream: returning would end the
                    # response cleanly whenever no send was stuck at the drop.
                    await asyncio.Event().wait()
                if ending is not None:
                    if ending.final:
                        yield ending.frame or event_frame("end", {"last_seq": self.cursor})
                    return
                self._wake.clear()
                await self._wake.wait()
        finally:
            self._fanout.live.discard(self)
            self._leave()

    async def _catch_up(self) -> AsyncGenerator[bytes, None]:
        """Stored chunks read by this subscription alone, until its run's feed covers it."""
        fanout = self._fanout
        page_size = fanout.run_log.page_size
        while self._ending is None:
            if fanout.closed:
                self.finish(_SHUT_DOWN)
                return
            feed = fanout.feeds.get(self.run_id)
            if feed is not None and feed.covers(self.cursor):
                feed.attach(self)
                return
            try:
                page = await fanout.run_log.page(self.run_id, self.cursor, page_size)
            except LogError as exc:
                log.warning(
                    "sse.stream.failed", run_id=self.run_id, offset=self.cursor, error=str(exc)
                )
                self.finish(_Ending(error_frame(exc)))
                return
            for seq, chunk in page.chunks:
                if self._ending is not None:
                    return
                self.cursor = seq
                yield chunk_frame(seq, chunk)
            if page.ended:
                self.finish(_ENDED)
                return
            if len(page.chunks) < page_size and self.run_id not in fanout.feeds:
                if fanout.closed:
                    continue
                # At the end of what is stored, and nobody reads on: this one starts the feed.
                fanout.start_feed(self.run_id, self.cursor).attach(self)
                return


class RunFeed:
    """The one parked reader of a run's log in this process; ends with its log."""

    def __init__(self, fanout: FanOut, run_id: str, after: int) -> None:
        self.run_id = run_id
        self.cursor = after
        self._fanout = fanout
        self._subscribers: dict[Subscription, None] = {}  # insertion-ordered set
        self._backlog: deque[tuple[int, bytes]] = deque()
        self._backlog_bytes = 0
        self.room = asyncio.Event()
        """Set when some subscriber's buffer is under half full."""
        self.task = asyncio.create_task(self._pump(), name=f"turnkeeper-feed-{run_id}")

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def covers(self, cursor: int) -> bool:
        """Can a subscriber at ``cursor`` join, i.e. is every chunk after it still to come
        or in the backlog?"""
        floor = self._backlog[0][0] - 1 if self._backlog else self.cursor
        return cursor >= floor

    def attach(self, subscription: Subscription) -> None:
        for seq, frame in self._backlog:
            subscription.offer(seq, frame)
        if subscription.ended:  # the backlog did not fit what it still had queued
            return
        subscription._feed = self
        self._subscribers[subscription] = None
        if subscription.has_room:
            self.room.set()

    def detach(self, subscription: Subscription) -> None:
        self._subscribers.pop(subscription, None)
        if not self._subscribers:
            self.stop()

    def stop(self) -> None:
        if self._fanout.feeds.get(self.run_id) is self:
            del self._fanout.feeds[self.run_id]
        self.task.cancel()

    def _remember(self, seq: int, frame: bytes) -> None:
        limits = self._fanout.limits
        self._backlog.append((seq, frame))
        self._backlog_bytes += len(frame)
        while len(self._backlog) > limits.backlog_frames or (
            self._backlog_bytes > limits.backlog_bytes and len(self._backlog) > 1
        ):
            self._backlog_bytes -= len(self._backlog.popleft()[1])

    async def _pump(self) -> None:
        ending: _Ending | None = None
        try:
            reader = self._fanout.feed_log.read(self.run_id, self.cursor, block_ms=FEED_BLOCK_MS)
            async for seq, chunk in reader:
                frame = chunk_frame(seq, chunk)
                self.cursor = seq
                self._remember(seq, frame)
                room = False
                for subscription in list(self._subscribers):
                    subscription.offer(seq, frame)
                    room = room or subscription.has_room
                if not room and self._subscribers:
                    # Read on at the pace of the fastest subscriber (a stored burst is
                    # not thrown at everyone at once); the slow ones fall behind alone.
                    self.room.clear()
                    await self.room.wait()
            ending = _ENDED
        except LogError as exc:
            log.warning("sse.stream.failed", run_id=self.run_id, offset=self.cursor, error=str(exc))
            ending = _Ending(error_frame(exc))
        finally:
            if self._fanout.feeds.get(self.run_id) is self:
                del self._fanout.feeds[self.run_id]
            subscribers, self._subscribers = list(self._subscribers), {}
            for subscription in subscribers:
                subscription.finish(ending or _SHUT_DOWN)


class FanOut:
    """The feeds of one web process, by run id.

    ``feed_log`` parks the feeds' reads (one connection per watched run);
    ``run_log`` serves the short reads of subscriptions catching up.
    """

    def __init__(
        self,
        run_log: AsyncRunLog,
        feed_log: AsyncRunLog,
        limits: FanOutLimits | None = None,
        *,
        on_drop: Callable[[], None] | None = None,
    ) -> None:
        self.run_log = run_log
        self.on_drop = on_drop
        self.feed_log = feed_log
        self.limits = limits or FanOutLimits()
        self.feeds: dict[str, RunFeed] = {}
        self.live: set[Subscription] = set()
        """The subscriptions whose streams are being sent."""
        self.closed = False
        self.dropped = 0
        """Subscriptions dropped so far for falling behind."""
        self._stopping: list[asyncio.Task[None]] = []

    def subscribe(
        self,
        run_id: str,
        after: int,
        *,
        on_first_event: Callable[[float], None] | None = None,
    ) -> Subscription:
        """A subscription to the chunks of ``run_id`` after seq ``after`` (read on ``frames``)."""
        return Subscription(self, run_id, after, on_first_event)

    async def wait_past(self, run_id: str, after: int, seconds: float) -> bool:
        """True once a chunk after ``after`` is stored, or the log ended or failed;
        False when ``seconds`` passed first, or the server is shutting down. Through the
        run's feed, as a subscription that leaves at its first frame: however many
        long-polls wait on one run, one read of it parks in Redis."""
        if self.closed:
            return False
        frames = self.subscribe(run_id, after).frames()
        try:
            async with asyncio.timeout(seconds):
                async for _ in frames:
                    return True
        except TimeoutError:
            return False
        finally:
            await frames.aclose()
        return False  # ended without a frame: the server is shutting down

    def start_feed(self, run_id: str, after: int) -> RunFeed:
        feed = RunFeed(self, run_id, after)
        self.feeds[run_id] = feed
        return feed

    def drain(self, grace: float = DRAIN_GRACE_SECONDS) -> None:
        """The server is shutting down: every stream ends once its buffer is sent,
        without an end event (its client resumes with ``Last-Event-ID`` elsewhere), and
        every feed stops. A stream still open ``grace`` seconds later (its client does
        not read) is cut."""
        if self.closed:
            return
        self.closed = True
        feeds, self.feeds = list(self.feeds.values()), {}
        self._stopping.extend(feed.task for feed in feeds)
        for feed in feeds:
            feed.task.cancel()
        for subscription in list(self.live):
            subscription.finish(_SHUT_DOWN)
        asyncio.get_running_loop().call_later(grace, self._cut_remaining)

    def _cut_remaining(self) -> None:
        for subscription in list(self.live):
            subscription.cut.set()

    async def aclose(self) -> None:
        self.drain()
        # The feeds were cancelled; their reads let go of their connections first.
        for task in self._stopping:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.feed_log.aclose()
