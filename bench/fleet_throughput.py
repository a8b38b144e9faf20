"""Fleet throughput: N short scripted runs through 2 workers, turnkeeper against plain Celery.

Plain: a Celery task spawns the same agent process with a pipe and XADDs its lines
(bench/plain_tasks.py). Ours: the whole path (admit, claim, sandbox, journaled
spawn, follow, translate, fenced append, segments, transcript, settle, cleanup).
Both sides get 2 worker processes with 2 pool processes each, in one run; the
ratio is ours / plain wall time (goal: at most 1.2). Then ours once more on the same
2 worker processes with the threads pool and ``--threads`` turns each (a turn mostly
waits on its agent: docs/architecture.md, "Many turns in one worker process"), against
the same plain figure.

    .venv/bin/python bench/fleet_throughput.py [--runs 500] [--threads 4]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
import redis

from _fleet import QUIET, bench_fleet
from turnkeeper.agents.spec import AgentSpec
from turnkeeper.client import Client
from turnkeeper.config import plain_postgres_url
from turnkeeper.logconfig import configure_logging

AGENT = {"preset": "scripted", "turns": 1, "pace": 0.0, "seed": 5}
WORKERS, CONCURRENCY = 2, 2


def _settled(database_url: str) -> int:
    with psycopg.connect(plain_postgres_url(database_url)) as conn:
        row = conn.execute(
            "SELECT count(*) FROM runs WHERE status <> 'queued' AND status <> 'running'"
        ).fetchone()
    return int(row[0]) if row else 0


def ours(runs: int, threads: int | None = None) -> float:
    with tempfile.TemporaryDirectory() as tmp, bench_fleet(Path(tmp)) as fleet:
        for _ in range(WORKERS):
            if threads is None:
                fleet.worker(CONCURRENCY)
            else:
                fleet.start("worker", "-P", "threads", "-c", str(threads), *QUIET)
        client = Client.from_settings(fleet.settings)
        client.submit(AGENT, "warm-up")  # workers up and warm before the clock starts
        while _settled(fleet.settings.require_database_url()) < 1:
            time.sleep(0.05)
        started = time.monotonic()
        for index in range(runs):
            client.submit(AGENT, f"run {index}")
        while _settled(fleet.settings.require_database_url()) < runs + 1:
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        client.close()
        return elapsed


def plain(runs: int, redis_url: str) -> float:
    prefix = f"plain-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PLAIN_BROKER_URL": redis_url,
        "PLAIN_REDIS_URL": redis_url,
        "PLAIN_PREFIX": prefix,
        "PYTHONPATH": str(Path(__file__).parent),
    }
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "plain_tasks",
                "worker",
                "-c",
                str(CONCURRENCY),
                "-Q",
                f"{prefix}.plain",
                "--without-mingle",
                "--without-gossip",
                "--without-heartbeat",
                "--loglevel",
                "WARNING",
                "-n",
                f"plain{i}@%h",
            ],
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=Path(__file__).parent,
        )
        for i in range(WORKERS)
    ]
    sys.path.insert(0, str(Path(__file__).parent))
    os.environ.update(PLAIN_BROKER_URL=redis_url, PLAIN_REDIS_URL=redis_url, PLAIN_PREFIX=prefix)
    import plain_tasks  # noqa: PLC0415 - configured by the environment just set

    argv = AgentSpec.from_payload(AGENT).argv("run")
    done_key = f"{prefix}:done"
    client = redis.Redis.from_url(redis_url)
    try:
        plain_tasks.run.apply_async(args=[argv, f"{prefix}:warm"])
        while int(client.get(done_key) or 0) < 1:
            time.sleep(0.05)
        started = time.monotonic()
        for index in range(runs):
            plain_tasks.run.apply_async(args=[argv, f"{prefix}:run:{index}"])
        while int(client.get(done_key) or 0) < runs + 1:
            time.sleep(0.05)
        return time.monotonic() - started
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--threads", type=int, default=4, help="turns per threads worker")
    args = parser.parse_args()
    configure_logging("WARNING")
    from turnkeeper.config import load_settings  # noqa: PLC0415
    from turnkeeper.embedded import resolve_services  # noqa: PLC0415

    base, _ = resolve_services(load_settings(), start=True)
    plain_s = plain(args.runs, base.require_redis_url())
    ours_s = ours(args.runs)
    threads_s = ours(args.runs, args.threads)
    print(f"{args.runs} short scripted runs, {WORKERS} workers x {CONCURRENCY} processes each")
    print(f"plain Celery + XADD : {plain_s:7.1f}s  ({args.runs / plain_s:6.1f} runs/s)")
    print(f"turnkeeper          : {ours_s:7.1f}s  ({args.runs / ours_s:6.1f} runs/s)")
    print(f"ratio ours / plain  : {ours_s / plain_s:.2f}  (goal <= 1.2)")
    print(
        f"turnkeeper, -P threads -c {args.threads} on the same {WORKERS} processes: "
        f"{threads_s:7.1f}s  ({args.runs / threads_s:6.1f} runs/s), "
        f"ratio {threads_s / plain_s:.2f}"
    )


if __name__ == "__main__":
    main()
