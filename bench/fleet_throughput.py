"""Fleet throughput: N short scripted runs through 2 workers, turnkeeper against plain Celery.

Plain: a Celery task spawns the same agent process with a pipe and XADDs its lines
(bench/plain_tasks.py). Ours: the whole path (admit, claim, sandbox, journaled
spawn, follow, translate, fenced append, segments, transcript, settle, cleanup).
Both sides get 2 worker processes with 2 pool processes each, in one run; the
ratio is ours / plain wall time (goal: at most 1.2). Then ours once more on the same
2 worker processes with the threads pool and ``--threads`` turns each (a turn mostly
waits on its agent: docs/architecture.md, "Many turns in one worker process"), against
the same plain figure. Then ours without its jail (the ``local`` provider), which
says how much of the difference is the jail's. Each side's line gives the whole
machine's CPU per run over its wall time (every process: workers, agents, jails,
Postgres, Redis) and how busy that kept the machine: at 100% the side is bound by
CPU, and the ratio is its CPU per run.

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
from dataclasses import dataclass, field
from pathlib import Path

import psutil
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


@dataclass
class Timed:
    """A side's wall time, the whole machine's CPU over it (every process: workers,
    agents, jails, Postgres, Redis; from /proc/stat), and where that CPU went."""

    seconds: float
    cpu_seconds: float
    split: dict[str, float]

    def line(self, runs: int) -> str:
        busy = self.cpu_seconds / (self.seconds * (os.cpu_count() or 1))
        return (
            f"{self.seconds:7.1f}s  ({runs / self.seconds:6.1f} runs/s)  "
            f"CPU {self.cpu_seconds * 1000 / runs:5.0f} ms per run, machine {busy:4.0%} busy"
        )

    def where(self, runs: int) -> str:
        rest = self.cpu_seconds - sum(self.split.values())
        parts = [*sorted(self.split.items(), key=lambda kv: -kv[1]), ("the rest", rest)]
        shown = ", ".join(f"{name} {seconds * 1000 / runs:.0f}" for name, seconds in parts)
        return f"  ms per run: {shown}"


def cpu_seconds() -> float:
    """CPU time the machine spent busy since boot (all but idle and iowait)."""
    with Path("/proc/stat").open() as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _kind(process: psutil.Process) -> str:
    name, cmdline = process.name(), " ".join(process.cmdline())
    if process.pid == os.getpid():
        return "submits"
    if "postgres" in name:
        return "Postgres"
    if "redis" in name:
        return "Redis"
    if " worker" in cmdline and ("turnkeeper" in cmdline or "celery" in cmdline):
        return "workers"
    return "other processes"


def _cpu_by_kind() -> dict[int, tuple[str, float, float]]:
    """Each live process: its kind, its own CPU, and its reaped children's CPU."""
    found = {}
    for process in psutil.process_iter():
        try:
            with process.oneshot():
                times = process.cpu_times()
                found[process.pid] = (
                    _kind(process),
                    times.user + times.system,
                    times.children_user + times.children_system,
                )
        except psutil.Error:
            continue
    return found


_REAPED = {"workers": "reaped by workers", "Postgres": "Postgres"}
"""Where the CPU of a process that exited is counted: a Postgres backend is Postgres."""


@dataclass
class CpuClock:
    """Started before a side's runs are submitted, read once they all settled (before
    its processes stop). A process that exited in between is counted in whoever reaped
    it: plain's agents are reaped by its workers; ours' agents, jails and journal
    writers are detached, and reaped by init (pid 1); ours' workers reap their short
    sandbox commands (journal follow, liveness, size, cleanup). "submits" is this
    process, "the rest" what no process here accounts for (the kernel's own threads,
    processes started meanwhile)."""

    started: float = field(default_factory=time.monotonic)
    cpu_started: float = field(default_factory=cpu_seconds)
    processes: dict[int, tuple[str, float, float]] = field(default_factory=_cpu_by_kind)

    def read(self) -> Timed:
        split: dict[str, float] = {}
        for pid, (kind, own, reaped) in _cpu_by_kind().items():
            if pid not in self.processes:
                continue
            _, own_before, reaped_before = self.processes[pid]
            split[kind] = split.get(kind, 0.0) + own - own_before
            reaper = {1: "reaped by init"}.get(pid, _REAPED.get(kind, "other processes"))
            if reaped - reaped_before > 0:
                split[reaper] = split.get(reaper, 0.0) + reaped - reaped_before
        split = {kind: seconds for kind, seconds in split.items() if seconds > 0}
        return Timed(time.monotonic() - self.started, cpu_seconds() - self.cpu_started, split)


def ours(runs: int, threads: int | None = None, **overrides: str) -> Timed:
    with tempfile.TemporaryDirectory() as tmp, bench_fleet(Path(tmp), **overrides) as fleet:
        for _ in range(WORKERS):
            if threads is None:
                fleet.worker(CONCURRENCY)
            else:
                fleet.start("worker", "-P", "threads", "-c", str(threads), *QUIET)
        client = Client.from_settings(fleet.settings)
        client.submit(AGENT, "warm-up")  # workers up and warm before the clock starts
        while _settled(fleet.settings.require_database_url()) < 1:
            time.sleep(0.05)
        clock = CpuClock()
        for index in range(runs):
            client.submit(AGENT, f"run {index}")
        while _settled(fleet.settings.require_database_url()) < runs + 1:
            time.sleep(0.05)
        elapsed = clock.read()
        client.close()
        return elapsed


def plain(runs: int, redis_url: str) -> Timed:
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
        clock = CpuClock()
        for index in range(runs):
            plain_tasks.run.apply_async(args=[argv, f"{prefix}:run:{index}"])
        while int(client.get(done_key) or 0) < runs + 1:
            time.sleep(0.05)
        return clock.read()
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
    local_s = ours(args.runs, sandbox_provider="local")
    print(f"{args.runs} short scripted runs, {WORKERS} workers x {CONCURRENCY} processes each")
    print(f"plain Celery + XADD : {plain_s.line(args.runs)}")
    print(plain_s.where(args.runs))
    print(f"turnkeeper          : {ours_s.line(args.runs)}")
    print(ours_s.where(args.runs))
    print(f"ratio ours / plain  : {ours_s.seconds / plain_s.seconds:.2f}  (goal <= 1.2)")
    print(f"turnkeeper, -P threads -c {args.threads} on the same {WORKERS} processes:")
    print(f"                      {threads_s.line(args.runs)}")
    print(threads_s.where(args.runs))
    print(f"ratio threads / plain: {threads_s.seconds / plain_s.seconds:.2f}")
    print("turnkeeper without its jail (sandbox_provider=local; never for untrusted agents):")
    print(f"                      {local_s.line(args.runs)}")
    print(local_s.where(args.runs))
    print(f"ratio no jail / plain: {local_s.seconds / plain_s.seconds:.2f}")


if __name__ == "__main__":
    main()
