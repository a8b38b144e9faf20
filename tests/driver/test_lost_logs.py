"""``log.rebuilt`` means Redis lost a log (docs/architecture.md, "Lost logs").

Ordinary runs make their logs through the same path a lost log comes back by (the
first fence finds nothing and writes back what Postgres holds); that is no loss, and
an operator told to watch ``log.rebuilt`` must never see it for one. A log Redis
really dropped under a running owner is rebuilt, said so with its reason, counted in
``/metrics``, and the run's whole log still equals its oracle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.driver.fleet import (
    Fleet,
    chunks_while_held,
    expected_log,
    held_agent,
    release_held,
    wait_held,
)
from turnkeeper.log.runlog import LOGS_LOST
from turnkeeper.store.records import RunStatus

AGENT: dict[str, Any] = {"preset": "scripted", "turns": 1, "pace": 0.0, "seed": 3}
RUNS = 50


def test_fifty_ordinary_runs_rebuild_no_log(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_worker(concurrency=8, pool="threads")
    prompts = [f"ordinary {index}" for index in range(RUNS)]
    runs = [fleet.client.submit(AGENT, prompt) for prompt in prompts]
    queued = fleet.client.submit(AGENT, "cancelled before any worker saw it", run_id="early")
    fleet.client.cancel(queued.run_id)  # may race a claim: either way no loss
    for run in runs:
        assert fleet.wait_settled(run.run_id).status is RunStatus.COMPLETED
    fleet.wait_settled(queued.run_id)
    for run, prompt in list(zip(runs, prompts, strict=True))[:5]:  # whole, as a client reads
        said = expected_log(run.run_id, run.session_id, AGENT, prompt, tmp_path / run.run_id)
        assert [chunk for _, chunk in fleet.log_of(run.run_id)] == said

    assert fleet.events("log.rebuilt", "log.restored") == []
    assert fleet.client.log.counters().get(LOGS_LOST, 0) == 0


def test_a_log_redis_dropped_under_its_owner_is_rebuilt_and_said_so(
    fleet: Fleet, tmp_path: Path
) -> None:
    agent = {"preset": "scripted", "turns": 2, "pace": 0.0, "seed": 9}
    fleet.start_worker()
    prompt = "lose my log"
    run = fleet.client.submit(held_agent(agent, "dropped", lines=4), prompt)
    wait_held("dropped")
    fleet.wait_chunks(
        run.run_id, chunks_while_held(run.run_id, agent, prompt, 4, tmp_path / "held")
    )
    fleet.client.log.delete(run.run_id)  # what a flush or an eviction does to one log
    release_held("dropped")

    assert fleet.wait_settled(run.run_id).status is RunStatus.COMPLETED
    said = expected_log(run.run_id, run.session_id, agent, prompt, tmp_path / "oracle")
    assert [chunk for _, chunk in fleet.log_of(run.run_id)] == said
    rebuilt = fleet.events("log.rebuilt", run_id=run.run_id)
    assert [(e["reason"], e["found_by"], e["epoch"], e["closed"]) for e in rebuilt] == [
        ("lost", "append", 1, False)
    ]
    assert fleet.client.log.counters()[LOGS_LOST] == 1
