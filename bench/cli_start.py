"""Start-up time of the ``turnkeeper`` command, against the floor of a bare interpreter.

A script that polls runs calls ``turnkeeper status`` (or ``tail``, ``runs``,
``cancel``, ``submit``) in a loop, so what each call costs before it does anything
is paid on every iteration. Each case is a fresh process, timed from spawn to exit:

- ``python -c pass``: the floor, what no command can go under;
- ``libraries only``: importing the libraries ``submit`` stands on (Typer, psycopg,
  pydantic-settings, redis-py, Celery) and ending as a quick command ends
  (``cli.exit_now``): what our own code and the command's work add is the rest;
- ``turnkeeper --help`` and ``turnkeeper status --help``: parsing only, no server;
- ``turnkeeper status ID``, ``runs`` and ``tail ID``: against a real stack (the
  configured servers, else the embedded ones), on a run a worker completed;
- ``turnkeeper submit`` and ``cancel ID``: a new run each round, then its cancel (a
  queued run, settled at once). The worker is stopped first, so no agent runs during
  the timings and the runs list holds settled runs only, one more each round (``runs``
  reads each listed run's turn slot: 21 runs by the 20th round).

Prints p50 and p95 per case and each median's ratio to the floor.

    .venv/bin/python bench/cli_start.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _fleet import bench_fleet, percentile

GUARD = 120.0  # a hang guard, per process and for the run to settle

Case = list[str] | Callable[[int], list[str]]
LIBRARIES = "import typer, psycopg, pydantic_settings, redis, celery.app, os; os._exit(0)"


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, check=False, timeout=GUARD)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv[3:]} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return elapsed


def settled_run(env: dict[str, str]) -> str:
    """Submit a scripted run through the CLI and follow it to its end: a run to look at."""
    cli = [sys.executable, "-m", "turnkeeper"]
    submitted = subprocess.run(
        [*cli, "submit", "--agent", "scripted", "--prompt", "bench", "--run-id", "bench-1"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=GUARD,
    )
    run_id = submitted.stdout.strip()
    subprocess.run(
        [*cli, "tail", run_id, "--json"], env=env, capture_output=True, check=True, timeout=GUARD
    )
    return run_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20, help="processes per case")
    args = parser.parse_args()
    cli = [sys.executable, "-m", "turnkeeper"]
    with tempfile.TemporaryDirectory() as tmp, bench_fleet(Path(tmp)) as fleet:
        fleet.worker()
        run_id = settled_run(fleet.env)
        fleet.stop()
        submit = [*cli, "submit", "--agent", "scripted", "--prompt", "bench", "--run-id"]
        cases: dict[str, Case] = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "libraries only": [sys.executable, "-c", LIBRARIES],
            "turnkeeper --help": [*cli, "--help"],
            "turnkeeper status --help": [*cli, "status", "--help"],
            "turnkeeper status ID": [*cli, "status", run_id],
            "turnkeeper runs": [*cli, "runs"],
            "turnkeeper tail ID": [*cli, "tail", run_id],
            "turnkeeper submit": lambda n: [*submit, f"bench-round-{n}"],
            "turnkeeper cancel ID": lambda n: [*cli, "cancel", f"bench-round-{n}"],
        }
        timings: dict[str, list[float]] = {name: [] for name in cases}
        for n in range(args.rounds):  # interleaved, so a busy moment costs every case alike
            for name, case in cases.items():
                timings[name].append(timed(case(n) if callable(case) else case, fleet.env))
    floor = statistics.median(timings["python -c pass"])
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"{args.rounds} processes per case; the floor is `python -c pass`; load {load}")
    for name, values in timings.items():
        p50 = statistics.median(values)
        print(
            f"{name:<26} p50 {p50 * 1000:7.1f} ms  p95 {percentile(values, 95) * 1000:7.1f} ms"
            f"  {p50 / floor:5.1f}x the floor"
        )


if __name__ == "__main__":
    main()
