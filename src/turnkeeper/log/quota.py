"""Per-key quotas kept in Redis, shared by every web process: submit rate and open streams.

Both are Lua scripts on the Redis clock (``keys.SUBMIT_BUCKET_LUA``,
``keys.STREAM_SLOT_LUA``). A refusal is a ``QuotaExceededError`` carrying the
seconds to wait, which the web app turns into 429 with ``Retry-After``.
"""

from __future__ import annotations

import math
import uuid

import redis
import redis.asyncio

from turnkeeper.errors import QuotaExceededError
from turnkeeper.log.entries import redis_errors
from turnkeeper.log.keys import (
    STREAM_SLOT_LUA,
    SUBMIT_BUCKET_LUA,
    check_namespace,
    stream_slots_key,
    submit_bucket_key,
)

STREAM_LEASE_MS = 60_000
"""A stream's slot lapses this long after its last renewal: what a crashed web process holds."""
STREAM_RENEW_SECONDS = STREAM_LEASE_MS / 3000


class SubmitRate:
    """A token bucket per API key: ``per_minute`` sustained, ``burst`` at once."""

    def __init__(
        self, client: redis.Redis, *, namespace: str, per_minute: float, burst: int
    ) -> None:
        self._script = client.register_script(SUBMIT_BUCKET_LUA)
        self._namespace = check_namespace(namespace)
        self._per_ms = per_minute / 60_000
        self._burst = burst

    def take(self, key_name: str) -> None:
        """Spend one submission of ``key_name``, or raise QuotaExceededError."""
        with redis_errors(None, "submit rate"):
            allowed, wait_ms = self._script(
                keys=[submit_bucket_key(self._namespace, key_name)],
                args=[repr(self._per_ms), self._burst],
            )
        if not allowed:
            raise QuotaExceededError(
                f"the key {key_name!r} submits faster than its rate allows",
                reason="submit-rate",
                retry_after=max(1, math.ceil(int(wait_ms) / 1000)),
            )


class StreamSlots:
    """At most ``cap`` open event streams per API key, counted across web processes."""

    def __init__(self, client: redis.asyncio.Redis, *, namespace: str, cap: int) -> None:
        self._script = client.register_script(STREAM_SLOT_LUA)
        self._client = client
        self._namespace = check_namespace(namespace)
        self._cap = cap

    async def _take(self, key: str, slot: str) -> bool:
        with redis_errors(None, "stream slot"):
            held = await self._script(keys=[key], args=[slot, self._cap, STREAM_LEASE_MS])
        return bool(held)

    async def acquire(self, key_name: str) -> str:
        """A slot id for a new stream of ``key_name``; QuotaExceededError at the cap."""
        slot = uuid.uuid4().hex
        if not await self._take(stream_slots_key(self._namespace, key_name), slot):
            raise QuotaExceededError(
                f"the key {key_name!r} has {self._cap} event streams open, its limit",
                reason="open-streams",
                retry_after=5,
            )
        return slot

    async def renew(self, key_name: str, slot: str) -> None:
        await self._take(stream_slots_key(self._namespace, key_name), slot)

    async def release(self, key_name: str, slot: str) -> None:
        with redis_errors(None, "stream slot"):
            await self._client.zrem(stream_slots_key(self._namespace, key_name), slot)
