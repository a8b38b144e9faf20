"""Start times of the embedded stack: cold (empty data dir), restart (data kept), warm (running).

.venv/bin/python bench/embedded_start.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from turnkeeper.embedded import EmbeddedStack
from turnkeeper.logconfig import configure_logging


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    configure_logging("WARNING")
    cold, restart, warm, stop = [], [], [], []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            stack = EmbeddedStack(Path(tmp) / "data")
            cold.append(timed(stack.start))
            warm.append(timed(stack.start))
            stop.append(timed(stack.stop))
            restart.append(timed(stack.start))
            stack.stop()
    for name, values in [
        ("cold start (initdb)", cold),
        ("restart (data kept)", restart),
        ("warm (already running)", warm),
        ("clean stop", stop),
    ]:
        print(
            f"{name:<24} median {statistics.median(values) * 1000:7.1f} ms  "
            f"min {min(values) * 1000:7.1f} ms  max {max(values) * 1000:7.1f} ms"
        )


if __name__ == "__main__":
    main()
