"""Contract tests: a session's queued runs wait in admission order behind its active
run; the settle of the run ahead names the next, and the stale sweep leaves waiting
runs alone."""

from __future__ import annotations

from tests.store.conftest import LONG_LEASE, admit, claimed
from turnkeeper.store import Store, Verdict


def test_queued_runs_wait_behind_the_active_run_in_admission_order(store: Store) -> None:
    active = claimed(store, "r1", "s1")
    admit(store, "r2", "s1")
    admit(store, "r3", "s1")
    admit(store, "other", "s2")
    assert [store.waiting_behind(r) for r in ("r1", "r2", "r3", "other")] == [None, 1, 2, 0]
    assert store.claim_run("r2", "worker-b", LONG_LEASE) is None, "never beside the active run"
    assert store.next_in_session("r1") is None, "r1 still runs"
    assert [r.run_id for r in store.stale_queued_runs(0, 10)] == ["other"]

    assert store.settle_run(active, "completed") is Verdict.DONE
    assert store.next_in_session("r1") == "r2"
    assert [store.waiting_behind(r) for r in ("r2", "r3")] == [0, 1]
    assert [r.run_id for r in store.stale_queued_runs(0, 10)] == ["r2", "other"]
    second = store.claim_run("r2", "worker-b", LONG_LEASE)
    assert second is not None
    assert store.next_in_session("r1") is None, "r2 leads, and is running"
    assert store.settle_run(second, "failed") is Verdict.DONE
    assert store.next_in_session("r2") == "r3"
    assert store.next_in_session("r3") is None, "a queued run names no successor"
