"""Contract tests: the writes merged into one statement (docs/architecture.md, "Store
round trips") make exactly what their one-by-one writes make, or nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.store.conftest import LONG_LEASE, admit, expire_lease
from turnkeeper.errors import InvalidInputError
from turnkeeper.store import Claim, NewEntry, Store, TurnPhase, Verdict
from turnkeeper.store.records import BegunRun


def _slot(store: Store, run_id: str) -> tuple[Any, ...]:
    slot = store.get_turn_slot(run_id)
    assert slot is not None
    return (
        slot.attempt_id,
        slot.turn_index,
        slot.turn_id,
        slot.phase.value,
        slot.revision,
        slot.journal_key,
        slot.tool_request,
        slot.checkpoint_leaf_id,
        slot.committed_leaf_id,
        slot.journal_consumed_at is not None,
    )


def _path(store: Store, session_id: str) -> list[tuple[str, str | None, str, Any]]:
    return [(e.entry_id, e.parent_id, e.kind, e.body) for e in store.active_path(session_id)]


def _begun(store: Store, run_id: str, session_id: str = "s1", **kwargs: Any) -> BegunRun:
    admit(store, run_id, session_id, **kwargs)
    begun = store.claim_and_begin(run_id, "worker-a", LONG_LEASE)
    assert begun is not None
    return begun


def _started(store: Store, claim: Claim, journal_key: str = "k0") -> None:
    assert store.update_turn_phase(claim, "provider_started", journal_key=journal_key) is (
        Verdict.DONE
    )


def _takeover(store: Store, claim: Claim) -> Claim:
    expire_lease(store, claim)
    (handed,) = store.hand_over_expired(10)
    adopted = store.adopt_attempt(claim.run_id, handed.attempt_id, "worker-b", LONG_LEASE)
    assert adopted is not None
    return adopted


# --- the claim and its first steps -------------------------------------------------------


def test_a_fresh_claim_appends_the_input_and_begins_turn_zero_in_one_write(
    store: Store,
) -> None:
    admit(store, "r0", "s1")
    first = store.claim_and_begin("r0", "worker-a", LONG_LEASE)
    assert first is not None
    assert first.input_parent is None
    assert store.settle_run(first.claim, "completed") is Verdict.DONE
    begun = _begun(store, "r1", "s1", payload={"prompt": "hello", "agent": "scripted"})
    claim = begun.claim
    assert (claim.run_id, claim.epoch) == ("r1", 1)
    run = store.get_run("r1")
    assert begun.run == run
    assert run is not None
    assert run.attempt_id == claim.attempt_id
    assert run.status == "running"
    # Under the session's leaf (the first run's input), which moved to the new input.
    assert begun.input_parent == "r0/input"
    assert _path(store, "s1") == [
        ("r0/input", None, "user", {"prompt": "r0"}),
        ("r1/input", "r0/input", "user", {"prompt": "hello"}),
    ]
    assert begun.slot == store.get_turn_slot("r1")
    assert _slot(store, "r1") == (
        claim.attempt_id, 0, "r1/turn-0", "before_provider", 1, None, None, "r1/input", None,
        False,
    )  # fmt: skip
    # One attempt, counted, as claim_run makes it.
    assert store.takeovers_of("r1") == {}
    assert run.attempt_count == 1


def test_a_branch_is_only_claimed(store: Store) -> None:
    """A run that branches has its branch checked before its input is appended."""
    begun = _begun(store, "r1", payload={"prompt": "again", "from_entry": "e0"})
    assert begun.slot is None
    assert begun.input_parent is None
    assert store.get_turn_slot("r1") is None
    assert _path(store, "s1") == []
    assert begun.run.attempt_id == begun.claim.attempt_id


def test_a_claim_refused_begins_nothing(store: Store) -> None:
    admit(store, "r1")
    admit(store, "r2")  # behind r1 in its session
    assert store.claim_and_begin("r2", "worker-a", LONG_LEASE) is None
    begun = store.claim_and_begin("r1", "worker-a", LONG_LEASE)
    assert begun is not None
    assert store.claim_and_begin("r1", "worker-b", LONG_LEASE) is None  # claimed already
    assert store.get_turn_slot("r2") is None
    assert [e[0] for e in _path(store, "s1")] == ["r1/input"]


def test_a_leaf_moved_under_the_claim_leaves_the_input_to_the_driver(store: Store) -> None:
    """An input entry already stored (none can be, but the statement must not trust
    that): the claim is made, nothing else."""
    admit(store, "r0", "s1")
    first = store.claim_and_begin("r0", "worker-a", LONG_LEASE)
    assert first is not None
    assert (
        store.append_transcript(
            first.claim, "s1", [NewEntry("r1/input", "user", {"prompt": "x"})], "r0/input"
        )
        == "r1/input"
    )
    assert store.settle_run(first.claim, "completed") is Verdict.DONE
    begun = _begun(store, "r1", "s1")
    assert begun.slot is None
    assert store.get_turn_slot("r1") is None
    assert [e[0] for e in _path(store, "s1")] == ["r0/input", "r1/input"]


# --- the end of a turn -------------------------------------------------------------------


def _turn_entries(run_id: str, index: int) -> list[NewEntry]:
    prefix = f"{run_id}/turn-{index}"
    return [
        NewEntry(f"{prefix}/assistant", "assistant", {"messages": [{"id": "m", "text": "hi"}]}),
        NewEntry(f"{prefix}/tools", "tool", {"results": [{"toolCallId": "c", "content": "ok"}]}),
    ]


def test_the_end_of_a_turn_is_what_its_writes_one_by_one_make(store: Store) -> None:
    merged = _begun(store, "r1", "s1").claim
    single = _begun(store, "r2", "s2").claim
    for claim in (merged, single):
        _started(store, claim)
        assert (
            store.update_turn_phase(
                claim, TurnPhase.TOOL_REQUEST_RECORDED, tool_request=[{"id": "c"}]
            )
            is Verdict.DONE
        )
    entries = _turn_entries("r1", 0)
    assert (
        store.commit_turn(
            merged, "s1", entries, "r1/input", next_turn=(1, "r1/turn-1"), next_journal_key="k0"
        )
        is Verdict.DONE
    )
    leaf = store.append_transcript(single, "s2", _turn_entries("r2", 0), "r2/input")
    assert leaf == "r2/turn-0/tools"
    assert store.commit_turn_slot(single, leaf) is Verdict.DONE
    assert store.begin_turn_slot(single, 1, "r2/turn-1", leaf) is Verdict.DONE
    _started(store, single)
    for run_id, session_id, claim in (("r1", "s1", merged), ("r2", "s2", single)):
        assert _slot(store, run_id) == (
            claim.attempt_id, 1, f"{run_id}/turn-1", "provider_started", 6, "k0", None,
            f"{run_id}/turn-0/tools", None, False,
        )  # fmt: skip
        assert [e[:3] for e in _path(store, session_id)] == [
            (f"{run_id}/input", None, "user"),
            (f"{run_id}/turn-0/assistant", f"{run_id}/input", "assistant"),
            (f"{run_id}/turn-0/tools", f"{run_id}/turn-0/assistant", "tool"),
        ]


def test_the_last_turn_is_committed_at_its_leaf(store: Store) -> None:
    claim = _begun(store, "r1").claim
    _started(store, claim)
    assert store.commit_turn(claim, "s1", _turn_entries("r1", 0), "r1/input") is Verdict.DONE
    assert _slot(store, "r1") == (
        claim.attempt_id, 0, "r1/turn-0", "committed", 3, "k0", None, "r1/input",
        "r1/turn-0/tools", False,
    )  # fmt: skip
    # Without entries the leaf stays, and the turn is committed there.
    other = _begun(store, "r2", "s2").claim
    _started(store, other)
    assert store.commit_turn(other, "s2", [], "r2/input", next_turn=(1, "t1")) is Verdict.DONE
    assert _slot(store, "r2") == (
        other.attempt_id, 1, "t1", "before_provider", 4, None, None, "r2/input", None, False,
    )  # fmt: skip
    assert [e[0] for e in _path(store, "s2")] == ["r2/input"]


def test_a_stale_attempt_ends_no_turn(store: Store) -> None:
    stale = _begun(store, "r1").claim
    _started(store, stale)
    before = _slot(store, "r1")
    heir = _takeover(store, stale)
    after_handover = _slot(store, "r1")
    assert after_handover[0] == heir.attempt_id
    assert after_handover[4] == before[4] + 1
    verdict = store.commit_turn(
        stale, "s1", _turn_entries("r1", 0), "r1/input", next_turn=(1, "t1"), next_journal_key="k"
    )
    assert verdict is Verdict.NOT_OWNER
    assert _slot(store, "r1") == after_handover
    assert [e[0] for e in _path(store, "s1")] == ["r1/input"]
    assert store.session_leaf("s1") == "r1/input"


@pytest.mark.parametrize("case", ["replayed", "leaf-moved", "slot-not-open", "turn-behind"])
def test_a_turn_end_that_would_not_be_made_whole_makes_nothing(store: Store, case: str) -> None:
    claim = _begun(store, "r1").claim
    _started(store, claim)
    entries = _turn_entries("r1", 0)
    expected_leaf: str | None = "r1/input"
    next_turn = (1, "t1")
    if case == "replayed":  # the append was made before: the one-by-one writes replay it
        assert store.append_transcript(claim, "s1", entries, "r1/input") == "r1/turn-0/tools"
    elif case == "leaf-moved":
        expected_leaf = None
    elif case == "slot-not-open":
        assert store.commit_turn_slot(claim, "r1/input") is Verdict.DONE
    else:
        next_turn = (0, "t0")
    slot, path = _slot(store, "r1"), _path(store, "s1")
    verdict = store.commit_turn(claim, "s1", entries, expected_leaf, next_turn=next_turn)
    assert verdict is Verdict.WRONG_STATE
    assert _slot(store, "r1") == slot
    assert _path(store, "s1") == path


def test_a_turn_end_is_checked_before_any_sql(store: Store) -> None:
    claim = _begun(store, "r1").claim
    with pytest.raises(InvalidInputError):
        store.commit_turn(claim, "s1", [], None)
    with pytest.raises(InvalidInputError):
        store.commit_turn(claim, "s1", [], "r1/input", next_journal_key="k")
    with pytest.raises(InvalidInputError):
        store.commit_turn(claim, "s1", [], "r1/input", next_turn=(-1, "t"))


# --- the sentinel's segment ----------------------------------------------------------------


def test_the_last_segment_marks_the_journal_consumed_in_the_same_write(store: Store) -> None:
    claim = _begun(store, "r1").claim
    _started(store, claim, "k0")
    assert store.append_segment(claim, "k0", 0, b"line\n") is Verdict.DONE
    assert _slot(store, "r1")[-1] is False
    assert store.append_segment(claim, "k0", 5, b"end\n", mark_consumed=True) is Verdict.DONE
    slot = _slot(store, "r1")
    assert (slot[4], slot[-1]) == (3, True)
    # Stored already (a retry): nothing is written again.
    assert store.append_segment(claim, "k0", 5, b"end\n", mark_consumed=True) is (
        Verdict.WRONG_STATE
    )
    assert _slot(store, "r1") == slot
    # Another journal's segment marks nothing; nor does a stale attempt's.
    assert store.append_segment(claim, "k1", 0, b"x\n", mark_consumed=True) is Verdict.DONE
    assert _slot(store, "r1") == slot


def test_a_stale_attempts_last_segment_changes_nothing(store: Store) -> None:
    stale = _begun(store, "r1").claim
    _started(store, stale, "k0")
    _takeover(store, stale)
    slot = _slot(store, "r1")
    assert store.append_segment(stale, "k0", 0, b"end\n", mark_consumed=True) is (Verdict.NOT_OWNER)
    assert _slot(store, "r1") == slot
    assert store.segments("k0") == []


# --- a tool request, with the bytes or the turn's end -----------------------------------


def test_a_tool_request_rides_on_the_next_segment(store: Store) -> None:
    merged = _begun(store, "r1", "s1").claim
    single = _begun(store, "r2", "s2").claim
    request = [{"id": "c1", "name": "Bash", "args": "{}"}]
    for claim in (merged, single):
        _started(store, claim, f"k-{claim.run_id}")
        assert store.append_segment(claim, f"k-{claim.run_id}", 0, b"a\n") is Verdict.DONE
    assert (
        store.append_segment(merged, "k-r1", 2, b"b\n", tool_request=(request, "r1/input"))
        is Verdict.DONE
    )
    assert store.append_segment(single, "k-r2", 2, b"b\n") is Verdict.DONE
    assert (
        store.update_turn_phase(
            single,
            TurnPhase.TOOL_REQUEST_RECORDED,
            tool_request=request,
            checkpoint_leaf_id="r2/input",
        )
        is Verdict.DONE
    )
    for run_id, claim in (("r1", merged), ("r2", single)):
        assert _slot(store, run_id) == (
            claim.attempt_id, 0, f"{run_id}/turn-0", "tool_request_recorded", 3,
            f"k-{run_id}", request, f"{run_id}/input", None, False,
        )  # fmt: skip
    # Recorded already: the segment is stored, the slot left as it is.
    slot = _slot(store, "r1")
    assert (
        store.append_segment(merged, "k-r1", 4, b"c\n", tool_request=([], "elsewhere"))
        is Verdict.DONE
    )
    assert _slot(store, "r1") == slot
    assert [s.body for s in store.segments("k-r1")] == [b"a\n", b"b\n", b"c\n"]
    with pytest.raises(InvalidInputError):
        store.append_segment(merged, "k-r1", 6, b"d\n", mark_consumed=True, tool_request=([], None))


def test_a_tool_request_goes_first_in_the_end_of_its_turn(store: Store) -> None:
    merged = _begun(store, "r1", "s1").claim
    single = _begun(store, "r2", "s2").claim
    request = [{"id": "c1", "name": "Read", "args": "{}"}]
    for claim in (merged, single):
        _started(store, claim, "k0")
    assert (
        store.commit_turn(
            merged, "s1", _turn_entries("r1", 0), "r1/input", tool_request=(request, "r1/input")
        )
        is Verdict.DONE
    )
    assert (
        store.update_turn_phase(
            single,
            TurnPhase.TOOL_REQUEST_RECORDED,
            tool_request=request,
            checkpoint_leaf_id="r2/input",
        )
        is Verdict.DONE
    )
    assert store.append_transcript(single, "s2", _turn_entries("r2", 0), "r2/input")
    assert store.commit_turn_slot(single, "r2/turn-0/tools") is Verdict.DONE
    for run_id, claim in (("r1", merged), ("r2", single)):
        assert _slot(store, run_id) == (
            claim.attempt_id, 0, f"{run_id}/turn-0", "committed", 4, "k0", request,
            f"{run_id}/input", f"{run_id}/turn-0/tools", False,
        )  # fmt: skip
    # Recorded already (the slot moved past provider_started): nothing is made.
    other = _begun(store, "r3", "s3").claim
    _started(store, other, "k0")
    assert (
        store.update_turn_phase(other, TurnPhase.TOOL_REQUEST_RECORDED, tool_request=request)
        is Verdict.DONE
    )
    slot = _slot(store, "r3")
    assert (
        store.commit_turn(
            other, "s3", [], "r3/input", next_turn=(1, "t1"), tool_request=(request, None)
        )
        is Verdict.WRONG_STATE
    )
    assert _slot(store, "r3") == slot


def test_a_stale_attempts_tool_request_changes_nothing(store: Store) -> None:
    stale = _begun(store, "r1").claim
    _started(store, stale, "k0")
    assert store.append_segment(stale, "k0", 0, b"a\n") is Verdict.DONE
    _takeover(store, stale)
    slot = _slot(store, "r1")
    assert (
        store.append_segment(stale, "k0", 2, b"b\n", tool_request=([{"id": "c"}], None))
        is Verdict.NOT_OWNER
    )
    assert (
        store.commit_turn(stale, "s1", [], "r1/input", tool_request=([{"id": "c"}], None))
        is Verdict.NOT_OWNER
    )
    assert _slot(store, "r1") == slot
    assert [s.body for s in store.segments("k0")] == [b"a\n"]


# --- the takeover's log position -------------------------------------------------------


def test_a_superseded_takeover_records_no_log_position(store: Store) -> None:
    """A zombie takeover (stopped between its log fence and its position write, then
    superseded) must not mark a position the successor's chunks already passed."""
    begun = _begun(store, "r1", "s1")
    zombie = _takeover(store, begun.claim)
    heir = _takeover(store, zombie)
    store.record_attempt_log_seq(heir, 7)
    store.record_attempt_log_seq(zombie, 12)
    assert [(a.attempt_id, a.epoch, a.outcome, a.log_seq) for a in store.attempts("r1")] == [
        (begun.claim.attempt_id, begun.claim.epoch, "superseded", None),
        (zombie.attempt_id, zombie.epoch, "superseded", None),
        (heir.attempt_id, heir.epoch, None, 7),
    ]
