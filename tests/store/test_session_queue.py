"""Contract tests: a session's queued runs wait in admission order behind its active
run; the settle of the run ahead names the next, and the stale sweep leaves waiting
runs alone."""

from __future__ import annotations

import threading

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


def test_racing_claimers_run_a_sessions_runs_one_at_a_time_in_admission_order(
    store: Store,
) -> None:
    """Six threads claim every run of one session over and over, each settling what it
    claimed: the runs are claimed in admission order, each only once the one before
    has settled, and no claim ever sees a second running run of the session."""
    run_ids = [f"r{i}" for i in range(1, 9)]
    for run_id in run_ids:
        admit(store, run_id, "s1")
    order: list[str] = []
    running_seen: list[list[str]] = []
    verdicts: list[Verdict] = []
    lock = threading.Lock()

    def claimer(owner: str) -> None:
        while len(order) < len(run_ids):
            for run_id in run_ids:
                claim = store.claim_run(run_id, owner, LONG_LEASE)
                if claim is None:
                    continue
                runs = store.list_runs(session_id="s1", limit=100)
                with lock:
                    order.append(run_id)
                    running_seen.append([r.run_id for r in runs if r.status == "running"])
                    verdicts.append(store.settle_run(claim, "completed"))

    threads = [threading.Thread(target=claimer, args=(f"worker-{n}",)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert order == run_ids
    assert running_seen == [[run_id] for run_id in run_ids]
    assert verdicts == [Verdict.DONE] * len(run_ids)
