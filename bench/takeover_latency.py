"""Takeover latency: SIGKILL of a run's owner -> first chunk appended by its successor.

Lease 3 s, heartbeat 1 s, reconcile 1 s (the issue's settings); the bound to beat
is lease + reconcile interval = 4 s (a lease may have just been renewed when the
owner dies, and the reconciler may have just run when it expires). Each trial
kills the worker that owns a long scripted run mid-stream, times the first new
chunk, then cancels the run and replaces the worker.

    .venv/bin/python bench/takeover_latency.py [--kills 20]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

import structlog

from _fleet import bench_fleet, percentile
from turnkeeper.client import Client
from turnkeeper.logconfig import configure_logging

LEASE, HEARTBEAT, RECONCILE = 3.0, 1.0, 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=20)
    args = parser.parse_args()
    configure_logging("WARNING")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    with (
        tempfile.TemporaryDirectory() as tmp,
        bench_fleet(
            Path(tmp), lease_ttl=LEASE, heartbeat_interval=HEARTBEAT, reconcile_interval=RECONCILE
        ) as fleet,
    ):
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
            pid = int(str(owned.owner).rsplit(":", 1)[1])
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


if __name__ == "__main__":
    main()
