"""Live turns per worker process: memory and CPU of the threads pool against prefork.

Real workers on the default provider hold live turns of a gated agent (it prints a line,
then blocks reading a FIFO in its workspace until the bench opens it: no CPU, no
clock), at the settings' own lease and heartbeat. In one run:

- a ``-P threads`` worker process is filled step by step up to ``--turns`` live turns;
  at each step its RSS, threads, file descriptors and server connections are read,
  then its CPU (its own and its reaped children's, the journal probes) over
  ``--window`` seconds;
- a prefork worker (today's default) holds ``--prefork`` live turns, one pool
  process each: the same figures, summed over its processes, and each pool process's
  USS (the memory it holds alone, what one more turn costs there).

Memory per turn is, for threads, the worker process's growth from warm and idle to the
last step divided by the turns; for prefork, which starts a pool process per slot up
front, its Python processes' RSS divided by its slots (and a pool process's USS). The
helper processes each turn has under either pool (the journal's ``tail -F``) are shown
apart. CPU is the growth from idle, per 100 live turns, probes and helpers included.

    .venv/bin/python bench/turns_per_worker.py [--turns 200] [--prefork 8] [--window 20]
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import psycopg
import structlog
from sqlalchemy.engine import make_url

from _fleet import QUIET, BenchFleet, bench_fleet
from turnkeeper.client import Client
from turnkeeper.config import plain_postgres_url
from turnkeeper.driver.placement import Placement
from turnkeeper.logconfig import configure_logging
from turnkeeper.owner import owner_pid

GATE = "gate"
GATED: dict[str, Any] = {
    "command": ["sh", "-c", f"echo begin; mkfifo {GATE} && read word < {GATE}; echo end"],
    "format": "text",
}
MIB = 1024.0 * 1024.0


@dataclass
class Sample:
    turns: int
    rss: float
    """Bytes: the worker's Python processes (main and pool processes), summed."""
    uss_each: float
    """Bytes: the mean USS of the processes that hold turns (each of prefork's pool
    processes; the threads worker's one process)."""
    helpers: int
    """The other processes under the worker: each turn's ``tail -F``, probes."""
    helpers_rss: float
    threads: int
    fds: int
    pg: int
    redis: int
    cpu: float
    """Cores: CPU seconds per second over the window, helpers and probes included."""


def _python(main: psutil.Process) -> list[psutil.Process]:
    """The worker process and its pool processes (its Python children)."""
    return [main, *(p for p in main.children() if _name(p).startswith("python"))]


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:  # a probe that just ended
        return ""


def _total(procs: list[psutil.Process], measure: Any) -> float:
    """``measure`` summed over ``procs``, those that ended meanwhile left out."""
    total = 0.0
    for proc in procs:
        with suppress(psutil.Error):
            total += measure(proc)
    return total


def _helpers(main: psutil.Process, python: list[psutil.Process]) -> list[psutil.Process]:
    ours = {p.pid for p in python}
    return [p for p in main.children(recursive=True) if p.pid not in ours and _name(p)]


def _cpu(python: list[psutil.Process], helpers: list[psutil.Process]) -> dict[int, float]:
    """CPU seconds by pid: the Python processes with their reaped children (the short
    probes), and each helper still running."""
    times: dict[int, float] = {}
    for proc in python:
        with suppress(psutil.Error):
            times[proc.pid] = sum(proc.cpu_times()[:4])
    for proc in helpers:
        with suppress(psutil.Error):
            times[proc.pid] = sum(proc.cpu_times()[:2])
    return times


def _connections(procs: list[psutil.Process], port: int) -> int:
    return int(
        _total(
            procs,
            lambda proc: sum(
                1 for c in proc.net_connections(kind="inet") if c.raddr and c.raddr.port == port
            ),
        )
    )


def sample(fleet: BenchFleet, main: psutil.Process, turns: int, window: float) -> Sample:
    python = _python(main)
    holders = python[1:] or python
    pg_port = make_url(fleet.settings.require_database_url()).port or 5432
    redis_port = make_url(fleet.settings.require_redis_url()).port or 6379
    before, started = _cpu(python, _helpers(main, python)), time.monotonic()
    time.sleep(window)
    helpers = _helpers(main, python)
    after = _cpu(python, helpers)
    spent = sum(after[pid] - before[pid] for pid in after if pid in before)
    return Sample(
        turns=turns,
        rss=sum(p.memory_info().rss for p in python),
        uss_each=sum(p.memory_full_info().uss for p in holders) / len(holders),
        helpers=len(helpers),
        helpers_rss=_total(helpers, lambda p: p.memory_info().rss),
        threads=sum(p.num_threads() for p in python),
        fds=sum(p.num_fds() for p in python),
        pg=_connections(python, pg_port),
        redis=_connections(python, redis_port),
        cpu=spent / (time.monotonic() - started),
    )


_POLL: dict[str, psycopg.Connection[Any]] = {}


def _rows(database_url: str, statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """A poll's rows, on the bench's one held connection (a server shared with other
    loads may have no connection to spare for a new one each time), retried when the
    server refuses or drops it."""
    while True:
        conn = _POLL.get(database_url)
        try:
            if conn is None or conn.closed:
                conn = _POLL[database_url] = psycopg.connect(
                    plain_postgres_url(database_url), autocommit=True
                )
            return [tuple(row) for row in conn.execute(statement, params).fetchall()]
        except psycopg.OperationalError:
            if conn is not None:
                conn.close()
            _POLL.pop(database_url, None)
            time.sleep(1.0)


def _live(database_url: str, run_ids: list[str]) -> int:
    """Runs running, watched (owner lock marked) and past their agent's first line."""
    rows = _rows(
        database_url,
        "SELECT count(*) FROM runs r WHERE r.run_id = ANY(%s) AND r.status = 'running'"
        " AND r.lock_attempt_id = r.attempt_id AND EXISTS (SELECT 1 FROM segments s"
        " WHERE s.run_id = r.run_id)",
        (run_ids,),
    )
    return int(rows[0][0])


def _all_started(database_url: str, run_ids: list[str]) -> bool:
    """Every run live, or already settled (an agent lost on the way)."""
    rows = _rows(
        database_url,
        "SELECT count(*) FROM runs WHERE run_id = ANY(%s) AND status NOT IN ('queued', 'running')",
        (run_ids,),
    )
    return _live(database_url, run_ids) + int(rows[0][0]) == len(run_ids)


def _all_live(database_url: str, run_ids: list[str]) -> bool:
    return _live(database_url, run_ids) == len(run_ids)


def _wait(what: str, done: Any, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting: {what}")
        time.sleep(0.2)


def _release(client: Client, run_ids: list[str]) -> None:
    """Open each agent's FIFO, so that it prints its last line and exits."""
    pending = list(run_ids)
    while pending:
        left = []
        for run_id in pending:
            sandbox = Placement.of(client.require(run_id)).sandbox
            gate = None if sandbox is None else Path(sandbox.workspace) / GATE
            try:
                if gate is None:
                    raise FileNotFoundError(run_id)
                fd = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENXIO):
                    raise
                left.append(run_id)
                continue
            os.write(fd, b"go\n")
            os.close(fd)
        pending = left
        if pending:
            time.sleep(0.2)


def _settled(client: Client, run_ids: list[str]) -> bool:
    return all(client.require(run_id).status.is_terminal for run_id in run_ids)


def measure(
    fleet: BenchFleet, pool: list[str], steps: list[int], window: float, label: str
) -> list[Sample]:
    proc = fleet.start("worker", *pool, *QUIET)
    client = Client.from_settings(fleet.settings)
    database_url = fleet.settings.require_database_url()
    main = psutil.Process(proc.pid)
    try:
        warm = [client.submit(GATED, f"{label} warm-up").run_id]
        _wait("the warm-up run", lambda: _live(database_url, warm) == 1)
        _release(client, warm)
        _wait("the warm-up run settled", lambda: _settled(client, warm))
        samples = [sample(fleet, main, 0, window)]
        runs: list[str] = []
        for step in steps:
            runs += [client.submit(GATED, f"{label} {i}").run_id for i in range(len(runs), step)]
            _wait(f"{step} live turns", partial(_all_live, database_url, list(runs)))
            samples.append(sample(fleet, main, step, window))
            print(f"  {label}: {step} live turns sampled", flush=True)
        _release(client, runs)
        _wait("every run settled", lambda: _settled(client, runs))
        return samples
    finally:
        client.close()
        fleet.stop()


def report(label: str, samples: list[Sample], *, prefork: bool) -> tuple[float, float]:
    """Print the samples; (worker RSS per turn, cores per 100 turns) at the last step."""
    print(f"{label}")
    print("  turns  RSS MiB  USS/holder MiB  helpers (MiB)  threads   fds  pg  redis  CPU cores")
    for s in samples:
        print(
            f"  {s.turns:5d}  {s.rss / MIB:7.1f}  {s.uss_each / MIB:14.1f}"
            f"  {s.helpers:4d} ({s.helpers_rss / MIB:6.1f})  {s.threads:7d}  {s.fds:4d}"
            f"  {s.pg:2d}  {s.redis:5d}  {s.cpu:9.3f}"
        )
    idle, last = samples[0], samples[-1]
    # Prefork starts a pool process per slot up front: a turn costs one of them.
    per_turn = last.rss / last.turns if prefork else (last.rss - idle.rss) / last.turns
    per_100 = (last.cpu - idle.cpu) / last.turns * 100
    helpers = (last.helpers_rss - idle.helpers_rss) / last.turns
    print(
        f"  worker RSS per turn {per_turn / MIB:.2f} MiB (helper processes besides:"
        f" {helpers / MIB:.2f} MiB); CPU per 100 live turns {per_100:.3f} cores"
    )
    return per_turn, per_100


def _takeovers(database_url: str, run_ids: list[str]) -> list[tuple[Any, ...]]:
    return _rows(
        database_url,
        "SELECT epoch, outcome, handover_cause, count(*) FROM attempts"
        " WHERE run_id = ANY(%s) GROUP BY 1, 2, 3 ORDER BY 1, 2",
        (run_ids,),
    )


def fleet_case(fleet: BenchFleet, runs: int, per_worker: int) -> None:
    """``runs`` live runs over threads workers of ``per_worker`` turns; one is SIGKILLed
    and replaced; each of its runs must be taken over once, and every run complete."""
    workers = -(-runs // per_worker)
    procs = [fleet.start("worker", "-P", "threads", "-c", str(per_worker), *QUIET)]
    procs += [
        fleet.start("worker", "-P", "threads", "-c", str(per_worker), *QUIET)
        for _ in range(workers - 1)
    ]
    fleet.beat()
    client = Client.from_settings(fleet.settings)
    database_url = fleet.settings.require_database_url()
    started = time.monotonic()
    run_ids = [client.submit(GATED, f"fleet {i}").run_id for i in range(runs)]
    _wait(f"{runs} live runs", partial(_all_started, database_url, run_ids), timeout=1800)
    live_after = time.monotonic() - started
    before_kill = _takeovers(database_url, run_ids)
    running = [r for r in run_ids if client.require(r).status.value == "running"]
    owners = {run_id: str(client.require(run_id).owner) for run_id in running}
    victim = procs[0].pid
    doomed = [r for r, owner in owners.items() if owner_pid(owner) == victim]
    total = sum(
        _total(
            [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)],
            lambda q: q.memory_info().rss,
        )
        for p in procs
    )
    os.killpg(victim, signal.SIGKILL)
    procs[0].wait()
    killed = time.monotonic()
    fleet.start("worker", "-P", "threads", "-c", str(per_worker), *QUIET)

    def taken_over() -> bool:
        rows = _rows(  # adopted by another process and watched again, or settled
            database_url,
            "SELECT count(*) FROM runs WHERE run_id = ANY(%s) AND (status NOT IN"
            " ('queued', 'running') OR (status = 'running' AND lock_attempt_id = attempt_id"
            " AND split_part(owner, ':', 2) <> %s))",
            (doomed, str(victim)),
        )
        return int(rows[0][0]) == len(doomed)

    _wait("the dead worker's runs taken over", taken_over, timeout=1800)
    takeover = time.monotonic() - killed
    _release(client, running)
    _wait("every run settled", lambda: _settled(client, run_ids), timeout=1800)
    statuses = sorted(client.require(r).status.value for r in run_ids)
    client.close()
    print(f"fleet: {runs} live runs on {workers} threads workers of {per_worker} turns")
    print(
        f"  all live after {live_after:.1f}s; fleet RSS (workers, agents, helpers)"
        f" {total / MIB:.0f} MiB"
    )
    print(
        f"  SIGKILL of one worker holding {len(doomed)} runs: all adopted and watched"
        f" again {takeover:.1f}s later (its successor's start included)"
    )
    counts = {status: statuses.count(status) for status in set(statuses)}
    print(f"  attempts before the kill (epoch, outcome, cause, runs): {before_kill}")
    print(f"  runs: {counts}; attempts at the end: {_takeovers(database_url, run_ids)}")
    crash = _rows(
        database_url,
        "SELECT run_id, count(*) FILTER (WHERE handover_cause = 'crash') FROM attempts"
        " WHERE run_id = ANY(%s) GROUP BY 1",
        (doomed,),
    )
    once = sum(1 for _, n in crash if n == 1)
    print(f"  of the {len(doomed)} runs the dead worker held, {once} taken over by crash once")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--prefork", type=int, default=8)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument(
        "--fleet",
        type=int,
        default=0,
        help="Instead: this many live runs over threads "
        "workers of --turns turns each, one SIGKILLed (e.g. --fleet 500).",
    )
    args = parser.parse_args()
    configure_logging("WARNING")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    if args.fleet:
        with tempfile.TemporaryDirectory() as tmp, bench_fleet(Path(tmp) / "data") as fleet:
            fleet_case(fleet, args.fleet, args.turns)
        return
    steps = sorted({max(1, args.turns // 4), args.turns // 2, args.turns} - {0})
    with tempfile.TemporaryDirectory() as tmp, bench_fleet(Path(tmp) / "data") as fleet:
        threads = measure(
            fleet, ["-P", "threads", "-c", str(args.turns)], steps, args.window, "threads"
        )
        prefork = measure(fleet, ["-c", str(args.prefork)], [args.prefork], args.window, "prefork")
    print()
    t_mem, t_cpu = report(f"-P threads -c {args.turns} (one process)", threads, prefork=False)
    p_mem, p_cpu = report(f"prefork -c {args.prefork} (today's default)", prefork, prefork=True)
    uss = prefork[-1].uss_each
    print()
    print(f"memory per turn, prefork RSS / threads = {p_mem / t_mem:.1f}x")
    print(f"memory per turn, prefork USS / threads = {uss / t_mem:.1f}x (a pool process's own)")
    print(f"CPU per 100 live turns: threads {t_cpu:.3f}, prefork {p_cpu:.3f} cores")


if __name__ == "__main__":
    main()
