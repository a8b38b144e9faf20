"""Append throughput: the fenced Lua append of RunLog against plain pipelined XADD.

Both sides write the same encoded chunks with the same explicit ids ``0-<seq>``,
one round trip per batch: ours is one EVALSHA per batch (epoch, closed and seq
checks, XADDs, the next-seq update, the length check); the plain side is a
pipeline of XADDs with no guard at all. Rounds alternate to share the noise.

    .venv/bin/python bench/log_append.py [--quick] [--chunks N] [--url URL]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable
from functools import partial

import redis

from turnkeeper.chunks import Chunk, encode_chunk
from turnkeeper.log import RunLog
from turnkeeper.logconfig import configure_logging


def make_chunks(count: int) -> list[Chunk]:
    return [
        {
            "type": "TEXT_MESSAGE_CONTENT",
            "messageId": "0190b5e2-7f3a-7cc1-9a5e-2f1d7e0c9b11-m3",
            "delta": f"token {n} of a realistic streamed answer, about sixty bytes",
        }
        for n in range(count)
    ]


def run_ours(log: RunLog, run_id: str, chunks: list[Chunk], batch: int) -> list[float]:
    log.fence(run_id, 1)
    latencies = []
    seq = 1
    for start in range(0, len(chunks), batch):
        began = time.perf_counter()
        seq = log.append(run_id, 1, seq, chunks[start : start + batch]) + 1
        latencies.append(time.perf_counter() - began)
    return latencies


def run_plain(client: redis.Redis, key: str, chunks: list[Chunk], batch: int) -> list[float]:
    latencies = []
    seq = 1
    for start in range(0, len(chunks), batch):
        began = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for chunk in chunks[start : start + batch]:
            pipe.xadd(key, {b"c": encode_chunk(chunk)}, id=f"0-{seq}")
            seq += 1
        pipe.execute()
        latencies.append(time.perf_counter() - began)
    return latencies


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def latency(latencies: list[float]) -> str:
    return f"{percentile(latencies, 50) * 1e3:.3f}/{percentile(latencies, 99) * 1e3:.3f}"


Result = tuple[float, list[float]]


def measure_batch(
    log: RunLog, client: redis.Redis, chunks: list[Chunk], batch: int, rounds: int
) -> tuple[Result, Result]:
    """Best round (elapsed, per-call latencies) of ours and of plain, alternating who goes first."""
    ours: list[Result] = []
    plain: list[Result] = []
    for round_number in range(rounds):
        run_id = f"append-{batch}-{round_number}"
        plain_key = f"{log.namespace}:plain:{batch}:{round_number}"
        sides: list[tuple[list[Result], Callable[[], list[float]]]] = [
            (ours, partial(run_ours, log, run_id, chunks, batch)),
            (plain, partial(run_plain, client, plain_key, chunks, batch)),
        ]
        if round_number % 2:
            sides.reverse()
        for results, run in sides:
            began = time.perf_counter()
            latencies = run()
            results.append((time.perf_counter() - began, latencies))
        assert log.snapshot(run_id, after_seq=len(chunks) - 1)[-1][0] == len(chunks)
        assert client.xlen(plain_key) == len(chunks)
        client.delete(*log.keys(run_id).as_list(), plain_key)
    return min(ours, key=lambda r: r[0]), min(plain, key=lambda r: r[0])


def main() -> None:
    configure_logging("WARNING")
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--url", default=os.environ.get("TURNKEEPER_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2,000 chunks, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.chunks, args.rounds = 2_000, 2

    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(args.url)
    log = RunLog(client, namespace=namespace, retention_seconds=60, max_chunks=10_000_000)
    chunks = make_chunks(args.chunks)
    print(f"{args.chunks} chunks of {len(encode_chunk(chunks[0]))} bytes, best of {args.rounds}")
    print("batch  ours ch/s  plain ch/s  ratio  ours p50/p99 ms  plain p50/p99 ms")
    try:
        for batch in (1, 32):
            (ours_s, ours_lat), (plain_s, plain_lat) = measure_batch(
                log, client, chunks, batch, args.rounds
            )
            ours_rate, plain_rate = args.chunks / ours_s, args.chunks / plain_s
            print(
                f"{batch:>5} {ours_rate:>10,.0f} {plain_rate:>11,.0f} "
                f"{ours_rate / plain_rate:>6.2f}  {latency(ours_lat):>15}  {latency(plain_lat):>16}"
            )
    finally:
        leftovers = list(client.scan_iter(match=f"{namespace}:*"))
        if leftovers:
            client.delete(*leftovers)
        client.close()


if __name__ == "__main__":
    main()
