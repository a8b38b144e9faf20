"""The fan-out of run logs to SSE streams (``turnkeeper.web.fanout``): one reader per run
per web process, whatever the number of clients; slow clients dropped and resumed.

The logs are written here exactly as a run's owner writes them (a fenced
``RunLog``: fence, append, close) on real runs of the store that no worker takes,
so each test chooses when chunks land relative to its subscribers.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
import redis

from tests.web.conftest import ApiKeys, WebServer, stream_tokens
from turnkeeper.chunks import Chunk
from turnkeeper.client import Client
from turnkeeper.config import Settings
from turnkeeper.log import RunLog
from turnkeeper.web import create_app
from turnkeeper.web.fanout import FanOutLimits
from turnkeeper.web.sse import parse_stream
from turnkeeper.web.state import web_client_names

HANG_GUARD = 120.0
TOKENS = stream_tokens(ttl=600)
# Small enough that a client that stops reading overflows its buffer soon, and a
# joiner a few dozen chunks behind its run's feed reads its way up alone. The other
# tests run at the defaults (``bare_web``).
SMALL = FanOutLimits(max_frames=64, max_bytes=512 << 10, backlog_frames=8, backlog_bytes=64 << 10)

Received = tuple[list[tuple[int, Chunk]], tuple[str, Any] | None]


def chunk(run_id: str, n: int, size: int = 0) -> Chunk:
    delta = f"{run_id} chunk {n} " + "x" * size
    return {"type": "TEXT_MESSAGE_CONTENT", "messageId": run_id, "delta": delta}


def numbered(run_id: str, first: int, last: int, size: int = 0) -> list[tuple[int, Chunk]]:
    return [(n, chunk(run_id, n, size)) for n in range(first, last + 1)]


@pytest.fixture
def small_web(settings: Settings, api_keys: ApiKeys) -> Iterator[WebServer]:
    server = WebServer.start_app(create_app(settings, ping_seconds=0.5, fanout_limits=SMALL))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def writer(settings: Settings) -> Iterator[RunLog]:
    log = RunLog.from_settings(settings)
    try:
        yield log
    finally:
        log.client.close()


def queued_runs(settings: Settings, prefix: str, count: int) -> list[str]:
    """Runs of a trusted client (their streams count against no key), left queued."""
    client = Client.from_settings(settings)
    try:
        return [client.submit("scripted", "p", run_id=f"{prefix}-{n}").run_id for n in range(count)]
    finally:
        client.close()


def url_of(run_id: str) -> str:
    return f"/runs/{run_id}/events?token={TOKENS.issue(run_id)}"


def write(log: RunLog, run_id: str, first: int, last: int, size: int = 0) -> None:
    if first == 1:
        log.fence(run_id, 1)
    log.append(run_id, 1, first, [c for _, c in numbered(run_id, first, last, size)])


async def read_events(
    http: httpx.AsyncClient,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    seen: Callable[[int], None] | None = None,
) -> Received:
    """The (seq, chunk) pairs of a stream, and its last event when not a chunk (None when
    the response ended without one)."""
    chunks: list[tuple[int, Chunk]] = []
    async with http.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        lines: list[str] = []
        async for line in response.aiter_lines():
            lines.append(line)
            if line != "":
                continue
            for event_id, event, data in parse_stream(lines):
                if event != "message":
                    return chunks, (event, orjson.loads(data))
                assert event_id is not None
                chunks.append((int(event_id), orjson.loads(data)))
                if seen is not None:
                    seen(len(chunks))
            lines = []
    return chunks, None


def metric(web: WebServer, key: str, name: str) -> float:
    with web.http(key) as admin:
        text = admin.get("/metrics").text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found is not None, name
    return float(found.group(1))


async def until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def feed_connections(settings: Settings) -> list[dict[str, Any]]:
    """The web process's feed connections, from Redis's own CLIENT LIST."""
    name = web_client_names(settings.namespace).feeds
    client = redis.Redis.from_url(settings.require_redis_url())
    try:
        return [c for c in client.client_list() if c.get("name") == name]
    finally:
        client.close()


def parked_feeds(settings: Settings) -> int:
    return sum(1 for c in feed_connections(settings) if c.get("cmd") == "xread")


def async_http(web: WebServer, streams: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=web.base_url,
        timeout=httpx.Timeout(HANG_GUARD),
        limits=httpx.Limits(max_connections=streams + 10, max_keepalive_connections=0),
    )


def test_a_hundred_subscribers_of_one_run_each_receive_exactly_the_log(
    settings: Settings, bare_web: WebServer, api_keys: ApiKeys, writer: RunLog
) -> None:
    (run_id,) = queued_runs(settings, "hundred", 1)
    last = 300

    async def scenario() -> list[Received]:
        async with async_http(bare_web, 100) as http:
            readers = [asyncio.create_task(read_events(http, url_of(run_id))) for _ in range(100)]
            await until(lambda: parked_feeds(settings) == 1, "the run's feed to park")
            await until(
                lambda: metric(bare_web, api_keys.admin, "turnkeeper_sse_open_streams") == 100,
                "100 open streams",
            )
            # One reader in Redis for the hundred streams, and it is the run's feed.
            assert len(feed_connections(settings)) == 1
            for first in range(1, last + 1, 25):
                await asyncio.to_thread(write, writer, run_id, first, first + 24)
            await asyncio.to_thread(writer.close, run_id, 1)
            return await asyncio.wait_for(asyncio.gather(*readers), HANG_GUARD)

    for received in asyncio.run(scenario()):
        assert received == (numbered(run_id, 1, last), ("end", {"last_seq": last}))
    assert metric(bare_web, api_keys.admin, "turnkeeper_sse_feeds") == 0


def test_redis_connections_grow_with_runs_not_clients(
    settings: Settings, bare_web: WebServer, api_keys: ApiKeys, writer: RunLog
) -> None:
    """Read on Redis itself (CLIENT LIST, by the name the web process gives its feed
    connections): 3 runs watched by 30 clients each hold 3 connections; 30 more clients
    of those runs add none; 3 more runs with one client each add 3."""
    runs = queued_runs(settings, "conns", 6)
    crowded, single = runs[:3], runs[3:]

    def open_streams() -> float:
        return metric(bare_web, api_keys.admin, "turnkeeper_sse_open_streams")

    async def scenario() -> tuple[list[int], list[Received]]:
        counts: list[int] = []
        async with async_http(bare_web, 130) as http:
            readers = [
                asyncio.create_task(read_events(http, url_of(run_id)))
                for run_id in crowded
                for _ in range(30)
            ]
            await until(lambda: open_streams() == 90, "90 open streams")
            await until(lambda: parked_feeds(settings) == 3, "3 parked feeds")
            counts.append(len(feed_connections(settings)))
            readers += [
                asyncio.create_task(read_events(http, url_of(run_id)))
                for run_id in crowded
                for _ in range(10)
            ]
            await until(lambda: open_streams() == 120, "120 open streams")
            counts.append(len(feed_connections(settings)))
            readers += [asyncio.create_task(read_events(http, url_of(run_id))) for run_id in single]
            await until(lambda: open_streams() == 123, "123 open streams")
            await until(lambda: parked_feeds(settings) == 6, "6 parked feeds")
            counts.append(len(feed_connections(settings)))
            for run_id in runs:
                await asyncio.to_thread(write, writer, run_id, 1, 5)
                await asyncio.to_thread(writer.close, run_id, 1)
            return counts, await asyncio.wait_for(asyncio.gather(*readers), HANG_GUARD)

    counts, received = asyncio.run(scenario())
    assert counts == [3, 3, 6]
    expected = [*(r for r in crowded for _ in range(30)), *(r for r in crowded for _ in range(10))]
    for run_id, got in zip([*expected, *single], received, strict=True):
        assert got == (numbered(run_id, 1, 5), ("end", {"last_seq": 5}))


def test_subscribers_of_many_runs_at_once_each_receive_their_own_log(
    settings: Settings, bare_web: WebServer, api_keys: ApiKeys, writer: RunLog
) -> None:
    """40 runs, 3 streams each, written in interleaved rounds while all are open."""
    runs = queued_runs(settings, "many", 40)
    rounds = 12

    async def scenario() -> list[Received]:
        async with async_http(bare_web, 120) as http:
            readers = [
                asyncio.create_task(read_events(http, url_of(run_id)))
                for run_id in runs
                for _ in range(3)
            ]
            await until(
                lambda: metric(bare_web, api_keys.admin, "turnkeeper_sse_open_streams") == 120,
                "120 open streams",
            )
            for index in range(rounds):
                for run_id in runs:
                    first = index * 3 + 1
                    await asyncio.to_thread(write, writer, run_id, first, first + 2)
            for run_id in runs:
                await asyncio.to_thread(writer.close, run_id, 1)
            return await asyncio.wait_for(asyncio.gather(*readers), HANG_GUARD)

    received = asyncio.run(scenario())
    expected = [run_id for run_id in runs for _ in range(3)]
    for run_id, got in zip(expected, received, strict=True):
        assert got == (numbered(run_id, 1, rounds * 3), ("end", {"last_seq": rounds * 3}))
    assert metric(bare_web, api_keys.admin, "turnkeeper_sse_feeds") == 0


def test_subscribers_joining_mid_run_at_an_offset_get_exactly_the_suffix(
    settings: Settings, small_web: WebServer, api_keys: ApiKeys, writer: RunLog
) -> None:
    """A live subscriber holds the run's feed; later ones join at offsets far behind it
    (read up alone), within its backlog, at its head, by ``?offset=`` and by
    ``Last-Event-ID``."""
    (run_id,) = queued_runs(settings, "joiners", 1)

    async def scenario() -> dict[str, Received]:
        async with async_http(small_web, 10) as http:
            got: dict[str, asyncio.Task[Received]] = {}
            progress = [0]
            got["live"] = asyncio.create_task(
                read_events(http, url_of(run_id), seen=lambda n: progress.__setitem__(0, n))
            )
            await until(lambda: parked_feeds(settings) == 1, "the feed to park")
            await asyncio.to_thread(write, writer, run_id, 1, 600)
            await until(lambda: progress[0] == 600, "the live subscriber to reach 600")
            for name, offset in (("far", 20), ("backlog", 595), ("head", 600), ("zero", 0)):
                got[name] = asyncio.create_task(
                    read_events(http, f"{url_of(run_id)}&offset={offset}")
                )
            header = {"Last-Event-ID": "300"}
            got["header"] = asyncio.create_task(
                read_events(http, f"{url_of(run_id)}&offset=7", headers=header)
            )
            await until(
                lambda: metric(small_web, api_keys.admin, "turnkeeper_sse_open_streams") == 6,
                "6 open streams",
            )
            await asyncio.to_thread(write, writer, run_id, 601, 700)
            await asyncio.to_thread(writer.close, run_id, 1)
            assert len(feed_connections(settings)) == 1
            done = await asyncio.wait_for(asyncio.gather(*got.values()), HANG_GUARD)
            return dict(zip(got, done, strict=True))

    received = asyncio.run(scenario())
    starts = {"live": 0, "far": 20, "backlog": 595, "head": 600, "zero": 0, "header": 300}
    for name, after in starts.items():
        assert received[name] == (
            numbered(run_id, after + 1, 700),
            ("end", {"last_seq": 700}),
        ), name


def _stalled_get(web: WebServer, path: str) -> socket.socket:
    """A GET on a socket with a tiny receive buffer, that the test stops reading."""
    host, port = web.base_url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # before connect: the window
    sock.settimeout(HANG_GUARD)
    sock.connect((host, int(port)))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    return sock


def _read_until(sock: socket.socket, got: bytearray, marker: bytes) -> None:
    while marker not in got:
        data = sock.recv(65536)
        assert data, "the stream closed early"
        got += data


def _dechunk(raw: bytes) -> tuple[bytes, bool]:
    """The body of a chunked HTTP response, and whether its last chunk (0) arrived."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:100]
    assert b"transfer-encoding: chunked" in head.lower()
    body = bytearray()
    while rest:
        size_line, sep, after = rest.partition(b"\r\n")
        if not sep:
            break
        size = int(size_line, 16)
        if size == 0:
            return bytes(body), True
        if len(after) < size + 2:
            break  # cut inside a chunk
        body += after[:size]
        rest = after[size + 2 :]
    return bytes(body), False


def _whole_events(body: bytes) -> list[tuple[int, Chunk]]:
    """The chunk events that arrived whole (a cut stream may end inside one)."""
    complete, _, _ = body.rpartition(b"\n\n")
    lines = [*complete.decode().split("\n"), ""]
    out: list[tuple[int, Chunk]] = []
    for event_id, event, data in parse_stream(lines):
        assert event == "message", (event, data)  # neither end nor error: a cut
        assert event_id is not None
        out.append((int(event_id), orjson.loads(data)))
    return out


def test_a_stalled_subscriber_is_dropped_and_resumes_without_loss(
    settings: Settings, small_web: WebServer, api_keys: ApiKeys, writer: RunLog
) -> None:
    """A client that stops reading fills its socket, then its buffer, and is cut; a
    client of the same run reads on at its own pace meanwhile. The stalled one reads
    what reached it, resumes with ``Last-Event-ID`` and has the whole log, once."""
    (run_id,) = queued_runs(settings, "stalled", 1)
    last, size = 3000, 3000  # ~9 MB: more than the sockets on the way can hold
    whole = numbered(run_id, 1, last, size)
    write(writer, run_id, 1, 1, size)
    stalled = _stalled_get(small_web, url_of(run_id))
    got = bytearray()
    _read_until(stalled, got, b"id: 1\n")  # it follows the run; then it stops reading

    async def fast() -> Received:
        async with async_http(small_web, 2) as http:
            return await read_events(http, url_of(run_id))

    reader = threading.Thread(target=lambda: results.append(asyncio.run(fast())))
    results: list[Received] = []
    reader.start()
    for first in range(2, last + 1, 100):
        write(writer, run_id, first, min(first + 99, last), size)
    writer.close(run_id, 1)
    reader.join(HANG_GUARD)
    assert results == [(whole, ("end", {"last_seq": last}))]  # while the other still stalls

    deadline = time.monotonic() + HANG_GUARD
    while metric(small_web, api_keys.admin, "turnkeeper_sse_dropped_total") < 1:
        assert time.monotonic() < deadline, "the stalled subscriber was never dropped"
        time.sleep(0.05)
    while data := stalled.recv(65536):
        got += data
    stalled.close()
    body, finished = _dechunk(bytes(got))
    assert not finished, "a dropped stream is cut, not ended"
    before = _whole_events(body)
    assert 1 <= len(before) < last
    assert before == whole[: len(before)]
    with small_web.http() as http:
        resumed = http.get(url_of(run_id), headers={"Last-Event-ID": str(before[-1][0])})
    events = list(parse_stream(resumed.text.split("\n")))
    rest = [(int(i or 0), orjson.loads(d)) for i, e, d in events if e == "message"]
    assert before + rest == whole
    assert events[-1][1:] == ("end", orjson.dumps({"last_seq": last}).decode())
    assert metric(small_web, api_keys.admin, "turnkeeper_sse_dropped_total") == 1


def test_web_shutdown_closes_every_stream_cleanly(
    settings: Settings, api_keys: ApiKeys, writer: RunLog
) -> None:
    """Stopping the server ends each open stream's response properly (no end event: the
    run goes on) and lets go of its Redis connections; another server resumes them."""
    runs = queued_runs(settings, "shutdown", 3)
    for run_id in runs:
        write(writer, run_id, 1, 20)
    web = WebServer.start_app(create_app(settings, ping_seconds=0.5))
    counts: dict[int, int] = {}

    async def scenario() -> list[Received]:
        async with async_http(web, 10) as http:
            readers = [
                asyncio.create_task(
                    read_events(http, url_of(run_id), seen=lambda n, k=k: counts.__setitem__(k, n))
                )
                for k, run_id in enumerate(r for r in runs for _ in range(2))
            ]
            await until(lambda: sorted(counts.values()) == [20] * 6, "every stream at seq 20")
            await until(lambda: parked_feeds(settings) == 3, "3 parked feeds")
            stopping = threading.Thread(target=web.stop, kwargs={"timeout": HANG_GUARD})
            stopping.start()
            done = await asyncio.wait_for(asyncio.gather(*readers), HANG_GUARD)
            await asyncio.to_thread(stopping.join, HANG_GUARD)
            return done

    try:
        received = asyncio.run(scenario())
    finally:
        web.stop()
    assert not web.thread.is_alive()
    expected = [run_id for run_id in runs for _ in range(2)]
    for run_id, got in zip(expected, received, strict=True):
        assert got == (numbered(run_id, 1, 20), None)  # whole events, a complete response
    deadline = time.monotonic() + HANG_GUARD
    while feed_connections(settings):  # closed by the server; Redis drops each on reading it
        assert time.monotonic() < deadline, "the stopped server's feed connections stayed"
        time.sleep(0.05)
    for run_id in runs:
        write(writer, run_id, 21, 30)
        writer.close(run_id, 1)
    again = WebServer.start_app(create_app(settings, ping_seconds=0.5))
    try:
        with again.http() as http:
            for run_id in runs:
                resumed = http.get(url_of(run_id), headers={"Last-Event-ID": "20"})
                lines = resumed.text.split("\n")
                events = list(parse_stream(lines))
                assert [(int(i or 0), orjson.loads(d)) for i, e, d in events[:-1]] == numbered(
                    run_id, 21, 30
                )
                assert events[-1][1] == "end"
    finally:
        again.stop()


def test_a_chunk_bigger_than_a_whole_buffer_reaches_a_subscriber_that_keeps_up(
    settings: Settings, small_web: WebServer, writer: RunLog
) -> None:
    """A single chunk larger than ``max_bytes`` is no sign of a slow client: a subscriber
    whose buffer is empty takes it (before the fan-out such a chunk streamed as any other);
    dropping it would cut every live stream of the run at that chunk, each time."""
    (run_id,) = queued_runs(settings, "huge", 1)
    huge = SMALL.max_bytes + (64 << 10)

    async def scenario() -> list[Received]:
        async with async_http(small_web, 3) as http:
            seen: list[int] = [0, 0]

            def counter(index: int) -> Callable[[int], None]:
                return lambda count: seen.__setitem__(index, count)

            readers = [
                asyncio.create_task(read_events(http, url_of(run_id), seen=counter(i)))
                for i in range(2)
            ]
            await until(lambda: parked_feeds(settings) == 1, "the run's feed to park")
            await asyncio.to_thread(write, writer, run_id, 1, 2)
            await until(lambda: seen == [2, 2], "both streams at chunk 2")
            await asyncio.to_thread(writer.append, run_id, 1, 3, [chunk(run_id, 3, huge)])
            await asyncio.to_thread(write, writer, run_id, 4, 5)
            await asyncio.to_thread(writer.close, run_id, 1)
            return await asyncio.wait_for(asyncio.gather(*readers), HANG_GUARD)

    expected = [*numbered(run_id, 1, 2), (3, chunk(run_id, 3, huge)), *numbered(run_id, 4, 5)]
    for received in asyncio.run(scenario()):
        assert received == (expected, ("end", {"last_seq": 5}))


def test_a_killed_feed_connection_neither_loses_nor_doubles_a_chunk_nor_parks_forever(
    settings: Settings, bare_web: WebServer, api_keys: ApiKeys, writer: RunLog
) -> None:
    """CLIENT KILL of the run's feed connection (found by its name in CLIENT LIST) while
    two streams are parked on it: each goes on with no gap and no double, or ends with the
    ``log-error`` of a lost Redis; a subscriber that comes after gets the whole log."""
    (run_id,) = queued_runs(settings, "killed", 1)

    async def scenario() -> tuple[list[Received], Received]:
        async with async_http(bare_web, 3) as http:
            seen: list[int] = [0, 0]
            readers = [
                asyncio.create_task(
                    read_events(http, url_of(run_id), seen=lambda n, i=i: seen.__setitem__(i, n))
                )
                for i in range(2)
            ]
            await until(lambda: parked_feeds(settings) == 1, "the run's feed to park")
            await asyncio.to_thread(write, writer, run_id, 1, 2)
            await until(lambda: seen == [2, 2], "both streams at chunk 2")
            (feed,) = feed_connections(settings)
            killer = redis.Redis.from_url(settings.require_redis_url())
            try:
                killer.client_kill_filter(_id=feed["id"])
            finally:
                killer.close()
            await asyncio.to_thread(write, writer, run_id, 3, 4)
            await asyncio.to_thread(writer.close, run_id, 1)
            first = await asyncio.wait_for(asyncio.gather(*readers), HANG_GUARD)
            late = await asyncio.wait_for(read_events(http, url_of(run_id)), HANG_GUARD)
            return first, late

    first, late = asyncio.run(scenario())
    for chunks, last in first:
        if last is not None and last[0] == "log-error":
            assert chunks == numbered(run_id, 1, len(chunks))
            assert last[1]["status"] == 503
        else:
            assert (chunks, last) == (numbered(run_id, 1, 4), ("end", {"last_seq": 4}))
    assert late == (numbered(run_id, 1, 4), ("end", {"last_seq": 4}))
    assert metric(bare_web, api_keys.admin, "turnkeeper_sse_feeds") == 0


def test_subscribers_that_hang_up_mid_stream_leave_no_feed_behind(
    settings: Settings, bare_web: WebServer, api_keys: ApiKeys, writer: RunLog
) -> None:
    """Three clients close their sockets mid-stream: the run's feed stops with the last
    of them and its parked read lets go of Redis; a client after them starts a new feed
    and gets the whole log."""
    (run_id,) = queued_runs(settings, "hangup", 1)

    def gauge(name: str) -> float:
        return metric(bare_web, api_keys.admin, name)

    async def scenario() -> Received:
        async with async_http(bare_web, 4) as http:
            seen: list[int] = [0, 0, 0]
            readers = [
                asyncio.create_task(
                    read_events(http, url_of(run_id), seen=lambda n, i=i: seen.__setitem__(i, n))
                )
                for i in range(3)
            ]
            await until(lambda: parked_feeds(settings) == 1, "the run's feed to park")
            await asyncio.to_thread(write, writer, run_id, 1, 3)
            await until(lambda: seen == [3, 3, 3], "the streams at chunk 3")
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            await until(lambda: gauge("turnkeeper_sse_open_streams") == 0, "no open stream")
            await until(lambda: gauge("turnkeeper_sse_feeds") == 0, "no feed")
            await until(lambda: parked_feeds(settings) == 0, "no parked read in Redis")
            late = asyncio.create_task(read_events(http, url_of(run_id)))
            await until(lambda: parked_feeds(settings) == 1, "a new feed to park")
            await asyncio.to_thread(write, writer, run_id, 4, 5)
            await asyncio.to_thread(writer.close, run_id, 1)
            return await asyncio.wait_for(late, HANG_GUARD)

    assert asyncio.run(scenario()) == (numbered(run_id, 1, 5), ("end", {"last_seq": 5}))
