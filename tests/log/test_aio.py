"""AsyncRunLog: the web server's reader, with the same semantics as RunLog.read."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from turnkeeper.chunks import Chunk
from turnkeeper.embedded.ports import free_port
from turnkeeper.embedded.redis import EmbeddedRedis
from turnkeeper.errors import LogGoneError, LogOffsetError, LogUnavailableError
from turnkeeper.log import AsyncRunLog, RunLog, aio

from .samples import text_chunk

HANG_GUARD = 30.0


def numbered(first: int, stop: int) -> list[tuple[int, Chunk]]:
    return [(n, text_chunk(n)) for n in range(first, stop)]


async def collect(log: AsyncRunLog, run_id: str, after_seq: int) -> list[tuple[int, Chunk]]:
    return [item async for item in log.read(run_id, after_seq, block_ms=10_000)]


def test_concurrent_async_readers_park_and_end_at_close(
    redis_url: str, namespace: str, runlog: RunLog
) -> None:
    async def scenario() -> None:
        reader = AsyncRunLog.from_url(redis_url, namespace=namespace, max_connections=64)
        runlog.fence("r", 1)
        runlog.append("r", 1, 1, [text_chunk(1), text_chunk(2)])
        offsets = [n % 3 for n in range(40)]
        tasks = [asyncio.create_task(collect(reader, "r", after)) for after in offsets]
        await asyncio.sleep(0.2)
        assert not any(task.done() for task in tasks)
        for n in range(3, 30):
            await asyncio.to_thread(runlog.append, "r", 1, n, [text_chunk(n)])
        await asyncio.to_thread(runlog.close, "r", 1)
        results = await asyncio.wait_for(asyncio.gather(*tasks), HANG_GUARD)
        for after, got in zip(offsets, results, strict=True):
            assert got == numbered(after + 1, 30)
        assert await reader.snapshot("r") == numbered(1, 30)
        assert await reader.snapshot("r", after_seq=28) == numbered(29, 30)
        assert await reader.snapshot("unknown") == []
        state = await reader.state("r")
        assert (state.epoch, state.closed, state.next_seq) == (1, True, 30)
        await reader.aclose()

    asyncio.run(scenario())


def test_async_reader_reports_gone_and_bad_offsets(redis_url: str, namespace: str) -> None:
    writer = RunLog.from_url(redis_url, namespace=namespace, retention_seconds=60, max_chunks=3)
    writer.fence("r", 1)
    writer.append("r", 1, 1, [text_chunk(n) for n in range(1, 7)])

    async def scenario() -> None:
        reader = AsyncRunLog.from_url(redis_url, namespace=namespace)
        with pytest.raises(LogGoneError):
            await reader.snapshot("r")
        with pytest.raises(LogGoneError):
            await anext(reader.read("r", 1, block_ms=50))
        with pytest.raises(LogOffsetError):
            await anext(reader.read("r", 7, block_ms=50))
        with pytest.raises(LogGoneError):
            await anext(reader.read("never", 4, block_ms=50))
        assert await reader.snapshot("r", after_seq=3) == numbered(4, 7)
        await reader.aclose()

    asyncio.run(scenario())
    writer.client.close()


def test_a_read_without_a_socket_timeout_ends_when_redis_freezes(
    tmp_path: Path, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The web feeds' client has no socket timeout (redis-py would spend a task per
    command on it): a Redis that stops answering mid-read still ends the read, with
    LogUnavailableError once the read's guard runs out, not a read parked for good."""
    monkeypatch.setattr(aio, "READ_GUARD_SLACK", 0.5)
    server, port = EmbeddedRedis(tmp_path / "redis"), free_port()
    server.start(port)
    try:
        writer = RunLog.from_url(server.url(port), namespace=namespace)
        writer.fence("r", 1)
        writer.append("r", 1, 1, [text_chunk(1)])
        writer.client.close()
        pid = int(server.pidfile.read_text())

        async def read_and_freeze(reader: AsyncRunLog, got: list[tuple[int, Chunk]]) -> None:
            async with asyncio.timeout(HANG_GUARD):
                async for item in reader.read("r", 0, block_ms=200):
                    got.append(item)
                    os.kill(pid, signal.SIGSTOP)  # Redis freezes with the read parked next

        async def scenario() -> list[tuple[int, Chunk]]:
            url = server.url(port)
            reader = AsyncRunLog.from_url(url, namespace=namespace, socket_timeout=None)
            got: list[tuple[int, Chunk]] = []
            try:
                with pytest.raises(LogUnavailableError) as caught:
                    await read_and_freeze(reader, got)
                assert caught.value.reason == "TimeoutError"
            finally:
                os.kill(pid, signal.SIGCONT)
                await reader.aclose()
            return got

        assert asyncio.run(scenario()) == numbered(1, 2)
    finally:
        os.kill(int(server.pidfile.read_text()), signal.SIGCONT)
        server.stop(port)
