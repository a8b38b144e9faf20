"""Chaos: 30 runs on 3 workers, SIGKILLs and SIGSTOPs every few seconds until all settle.

Every log must equal its run's oracle, element by element: nothing lost, doubled
or produced twice, whatever the kills hit. The runs have the default
``max_attempts``: time a takeover spends waiting for a slot costs no attempt, so
only the deaths of a run's owners do. The kills are sized for that: a worker is
only hit while none of the runs it owns has suffered ``MAX_HITS`` hits already.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.driver.fleet import Fleet, expected_log
from turnkeeper.config import Settings
from turnkeeper.owner import owner_pid
from turnkeeper.store.records import RunStatus

RUNS = 30
WORKERS = 3
# Hits (a SIGKILL or SIGSTOP of its owner's worker) a run may suffer: each costs at
# most one attempt, and one more is kept for a hit this loop cannot see (the worker
# claimed or adopted a run just after the loop looked at who owns what).
MAX_HITS = Settings.model_fields["max_attempts"].default - 2


DEFAULT_LEASE: dict[str, Any] = {
    name: Settings.model_fields[name].default
    for name in ("lease_ttl", "heartbeat_interval", "reconcile_interval", "requeue_after")
}
"""The default lease with crash detection on: a killed owner's runs are handed over by
its death, a frozen one's by nothing (each is woken before its lease runs out)."""


@pytest.mark.slow
@pytest.mark.parametrize("timing", ["short-lease", "default-lease"])
def test_chaos(settings: Settings, tmp_path: Path, timing: str) -> None:
    fleet = Fleet.create(
        settings, tmp_path / "logs", **(DEFAULT_LEASE if timing != "short-lease" else {})
    )
    rng = random.Random(20261130)
    try:
        workers = [fleet.start_worker(concurrency=2) for _ in range(WORKERS)]
        fleet.start_beat()
        agents: dict[str, dict[str, Any]] = {}
        for index in range(RUNS):
            agent = {"preset": "scripted", "turns": 1 + index % 3, "pace": 0.05, "seed": index}
            run = fleet.client.submit(agent, f"chaos {index}")
            agents[run.run_id] = agent
        frozen: list[subprocess.Popen[bytes]] = []
        kills = stops = 0
        hits: Counter[str] = Counter()
        deadline = time.monotonic() + 600
        while not all(fleet.client.require(r).status.is_terminal for r in agents):
            assert time.monotonic() < deadline, fleet.dump_logs()
            time.sleep(rng.uniform(1.0, 3.0))
            for proc in frozen:  # wake last round's zombies: they must change nothing
                os.killpg(proc.pid, signal.SIGCONT)
            frozen.clear()
            owned = _owned_runs(fleet, agents)
            allowed = [w for w in workers if all(hits[r] < MAX_HITS for r in owned.get(w.pid, []))]
            if not allowed:
                continue
            victim = rng.choice(allowed)
            for run_id in owned.get(victim.pid, []):
                hits[run_id] += 1
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
        most = max(
            _check_run(fleet, run_id, agent, f"chaos {index}", tmp_path / "oracle" / run_id)
            for index, (run_id, agent) in enumerate(agents.items())
        )
        print(
            f"chaos: {kills} kills, {stops} stops; the most hits on one run {max(hits.values())}, "
            f"the most attempts one run used {most} (max_attempts {MAX_HITS + 2})"
        )
    finally:
        fleet.stop()


def _check_run(fleet: Fleet, run_id: str, agent: dict[str, Any], prompt: str, workdir: Path) -> int:
    """The run completed, with its oracle's log and one attempt per claim or adoption;
    returns how many attempts it used."""
    run = fleet.client.require(run_id)
    assert run.status is RunStatus.COMPLETED, (run_id, run.error)
    # An attempt counts when it is claimed or adopted, and only then: the attempts
    # table has one row per claim or adoption, and every handed-over attempt was
    # adopted before it could expire again.
    outcomes = _attempt_outcomes(fleet, run_id)
    assert outcomes == ["superseded"] * (run.attempt_count - 1) + ["completed"], run_id
    assert run.epoch == run.attempt_count, "every handover was adopted once"
    fleet.wait_log_closed(run_id)  # its owner may have died right after settling
    oracle = expected_log(run_id, run.session_id, agent, prompt, workdir)
    stored = fleet.log_of(run_id)
    assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
    assert [chunk for _, chunk in stored] == oracle, run_id
    return run.attempt_count


def _owned_runs(fleet: Fleet, agents: dict[str, Any]) -> dict[int, list[str]]:
    """The unsettled runs each worker (by its process group) owns now."""
    owned: dict[int, list[str]] = {}
    for run_id in agents:
        run = fleet.client.require(run_id)
        if run.status.is_terminal or run.owner is None:
            continue
        try:
            pgid = os.getpgid(owner_pid(run.owner))
        except ProcessLookupError:
            continue
        owned.setdefault(pgid, []).append(run_id)
    return owned


def _attempt_outcomes(fleet: Fleet, run_id: str) -> list[str | None]:
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        return [
            row[0]
            for row in conn.execute(
                "SELECT outcome FROM attempts WHERE run_id = %s ORDER BY epoch", (run_id,)
            )
        ]
