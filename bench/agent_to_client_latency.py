"""End to end: an agent writes a line -> an SSE client receives its event.

Ours: a real worker runs the agent journaled in a sandbox, follows the journal,
translates, stores the bytes in Postgres and appends to the fenced log; a
`turnkeeper web` process streams the run to N SSE clients. Plain: the same agent
with a pipe, each line XADDed at once, N clients on XREAD BLOCK. The agent
prints time.time_ns() on each line (one every 20 ms), so each client measures
the latency of every line it receives. With 1 and with 200 clients on one run.

Then the fleet's usual shape, each user watching their own run: 200 runs, and
1,000 runs, with one client each, all on the one web process. These cases measure
the web process, not the agents: 1,000 jailed agents and their turns on this
machine's 2 cores would leave it no CPU to measure with (bench/turns_per_worker.py
measures live turns). So these runs' lines are appended to the fenced log as their
owners would (``RunLog.append``, one line per run every ``--fleet-gap`` seconds,
stamped with time.time_ns()), by a few writer threads in a process of their own,
once every client has a first, untimed chunk (as the plain readers are connected
before their writers start), and once the clients' collector is settled
(``settle_clients_gc``);
plain is the same writers XADDing to plain streams, one client per stream on XREAD
BLOCK. Our clients are lean SSE readers on asyncio streams, as light as the plain
path's redis-py readers, in this process with them. For each case:
p50 and p99 of both paths, the web process's RSS per open stream (RSS with the
streams open minus RSS before, per stream), and its Redis connections (CLIENT
LIST by the names it gives them: parked feed reads, and short commands). The load
average is printed with them: the machine may be shared.

    .venv/bin/python bench/agent_to_client_latency.py [--lines 150] [--fleet-lines 20]
        [--fleet-gap 0.5] [--cases 1,200,200x1,1000x1]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import multiprocessing.process
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis
import redis.asyncio

from _fleet import bench_fleet, percentile
from turnkeeper.client import Client
from turnkeeper.config import Settings
from turnkeeper.log import RunLog
from turnkeeper.logconfig import configure_logging
from turnkeeper.secret import STREAM_TOKENS, ServerSecret
from turnkeeper.store.store import Store
from turnkeeper.web.serve import free_port
from turnkeeper.web.state import web_client_names
from turnkeeper.web.tokens import StreamTokens

GAP = 0.02
# This venv's interpreter by a path the jail can show (``../.venv`` would not be one).
INTERPRETER = str(Path(sys.executable).parent.resolve() / Path(sys.executable).name)
WRITERS = 4


def agent_argv(lines: int) -> list[str]:
    script = (
        "import time\n"
        "time.sleep(3.0)\n"  # the clients connect meanwhile (the plain ones before it starts)
        f"for _ in range({lines}):\n"
        "    print(time.time_ns(), flush=True)\n"
        f"    time.sleep({GAP})\n"
    )
    return [INTERPRETER, "-c", script]


def latency_ms(value: str) -> float:
    return (time.time_ns() - int(value.strip())) / 1e6


async def sse_client(
    base_url: str, path: str, out: list[float], opened: Callable[[], None] | None = None
) -> None:
    """A lean SSE reader on asyncio streams (HTTP/1.1, chunked), as light on the
    client's side as the plain path's XREAD reader: the figures are the server's."""
    host, _, port = base_url.removeprefix("http://").partition(":")
    reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 22)
    try:
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head.split(b"\r\n")[0]
        assert b"transfer-encoding: chunked" in head.lower(), head
        pending = b""
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            if size == 0:
                return
            pending += (await reader.readexactly(size + 2))[:-2]
            *events, pending = pending.split(b"\r\n\r\n")
            for event in events:
                if event.startswith(b":"):  # a ping
                    continue
                if not event.startswith(b"id: "):  # the end (or an error) event
                    return
                if opened is not None:  # its first event: the stream is open and fed
                    opened()
                    opened = None
                chunk = orjson.loads(event.partition(b"\r\ndata: ")[2])
                if chunk.get("type") == "TEXT_MESSAGE_CONTENT":
                    out.append(latency_ms(chunk["delta"]))
    finally:
        writer.close()


async def ours(  # noqa: PLR0917 - one call site
    client: Client, base_url: str, tokens: StreamTokens, lines: int, n: int, web_pid: int
) -> tuple[list[float], float, tuple[int, int]]:
    """Latencies, RSS KiB per open stream, and (feed, command) connections while open."""
    agent = {"command": agent_argv(lines), "format": "text"}
    before = rss_kb(web_pid)
    run = client.submit(agent, "")
    url = f"/runs/{run.run_id}/events?token={tokens.issue(run.run_id)}"
    samples: list[float] = []
    measured: dict[str, Any] = {}

    async def measure() -> None:
        ticks = 0
        while len(samples) < n:  # about one line each: every stream is open and fed
            await asyncio.sleep(0.01)
            ticks += 1
            if ticks % 100 == 0:  # a run that failed never feeds them: say why
                now = await asyncio.to_thread(client.require, run.run_id)
                if now.status.is_terminal:
                    raise SystemExit(f"the run ended {now.status.value}: {now.error}")
        measured["rss"] = rss_kb(web_pid)
        measured["connections"] = await asyncio.to_thread(web_connections, client.settings)

    await asyncio.gather(measure(), *(sse_client(base_url, url, samples) for _ in range(n)))
    return samples, (measured["rss"] - before) / n, measured["connections"]


async def read_plain_stream(
    redis_url: str, key: str, ready: asyncio.Event, samples: list[float]
) -> None:
    """The plain path's client: XREAD BLOCK on its own connection until the end entry,
    a latency sample per entry."""
    conn = redis.asyncio.Redis.from_url(redis_url, socket_timeout=None, socket_connect_timeout=120)
    last = "0-0"
    try:
        await conn.ping()
        ready.set()
        while True:
            reply = await conn.xread({key: last}, block=5000, count=100)
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    last = entry_id
                    if b"end" in fields:
                        return
                    samples.append(latency_ms(fields[b"c"].decode()))
    finally:
        await conn.aclose()


async def plain(redis_url: str, lines: int, n: int) -> list[float]:
    key = f"plain-e2e-{uuid.uuid4().hex[:8]}"
    samples: list[float] = []

    async def reader(ready: asyncio.Event) -> None:
        await read_plain_stream(redis_url, key, ready, samples)

    def produce() -> None:
        sync = redis.Redis.from_url(redis_url)
        proc = subprocess.Popen(agent_argv(lines), stdout=subprocess.PIPE)
        assert proc.stdout is not None
        for line in proc.stdout:
            sync.xadd(key, {"c": line})
        proc.wait()
        sync.xadd(key, {"end": b"1"})
        sync.close()

    readies = [asyncio.Event() for _ in range(n)]
    readers = [asyncio.create_task(reader(ready)) for ready in readies]
    for ready in readies:
        await ready.wait()
    await asyncio.to_thread(produce)
    await asyncio.gather(*readers)
    cleanup = redis.Redis.from_url(redis_url)
    cleanup.delete(key)  # once every reader has read the end (a deleted key never ends)
    cleanup.close()
    return samples


def settle_clients_gc() -> None:
    """Once every client of a fleet case is connected, before its writers start: what
    the connections made stays out of this process's later collections, as
    ``turnkeeper web`` does for itself (``cli/web.py: settle_gc``). A full collection
    here stalls every client at once, and times the harness, not the server: one of
    258 ms in this process set the 1,000-run case's p99 (its web process collected
    nothing over 5 ms meanwhile). Both paths' clients get the same; ``gc.unfreeze``
    after the case."""
    gc.collect()
    gc.freeze()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def web_connections(settings: Settings) -> tuple[int, int]:
    """(feed connections, command connections) of the web process, from CLIENT LIST."""
    names = web_client_names(settings.namespace)
    sync = redis.Redis.from_url(settings.require_redis_url())
    try:
        listed = [c.get("name") for c in sync.client_list()]
    finally:
        sync.close()
    return listed.count(names.feeds), listed.count(names.commands)


def start_writers(  # noqa: PLR0917 - two call sites, the same shape
    path: str, redis_url: str, namespace: str, keys: list[str], lines: int, gap: float
) -> multiprocessing.process.BaseProcess:
    """The writers of a fleet case, in a process of their own (as a fleet's workers
    are), apart from the clients that time them: ``path`` "plain" XADDs, "ours"
    appends to the fenced log (``RunLog.append``, the run's first chunk already in)."""
    process = multiprocessing.get_context("spawn").Process(
        target=write_paced, args=(path, redis_url, namespace, keys, lines, gap)
    )
    process.start()
    return process


def write_paced(  # noqa: PLR0917 - a process target
    path: str, redis_url: str, namespace: str, keys: list[str], lines: int, gap: float
) -> None:
    """WRITERS threads, each appending line 1..lines to its share of ``keys``, one line
    per key every ``gap`` seconds, spread evenly over the gap, stamped with
    time.time_ns() as it is written."""

    def appender() -> Callable[[str, int], None]:
        if path == "plain":
            sync = redis.Redis.from_url(redis_url)
            return lambda key, _line: sync.xadd(key, {"c": str(time.time_ns())})
        log = RunLog.from_url(redis_url, namespace=namespace)

        def append(run_id: str, line: int) -> None:
            chunk = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": str(time.time_ns())}
            log.append(run_id, 1, line + 1, [chunk])

        return append

    def write(share: list[str], index: int) -> None:
        append = appender()
        step = gap / max(1, len(share))
        start = time.monotonic() + index * step / WRITERS
        for line in range(1, lines + 1):
            for n, key in enumerate(share):
                due = start + (line - 1) * gap + n * step
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                append(key, line)

    shares = [keys[i::WRITERS] for i in range(WRITERS)]
    threads = [
        threading.Thread(target=write, args=(share, i)) for i, share in enumerate(shares) if share
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def fleet_ours(  # noqa: PLR0917 - one call site
    settings: Settings,
    base_url: str,
    tokens: StreamTokens,
    web_pid: int,
    runs: int,
    lines: int,
    gap: float,
) -> tuple[list[float], float, tuple[int, int]]:
    """Latencies, RSS KiB per open stream, and (feed, command) connections while open."""
    tag = uuid.uuid4().hex[:8]
    run_ids = [f"fleet-{tag}-{i}" for i in range(runs)]
    with Store(settings.require_database_url(), pool_size=2) as store:
        for run_id in run_ids:
            store.admit_run(run_id, run_id, {"bench": True}, max_attempts=1, deadline=600)
    log = RunLog.from_settings(settings)
    for run_id in run_ids:
        # A first chunk, not timed: the writers start once every client has it, as the
        # plain readers are connected before their writers start.
        log.fence(run_id, 1)
        log.append(run_id, 1, 1, [{"type": "CUSTOM", "name": "warm-up", "value": 0}])

    samples: list[float] = []
    before = rss_kb(web_pid)
    opened = 0
    all_open = asyncio.Event()
    measured: dict[str, Any] = {}

    def one_opened() -> None:
        nonlocal opened
        opened += 1
        if opened == runs:
            all_open.set()

    async def scenario() -> None:
        clients = [
            asyncio.create_task(
                sse_client(
                    base_url, f"/runs/{r}/events?token={tokens.issue(r)}", samples, one_opened
                )
            )
            for r in run_ids
        ]
        await asyncio.wait_for(all_open.wait(), 300)
        settle_clients_gc()
        writers = start_writers(
            "ours", settings.require_redis_url(), settings.namespace, run_ids, lines, gap
        )
        await asyncio.sleep(gap * min(lines, 4))  # every feed has parked by now
        measured["rss"] = rss_kb(web_pid)
        measured["connections"] = await asyncio.to_thread(web_connections, settings)
        await asyncio.to_thread(writers.join)
        assert writers.exitcode == 0, writers.exitcode
        for run_id in run_ids:
            await asyncio.to_thread(log.close, run_id, 1)
        await asyncio.gather(*clients)

    try:
        asyncio.run(scenario())
    finally:
        gc.unfreeze()
    log.client.close()
    return samples, (measured["rss"] - before) / runs, measured["connections"]


async def fleet_plain(redis_url: str, runs: int, lines: int, gap: float) -> list[float]:
    tag = uuid.uuid4().hex[:8]
    keys = [f"plain-fleet-{tag}-{i}" for i in range(runs)]
    samples: list[float] = []

    async def reader(key: str, ready: asyncio.Event) -> None:
        await read_plain_stream(redis_url, key, ready, samples)

    readies = [asyncio.Event() for _ in keys]
    readers = [asyncio.create_task(reader(k, e)) for k, e in zip(keys, readies, strict=True)]
    for ready in readies:
        await ready.wait()
    settle_clients_gc()
    try:
        writers = start_writers("plain", redis_url, "", keys, lines, gap)
        await asyncio.to_thread(writers.join)
    finally:
        gc.unfreeze()
    assert writers.exitcode == 0, writers.exitcode
    sync = redis.Redis.from_url(redis_url)
    for key in keys:
        sync.xadd(key, {"end": b"1"})
    await asyncio.gather(*readers)
    for key in keys:
        sync.delete(key)
    sync.close()
    return samples


def report(label: str, count: str, ours_samples: list[float], plain_samples: list[float]) -> None:
    plain50, plain99 = (percentile(plain_samples, q) for q in (50, 99))
    ours50, ours99 = (percentile(ours_samples, q) for q in (50, 99))
    print(f"{label:>10} {'plain':<6} {len(plain_samples):>7} {plain50:>8.2f} {plain99:>8.2f}")
    print(
        f"{'':>10} {'ours':<6} {len(ours_samples):>7} {ours50:>8.2f} {ours99:>8.2f}"
        f"   ratio p50 {ours50 / plain50:.2f}x  p99 {ours99 / plain99:.2f}x  {count}"
    )


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=150, help="agent lines (one run)")
    parser.add_argument("--fleet-lines", type=int, default=20, help="lines per run (many runs)")
    parser.add_argument(
        "--fleet-gap", type=float, default=0.5, help="seconds between a run's lines"
    )
    parser.add_argument("--cases", default="1,200,200x1,1000x1")
    args = parser.parse_args()
    configure_logging("WARNING")
    secret = secrets.token_hex(16)
    # The agent is this interpreter: the jail shows it read-only.
    binds = ",".join(dict.fromkeys(str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix)))
    with (
        tempfile.TemporaryDirectory() as tmp,
        bench_fleet(Path(tmp), secret=secret, sandbox_ro_binds=binds) as fleet,
    ):
        fleet.worker()
        port = free_port("127.0.0.1", 0)
        web = fleet.start("web", "--port", str(port))
        base_url = f"http://127.0.0.1:{port}"
        while True:
            try:
                if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        client = Client.from_settings(fleet.settings)
        redis_url = fleet.settings.require_redis_url()
        tokens = StreamTokens(ServerSecret(secret.encode()).subkey(STREAM_TOKENS), 600)
        print(
            f"one run: the agent prints a timestamp every {GAP * 1000:.0f} ms, {args.lines} lines"
        )
        print(
            f"many runs: a line per run every {args.fleet_gap * 1000:.0f} ms, "
            f"{args.fleet_lines} lines each"
        )
        print(f"{'case':>10} {'path':<6} {'events':>7} {'p50 ms':>8} {'p99 ms':>8}")
        for case in args.cases.split(","):
            load = load_average()
            if "x" in case:
                runs = int(case.partition("x")[0])
                lines = args.fleet_lines
                plain_samples = asyncio.run(fleet_plain(redis_url, runs, lines, args.fleet_gap))
                ours_samples, per_stream, (feeds, commands) = fleet_ours(
                    fleet.settings, base_url, tokens, web.pid, runs, lines, args.fleet_gap
                )
                expected, label = runs * lines, f"{runs} runs"
            else:
                n = int(case)
                plain_samples = asyncio.run(plain(redis_url, args.lines, n))
                ours_samples, per_stream, (feeds, commands) = asyncio.run(
                    ours(client, base_url, tokens, args.lines, n, web.pid)
                )
                expected, label = n * args.lines, f"{n} on 1"
            assert len(plain_samples) == expected, ("plain", len(plain_samples))
            assert len(ours_samples) == expected, ("ours", len(ours_samples))
            report(
                label,
                f"RSS/stream {per_stream:.0f} KiB, Redis conns {feeds} feed + {commands} "
                f"command, load {load}",
                ours_samples,
                plain_samples,
            )
        client.close()
        os.killpg(web.pid, signal.SIGTERM)


if __name__ == "__main__":
    main()
