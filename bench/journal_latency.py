"""Latency from an agent writing a journal line to the reader yielding it: follow vs poll.

The baseline is the plain alternative a worker would otherwise use: reading the agent's
stdout pipe directly (fast, but it dies with the worker). Run:
    .venv/bin/python bench/journal_latency.py [--quick] [--provider local|bwrap]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import structlog

from turnkeeper.sandbox import AgentCommand, JournalReader, SandboxSpec, spawn_journaled
from turnkeeper.sandbox.bwrap import BwrapProvider
from turnkeeper.sandbox.local import LocalProvider
from turnkeeper.sandbox.uids import UidPool

AGENT = (
    "import sys, time\n"
    "n, gap = int(sys.argv[1]), float(sys.argv[2])\n"
    "for _ in range(n):\n"
    "    sys.stdout.write(f'{time.monotonic_ns()}\\n'); sys.stdout.flush(); time.sleep(gap)\n"
)


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {p50:8.2f} ms   p99 {p99:8.2f} ms   max {ordered[-1]:8.2f} ms"


def via_pipe(lines: int, gap: float) -> list[float]:
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(lines), str(gap)], stdout=subprocess.PIPE
    )
    assert agent.stdout is not None
    out = [(time.monotonic_ns() - int(line)) / 1e6 for line in agent.stdout]
    agent.wait()
    agent.stdout.close()
    return out


BENCH_UIDS = (1900000000, 1900065535)  # TURNKEEPER_SANDBOX_UIDS's default range


def via_journal(
    provider_name: str, strategy: str, lines: int, gap: float, poll: float
) -> list[float]:
    root = Path(tempfile.mkdtemp(prefix="tk-bench-"))
    provider = (
        BwrapProvider(root, uids=UidPool(*BENCH_UIDS))
        if provider_name == "bwrap"
        else LocalProvider(root)
    )
    ref = provider.create("bench", SandboxSpec())
    sandbox = provider.resume(ref)
    assert sandbox is not None
    try:
        argv = (sys.executable, "-c", AGENT, str(lines), str(gap))
        command = AgentCommand(argv, read_only=(sys.prefix, sys.base_prefix))
        handle = spawn_journaled(sandbox, "bench", command)
        reader = JournalReader(
            sandbox, handle.paths, nonce=handle.nonce,
            strategy=strategy, poll_interval=poll,  # type: ignore[arg-type]
        )  # fmt: skip
        out = [(time.monotonic_ns() - int(line)) / 1e6 for line, _ in reader]
        assert reader.exit_code == 0
        assert len(out) == lines
        return out
    finally:
        provider.destroy(ref)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--provider", choices=["local", "bwrap"], default="local")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    lines, gap = (100, 0.01) if args.quick else (400, 0.02)
    print(f"{lines} lines, one every {gap * 1000:.0f} ms, provider {args.provider}")
    pipe = via_pipe(lines, gap)
    print(f"stdout pipe (baseline)   {percentiles(pipe)}")
    follow = via_journal(args.provider, "follow", lines, gap, 0.25)
    print(f"journal follow (tail -F) {percentiles(follow)}")
    for poll in (0.25, 0.05):
        polled = via_journal(args.provider, "poll", lines, gap, poll)
        print(f"journal poll {int(poll * 1000):3d} ms     {percentiles(polled)}")
    ratio = statistics.median(follow) / max(statistics.median(pipe), 1e-6)
    print(f"follow p50 / pipe p50 = {ratio:.1f}x")


if __name__ == "__main__":
    main()
