"""Revoking a key ends the event streams it has open, within a second.

A request is refused as soon as its key is revoked, since every request looks
its key up; an event stream, though, is one request that lasts as long as its
run. So each web process keeps the names of the keys that have streams open
(the caller's key, or the run's owner for a stream opened with a token) and asks
the store once a second which of them are revoked: one query per process,
whatever the number of streams. A stream whose key is revoked ends with a
``log-error`` event of status 401 (``turnkeeper.web.sse``), and the reconnect
its client may try is refused like any request of a revoked key.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import structlog
from starlette.concurrency import run_in_threadpool

from turnkeeper.errors import TurnkeeperError
from turnkeeper.store.store import Store

log = structlog.get_logger(__name__)

CHECK_SECONDS = 1.0


class RevocationWatch:
    """Sets an asyncio event per watched key when the store says it is revoked."""

    def __init__(self, store: Store, *, every: float = CHECK_SECONDS) -> None:
        self._store = store
        self._every = every
        self._watched: dict[str, tuple[asyncio.Event, int]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @contextlib.contextmanager
    def watch(self, key_name: str) -> Iterator[asyncio.Event]:
        """An event that is set once ``key_name`` is revoked, for as long as the block runs."""
        event, count = self._watched.get(key_name, (asyncio.Event(), 0))
        self._watched[key_name] = (event, count + 1)
        try:
            yield event
        finally:
            event, count = self._watched[key_name]
            if count == 1:
                del self._watched[key_name]
            else:
                self._watched[key_name] = (event, count - 1)

    async def check(self) -> None:
        """One look at the store: set the events of the watched keys that are revoked."""
        names = [name for name, (event, _) in self._watched.items() if not event.is_set()]
        if not names:
            return
        revoked = await run_in_threadpool(self._store.revoked_among, names)
        for name in revoked:
            watched = self._watched.get(name)
            if watched is not None:
                log.info("web.stream.key_revoked", key_name=name)
                watched[0].set()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            try:
                await self.check()
            except TurnkeeperError as exc:  # the store is away: look again next time
                log.warning("web.revocation.check_failed", error=str(exc))
            except Exception:  # the watch outlives any one failed look
                log.exception("web.revocation.check_crashed")
