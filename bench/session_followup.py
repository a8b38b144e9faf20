"""A session's follow-up against a first run: submit -> first chunk, warm workspace.

One real worker (bwrap by default) runs the scripted agent. A first run opens a new
session: its sandbox is created. A follow-up goes to a session whose previous run
settled: its workspace is resumed and stopped, the conversation before its input is
read from the transcript, and the agent starts with it. Each measures the time from
``Client.submit`` to ``RUN_STARTED`` (the claim) and to the first chunk the agent
printed (the sandbox ready and the agent started), read from the run log.

    .venv/bin/python bench/session_followup.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _fleet import bench_fleet, percentile
from turnkeeper.client import Client
from turnkeeper.logconfig import configure_logging

AGENT = {"preset": "scripted", "turns": 0, "pace": 0}


def measure(client: Client, session_id: str, prompt: str) -> tuple[float, float]:
    """Seconds from submit to RUN_STARTED and to the agent's first chunk; waits for the
    run's log to close."""
    started = time.perf_counter()
    run = client.submit(AGENT, prompt, session_id=session_id)
    claimed = first = None
    for _, chunk in client.events(run.run_id):
        now = time.perf_counter() - started
        if chunk["type"] == "RUN_STARTED":
            claimed = now
        elif first is None and chunk["type"] != "RUN_STARTED":
            first = now
    assert claimed is not None
    assert first is not None
    return claimed, first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    configure_logging("WARNING")
    with tempfile.TemporaryDirectory() as tmp, bench_fleet(Path(tmp)) as fleet:
        fleet.worker()
        client = Client.from_settings(fleet.settings)
        try:
            measure(client, "warm-up", "warm up")  # imports, pools, the first claim
            first_runs, follow_ups = [], []
            for n in range(args.rounds):
                first_runs.append(measure(client, f"bench-{n}", "write the notes"))
                follow_ups.append(measure(client, f"bench-{n}", "and a summary"))
        finally:
            client.close()
    for name, samples in (("first run", first_runs), ("follow-up", follow_ups)):
        claims = [c * 1000 for c, _ in samples]
        chunks = [f * 1000 for _, f in samples]
        print(
            f"{name:<10} submit->RUN_STARTED p50 {percentile(claims, 50):6.1f} ms "
            f"p90 {percentile(claims, 90):6.1f} ms | submit->first agent chunk "
            f"p50 {percentile(chunks, 50):6.1f} ms p90 {percentile(chunks, 90):6.1f} ms "
            f"({len(samples)} runs, {fleet.settings.sandbox_provider})"
        )


if __name__ == "__main__":
    main()
