"""Spawn overhead of the default jail (bwrap, egress proxy, cgroup, a uid of its own)
against the local provider: from ``spawn_journaled`` to the journal's first byte, and to
its sentinel, for a trivial agent (``echo x``), in one run. Run:
    .venv/bin/python bench/sandbox_spawn.py [--quick] [--runs N]

The agents of both providers are started the way a worker starts them (``provider_for``
on the same settings); sandboxes are created beforehand and their creation is reported
apart. The journal is watched by ``stat`` every 0.2 ms, so the figures are the spawn's,
not a reader's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from turnkeeper.config import Settings
from turnkeeper.sandbox import SandboxProvider, SandboxSpec, spawn_journaled
from turnkeeper.sandbox.egress import stop_proxies
from turnkeeper.sandbox.factory import provider_for
from turnkeeper.sandbox.journal import final_exit

POLL = 0.0002


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered):7.1f} ms   p95 {p95:7.1f} ms"


def wait_for(check: Callable[[], bool]) -> float:
    while not check():
        time.sleep(POLL)
    return time.perf_counter()


def spawn_once(provider: SandboxProvider) -> tuple[float, float, float]:
    """(create, first byte, sentinel) in ms, for one fresh sandbox and agent."""
    started = time.perf_counter()
    ref = provider.create("bench", SandboxSpec())
    sandbox = provider.resume(ref)
    assert sandbox is not None
    created = time.perf_counter()
    try:
        spawned = time.perf_counter()
        handle = spawn_journaled(sandbox, "bench", "echo x")
        journal = Path(handle.paths.journal)
        first = wait_for(lambda: journal.stat().st_size > 0)
        done = wait_for(lambda: final_exit(journal.read_bytes(), handle.nonce) is not None)
    finally:
        provider.destroy(ref)
    return (created - started) * 1000, (first - spawned) * 1000, (done - spawned) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    runs = args.runs or (10 if args.quick else 40)
    with tempfile.TemporaryDirectory(prefix="tk-spawn-") as tmp:
        settings = Settings(data_dir=Path(tmp))
        providers = {name: provider_for(name, settings) for name in ("local", "bwrap")}
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in providers}
        try:
            for provider in providers.values():
                spawn_once(provider)  # warm up: the egress proxy starts on first use
            for _ in range(runs):  # interleaved, so both see the same machine
                for name, provider in providers.items():
                    results[name].append(spawn_once(provider))
        finally:
            stop_proxies(settings.data_dir)
    print(f"{runs} spawns each of `echo x`, journaled")
    for name, rows in results.items():
        create, first, done = zip(*rows, strict=True)
        print(f"{name:5s} create      {percentiles(list(create))}")
        print(f"{name:5s} first byte  {percentiles(list(first))}")
        print(f"{name:5s} sentinel    {percentiles(list(done))}")
    for index, label in ((1, "first byte"), (2, "sentinel")):
        jail = statistics.median(r[index] for r in results["bwrap"])
        local = statistics.median(r[index] for r in results["local"])
        print(f"bwrap / local p50 to {label}: {jail / local:.1f}x ({jail - local:+.1f} ms)")


if __name__ == "__main__":
    main()
