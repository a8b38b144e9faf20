"""`turnkeeper tail` on a log Redis lost: rebuilt from Postgres, or one line and exit 1
when it cannot be (its run was pruned). Never an empty log and exit 0."""

from __future__ import annotations

import json

from tests.driver.fleet import Fleet
from tests.driver.test_cli_runs import cli
from turnkeeper.driver import lifecycle
from turnkeeper.store.records import RunStatus


def test_tail_rebuilds_a_lost_log_and_fails_loudly_on_a_pruned_one(fleet: Fleet) -> None:
    run = fleet.client.submit({"preset": "scripted"}, "never runs", run_id="gone-1")
    cancelled = fleet.client.cancel(run.run_id)  # queued: settled at once, log [cancelled]
    assert cancelled.status is RunStatus.ABORTED
    expected = [
        {"seq": 1, "chunk": lifecycle.run_error("cancelled before it started", "cancelled")}
    ]

    def tail() -> tuple[int, list[object], str]:
        done = cli(fleet, "tail", "gone-1", "--json", "--no-follow")
        return done.returncode, [json.loads(line) for line in done.stdout.splitlines()], done.stderr

    assert tail()[:2] == (0, expected)
    fleet.client.log.delete("gone-1")  # lost: rebuilt from the run's row
    assert tail()[:2] == (0, expected)
    follow = cli(fleet, "tail", "gone-1", "--json")
    assert follow.returncode == 0
    assert [json.loads(line) for line in follow.stdout.splitlines()] == expected

    assert fleet.client.store.prune_settled(0, 10) == 1
    assert tail()[:2] == (0, expected)  # still cached
    fleet.client.log.delete("gone-1")
    code, lines, stderr = tail()
    assert (code, lines) == (1, [])
    assert stderr.count("\n") == 1
    assert stderr.startswith("error: the run's log was lost and its stored output was pruned")
    assert cli(fleet, "tail", "gone-1").returncode == 1
