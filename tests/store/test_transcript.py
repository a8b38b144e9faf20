"""Contract tests: the transcript tree, sessions, the reconciler queries and retention."""

from __future__ import annotations

import time

import pytest

from tests.store.conftest import admit, claimed, expire_lease, expired
from turnkeeper.errors import (
    InvalidInputError,
    SessionBusyError,
    SessionDeletedError,
    TranscriptConflictError,
)
from turnkeeper.store import Claim, NewEntry, Store, Verdict


def _ids(store: Store, session_id: str = "s1") -> list[str]:
    return [e.entry_id for e in store.active_path(session_id)]


def test_append_moves_the_leaf_and_a_replay_is_a_no_op(store: Store) -> None:
    claim = claimed(store, "r1")
    batch = [NewEntry("u1", "user", {"text": "hi"}), NewEntry("a1", "assistant", {"text": "yo"})]
    assert store.append_transcript(claim, "s1", batch, None) == "a1"
    assert store.append_transcript(claim, "s1", [NewEntry("u2", "user", {"n": 2})], "a1") == "u2"
    assert store.append_transcript(claim, "s1", batch, None) == "a1"  # replayed commit
    path = store.active_path("s1")
    assert [(e.entry_id, e.parent_id, e.kind, e.body) for e in path] == [
        ("u1", None, "user", {"text": "hi"}),
        ("a1", "u1", "assistant", {"text": "yo"}),
        ("u2", "a1", "user", {"n": 2}),
    ]
    assert {(e.run_id, e.attempt_id) for e in path} == {("r1", claim.attempt_id)}
    assert [e.position for e in path] == sorted(e.position for e in path)


def test_append_refusals(store: Store) -> None:
    claim = claimed(store, "r1")
    assert store.append_transcript(claim, "s1", [NewEntry("u1", "user", {})], None) == "u1"
    with pytest.raises(TranscriptConflictError) as moved:
        store.append_transcript(claim, "s1", [NewEntry("x1", "user", {})], None)
    assert (moved.value.reason, moved.value.fields["current_leaf"]) == ("leaf-moved", "u1")
    with pytest.raises(TranscriptConflictError) as taken:
        store.append_transcript(claim, "s1", [NewEntry("u1", "user", {"other": 1})], "u1x")
    assert taken.value.reason == "entry-id-taken"
    assert store.append_transcript(claim, "s1", [NewEntry("n1", "u", {})], "u1") == "n1"
    with pytest.raises(TranscriptConflictError) as reused:  # an id reused under the leaf
        store.append_transcript(
            claim, "s1", [NewEntry("m1", "u", {}), NewEntry("u1", "u", {})], "n1"
        )
    assert reused.value.reason == "entry-id-taken"
    assert _ids(store) == ["u1", "n1"]  # the leaf move was rolled back with the entries
    assert (
        store.append_transcript(Claim("r1", "stale", 1), "s1", [NewEntry("z", "u", {})], "n1")
        is None
    )
    assert store.append_transcript(claim, "other-session", [NewEntry("z", "u", {})], None) is None
    for bad in ([], [("id", "kind", {})], [NewEntry("a", "k", {1})], [NewEntry("a", "k", 1)] * 2):
        with pytest.raises(InvalidInputError):
            store.append_transcript(claim, "s1", bad, "n1")  # type: ignore[arg-type]
    assert _ids(store) == ["u1", "n1"]


def test_an_unknown_session_has_an_empty_active_path(store: Store) -> None:
    assert store.active_path("unknown") == []


def test_delete_session_is_refused_while_busy_and_leaves_receipts(store: Store) -> None:
    claim = claimed(store, "r1")
    store.append_transcript(claim, "s1", [NewEntry("a", "u", {})], None)
    with pytest.raises(SessionBusyError):
        store.delete_session("s1")
    assert store.settle_run(claim, "completed") is Verdict.DONE
    admit(store, "r2")
    with pytest.raises(SessionBusyError):
        store.delete_session("s1")
    assert store.request_cancel("r2") is not None
    assert store.delete_session("s1") == 2
    assert store.get_run("r1") is None
    assert store.active_path("s1") == []
    with pytest.raises(SessionDeletedError) as err:
        store.admit_run("r1", "s1", {"prompt": "r1"}, max_attempts=5, deadline=None)
    assert err.value.run_id == "r1"
    assert store.delete_session("s1") == 0
    assert store.delete_session("never") == 0
    # A new run in the same session id starts a fresh session.
    assert store.admit_run("r3", "s1", {}, max_attempts=1, deadline=None)[1]


def test_hand_over_expired_hands_over_only_expired_runs_within_budget(store: Store) -> None:
    fresh = claimed(store, "fresh", "s1")
    stale = claimed(store, "stale", "s2")
    spent = claimed(store, "spent", "s3", max_attempts=1)
    late = claimed(store, "late", "s4", deadline=0.05)
    cancelled = claimed(store, "cancelled", "s5")
    for claim in (stale, spent, late, cancelled):
        expire_lease(store, claim)
    time.sleep(0.05)
    assert store.request_cancel("cancelled") is not None
    assert expired(store, "fresh", "stale", "spent", "late", "cancelled") == [
        "stale",
        "spent",
        "late",
        "cancelled",
    ]
    claims = store.hand_over_expired(10)
    assert [(c.run_id, c.epoch) for c in claims] == [("stale", 2)]
    assert claims[0].attempt_id != stale.attempt_id
    handed = store.get_run("stale")
    assert handed is not None
    # Awaiting adoption: nobody's, no lease, and the attempt is not counted yet.
    assert (handed.owner, handed.lease_expires_at, handed.attempt_count) == (None, None, 1)
    assert handed.awaiting_adoption
    assert store.hand_over_expired(10) == []
    settled = store.expire_exhausted(10)
    assert [(r.run_id, r.status, r.error["reason"]) for r in settled] == [
        ("spent", "failed", "attempts-exhausted"),
        ("late", "failed", "deadline-exceeded"),
        ("cancelled", "aborted", "cancelled"),
    ]
    assert store.expire_exhausted(10) == []
    assert store.get_run("fresh").status == "running"  # type: ignore[union-attr]
    assert store.settle_run(fresh, "completed") is Verdict.DONE


def test_queued_runs_past_their_deadline_are_failed(store: Store) -> None:
    admit(store, "q", deadline=0.001)
    time.sleep(0.02)
    assert [(r.run_id, r.status) for r in store.expire_exhausted(5)] == [("q", "failed")]


def test_stale_queued_runs_and_mark_dispatched(store: Store) -> None:
    admit(store, "q1", "s1")
    admit(store, "q2", "s2")
    claimed(store, "r", "s3")
    time.sleep(1.0)
    assert [r.run_id for r in store.stale_queued_runs(0.5, 10)] == ["q1", "q2"]
    assert store.mark_dispatched("q1")
    assert [r.run_id for r in store.stale_queued_runs(0.5, 10)] == ["q2"]
    assert [r.run_id for r in store.stale_queued_runs(3600, 10)] == []
    assert not store.mark_dispatched("r")
    assert not store.mark_dispatched("unknown")


def test_prune_settled_deletes_segments_and_slots_in_batches(store: Store) -> None:
    claims = [claimed(store, f"r{i}", f"s{i}") for i in range(3)]
    for claim in claims:
        assert store.begin_turn_slot(claim, 0, "t", None) is Verdict.DONE
        assert store.append_segment(claim, f"k-{claim.run_id}", 0, b"data") is Verdict.DONE
    assert store.settle_run(claims[0], "completed") is Verdict.DONE
    assert store.settle_run(claims[1], "failed") is Verdict.DONE
    assert store.prune_settled(3600, 10) == 0
    time.sleep(0.02)
    assert store.prune_settled(0.01, 1) == 1
    assert store.prune_settled(0.01, 10) == 1
    assert store.prune_settled(0.01, 10) == 0
    for claim in claims[:2]:
        assert store.get_turn_slot(claim.run_id) is None
        assert store.segments(f"k-{claim.run_id}") == []
        assert store.get_run(claim.run_id).pruned_at is not None  # type: ignore[union-attr]
    assert store.get_turn_slot("r2") is not None
    assert store.segments("k-r2") != []


def test_session_leaf_and_entry_parent(store: Store) -> None:
    assert store.session_leaf("s1") is None
    assert store.entry_parent("s1", "u1") == (False, None)
    claim = claimed(store, "r1")
    store.append_transcript(
        claim, "s1", [NewEntry("u1", "user", {}), NewEntry("a1", "x", {})], None
    )
    assert store.session_leaf("s1") == "a1"
    assert store.entry_parent("s1", "u1") == (True, None)
    assert store.entry_parent("s1", "a1") == (True, "u1")
    assert store.entry_parent("other", "a1") == (False, None)


def test_a_branch_appends_under_an_earlier_entry_and_moves_the_leaf_by_cas(
    store: Store,
) -> None:
    claim = claimed(store, "r1", "s1")
    assert store.append_transcript(claim, "s1", [NewEntry("u1", "user", {})], None) == "u1"
    assert store.append_transcript(claim, "s1", [NewEntry("a1", "assistant", {})], "u1") == "a1"
    assert store.append_transcript(claim, "s1", [NewEntry("u2", "user", {})], "a1") == "u2"
    # From a1 again: a second child of a1, and the leaf moves from u2 to it.
    branch = [NewEntry("u2b", "user", {"edited": True})]
    assert store.append_transcript(claim, "s1", branch, "u2", under="a1") == "u2b"
    assert [e.entry_id for e in store.active_path("s1")] == ["u1", "a1", "u2b"]
    assert [(e.entry_id, e.parent_id) for e in store.session_entries("s1")] == [
        ("u1", None),
        ("a1", "u1"),
        ("u2", "a1"),
        ("u2b", "a1"),
    ]
    assert [e.entry_id for e in store.path_to("s1", "u2")] == ["u1", "a1", "u2"]
    assert store.append_transcript(claim, "s1", branch, "u2", under="a1") == "u2b"  # replayed
    with pytest.raises(TranscriptConflictError) as moved:  # the leaf is u2b now, not u2
        store.append_transcript(claim, "s1", [NewEntry("u3", "user", {})], "u2", under="u1")
    assert moved.value.reason == "leaf-moved"
