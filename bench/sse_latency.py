"""Latency from a chunk landing in the run log to an SSE client receiving its event.

The writer appends chunks exactly as the driver does (fenced RunLog.append) and
stamps each with time.perf_counter_ns(); readers in the same process note when
the event arrives. Ours: `turnkeeper web` (a separate uvicorn process) serving
/runs/{id}/events to httpx clients. The plain alternative: the same readers
doing XREAD BLOCK on Redis directly (no HTTP, no SSE, no token, no store check).
Ours twice: runs of a trusted client (no key), and runs owned by an API key,
whose streams also hold a slot of the key's stream quota and are watched for the
key's revocation (turnkeeper.web.revocation). With 1 and with 200 concurrent
streams. The hop before this one (agent line -> journal -> reader) is
bench/journal_latency.py; the driver adds its translate and append on top.

    .venv/bin/python bench/sse_latency.py [--quick]

Uses TURNKEEPER_DATABASE_URL / TURNKEEPER_REDIS_URL (a scratch database is
created and dropped), or the embedded servers in .turnkeeper when unset.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import httpx
import orjson
import psycopg
import structlog
from sqlalchemy.engine import make_url

from turnkeeper.config import Settings, plain_postgres_url
from turnkeeper.embedded import resolve_services
from turnkeeper.log import AsyncRunLog, RunLog
from turnkeeper.secret import STREAM_TOKENS, ServerSecret
from turnkeeper.store import migration
from turnkeeper.store.store import Store
from turnkeeper.web.serve import free_port
from turnkeeper.web.sse import parse_stream
from turnkeeper.web.tokens import StreamTokens

BENCH_KEY = "bench"
LABELS = {
    "direct": "Redis XREAD (plain)",
    "sse": "SSE, no key",
    "sse-key": "SSE, key-owned runs",
}


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def writer(log: RunLog, runs: list[str], rounds: int, gap: float, ready: threading.Event) -> None:
    ready.wait()
    for index in range(1, rounds + 1):
        for run_id in runs:
            chunk = {"type": "CUSTOM", "name": "bench", "value": time.perf_counter_ns()}
            log.append(run_id, 1, index, [chunk])
        time.sleep(gap)
    for run_id in runs:
        log.close(run_id, 1)


async def sse_reader(http: httpx.AsyncClient, url: str, out: list[float], opened: Any) -> None:
    async with http.stream("GET", url) as response:
        assert response.status_code == 200, response.status_code
        opened()
        lines = response.aiter_lines()
        buffer: list[str] = []
        async for line in lines:
            buffer.append(line)
            if line != "":
                continue
            for _, event, data in parse_stream(buffer):
                if event != "message":
                    return
                sent = orjson.loads(data)["value"]
                out.append((time.perf_counter_ns() - sent) / 1e6)
            buffer = []


async def direct_reader(log: AsyncRunLog, run_id: str, out: list[float], opened: Any) -> None:
    opened()
    async for _, chunk in log.read(run_id):
        out.append((time.perf_counter_ns() - chunk["value"]) / 1e6)


async def measure(  # noqa: PLR0917 - one call site, read as a table row
    mode: str, settings: Settings, base_url: str, streams: int, rounds: int, gap: float
) -> list[float]:
    tag = uuid.uuid4().hex[:8]
    runs = [f"bench-{tag}-{i}" for i in range(streams)]
    with Store(settings.require_database_url(), pool_size=2) as store:
        for run_id in runs:
            store.admit_run(
                run_id,
                run_id,
                {"bench": True},
                max_attempts=1,
                deadline=600,
                key_name=BENCH_KEY if mode == "sse-key" else None,
            )
    log = RunLog.from_settings(settings)
    for run_id in runs:
        log.fence(run_id, 1)
    samples: list[float] = []
    ready = threading.Event()
    count = 0

    def opened() -> None:
        nonlocal count
        count += 1
        if count == streams:
            ready.set()

    thread = threading.Thread(target=writer, args=(log, runs, rounds, gap, ready))
    thread.start()
    if mode in ("sse", "sse-key"):
        secret = settings.secret.get_secret_value().encode()  # type: ignore[union-attr]
        tokens = StreamTokens(ServerSecret(secret).subkey(STREAM_TOKENS), 600)
        limits = httpx.Limits(max_connections=streams + 10)
        async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as http:
            await asyncio.gather(
                *(
                    sse_reader(http, f"/runs/{r}/events?token={tokens.issue(r)}", samples, opened)
                    for r in runs
                )
            )
    else:
        alog = AsyncRunLog.from_settings(settings, max_connections=streams + 10)
        await asyncio.gather(*(direct_reader(alog, r, samples, opened) for r in runs))
        await alog.aclose()
    thread.join()
    log.client.close()
    return samples


def scratch_database(url: str) -> tuple[str, str]:
    admin = plain_postgres_url(url)
    name = f"tk_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    scratch = make_url(admin).set(database=name).render_as_string(hide_password=False)
    migration.upgrade(scratch)
    with Store(scratch, pool_size=1) as store:
        store.create_key(BENCH_KEY)
    return admin, name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    base, _ = resolve_services(Settings(), start=True)
    admin, dbname = scratch_database(base.require_database_url())
    database_url = make_url(admin).set(database=dbname).render_as_string(hide_password=False)
    settings = base.model_copy(
        update={
            "database_url": database_url,
            "namespace": f"bench-{uuid.uuid4().hex[:8]}",
            "secret": __import__("pydantic").SecretStr(secrets.token_hex(16)),
        }
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKEEPER_")}
    env.update(
        TURNKEEPER_DATABASE_URL=database_url,
        TURNKEEPER_REDIS_URL=settings.require_redis_url(),
        TURNKEEPER_NAMESPACE=settings.namespace,
        TURNKEEPER_SECRET=settings.secret.get_secret_value(),  # type: ignore[union-attr]
        TURNKEEPER_LOG_LEVEL="WARNING",
        TURNKEEPER_MAX_STREAMS_PER_KEY="1000",
    )
    web = subprocess.Popen(
        [sys.executable, "-m", "turnkeeper", "web", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        plans = [(1, 100 if args.quick else 400, 0.01), (200, 10 if args.quick else 30, 0.05)]
        print(f"{'streams':>7} {'reader':<22} {'events':>7} {'p50 ms':>8} {'p99 ms':>8}")
        for streams, rounds, gap in plans:
            results = {}
            for mode, label in LABELS.items():
                samples = asyncio.run(measure(mode, settings, base_url, streams, rounds, gap))
                assert len(samples) == streams * rounds, (mode, len(samples))
                results[mode] = percentiles(samples)
                p50, p99 = results[mode]
                print(f"{streams:>7} {label:<22} {len(samples):>7} {p50:>8.2f} {p99:>8.2f}")
            d50, d99 = results["direct"]
            for mode in ("sse", "sse-key"):
                s50, s99 = results[mode]
                print(
                    f"{streams:>7} {'ratio ' + mode + '/plain':<22} {'':>7} "
                    f"{s50 / d50:>7.1f}x {s99 / d99:>7.1f}x"
                )
    finally:
        web.terminate()
        web.wait(timeout=30)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


if __name__ == "__main__":
    main()
