"""Host takeover latency: a run's host loses its worker, then either comes back or dies.

Two simulated hosts on this machine (their own ``TURNKEEPER_HOST_ID`` and data dirs),
lease 3 s, heartbeat 1 s, reconcile 1 s, beat on host B. Each trial starts a long
scripted run on host A, waits for its output, SIGKILLs A's worker and measures, from
the kill to the successor's first new chunk:

- ``back``: A's worker is started again at once (its agent lived on); the takeover
  waited in A's queue and is adopted there. Bound: lease + reconcile + the new
  worker's boot (measured per trial: start -> its pool process's first heartbeat).
- ``dead``: A's worker and agent are killed and A never comes back; the run is taken
  over on B (whose worker is started, and booted, before the kill) once A is unseen
  for ``host_dead_after`` (``--dead-after``, 6 s here).
  Bound: host_dead_after + reconcile + the beacon interval (A may have beaten just
  before it died, and the reconciler may have just run when A was declared dead).

    .venv/bin/python bench/host_takeover.py [--trials 5] [--dead-after 6]
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import psycopg
import structlog

from _fleet import BenchFleet, bench_fleet, percentile
from turnkeeper.client import Client
from turnkeeper.logconfig import configure_logging
from turnkeeper.owner import owner_pid
from turnkeeper.sandbox.egress import stop_proxies

LEASE, HEARTBEAT, RECONCILE = 3.0, 1.0, 1.0
AGENT = {"preset": "scripted", "turns": 3, "pace": 0.2, "seed": 7}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--dead-after", type=float, default=6.0)
    args = parser.parse_args()
    configure_logging("WARNING")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    with (
        tempfile.TemporaryDirectory() as tmp,
        bench_fleet(
            Path(tmp) / "host-b",
            lease_ttl=LEASE,
            heartbeat_interval=HEARTBEAT,
            reconcile_interval=RECONCILE,
            host_dead_after=args.dead_after,
            host_id="host-b",
        ) as b,
    ):
        a = _host(b, Path(tmp) / "host-a", "host-a")
        b.beat()
        client = Client.from_settings(b.settings)
        try:
            back, boots = _trials(args.trials, lambda: _back(a, client, b))
            dead, _ = _trials(args.trials, lambda: _dead(a, client, b))
        finally:
            client.close()
            a.stop()
            b.stop()
            _kill_agents(a.settings.sandboxes_dir)
            for fleet in (a, b):  # the egress proxies the hosts' workers started
                stop_proxies(fleet.settings.data_dir)
    beacon = min(HEARTBEAT, args.dead_after / 4)
    boot = percentile(boots, 50)
    _report(
        "host back", back, LEASE + RECONCILE + boot, f"lease + reconcile + boot p50 {boot:.1f}s"
    )
    _report(
        "host dead",
        dead,
        args.dead_after + RECONCILE + beacon,
        f"host_dead_after {args.dead_after:g} + reconcile + beacon {beacon:g}",
    )


def _host(base: BenchFleet, data_dir: Path, host_id: str) -> BenchFleet:
    """Another simulated host of the same fleet: its host id and data dir."""
    env = {**base.env, "TURNKEEPER_HOST_ID": host_id, "TURNKEEPER_DATA_DIR": str(data_dir)}
    settings = base.settings.model_copy(update={"host_id": host_id, "data_dir": data_dir})
    return BenchFleet(settings, env)


def _trials(
    count: int, trial: Callable[[], tuple[float, float]]
) -> tuple[list[float], list[float]]:
    latencies, extras = [], []
    for index in range(count):
        latency, extra = trial()
        latencies.append(latency)
        extras.append(extra)
        print(f"  trial {index + 1}: {latency:.2f}s")
    return latencies, extras


def _start_on_a(a: BenchFleet, client: Client) -> tuple[str, int, int]:
    """A's worker and a run it owns, mid-stream: (run id, worker pgid, last seq)."""
    worker = a.worker()
    run = client.submit(AGENT, "host takeover", max_attempts=10)
    while len(client.log.snapshot(run.run_id)) < 10:
        if worker.poll() is not None:
            raise SystemExit(f"host-a's worker exited with {worker.returncode} before the run")
        time.sleep(0.01)
    owner = str(client.require(run.run_id).owner)
    assert owner.startswith("host-a:"), owner
    assert os.getpgid(owner_pid(owner)) == worker.pid
    return run.run_id, worker.pid, client.log.state(run.run_id).next_seq - 1


def _first_new_chunk(client: Client, run_id: str, killed_epoch: int, last: int) -> None:
    while (
        client.require(run_id).epoch <= killed_epoch
        or client.log.state(run_id).next_seq - 1 <= last
    ):
        time.sleep(0.005)


def _back(a: BenchFleet, client: Client, b: BenchFleet) -> tuple[float, float]:
    run_id, pgid, _ = _start_on_a(a, client)
    epoch = client.require(run_id).epoch
    os.killpg(pgid, signal.SIGKILL)
    killed_at = time.monotonic()
    last = client.log.state(run_id).next_seq - 1
    started = time.monotonic()
    worker = a.worker()
    boot = _boot_time(b, worker.pid, started)
    _first_new_chunk(client, run_id, epoch, last)
    latency = time.monotonic() - killed_at
    owner = str(client.require(run_id).owner)
    assert owner.startswith("host-a:"), f"taken over on {owner}, not on its host"
    client.cancel(run_id)
    _wait_settled(client, run_id)
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    return latency, boot


def _boot_time(fleet: BenchFleet, main_pid: int, started: float) -> float:
    """Start -> the first heartbeat of a pool process of worker ``main_pid``."""
    with psycopg.connect(fleet.settings.require_database_url(), autocommit=True) as conn:
        while not conn.execute("SELECT 1 FROM workers WHERE main_pid = %s", (main_pid,)).fetchone():
            time.sleep(0.02)
    return time.monotonic() - started


def _dead(a: BenchFleet, client: Client, b: BenchFleet) -> tuple[float, float]:
    run_id, pgid, _ = _start_on_a(a, client)
    epoch = client.require(run_id).epoch
    # B's worker, up before A dies (its boot is no part of the takeover).
    successor = b.worker()
    _boot_time(b, successor.pid, time.monotonic())
    os.killpg(pgid, signal.SIGKILL)
    killed_at = time.monotonic()
    _kill_agents(a.settings.sandboxes_dir)
    last = client.log.state(run_id).next_seq - 1
    _first_new_chunk(client, run_id, epoch, last)
    latency = time.monotonic() - killed_at
    owner = str(client.require(run_id).owner)
    assert owner.startswith("host-b:"), f"taken over on {owner}"
    client.cancel(run_id)
    _wait_settled(client, run_id)
    os.killpg(successor.pid, signal.SIGKILL)
    successor.wait()
    return latency, 0.0


def _kill_agents(root: Path) -> None:
    for proc in psutil.process_iter(["pid"]):
        try:
            if Path(proc.cwd()).is_relative_to(root):
                proc.kill()
        except (psutil.Error, OSError, ValueError):
            continue


def _wait_settled(client: Client, run_id: str) -> None:
    while not client.require(run_id).status.is_terminal:
        time.sleep(0.05)


def _report(name: str, latencies: list[float], bound: float, how: str) -> None:
    p50, p95 = percentile(latencies, 50), percentile(latencies, 95)
    print(
        f"\n{name}: kill -> first successor chunk over {len(latencies)} trials: p50 {p50:.2f}s, "
        f"p95 {p95:.2f}s, max {max(latencies):.2f}s"
    )
    print(f"  bound {how} = {bound:.1f}s: p95/bound = {p95 / bound:.2f}")


if __name__ == "__main__":
    main()
