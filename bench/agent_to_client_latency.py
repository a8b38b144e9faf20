"""End to end: an agent writes a line -> an SSE client receives its event.

Ours: a real worker runs the agent journaled in a sandbox, follows the journal,
translates, stores the bytes in Postgres and appends to the fenced log; a
`turnkeeper web` process streams the run to N SSE clients. Plain: the same agent
with a pipe, each line XADDed at once, N clients on XREAD BLOCK. The agent
prints time.time_ns() on each line (one every 20 ms), so each client measures
the latency of every line it receives. With 1 and with 200 clients.

    .venv/bin/python bench/agent_to_client_latency.py [--lines 150]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import orjson
import redis
import redis.asyncio

from _fleet import bench_fleet, percentile
from turnkeeper.client import Client
from turnkeeper.logconfig import configure_logging
from turnkeeper.secret import STREAM_TOKENS, ServerSecret
from turnkeeper.web.serve import free_port
from turnkeeper.web.sse import parse_stream
from turnkeeper.web.tokens import StreamTokens

GAP = 0.02


def agent_argv(lines: int) -> list[str]:
    script = (
        "import time\n"
        f"time.sleep(1.0)\n"  # the clients connect meanwhile
        f"for _ in range({lines}):\n"
        "    print(time.time_ns(), flush=True)\n"
        f"    time.sleep({GAP})\n"
    )
    return [sys.executable, "-c", script]


def latency_ms(value: str) -> float:
    return (time.time_ns() - int(value.strip())) / 1e6


async def sse_client(http: httpx.AsyncClient, url: str, out: list[float]) -> None:
    async with http.stream("GET", url) as response:
        assert response.status_code == 200, response.status_code
        buffer: list[str] = []
        async for line in response.aiter_lines():
            buffer.append(line)
            if line != "":
                continue
            for _, event, data in parse_stream(buffer):
                if event != "message":
                    return
                chunk = orjson.loads(data)
                if chunk.get("type") == "TEXT_MESSAGE_CONTENT":
                    out.append(latency_ms(chunk["delta"]))
            buffer = []


async def ours(
    client: Client, base_url: str, tokens: StreamTokens, lines: int, n: int
) -> list[float]:
    agent = {"command": agent_argv(lines), "format": "text"}
    run = client.submit(agent, "")
    url = f"/runs/{run.run_id}/events?token={tokens.issue(run.run_id)}"
    samples: list[float] = []
    limits = httpx.Limits(max_connections=n + 10)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=httpx.Timeout(10.0, read=None), limits=limits
    ) as http:
        await asyncio.gather(*(sse_client(http, url, samples) for _ in range(n)))
    return samples


async def plain(redis_url: str, lines: int, n: int) -> list[float]:
    key = f"plain-e2e-{uuid.uuid4().hex[:8]}"
    samples: list[float] = []

    async def reader() -> None:
        conn = redis.asyncio.Redis.from_url(redis_url, socket_timeout=None)
        last = "0-0"
        try:
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

    def produce() -> None:
        sync = redis.Redis.from_url(redis_url)
        proc = subprocess.Popen(agent_argv(lines), stdout=subprocess.PIPE)
        assert proc.stdout is not None
        for line in proc.stdout:
            sync.xadd(key, {"c": line})
        proc.wait()
        sync.xadd(key, {"end": b"1"})
        sync.delete(key)
        sync.close()

    readers = [asyncio.create_task(reader()) for _ in range(n)]
    await asyncio.to_thread(produce)
    await asyncio.gather(*readers)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=150)
    args = parser.parse_args()
    configure_logging("WARNING")
    secret = secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as tmp, bench_fleet(Path(tmp), secret=secret) as fleet:
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
        tokens = StreamTokens(ServerSecret(secret.encode()).subkey(STREAM_TOKENS), 600)
        print(f"agent prints a timestamp every {GAP * 1000:.0f} ms, {args.lines} lines")
        print(f"{'clients':>7} {'path':<36} {'events':>7} {'p50 ms':>8} {'p99 ms':>8}")
        for n in (1, 200):
            rows = {
                "plain": asyncio.run(plain(fleet.settings.require_redis_url(), args.lines, n)),
                "ours": asyncio.run(ours(client, base_url, tokens, args.lines, n)),
            }
            plain50, plain99 = (percentile(rows["plain"], q) for q in (50, 99))
            for name, samples in rows.items():
                label = (
                    "pipe -> XADD -> XREAD (plain)"
                    if name == "plain"
                    else "journal -> worker -> log -> SSE"
                )
                assert len(samples) == n * args.lines, (name, len(samples))
                print(
                    f"{n:>7} {label:<36} {len(samples):>7} "
                    f"{percentile(samples, 50):>8.2f} {percentile(samples, 99):>8.2f}"
                )
            ours50, ours99 = (percentile(rows["ours"], q) for q in (50, 99))
            print(
                f"{n:>7} {'ratio ours / plain':<36} {'':>7} "
                f"{ours50 / plain50:>7.1f}x {ours99 / plain99:>7.1f}x"
            )
        client.close()
        os.killpg(web.pid, signal.SIGTERM)


if __name__ == "__main__":
    main()
