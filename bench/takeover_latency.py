"""Takeover latency: SIGKILL of a run's owner -> first chunk appended by its successor.

Lease 3 s, heartbeat 1 s, reconcile 1 s (the issue's settings); the bound to beat
is lease + reconcile interval = 4 s (a lease may have just been renewed when the
owner dies, and the reconciler may have just run when it expires). Each trial
kills the worker that owns a long scripted run mid-stream, times the first new
chunk, then cancels the run and replaces the worker.

    .venv/bin/python bench/takeover_latency.py [--kills 20]

``--saturated``: the fleet's every slot is busy when the owner dies (two workers
with one slot each; the other slot runs a blocker that outlives the lease). The
takeover waits for the blocker's slot, and the figures are: handover -> the
successor's first chunk (the wait included), the slot freeing (the blocker
settled) -> that chunk, and the attempts the run used (one claim and one adoption
is 2, whatever the wait). Timestamps of the handover, the adoption and the slot
come from Postgres, the first chunk from the log as a client sees it.

    .venv/bin/python bench/takeover_latency.py --saturated [--kills 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import structlog

from _fleet import BenchFleet, bench_fleet, percentile
from turnkeeper.client import Client
from turnkeeper.logconfig import configure_logging
from turnkeeper.owner import owner_pid

LEASE, HEARTBEAT, RECONCILE = 3.0, 1.0, 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--saturated", action="store_true", help="every slot busy at the kill")
    args = parser.parse_args()
    configure_logging("WARNING")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    with (
        tempfile.TemporaryDirectory() as tmp,
        bench_fleet(
            Path(tmp), lease_ttl=LEASE, heartbeat_interval=HEARTBEAT, reconcile_interval=RECONCILE
        ) as fleet,
    ):
        if args.saturated:
            saturated(fleet, args.kills)
            return
        workers = [fleet.worker(), fleet.worker()]
        fleet.beat()
        client = Client.from_settings(fleet.settings)
        latencies: list[float] = []
        agent = {"preset": "scripted", "turns": 40, "pace": 0.05, "seed": 3}
        for trial in range(args.kills):
            run = client.submit(agent, f"trial {trial}", max_attempts=10)
            while len(client.log.snapshot(run.run_id)) < 10:
                time.sleep(0.01)
            owned = client.require(run.run_id)
            last = len(client.log.snapshot(run.run_id))
            pid = owner_pid(str(owned.owner))
            pgid = os.getpgid(pid)
            killed_at = time.monotonic()
            os.killpg(pgid, signal.SIGKILL)
            for _seq, _chunk in client.log.read(run.run_id, after_seq=last, block_ms=200):
                break
            # The dead owner may have appended after `last` before the signal landed:
            # wait for the successor's epoch to be the one writing.
            while client.require(run.run_id).epoch < 2 or (
                client.log.state(run.run_id).next_seq - 1 <= last
            ):
                time.sleep(0.005)
            latencies.append(time.monotonic() - killed_at)
            client.cancel(run.run_id)
            for index, proc in enumerate(workers):
                if proc.pid == pgid:
                    proc.wait()
                    workers[index] = fleet.worker()
            print(f"kill {trial + 1:>2}: first successor chunk after {latencies[-1]:.2f}s")
        client.close()
    bound = LEASE + RECONCILE
    p50, p95 = percentile(latencies, 50), percentile(latencies, 95)
    print(
        f"\ntakeover latency over {len(latencies)} kills: p50 {p50:.2f}s, p95 {p95:.2f}s, "
        f"max {max(latencies):.2f}s, mean {statistics.mean(latencies):.2f}s"
    )
    print(f"bound lease + reconcile = {bound:.1f}s: p95/bound = {p95 / bound:.2f}")


VICTIM = {"preset": "scripted", "turns": 3, "pace": 0.1, "seed": 5}
BLOCKER = {"preset": "scripted", "turns": 3, "pace": 0.2, "seed": 6}
"""80 lines at 0.2 s: the blocker runs ~16 s, past the lease and reconcile after the kill."""


def saturated(fleet: BenchFleet, kills: int) -> None:
    """Each trial: the victim and a blocker run, one per slot; the victim's worker is
    SIGKILLed; its takeover waits for the blocker's slot."""
    workers = [fleet.worker(), fleet.worker()]
    fleet.beat()
    client = Client.from_settings(fleet.settings)
    url = fleet.settings.require_database_url()
    waits, after_free, after_adopt, attempts = [], [], [], []
    trial = 0
    while len(waits) < kills:
        trial += 1
        # The blocker first: the victim starts only once both slots (a restarted worker
        # may take a while to boot) are up, so it is mid-stream when its owner dies.
        blocker = client.submit(BLOCKER, f"blocker {trial}")
        while client.require(blocker.run_id).owner is None:
            time.sleep(0.01)
        victim = client.submit(VICTIM, f"victim {trial}")
        while client.require(victim.run_id).owner is None:
            time.sleep(0.01)
        while len(client.log.snapshot(victim.run_id)) < 10:
            time.sleep(0.01)
        pgid = os.getpgid(owner_pid(str(client.require(victim.run_id).owner)))
        os.killpg(pgid, signal.SIGKILL)
        dead = next(proc for proc in workers if proc.pid == pgid)
        dead.wait()
        last = client.log.state(victim.run_id).next_seq - 1  # nothing more from the dead
        while client.log.state(victim.run_id).next_seq - 1 <= last:
            time.sleep(0.005)
        first_chunk = time.time()
        with psycopg.connect(url) as conn:
            handed, adopted = conn.execute(
                "SELECT (SELECT ended_at FROM attempts WHERE run_id = %(r)s AND epoch = 1),"
                " (SELECT started_at FROM attempts WHERE run_id = %(r)s AND epoch = 2)",
                {"r": victim.run_id},
            ).fetchone()  # type: ignore[misc]
        freed = client.require(blocker.run_id).finished_at
        assert handed is not None, "the handover ended the first attempt"
        assert adopted is not None, "a worker adopted the second"
        assert freed is not None, "the blocker settled"
        if freed < handed:
            print(f"trial {trial}: the blocker ended before the handover, not saturated")
            _settle_and_replace(client, victim.run_id, workers, dead, fleet)
            continue
        waits.append(first_chunk - handed.timestamp())
        after_free.append(first_chunk - freed.timestamp())
        after_adopt.append(first_chunk - adopted.timestamp())
        attempts.append(_settle_and_replace(client, victim.run_id, workers, dead, fleet))
        print(
            f"kill {len(waits):>2}: handover -> first chunk {waits[-1]:.2f}s "
            f"(slot freed -> first chunk {after_free[-1]:.2f}s), attempts {attempts[-1]}",
            flush=True,
        )
    client.close()
    print(f"\nsaturated fleet, {len(waits)} kills, lease {LEASE}s, reconcile {RECONCILE}s:")
    for name, values in [
        ("handover -> successor's first chunk", waits),
        ("slot freed -> successor's first chunk", after_free),
        ("adoption -> successor's first chunk", after_adopt),
    ]:
        print(
            f"  {name}: p50 {percentile(values, 50):.2f}s, p95 {percentile(values, 95):.2f}s, "
            f"max {max(values):.2f}s"
        )
    print(f"  attempts used per run: max {max(attempts)} (1 claim + 1 adoption = 2)")


def _settle_and_replace(
    client: Client,
    run_id: str,
    workers: list[subprocess.Popen[bytes]],
    dead: subprocess.Popen[bytes],
    fleet: BenchFleet,
) -> int:
    """Until the victim settles; then the killed worker is replaced. Its attempts."""
    while not client.require(run_id).status.is_terminal:
        time.sleep(0.05)
    workers[workers.index(dead)] = fleet.worker()
    return client.require(run_id).attempt_count


if __name__ == "__main__":
    main()
