"""Contract tests: the turn slot and the segments."""

from __future__ import annotations

import pytest

from tests.store.conftest import claimed, expire_lease
from turnkeeper.errors import InvalidInputError, SegmentConflictError
from turnkeeper.store import Claim, Segment, Store, TurnPhase, Verdict


def _phase(store: Store, run_id: str = "r1") -> tuple[str, int, str]:
    journal = store.get_turn_slot(run_id)
    assert journal is not None
    return journal.phase, journal.revision, journal.attempt_id


def test_a_full_turn_moves_forward_and_commit_is_final(store: Store) -> None:
    claim = claimed(store, "r1")
    assert store.begin_turn_slot(claim, 0, "t0", "leaf-0") is Verdict.DONE
    assert store.update_turn_phase(claim, "provider_started", journal_key="k0") is Verdict.DONE
    assert (
        store.update_turn_phase(
            claim,
            TurnPhase.TOOL_REQUEST_RECORDED,
            tool_request={"toolCalls": [{"id": "c1"}]},
            checkpoint_leaf_id="leaf-1",
        )
        is Verdict.DONE
    )
    assert store.commit_turn_slot(claim, "leaf-2") is Verdict.DONE
    journal = store.get_turn_slot("r1")
    assert journal is not None
    assert (
        journal.phase,
        journal.revision,
        journal.turn_index,
        journal.turn_id,
        journal.journal_key,
        journal.tool_request,
        journal.checkpoint_leaf_id,
        journal.committed_leaf_id,
    ) == ("committed", 4, 0, "t0", "k0", {"toolCalls": [{"id": "c1"}]}, "leaf-1", "leaf-2")
    # Every write to the committed turn is refused, also from a new attempt.
    assert store.commit_turn_slot(claim, "leaf-3") is Verdict.WRONG_STATE
    assert store.update_turn_phase(claim, "provider_started") is Verdict.WRONG_STATE
    assert store.mark_journal_consumed(claim, "k0") is Verdict.WRONG_STATE
    assert store.begin_turn_slot(claim, 0, "t0", None) is Verdict.WRONG_STATE
    forced = store.replace_turn_slot_attempt("r1", claim.attempt_id, "w", 30, only_if_expired=False)
    assert forced is not None
    assert store.commit_turn_slot(forced, "leaf-3") is Verdict.WRONG_STATE
    assert store.update_turn_phase(forced, "tool_request_recorded") is Verdict.WRONG_STATE
    assert store.get_turn_slot("r1").committed_leaf_id == "leaf-2"  # type: ignore[union-attr]
    # The next turn begins in place: reset, revision + 1.
    assert store.begin_turn_slot(forced, 1, "t1", "leaf-2") is Verdict.DONE
    journal = store.get_turn_slot("r1")
    assert journal is not None
    assert (
        journal.phase,
        journal.revision,
        journal.turn_index,
        journal.journal_key,
        journal.tool_request,
        journal.committed_leaf_id,
        journal.journal_consumed_at,
    ) == ("before_provider", 6, 1, None, None, None, None)


def test_provider_started_may_commit_directly(store: Store) -> None:
    claim = claimed(store, "r1")
    assert store.begin_turn_slot(claim, 0, "t0", None) is Verdict.DONE
    assert (
        store.commit_turn_slot(claim, "x") is Verdict.WRONG_STATE
    )  # before_provider cannot commit
    assert store.update_turn_phase(claim, "provider_started") is Verdict.DONE
    assert store.commit_turn_slot(claim, "leaf") is Verdict.DONE
    assert _phase(store)[:2] == ("committed", 3)


def test_a_write_for_one_turn_never_lands_on_the_next(store: Store) -> None:
    """A turn's own write made again once the slot moved on to the next turn (a retry
    whose first try's reply was lost) is refused for its state, whatever the phase the
    next turn is at: it neither commits that turn nor records a tool request in it."""
    claim = claimed(store, "r1")
    assert store.begin_turn_slot(claim, 0, "t0", "leaf-0") is Verdict.DONE
    assert store.update_turn_phase(claim, "provider_started", turn_index=0) is Verdict.DONE
    assert store.commit_turn_slot(claim, "leaf-1", turn_index=0) is Verdict.DONE
    assert store.begin_turn_slot(claim, 1, "t1", "leaf-1") is Verdict.DONE
    assert store.update_turn_phase(claim, "provider_started", turn_index=0) is Verdict.WRONG_STATE
    assert store.update_turn_phase(claim, "provider_started", turn_index=1) is Verdict.DONE
    late_request = store.update_turn_phase(
        claim, TurnPhase.TOOL_REQUEST_RECORDED, tool_request={"c": 1}, turn_index=0
    )
    assert late_request is Verdict.WRONG_STATE
    assert store.commit_turn_slot(claim, "leaf-1", turn_index=0) is Verdict.WRONG_STATE
    slot = store.get_turn_slot("r1")
    assert slot is not None
    assert (slot.turn_index, slot.phase, slot.tool_request, slot.committed_leaf_id) == (
        1,
        TurnPhase.PROVIDER_STARTED,
        None,
        None,
    )
    assert store.commit_turn_slot(claim, "leaf-2", turn_index=1) is Verdict.DONE


def test_phases_never_move_backwards_or_skip(store: Store) -> None:
    claim = claimed(store, "r1")
    assert store.update_turn_phase(claim, "provider_started") is Verdict.WRONG_STATE  # no slot yet
    assert store.begin_turn_slot(claim, 0, "t0", None) is Verdict.DONE
    assert store.update_turn_phase(claim, "tool_request_recorded") is Verdict.WRONG_STATE  # skip
    assert store.update_turn_phase(claim, "provider_started") is Verdict.DONE
    assert store.update_turn_phase(claim, "provider_started") is Verdict.WRONG_STATE  # repeat
    assert store.update_turn_phase(claim, "tool_request_recorded") is Verdict.DONE
    assert store.update_turn_phase(claim, "provider_started") is Verdict.WRONG_STATE  # back
    assert (
        store.begin_turn_slot(claim, 0, "t0-again", None) is Verdict.WRONG_STATE
    )  # same turn again
    assert _phase(store)[:2] == ("tool_request_recorded", 3)
    with pytest.raises(InvalidInputError):
        store.update_turn_phase(claim, "before_provider")
    with pytest.raises(InvalidInputError):
        store.update_turn_phase(claim, "committed")
    with pytest.raises(InvalidInputError):
        store.update_turn_phase(claim, "flying")
    with pytest.raises(InvalidInputError):
        store.begin_turn_slot(claim, -1, "t", None)
    with pytest.raises(InvalidInputError):
        store.update_turn_phase(claim, "provider_started", tool_request={1, 2})


def test_begin_is_guarded_by_the_attempt(store: Store) -> None:
    claim = claimed(store, "r1")
    stale = Claim("r1", "stale", 1)
    assert store.begin_turn_slot(stale, 0, "t0", None) is Verdict.NOT_OWNER
    assert store.get_turn_slot("r1") is None
    assert store.begin_turn_slot(claim, 0, "t0", None) is Verdict.DONE
    assert store.begin_turn_slot(stale, 5, "t5", None) is Verdict.NOT_OWNER
    assert store.begin_turn_slot(Claim("unknown", "x", 1), 0, "t0", None) is Verdict.NOT_OWNER
    assert _phase(store) == ("before_provider", 1, claim.attempt_id)


def test_mark_journal_consumed_once_and_only_for_its_key(store: Store) -> None:
    claim = claimed(store, "r1")
    assert store.begin_turn_slot(claim, 0, "t0", None) is Verdict.DONE
    assert store.mark_journal_consumed(claim, "k0") is Verdict.WRONG_STATE  # no journal key yet
    assert store.update_turn_phase(claim, "provider_started", journal_key="k0") is Verdict.DONE
    assert store.mark_journal_consumed(claim, "other") is Verdict.WRONG_STATE
    assert store.mark_journal_consumed(Claim("r1", "stale", 1), "k0") is Verdict.NOT_OWNER
    assert store.mark_journal_consumed(claim, "k0") is Verdict.DONE
    assert store.mark_journal_consumed(claim, "k0") is Verdict.WRONG_STATE
    journal = store.get_turn_slot("r1")
    assert journal is not None
    assert journal.journal_consumed_at is not None
    assert journal.revision == 3


def test_the_old_owner_is_refused_everything_after_a_replace(store: Store) -> None:
    old = claimed(store, "r1")
    assert store.begin_turn_slot(old, 0, "t0", "leaf-0") is Verdict.DONE
    assert store.update_turn_phase(old, "provider_started", journal_key="k") is Verdict.DONE
    assert store.append_segment(old, "k", 0, b"abc") is Verdict.DONE
    expire_lease(store, old)
    new = store.replace_turn_slot_attempt("r1", old.attempt_id, "w2", 30)
    assert new is not None
    before = (store.get_run("r1"), store.get_turn_slot("r1"), store.segments("k"))
    assert store.renew_lease(old, 30) is Verdict.NOT_OWNER
    assert store.begin_turn_slot(old, 1, "t1", None) is Verdict.NOT_OWNER
    assert (
        store.update_turn_phase(old, "tool_request_recorded", tool_request={}) is Verdict.NOT_OWNER
    )
    assert store.commit_turn_slot(old, "leaf-x") is Verdict.NOT_OWNER
    assert store.mark_journal_consumed(old, "k") is Verdict.NOT_OWNER
    assert store.append_segment(old, "k", 3, b"zombie") is Verdict.NOT_OWNER
    assert store.record_sandbox(old, {"x": 1}) is Verdict.NOT_OWNER
    assert store.settle_run(old, "completed") is Verdict.NOT_OWNER
    assert (store.get_run("r1"), store.get_turn_slot("r1"), store.segments("k")) == before
    # The new owner carries on where the slot was.
    assert store.update_turn_phase(new, "tool_request_recorded", tool_request={}) is Verdict.DONE
    assert store.append_segment(new, "k", 3, b"def") is Verdict.DONE


def test_segments_are_insert_once_contiguous_and_fenced(store: Store) -> None:
    claim = claimed(store, "r1")
    assert store.append_segment(claim, "k", 0, b"hello ") is Verdict.DONE
    assert store.append_segment(claim, "k", 0, b"hello ") is Verdict.WRONG_STATE  # exact replay
    with pytest.raises(SegmentConflictError) as differs:
        store.append_segment(claim, "k", 0, b"HELLO ")
    assert differs.value.reason == "body-differs"
    with pytest.raises(SegmentConflictError) as gap:
        store.append_segment(claim, "k", 7, b"x")
    assert gap.value.reason == "not-contiguous"
    with pytest.raises(SegmentConflictError) as overlap:
        store.append_segment(claim, "k", 3, b"lo world")
    assert overlap.value.reason == "not-contiguous"
    assert store.append_segment(claim, "k", 6, bytearray(b"world")) is Verdict.DONE
    assert store.append_segment(Claim("r1", "stale", 1), "k", 11, b"!") is Verdict.NOT_OWNER
    other = claimed(store, "r2", "s2")
    with pytest.raises(SegmentConflictError) as foreign:
        store.append_segment(other, "k", 11, b"!")
    assert foreign.value.reason == "foreign-journal"
    assert store.segments("k") == [
        Segment("k", 0, 6, b"hello "),
        Segment("k", 6, 11, b"world"),
    ]
    assert b"".join(s.body for s in store.segments("k", 4)) == b"o world"
    assert store.segments("k", 11) == []
    assert store.segments("unknown") == []
    for bad in [(claim, "k", -1, b"x"), (claim, "k", 11, b""), (claim, "k", 11, "str")]:
        with pytest.raises(InvalidInputError):
            store.append_segment(*bad)  # type: ignore[arg-type]


def test_a_page_of_segments_can_be_bounded_in_bytes(store: Store) -> None:
    claim = claimed(store, "r1")
    start = 0
    for body in (b"aaaa", b"bb", b"cccccc", b"d", b"eeeeeeeeee"):
        assert store.append_segment(claim, "k", start, body) is Verdict.DONE
        start += len(body)
    # The segments that start less than max_bytes after the page's start.
    assert [s.body for s in store.segments("k", max_bytes=6)] == [b"aaaa", b"bb"]
    assert [s.body for s in store.segments("k", max_bytes=7)] == [b"aaaa", b"bb", b"cccccc"]
    assert [s.body for s in store.segments("k", max_bytes=7, limit=1)] == [b"aaaa"]
    # The first segment always, however big; a trimmed one counts whole.
    assert [s.body for s in store.segments("k", 13, max_bytes=1)] == [b"eeeeeeeeee"]
    assert [s.body for s in store.segments("k", 7, max_bytes=6)] == [b"ccccc"]
    assert [s.body for s in store.segments("k", 7, max_bytes=7)] == [b"ccccc", b"d"]
    assert store.segments("k", 23, max_bytes=5) == []
