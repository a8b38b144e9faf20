"""Chaos: 30 runs on 3 workers, SIGKILLs and SIGSTOPs every few seconds until all settle.

Every log must equal its run's oracle, element by element: nothing lost, doubled
or produced twice, whatever the kills hit.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.driver.fleet import Fleet, expected_log
from turnkeeper.config import Settings
from turnkeeper.store.records import RunStatus

RUNS = 30
WORKERS = 3


@pytest.mark.slow
def test_chaos(settings: Settings, tmp_path: Path) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs")
    rng = random.Random(20261130)
    try:
        workers = [fleet.start_worker(concurrency=2) for _ in range(WORKERS)]
        fleet.start_beat()
        agents: dict[str, dict[str, Any]] = {}
        for index in range(RUNS):
            agent = {"preset": "scripted", "turns": 1 + index % 3, "pace": 0.05, "seed": index}
            run = fleet.client.submit(agent, f"chaos {index}", max_attempts=100)
            agents[run.run_id] = agent
        frozen: list[subprocess.Popen[bytes]] = []
        kills = stops = 0
        deadline = time.monotonic() + 600
        while not all(fleet.client.require(r).status.is_terminal for r in agents):
            assert time.monotonic() < deadline, fleet.dump_logs()
            time.sleep(rng.uniform(1.0, 3.0))
            for proc in frozen:  # wake last round's zombies: they must change nothing
                os.killpg(proc.pid, signal.SIGCONT)
            frozen.clear()
            victim = rng.choice(workers)
            if rng.random() < 0.5:
                os.killpg(victim.pid, signal.SIGKILL)
                victim.wait()
                workers[workers.index(victim)] = fleet.start_worker(concurrency=2)
                kills += 1
            else:
                os.killpg(victim.pid, signal.SIGSTOP)
                frozen.append(victim)
                stops += 1
        for proc in frozen:
            os.killpg(proc.pid, signal.SIGCONT)
        assert kills + stops >= 3, "the chaos really happened"
        for run_id, agent in agents.items():
            run = fleet.client.require(run_id)
            assert run.status is RunStatus.COMPLETED, (run_id, run.error)
            fleet.wait_log_closed(run_id)  # its owner may have died right after settling
            oracle = expected_log(
                run_id,
                run.session_id,
                agent,
                f"chaos {list(agents).index(run_id)}",
                tmp_path / "oracle" / run_id,
            )
            stored = fleet.log_of(run_id)
            assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
            assert [chunk for _, chunk in stored] == oracle, run_id
    finally:
        fleet.stop()
