"""The read side of the run log on redis.asyncio, for the web server's SSE streams.

Same keys, same decoding and the same semantics as ``RunLog.snapshot`` and
``RunLog.read``; only the writer (the driver) needs the sync class. Each parked
reader holds one pooled connection while it blocks, so size the pool for the
number of concurrent reads (the web server parks one per watched run,
``turnkeeper.web.fanout``).

A log Redis lost is rebuilt by ``restorer`` (a sync ``RunLog`` with a source), on a
worker thread, the first time a read finds it missing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Self, cast

import anyio.to_thread
import redis.asyncio

from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.errors import ConfigError, LogUnavailableError
from turnkeeper.log.entries import (
    STATE_FIELDS,
    LogState,
    Page,
    decode_page,
    parse_state,
    redis_errors,
)
from turnkeeper.log.keys import RunKeys, check_namespace
from turnkeeper.log.runlog import (
    DEFAULT_BLOCK_MS,
    DEFAULT_PAGE_SIZE,
    SHORT_READ_TRIES,
    SOCKET_TIMEOUT,
    FollowWalk,
    RunLog,
    SnapshotWalk,
    WalkStep,
    check_client,
    check_short_read,
)

READ_GUARD_SLACK = SOCKET_TIMEOUT
"""Seconds a blocking read may run past its block time before Redis counts as gone."""


@contextlib.asynccontextmanager
async def _read_guard(run_id: str, block_ms: int) -> AsyncIterator[None]:
    """A blocking read's hang guard, for a client with no socket timeout of its own
    (the web feeds': redis-py guards each command there with ``asyncio.wait_for``, a
    task per read; this is one timer)."""
    try:
        async with asyncio.timeout(block_ms / 1000 + READ_GUARD_SLACK):
            yield
    except TimeoutError as exc:
        raise LogUnavailableError(
            "Redis did not answer a blocking read", run_id=run_id, reason="TimeoutError"
        ) from exc


class AsyncRunLog:
    """Snapshots and blocking reads of run logs on an asyncio Redis client."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        namespace: str,
        page_size: int = DEFAULT_PAGE_SIZE,
        restorer: RunLog | None = None,
    ) -> None:
        check_client(client)
        if page_size < 1:
            raise ConfigError("page_size must be positive", reason="invalid-page-size")
        self._redis = client
        self.namespace = check_namespace(namespace)
        self.page_size = page_size
        self.restorer = restorer
        """Rebuilds a lost log (``RunLog.ensure``); None: a lost log reads as absent."""

    @classmethod
    def from_url(
        cls, url: str, *, namespace: str, blocking: bool = False, **client_options: Any
    ) -> Self:
        """A log on its own client. ``blocking``: at most ``max_connections`` are
        opened, and a command waits (``timeout`` seconds) for one to be free, instead of
        opening connections as fast as commands come."""
        client_options.setdefault("socket_timeout", SOCKET_TIMEOUT)
        pool_class = (
            redis.asyncio.BlockingConnectionPool if blocking else redis.asyncio.ConnectionPool
        )
        pool = pool_class.from_url(url, decode_responses=False, **client_options)
        return cls(redis.asyncio.Redis.from_pool(pool), namespace=namespace)

    @classmethod
    def from_settings(cls, settings: Settings, **client_options: Any) -> Self:
        return cls.from_url(
            settings.require_redis_url(), namespace=settings.namespace, **client_options
        )

    @property
    def client(self) -> redis.asyncio.Redis:
        return self._redis

    def keys(self, run_id: str) -> RunKeys:
        return RunKeys.of(self.namespace, run_id)

    async def _read_state(self, run_id: str) -> LogState:
        keys = self.keys(run_id)
        with redis_errors(run_id, "state"):
            pipe = self._redis.pipeline(transaction=True)
            pipe.hmget(keys.meta, STATE_FIELDS)
            pipe.xrange(keys.stream, "-", "+", count=1)
            meta, head = await pipe.execute()
        return parse_state(meta, head)

    async def state(self, run_id: str) -> LogState:
        """As ``RunLog.state``: a lost log is rebuilt first."""
        state = await self._read_state(run_id)
        restorer = self.restorer
        for stalls in range(SHORT_READ_TRIES + 2):
            if (
                not state.missing
                or restorer is None
                or not await anyio.to_thread.run_sync(restorer.ensure, run_id)
            ):
                return state
            state = await self._read_state(run_id)
            check_short_read(stalls, run_id, 0)
        return state

    async def snapshot(self, run_id: str, after_seq: int = 0) -> list[tuple[int, Chunk]]:
        """As ``RunLog.snapshot``."""
        stream = self.keys(run_id).stream
        rebuilds = self.restorer is not None
        walk = SnapshotWalk(run_id, after_seq, self.page_size, rebuilds, await self.state(run_id))
        while walk.going:
            with redis_errors(run_id, "snapshot"):
                rows = await self._redis.xrange(
                    stream, f"(0-{walk.cursor}", "+", count=self.page_size
                )
            if walk.take(cast("list[Any]", rows or [])) is WalkStep.STATE:
                walk.restate(await self.state(run_id))
        return walk.result()

    async def page(self, run_id: str, after_seq: int, count: int) -> Page:
        """Up to ``count`` stored chunks after ``after_seq`` (one XRANGE), and whether the
        end marker follows them; never blocks. LogGoneError when retention removed chunk
        ``after_seq + 1``."""
        stream = self.keys(run_id).stream
        with redis_errors(run_id, "page"):
            entries = await self._redis.xrange(stream, f"(0-{after_seq}", "+", count=count)
        return decode_page(cast("list[Any]", entries or []), after_seq, run_id)

    async def read(
        self, run_id: str, after_seq: int = 0, *, block_ms: int = DEFAULT_BLOCK_MS
    ) -> AsyncIterator[tuple[int, Chunk]]:
        """As ``RunLog.read``: parks on an open log, ends when it is closed."""
        follow = FollowWalk(run_id, after_seq, await self.state(run_id))
        stream = self.keys(run_id).stream
        while follow.going:
            with redis_errors(run_id, "read"):
                async with _read_guard(run_id, block_ms):
                    reply = await self._redis.xread(
                        {stream: f"0-{follow.cursor}"}, count=self.page_size, block=block_ms
                    )
            chunks = follow.take(reply)
            if chunks is None:
                follow.timed_out(await self.state(run_id))
            else:
                for event in chunks:
                    yield event

    async def aclose(self) -> None:
        await self._redis.aclose()
