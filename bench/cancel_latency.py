"""Cancel latency: the cancel's request -> the run settled and every agent process gone.

At the default settings (lease 30 s, heartbeat 10 s), two sides in one run, on one
worker each, over the same trials:

- ours: the cancel statement announces the run and the owner's process hears it at
  once (``TURNKEEPER_CANCEL_LISTEN=true``, the default);
- plain: the owner learns of the cancel at its next heartbeat, as before
  (``TURNKEEPER_CANCEL_LISTEN=false``).

Each trial starts a scripted run that talks for minutes, waits until it has spoken,
then a random part of a heartbeat interval more (so the cancel lands at a random point
of the heartbeat), and cancels it as ``Client.cancel`` does (what the HTTP route, the
CLI and ``turnkeeper chat`` call). It times, from just before that call: the run
settled (``finished_at``, polled every 5 ms) and no process left under the sandboxes
directory (polled every 5 ms).

    .venv/bin/python bench/cancel_latency.py [--cancels 50] [--plain-cancels 10]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import structlog

from _fleet import bench_fleet, percentile
from turnkeeper.client import Client
from turnkeeper.config import Settings
from turnkeeper.logconfig import configure_logging
from turnkeeper.store.records import RunStatus

TALKER = {"preset": "scripted", "turns": 10_000, "pace": 0.05}
POLL = 0.005
GUARD = 120.0  # a hang guard per trial: a plain cancel waits a heartbeat at most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cancels", type=int, default=50, help="trials on our side")
    parser.add_argument("--plain-cancels", type=int, default=10, help="trials on the plain side")
    parser.add_argument("--seed", type=int, default=25)
    args = parser.parse_args()
    configure_logging("WARNING")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    rng = random.Random(args.seed)
    sides = (("ours", True, args.cancels), ("plain", False, args.plain_cancels))
    results = {}
    for side, listen, trials in sides:
        print(f"{side} (TURNKEEPER_CANCEL_LISTEN={str(listen).lower()}):", flush=True)
        with (
            tempfile.TemporaryDirectory() as tmp,
            bench_fleet(Path(tmp), cancel_listen=listen) as fleet,
        ):
            fleet.worker()
            client = Client.from_settings(fleet.settings)
            try:
                results[side] = [_trial(client, rng, index) for index in range(trials)]
            finally:
                client.close()
    _report(results)


def _trial(client: Client, rng: random.Random, index: int) -> tuple[float, float]:
    """One cancel at a random point of the heartbeat: (settled, agent gone) in seconds."""
    settings = client.settings
    run_id = client.submit(TALKER, f"trial {index}").run_id
    _wait(lambda: len(client.log.snapshot(run_id)) >= 3, "it speaks")
    time.sleep(rng.uniform(0, settings.heartbeat_interval))
    started = time.perf_counter()
    client.cancel(run_id)
    settled = _wait(lambda: _settled(client, run_id), "settled") - started
    gone = _wait(lambda: not _agents(settings), "agent gone") - started
    done = client.require(run_id)
    assert done.status is RunStatus.ABORTED, done
    ms = settled * 1000, gone * 1000
    print(f"  {index + 1:3d}: settled {ms[0]:8.1f} ms, agent gone {ms[1]:8.1f} ms", flush=True)
    return settled, gone


def _settled(client: Client, run_id: str) -> bool:
    run = client.require(run_id)
    return run.status.is_terminal


def _agents(settings: Settings) -> list[int]:
    root = settings.sandboxes_dir
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if Path(proc.cwd()).is_relative_to(root) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (psutil.Error, OSError, ValueError):
            continue
    return found


def _wait(predicate: Callable[[], bool], what: str) -> float:
    deadline = time.monotonic() + GUARD
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting: {what}")
        time.sleep(POLL)
    return time.perf_counter()


def _report(results: dict[str, list[tuple[float, float]]]) -> None:
    print()
    heads = ("side", "n", "settled p50", "p95", "max", "gone p50", "p95", "max")
    print("{:6} {:>4} {:>12} {:>9} {:>9} {:>10} {:>9} {:>9}".format(*heads))
    rows = {}
    for side, trials in results.items():
        settled = [s * 1000 for s, _ in trials]
        gone = [g * 1000 for _, g in trials]
        rows[side] = (percentile(gone, 50), percentile(gone, 95))
        figures = [
            percentile(settled, 50), percentile(settled, 95), max(settled),
            percentile(gone, 50), percentile(gone, 95), max(gone),
        ]  # fmt: skip
        print(
            f"{side:6} {len(trials):4d} "
            + "{:10.1f}ms {:7.1f}ms {:7.1f}ms {:8.1f}ms {:7.1f}ms {:7.1f}ms".format(*figures)
        )
    if "plain" in rows and "ours" in rows:
        mean = statistics.mean(g for _, g in results["ours"]) * 1000
        print(
            f"\nagent gone, ours / plain: p50 {rows['ours'][0] / rows['plain'][0]:.3f}x, "
            f"p95 {rows['ours'][1] / rows['plain'][1]:.3f}x; mean ours {mean:.1f} ms"
        )
    print("goal: ours p95 (agent gone) <= 1000 ms")


if __name__ == "__main__":
    main()
