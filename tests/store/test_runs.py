"""Contract tests: admission, claim, lease, replace, settle, cancel, reads, refusals."""

from __future__ import annotations

import math
import time
from datetime import timedelta

import pytest

from tests.store.conftest import BLINK_LEASE, LONG_LEASE, admit, claimed, expire_lease, expired
from turnkeeper.errors import (
    InvalidInputError,
    RunConflictError,
    StoreError,
    StoreUnavailableError,
)
from turnkeeper.store import Claim, RunStatus, Store, Verdict
from turnkeeper.store.records import FleetCounts


def test_admit_creates_a_queued_run_and_replays_idempotently(store: Store) -> None:
    run, created = store.admit_run("r1", "s1", {"b": [1, 2], "a": "x"}, max_attempts=3, deadline=60)
    assert created
    assert (run.status, run.attempt_id, run.epoch, run.attempt_count) == ("queued", None, 0, 0)
    assert run.max_attempts == 3
    assert run.deadline is not None
    assert run.deadline - run.created_at == timedelta(seconds=60)
    again, created_again = store.admit_run(
        "r1", "s1", {"a": "x", "b": [1, 2]}, max_attempts=3, deadline=60
    )
    assert not created_again
    assert again == run
    assert [r.run_id for r in store.list_runs()] == ["r1"]


def test_admit_refuses_a_different_payload_or_session(store: Store) -> None:
    admit(store, "r1", "s1", {"v": 1})
    with pytest.raises(RunConflictError) as payload_err:
        store.admit_run("r1", "s1", {"v": 2}, max_attempts=5, deadline=None)
    assert payload_err.value.reason == "payload-differs"
    with pytest.raises(RunConflictError) as session_err:
        store.admit_run("r1", "s2", {"v": 1}, max_attempts=5, deadline=None)
    assert session_err.value.reason == "session-differs"
    assert store.get_run("r1").payload == {"v": 1}  # type: ignore[union-attr]


@pytest.mark.parametrize("payload", [{1, 2}, object(), {"x": math.nan}, {"x": "nul\x00"}, b"bytes"])
def test_admit_refuses_payloads_json_cannot_hold(store: Store, payload: object) -> None:
    with pytest.raises(InvalidInputError) as err:
        store.admit_run("r1", "s1", payload, max_attempts=1, deadline=None)
    assert err.value.reason == "not-json"
    assert store.get_run("r1") is None


@pytest.mark.parametrize(
    ("run_id", "session_id"), [("", "s"), ("r", ""), ("x" * 256, "s"), ("a\nb", "s"), (7, "s")]
)
def test_admit_refuses_bad_ids(store: Store, run_id: object, session_id: str) -> None:
    with pytest.raises(InvalidInputError):
        store.admit_run(run_id, session_id, {}, max_attempts=1, deadline=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("max_attempts", "deadline"), [(0, None), (1, 0), (1, -1), (1, math.inf)])
def test_admit_refuses_bad_budgets(store: Store, max_attempts: int, deadline: float) -> None:
    with pytest.raises(InvalidInputError):
        store.admit_run("r", "s", {}, max_attempts=max_attempts, deadline=deadline)


def test_claim_moves_queued_to_running_with_a_new_attempt(store: Store) -> None:
    admit(store, "r1")
    claim = store.claim_run("r1", "worker-a", 30)
    assert claim is not None
    assert claim.epoch == 1
    run = store.get_run("r1")
    assert run is not None
    assert (run.status, run.attempt_id, run.epoch, run.attempt_count, run.owner) == (
        RunStatus.RUNNING,
        claim.attempt_id,
        1,
        1,
        "worker-a",
    )
    assert run.lease_expires_at is not None
    assert run.started_at is not None
    assert run.lease_expires_at - run.updated_at == timedelta(seconds=30)
    assert store.claim_run("r1", "worker-b", 30) is None


def test_claim_refuses_unknown_settled_and_non_head_runs(store: Store) -> None:
    assert store.claim_run("nope", "w", 30) is None
    admit(store, "a1", "s1")
    admit(store, "a2", "s1")
    admit(store, "b1", "s2")
    assert store.claim_run("a2", "w", 30) is None  # a1 is the head of s1
    assert store.claim_run("b1", "w", 30) is not None  # other sessions are independent
    first = store.claim_run("a1", "w", 30)
    assert first is not None
    assert store.claim_run("a2", "w", 30) is None  # a1 is running
    assert store.settle_run(first, "completed") is Verdict.DONE
    assert store.claim_run("a1", "w", 30) is None  # settled
    assert store.claim_run("a2", "w", 30) is not None  # now the head


def test_claim_refuses_runs_past_their_deadline(store: Store) -> None:
    admit(store, "r1", deadline=0.001)
    time.sleep(0.02)
    assert store.claim_run("r1", "w", 30) is None


def test_claim_refuses_bad_arguments_before_any_sql(store: Store) -> None:
    for args in [("r", "", 30), ("r", "w", 0), ("r", "w", -1), ("r", "w", math.nan), ("", "w", 1)]:
        with pytest.raises(InvalidInputError):
            store.claim_run(*args)  # type: ignore[arg-type]


def test_renew_lease_extends_from_the_database_clock_and_reports_loss(store: Store) -> None:
    claim = claimed(store, "r1")
    assert store.renew_lease(claim, 120) is Verdict.DONE
    run = store.get_run("r1")
    assert run is not None
    assert run.lease_expires_at is not None
    assert run.lease_expires_at - run.updated_at == timedelta(seconds=120)
    stale = Claim("r1", "not-the-attempt", claim.epoch)
    assert store.renew_lease(stale, 120) is Verdict.NOT_OWNER
    assert store.renew_lease(Claim("unknown", "x", 1), 120) is Verdict.NOT_OWNER
    assert store.settle_run(claim, "completed") is Verdict.DONE
    assert store.renew_lease(claim, 120) is Verdict.NOT_OWNER


def test_replace_hands_an_expired_run_to_a_new_attempt(store: Store) -> None:
    claim = claimed(store, "r1")
    assert store.begin_turn_slot(claim, 0, "t0", None) is Verdict.DONE
    assert store.replace_turn_slot_attempt("r1", claim.attempt_id, "w2", 30) is None  # fresh
    expire_lease(store, claim)
    new = store.replace_turn_slot_attempt("r1", claim.attempt_id, "w2", 30)
    assert new is not None
    assert new.epoch == 2
    assert new.attempt_id != claim.attempt_id
    run = store.get_run("r1")
    assert run is not None
    assert (run.attempt_id, run.epoch, run.attempt_count, run.owner) == (
        new.attempt_id,
        2,
        2,
        "w2",
    )
    journal = store.get_turn_slot("r1")
    assert journal is not None
    assert (journal.attempt_id, journal.revision) == (new.attempt_id, 2)
    # The expected attempt is gone now: a second replace with it is refused.
    assert store.replace_turn_slot_attempt("r1", claim.attempt_id, "w3", 30) is None


def test_replace_refusals(store: Store) -> None:
    assert store.replace_turn_slot_attempt("nope", "x", "w", 30) is None
    admit(store, "q1")
    assert store.replace_turn_slot_attempt("q1", "x", "w", 30, only_if_expired=False) is None
    claim = claimed(store, "r1", "s2")
    assert store.replace_turn_slot_attempt("r1", "other", "w", 30, only_if_expired=False) is None
    forced = store.replace_turn_slot_attempt("r1", claim.attempt_id, "w", 30, only_if_expired=False)
    assert forced is not None
    assert store.settle_run(forced, "failed", {"why": "x"}) is Verdict.DONE
    assert (
        store.replace_turn_slot_attempt("r1", forced.attempt_id, "w", 30, only_if_expired=False)
        is None
    )


def test_settle_first_terminal_status_wins(store: Store) -> None:
    claim = claimed(store, "r1")
    assert store.settle_run(claim, "failed", {"message": "boom"}) is Verdict.DONE
    # A retry of that very settle was already made; any other is refused: settled.
    assert store.settle_run(claim, "failed", {"message": "boom"}) is Verdict.WRONG_STATE
    assert store.settle_run(claim, "completed") is Verdict.NOT_OWNER
    assert store.settle_run(claim, RunStatus.ABORTED) is Verdict.NOT_OWNER
    run = store.get_run("r1")
    assert run is not None
    assert (run.status, run.error) == ("failed", {"message": "boom"})
    assert run.finished_at is not None


def test_settle_refuses_stale_attempts_and_bad_statuses(store: Store) -> None:
    claim = claimed(store, "r1")
    assert store.settle_run(Claim("r1", "stale", 1), "completed") is Verdict.NOT_OWNER
    for status in ("queued", "running", "done", None):
        with pytest.raises(InvalidInputError):
            store.settle_run(claim, status)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        store.settle_run(claim, "failed", {"bad": {1, 2}})
    with pytest.raises(InvalidInputError):
        store.settle_run(("r1", claim.attempt_id, 1), "completed")  # type: ignore[arg-type]
    assert store.get_run("r1").status == "running"  # type: ignore[union-attr]
    assert store.settle_run(Claim("unknown", "x", 1), "completed") is Verdict.NOT_OWNER


def test_record_sandbox_is_fenced(store: Store) -> None:
    claim = claimed(store, "r1")
    assert store.record_sandbox(claim, {"provider": "local", "path": "/tmp/x"}) is Verdict.DONE
    stale = Claim("r1", "stale", 1)
    assert store.record_sandbox(stale, {"provider": "other"}) is Verdict.NOT_OWNER
    assert store.get_run("r1").sandbox_ref == {"provider": "local", "path": "/tmp/x"}  # type: ignore[union-attr]
    with pytest.raises(InvalidInputError):
        store.record_sandbox(claim, ["not", "a", "mapping"])  # type: ignore[arg-type]


def test_request_cancel_aborts_queued_and_flags_running(store: Store) -> None:
    admit(store, "q1", "s1")
    queued = store.request_cancel("q1")
    assert queued is not None
    assert queued.status == "aborted"
    assert queued.error == {"reason": "cancelled", "message": "cancelled before it started"}
    claim = claimed(store, "r1", "s2")
    running = store.request_cancel("r1")
    assert running is not None
    assert running.status == "running"
    assert running.cancel_requested_at is not None
    assert store.request_cancel("r1") == store.get_run("r1")  # still flagged, first time kept
    assert store.get_run("r1").cancel_requested_at == running.cancel_requested_at  # type: ignore[union-attr]
    assert store.settle_run(claim, "aborted") is Verdict.DONE
    assert store.request_cancel("r1") is None
    assert store.request_cancel("unknown") is None


def test_list_runs_filters(store: Store) -> None:
    admit(store, "a", "s1")
    admit(store, "b", "s1")
    claimed(store, "c", "s2")
    assert [r.run_id for r in store.list_runs()] == ["c", "b", "a"]
    assert [r.run_id for r in store.list_runs(session_id="s1")] == ["b", "a"]
    assert [r.run_id for r in store.list_runs(status="running")] == ["c"]
    assert [r.run_id for r in store.list_runs(status=RunStatus.QUEUED, limit=1)] == ["b"]
    assert store.list_runs(session_id="none") == []
    with pytest.raises(InvalidInputError):
        store.list_runs(status="sleeping")
    with pytest.raises(InvalidInputError):
        store.list_runs(limit=0)


def test_unknown_runs_give_none(store: Store) -> None:
    assert store.get_run("nope") is None
    assert store.get_turn_slot("nope") is None


@pytest.mark.slow
def test_an_unreachable_database_is_a_retryable_store_error() -> None:
    store = Store("postgresql://postgres@127.0.0.1:1/none", pool_size=1)
    try:
        with pytest.raises(StoreUnavailableError) as err:
            store.get_run("r1")
        assert err.value.reason == "unavailable"
        assert isinstance(err.value, StoreError)
        assert not any(
            type(e).__module__.startswith(("psycopg", "sqlalchemy")) for e in [err.value]
        )
    finally:
        store.close()


def test_driver_suffix_urls_are_accepted(database_url: str) -> None:
    suffixed = database_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    with Store(suffixed, pool_size=1) as store:
        assert store.get_run("r1") is None


def test_blink_lease_is_expired_after_the_sleep(store: Store) -> None:
    claim = claimed(store, "r1")
    assert store.renew_lease(claim, BLINK_LEASE) is Verdict.DONE
    time.sleep(0.02)
    assert expired(store, "r1") == ["r1"]
    assert store.renew_lease(claim, LONG_LEASE) is Verdict.DONE  # not replaced: still the owner
    assert expired(store, "r1") == []


def test_fleet_counts_are_what_a_metrics_scrape_reads(store: Store) -> None:
    assert store.fleet_counts() == FleetCounts({}, {}, {}, 0, 0)
    admit(store, "queued-1", "s-queued")
    done = claimed(store, "done-1", "s-done")
    assert store.settle_run(done, RunStatus.COMPLETED) is Verdict.DONE
    stale = claimed(store, "stale-1", "s-stale")
    expire_lease(store, stale)
    (handed,) = store.hand_over_expired(10)
    assert store.adopt_attempt(handed.run_id, handed.attempt_id, "worker-b", LONG_LEASE)
    live = claimed(store, "live-1", "s-live")
    expire_lease(store, live)  # expired, not yet handed over
    assert store.fleet_counts() == FleetCounts(
        runs_by_status={"queued": 1, "completed": 1, "running": 2},
        attempts_by_outcome={"completed": 1, "superseded": 1, "running": 2},
        takeovers_by_cause={"lease": 1},
        expired_leases=1,
        max_epoch=2,
    )
