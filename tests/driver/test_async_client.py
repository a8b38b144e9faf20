"""The asyncio client on a real fleet: it streams a run across a crash takeover (each chunk
once, the oracle's exact sequence), continues a session, and cancels a queued run."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import redis

from tests.driver.fleet import (
    Fleet,
    chunks_while_held,
    expected_log,
    held_agent,
    release_held,
    wait_held,
)
from tests.driver.test_crash_takeover import attempts, mid_run
from turnkeeper.chunks import Chunk
from turnkeeper.client import AsyncClient, Client
from turnkeeper.config import Settings
from turnkeeper.log import AsyncRunLog
from turnkeeper.store.records import Run, RunStatus

AGENT: dict[str, Any] = {"preset": "scripted", "turns": 3, "seed": 23}
PROMPT = "follow me across the crash"
HANG_GUARD = 180.0
HELD_LINES = 8


async def _follow_across_a_kill(
    fleet: Fleet, workdir: Path
) -> tuple[Run, Run, list[tuple[int, Chunk]]]:
    """Submit with the async client an agent held after HELD_LINES lines
    (tests.driver.fleet.held_agent) and read its stream; once all it said so far has
    arrived, SIGKILL the owner's whole worker, let the agent go on, and read on in the
    same iteration until the log closes."""
    token = f"held-{fleet.settings.namespace}"
    async with AsyncClient.from_settings(fleet.settings) as client:
        run = await client.submit(held_agent(AGENT, token, HELD_LINES), PROMPT)
        held = await asyncio.to_thread(
            chunks_while_held, run.run_id, AGENT, PROMPT, HELD_LINES, workdir
        )
        received: list[tuple[int, Chunk]] = []
        killed: Run | None = None
        try:
            async for seq, chunk in client.events(run.run_id):
                received.append((seq, chunk))
                if killed is None and len(received) == held:
                    await asyncio.to_thread(wait_held, token)
                    killed = await asyncio.to_thread(mid_run, fleet, run.run_id, held)
                    # The agent is held: the run cannot have settled, however slow the host.
                    assert killed.status is RunStatus.RUNNING
                    assert killed.epoch == 1
                    fleet.signal_worker_of(killed, signal.SIGKILL)
                    release_held(token)
        finally:
            release_held(token)
        assert killed is not None
        done = await client.require(run.run_id)
        return killed, done, received


def test_the_async_client_follows_a_run_across_a_crash_takeover(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.start_pair()
    fleet.wait_ready()
    killed, done, received = asyncio.run(
        asyncio.wait_for(_follow_across_a_kill(fleet, tmp_path / "held"), HANG_GUARD)
    )
    assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
    assert (done.epoch, done.attempt_count) == (2, 2)
    assert attempts(fleet, done.run_id)[0][:2] == (1, "superseded")
    oracle = expected_log(done.run_id, done.session_id, AGENT, PROMPT, tmp_path / "oracle")
    # The whole stream, element by element: every chunk once, in order, none after the end.
    assert received == list(enumerate(oracle, start=1))
    assert killed.owner != done.owner


async def _two_messages(settings: Settings) -> tuple[list[list[tuple[int, Chunk]]], list[str]]:
    async with AsyncClient.from_settings(settings) as client:
        chat = client.session("async-chat", agent={"preset": "scripted", "turns": 1})
        streams = []
        for prompt in ("first", "second"):
            reply = await chat.send(prompt)
            streams.append([event async for event in reply])
            assert (await reply.refresh()).status is RunStatus.COMPLETED
            # What is stored now, without following, is the stream just read.
            assert [event async for event in reply.events(follow=False)] == streams[-1]
            # A reader resuming after seq 3 gets the rest, each once (a closed log, too).
            assert [event async for event in reply.events(3)] == streams[-1][3:]
        runs = await chat.runs()
        entries = await chat.transcript()
        assert [run.session_id for run in runs] == ["async-chat", "async-chat"]
        return streams, [entry.run_id for entry in entries]


def test_an_async_session_sends_a_follow_up(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_worker()
    fleet.wait_ready()
    streams, entry_runs = asyncio.run(asyncio.wait_for(_two_messages(fleet.settings), HANG_GUARD))
    runs = list(reversed(fleet.client.list_runs(session_id="async-chat")))
    assert len(runs) == 2
    for run, stream in zip(runs, streams, strict=True):
        assert stream == fleet.log_of(run.run_id)
        assert [seq for seq, _ in stream] == list(range(1, len(stream) + 1))
        assert stream[0][1]["type"] == "RUN_STARTED"
        assert stream[-1][1]["type"] == "RUN_FINISHED"
    # Both messages are in the conversation, the first one's entries before the second's.
    first, second = (run.run_id for run in runs)
    assert entry_runs[0] == first
    assert entry_runs[-1] == second
    assert sorted(set(entry_runs), key=entry_runs.index) == [first, second]


async def _cancel_queued(settings: Settings) -> tuple[Run, list[tuple[int, Chunk]], Run | None]:
    async with AsyncClient.from_urls(
        settings.require_database_url(), settings.require_redis_url(), namespace=settings.namespace
    ) as client:
        run = await client.submit("scripted", "never runs", run_id="async-cancel")
        again = await client.submit("scripted", "never runs", run_id="async-cancel")
        assert again.run_id == run.run_id
        cancelled = await client.cancel(run.run_id)
        events = [event async for event in client.events(run.run_id)]
        return cancelled, events, await client.get("no-such-run")


def test_the_async_client_cancels_a_queued_run(settings: Settings) -> None:
    """No worker: the run stays queued, so cancelling it ends it and its log at once."""
    cancelled, events, missing = asyncio.run(asyncio.wait_for(_cancel_queued(settings), HANG_GUARD))
    assert cancelled.status is RunStatus.ABORTED
    assert [seq for seq, _ in events] == [1]
    assert events[0][1]["type"] == "RUN_ERROR"
    assert missing is None


FOLLOWERS = 5


def _blocked_readers(settings: Settings, name: str) -> list[dict[str, Any]]:
    """The Redis server's connections named ``name`` (each with its last command)."""
    probe = redis.Redis.from_url(settings.require_redis_url())
    try:
        return [c for c in probe.client_list() if c.get("name") == name]
    finally:
        probe.close()


async def _cancel_follows(settings: Settings, name: str) -> tuple[int, int, int]:
    """Follow a queued run (no worker: its log stays open) from FOLLOWERS tasks, cancel
    them while Redis holds each one's XREAD, and count the connections left."""
    sync = Client.from_settings(settings)
    client = AsyncClient(sync, AsyncRunLog.from_settings(settings, client_name=name))
    async with client:
        run = await client.submit("scripted", "never runs", run_id="async-follow-cancel")

        async def follow() -> list[tuple[int, Chunk]]:
            return [event async for event in client.events(run.run_id)]

        tasks = [asyncio.create_task(follow()) for _ in range(FOLLOWERS)]
        while True:  # until every follower is parked in a blocking read
            parked = [
                c
                for c in await asyncio.to_thread(_blocked_readers, settings, name)
                if c["cmd"] == "xread" and "b" in c["flags"]
            ]
            if len(parked) == FOLLOWERS:
                break
            await asyncio.sleep(0.05)
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
        after_cancel = await asyncio.to_thread(_blocked_readers, settings, name)
        still_blocked = sum(1 for c in after_cancel if "b" in c["flags"])
        # The client still works: a follow after the cancels reads the run's end.
        await client.cancel(run.run_id)
        events = [event async for event in client.events(run.run_id)]
        assert [(seq, chunk["type"]) for seq, chunk in events] == [(1, "RUN_ERROR")]
        in_use = len(client.run_log.client.connection_pool._in_use_connections)
    left = await asyncio.to_thread(_blocked_readers, settings, name)
    return still_blocked, in_use, len(left)


def test_cancelling_follows_leaves_no_blocked_read_or_connection(settings: Settings) -> None:
    name = f"follow-cancel-{settings.namespace}"[:60]
    still_blocked, in_use, left = asyncio.run(
        asyncio.wait_for(_cancel_follows(settings, name), HANG_GUARD)
    )
    # No cancelled follower's XREAD stays parked on the server, none holds a pooled
    # connection, and closing the client closes every connection it opened.
    assert (still_blocked, in_use, left) == (0, 0, 0)
