"""Crash detection: takeover latency after SIGKILL at the default lease, and what it costs.

Three measurements, side by side in one run, on a scratch database:

1. **Takeover latency** at the default lease (30 s, heartbeat 10 s, reconcile 5 s):
   each trial SIGKILLs the worker (its process group) that owns a long scripted run
   mid-stream and times, from the kill, the handover (the run's epoch moves on, as
   the client reads it) and the successor's first chunk (as a client reads the log).
   First with crash detection on (``--kills``, default 20), then off, the lease-only
   path (``--lease-kills``, default 5: each one waits for the lease, ~30 s). Three
   workers, one slot each; a trial starts once the last one's run settled, so a slot
   is free for its takeover.
2. **The watcher's load**: statements per second of one crash watcher while nothing
   dies, with 0, 100 and 1,000 running runs whose owner locks are held (rows claimed
   in the store, their locks held by one owner session, marked). Counted by the
   watcher's session, and by the server (``pg_stat_database.xact_commit`` of the
   scratch database, where nothing else commits meanwhile), both over the watcher's
   whole life (its first sweep included): the two must agree. All three loads fit in
   one page (``watcher.BATCH``, 2,000): past it a sweep is one statement more per
   2,000 running runs, and the sweep's time grows with the runs, so it is printed.
3. **An owner's re-take**: the time from ``pg_terminate_backend`` of an owner lock
   session holding ten runs' locks to the watcher seeing all ten held again (what
   ``TURNKEEPER_CRASH_GRACE`` must cover).

    .venv/bin/python bench/crash_takeover.py [--kills 20] [--lease-kills 5] [--seconds 10]
        [--skip-takeovers]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import structlog

from _fleet import BenchFleet, bench_fleet, percentile
from turnkeeper.client import Client
from turnkeeper.driver.replay import StoredLog
from turnkeeper.logconfig import configure_logging
from turnkeeper.owner import owner_pid
from turnkeeper.store.records import Claim
from turnkeeper.store.session import OwnerLockSession, WatchSession
from turnkeeper.watcher import CrashWatcher
from turnkeeper.workers.owner_locks import OwnerLocks
from turnkeeper.workers.runtime import WorkerRuntime

AGENT: dict[str, Any] = {"preset": "scripted", "turns": 40, "pace": 0.05, "seed": 3}
LOADS = (0, 100, 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=20, help="kills with crash detection")
    parser.add_argument("--lease-kills", type=int, default=5, help="kills without it")
    parser.add_argument("--seconds", type=float, default=10.0, help="per load figure")
    parser.add_argument(
        "--skip-takeovers", action="store_true", help="only the watcher's load and re-takes"
    )
    args = parser.parse_args()
    if args.skip_takeovers:
        args.kills = args.lease_kills = 0
    configure_logging("WARNING")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    results: dict[str, tuple[list[float], list[float]]] = {}
    for label, crash, kills in (
        ("crash detection", True, args.kills),
        ("lease only", False, args.lease_kills),
    ):
        if kills:
            results[label] = takeovers(crash, kills)
    loads = watcher_load(args.seconds)
    retakes = owner_retakes(20)

    if results:
        print("\ntakeover latency after SIGKILL, lease 30s (p50 / p95 / max):")
    for label, (handed, first) in results.items():
        print(
            f"  {label:<16} {len(first):>2} kills: handover {_stats(handed)}; "
            f"successor's first chunk {_stats(first)}"
        )
    if len(results) == 2:
        crash_p95 = percentile(results["crash detection"][1], 95)
        lease_p95 = percentile(results["lease only"][1], 95)
        print(f"  first chunk p95, lease only / crash detection = {lease_p95 / crash_p95:.1f}x")
    print("\nthe watcher's load while nothing dies (interval 0.5s):")
    for running, (by_watcher, by_server, sweep_ms) in loads.items():
        print(
            f"  {running:>5} running runs: {by_watcher:.2f} statements/s (server: "
            f"{by_server:.2f} commits/s), a sweep {sweep_ms:.1f} ms"
        )
    print(
        f"\nan owner's re-take after pg_terminate_backend (10 locks, {len(retakes)} drops): "
        f"{_stats(retakes, unit='ms')}"
    )


def _stats(values: list[float], unit: str = "s") -> str:
    if unit == "ms":
        return (
            f"p50 {percentile(values, 50) * 1000:.0f} ms, p95 {percentile(values, 95) * 1000:.0f}"
            f" ms, max {max(values) * 1000:.0f} ms"
        )
    return f"{percentile(values, 50):.2f}s / {percentile(values, 95):.2f}s / {max(values):.2f}s"


# --- 1. takeover latency -------------------------------------------------------------------


def takeovers(crash: bool, kills: int) -> tuple[list[float], list[float]]:
    handed: list[float] = []
    first: list[float] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        bench_fleet(Path(tmp), crash_detection=crash) as fleet,
    ):
        # Three workers: when one is killed, a second may still be restarting after the
        # last trial, and the third has a free slot for the takeover.
        workers = [fleet.worker(), fleet.worker(), fleet.worker()]
        fleet.beat()
        client = Client.from_settings(fleet.settings)
        url = fleet.settings.require_database_url()
        for trial in range(kills):
            run = client.submit(AGENT, f"trial {trial}", max_attempts=10)
            while len(client.log.snapshot(run.run_id)) < 10:
                time.sleep(0.01)
            if crash:
                _until_watched(url, run.run_id)
            owned = client.require(run.run_id)
            last = client.log.state(run.run_id).next_seq - 1
            pgid = os.getpgid(owner_pid(str(owned.owner)))
            killed_at = time.monotonic()
            os.killpg(pgid, signal.SIGKILL)
            handed_at = None
            # The dead owner may have appended after `last` before the signal landed:
            # the successor's chunk is the first one appended once the epoch moved on.
            while True:
                now = time.monotonic()
                current = client.require(run.run_id)
                if handed_at is None and current.epoch > owned.epoch:
                    handed_at = now
                    last = client.log.state(run.run_id).next_seq - 1
                if handed_at is not None and client.log.state(run.run_id).next_seq - 1 > last:
                    break
                time.sleep(0.005)
            handed.append(handed_at - killed_at)
            first.append(now - killed_at)
            print(
                f"{'crash' if crash else 'lease'} kill {trial + 1:>2}: handover after "
                f"{handed[-1]:.3f}s, first successor chunk after {first[-1]:.3f}s",
                flush=True,
            )
            client.cancel(run.run_id)
            _replace(fleet, workers, pgid)
            # The successor notices the cancel at its next heartbeat (10 s): until then
            # its slot is busy, so the next trial waits for it.
            while not client.require(run.run_id).status.is_terminal:
                time.sleep(0.05)
        client.close()
    return handed, first


def _until_watched(url: str, run_id: str) -> None:
    """Until the owner marked its lock, and the watcher looked at it since (twice the
    sweep interval): a run killed earlier in its life is left to its lease."""
    with psycopg.connect(url) as conn:
        while not conn.execute(
            "SELECT lock_attempt_id = attempt_id FROM runs WHERE run_id = %s", (run_id,)
        ).fetchone()[0]:  # type: ignore[index]
            time.sleep(0.01)
    time.sleep(1.0)


def _replace(fleet: BenchFleet, workers: list[subprocess.Popen[bytes]], pgid: int) -> None:
    for index, proc in enumerate(workers):
        if proc.pid == pgid:
            proc.wait()
            workers[index] = fleet.worker()


# --- 2. the watcher's load -----------------------------------------------------------------


class CountingSession(WatchSession):
    """A watch session that counts the statements it runs."""

    statements = 0

    def rows(self, *args: Any, **kwargs: Any) -> Any:
        self.statements += 1
        return super().rows(*args, **kwargs)


def watcher_load(seconds: float) -> dict[int, tuple[float, float, float]]:
    figures: dict[int, tuple[float, float, float]] = {}
    for running in LOADS:
        with tempfile.TemporaryDirectory() as tmp, bench_fleet(Path(tmp)) as fleet:
            rt = WorkerRuntime.open(fleet.settings, StoredLog)
            url = fleet.settings.require_database_url()
            owner = OwnerLockSession(url, owner="bench", lease_ttl=3600.0)
            claims = _running_runs(rt, running)
            assert owner.take(claims) == {c.run_id for c in claims}
            for claim in claims:
                rt.store.mark_owner_locked(claim)
            # The pool's sessions end, so the server counts their commits now, not
            # during the measurement; the owner session's are flushed within a second.
            rt.store.close()
            time.sleep(1.5)
            commits = _commits(url)
            # Both counts cover the watcher's whole life, its session's first statement
            # to its last: a session's statistics reach the server in full when it ends
            # (while it lives, up to a second late), so the server's count of a window
            # inside its life would be off by a sweep or two at each end.
            session = CountingSession(url)
            watcher = CrashWatcher(rt, session, enqueue_takeover=lambda *_: None, grace=0.25)
            thread = threading.Thread(target=watcher.run, args=(0.5,), daemon=True)
            started = time.monotonic()
            thread.start()
            time.sleep(seconds)
            watcher.stop()
            thread.join()  # its session ended
            elapsed = time.monotonic() - started
            by_watcher = session.statements / elapsed
            time.sleep(1.5)  # the ended sessions' statistics reach the server
            # Minus what the server counts for sessions themselves: the first probe's
            # start and its transaction, and the start of the watcher's session (a
            # backend's start is a transaction too).
            by_server = (_commits(url) - commits - _PROBE_COMMITS - 1) / elapsed
            sweep_ms = _sweep_ms(rt, url)
            figures[running] = (by_watcher, by_server, sweep_ms)
            print(f"{running} running runs: {by_watcher:.2f} statements/s", flush=True)
            owner.close()
            rt.close()
    return figures


def _running_runs(rt: WorkerRuntime, count: int) -> list[Claim]:
    claims = []
    for index in range(count):
        run_id = f"load-{index}"
        rt.store.admit_run(run_id, run_id, {"prompt": "x"}, max_attempts=5, deadline=None)
        claim = rt.store.claim_run(run_id, "bench", 3600.0)
        assert claim is not None
        claims.append(claim)
    return claims


_PROBE_COMMITS = 2
"""What one ``_commits`` adds to the server's count, once its session ended."""


def _commits(url: str) -> int:
    with psycopg.connect(url) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    # This session's own commits (``_PROBE_COMMITS``) are counted when it ends.
    return int(row[0])


def _sweep_ms(rt: WorkerRuntime, url: str, sweeps: int = 20) -> float:
    watcher = CrashWatcher(rt, WatchSession(url), enqueue_takeover=lambda *_: None, grace=0.25)
    watcher.sweep()
    started = time.perf_counter()
    for _ in range(sweeps):
        watcher.sweep()
    elapsed = time.perf_counter() - started
    watcher.close()
    return elapsed / sweeps * 1000


# --- 3. an owner's re-take -----------------------------------------------------------------


def owner_retakes(drops: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp, bench_fleet(Path(tmp)) as fleet:
        rt = WorkerRuntime.open(fleet.settings, StoredLog)
        url = fleet.settings.require_database_url()
        claims = _running_runs(rt, 10)
        locks = OwnerLocks(rt.store, OwnerLockSession(url, owner="bench", lease_ttl=3600.0))
        for claim in claims:
            locks.hold(claim)
        watch = WatchSession(url)
        while sum(o.held for o in watch.watched(100)) < len(claims):
            time.sleep(0.005)
        times = []
        with psycopg.connect(url, autocommit=True) as admin:
            for _ in range(drops):
                (old,) = _owner_backends(admin)
                admin.execute("SELECT pg_terminate_backend(%s)", (old,))
                dropped = time.monotonic()
                # Back: a new session of the owner holds all ten locks again.
                while _owner_backends(admin) in ([], [old]) or (
                    sum(o.held for o in watch.watched(100)) < len(claims)
                ):
                    time.sleep(0.001)
                times.append(time.monotonic() - dropped)
                time.sleep(0.2)
        watch.close()
        locks.close()
        rt.close()
    return times


def _owner_backends(admin: psycopg.Connection[Any]) -> list[int]:
    return [
        pid
        for (pid,) in admin.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            ("turnkeeper-locks bench",),
        ).fetchall()
    ]


if __name__ == "__main__":
    main()
