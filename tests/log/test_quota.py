"""Per-key quotas on a real Redis: the submit token bucket and the open-stream slots."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis
import redis.asyncio

from turnkeeper.errors import QuotaExceededError
from turnkeeper.log.keys import stream_slots_key
from turnkeeper.log.quota import StreamSlots, SubmitRate


def test_the_bucket_allows_a_burst_then_one_per_interval_per_key(
    redis_url: str, namespace: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        rate = SubmitRate(client, namespace=namespace, per_minute=2, burst=3)
        for _ in range(3):
            rate.take("alice")
        with pytest.raises(QuotaExceededError) as refused:
            rate.take("alice")
        assert refused.value.reason == "submit-rate"
        assert 1 <= refused.value.fields["retry_after"] <= 30  # one token every 30 s
        rate.take("bob")  # every key has a bucket of its own
        other = SubmitRate(client, namespace=f"{namespace}-other", per_minute=2, burst=3)
        other.take("alice")  # and every namespace
    finally:
        client.close()


def test_racing_takers_never_get_more_than_the_burst(redis_url: str, namespace: str) -> None:
    client = redis.Redis.from_url(redis_url, max_connections=32)
    rate = SubmitRate(client, namespace=namespace, per_minute=0.001, burst=10)
    taken: list[bool] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def take() -> None:
        start.wait()
        for _ in range(5):
            try:
                rate.take("alice")
                ok = True
            except QuotaExceededError:
                ok = False
            with lock:
                taken.append(ok)

    threads = [threading.Thread(target=take) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.close()
    assert (taken.count(True), taken.count(False)) == (10, 70)


def test_stream_slots_cap_release_and_lapse(redis_url: str, namespace: str) -> None:
    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        slots = StreamSlots(client, namespace=namespace, cap=2)
        try:
            first = await slots.acquire("alice")
            second = await slots.acquire("alice")
            with pytest.raises(QuotaExceededError) as refused:
                await slots.acquire("alice")
            assert (refused.value.reason, refused.value.fields["retry_after"]) == (
                "open-streams", 5,
            )  # fmt: skip
            await slots.acquire("bob")  # another key's cap is its own
            await slots.renew("alice", first)  # renewing a held slot never counts twice
            await slots.release("alice", second)
            third = await slots.acquire("alice")
            # A web process that died held `first`: its lease lapses and the slot goes.
            key = stream_slots_key(namespace, "alice")
            await client.zadd(key, {first: 1})
            await slots.acquire("alice")
            held = {m.decode() for m in await client.zrange(key, 0, -1)}
            assert first not in held
            assert third in held
            assert len(held) == 2
        finally:
            await client.aclose()

    asyncio.run(scenario())
