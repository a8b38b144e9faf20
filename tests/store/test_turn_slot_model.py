"""The turn slot against a model: any sequence of owner writes, stale writes and
handoffs leaves the stored slot exactly where the model says."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from turnkeeper.store import Claim, Store, TurnPhase, Verdict

PREDECESSORS = {
    "provider_started": ("before_provider",),
    "tool_request_recorded": ("provider_started",),
    "committed": ("provider_started", "tool_request_recorded"),
}


@dataclass(frozen=True)
class Slot:
    attempt_id: str
    turn_index: int
    phase: str
    revision: int
    journal_key: str | None
    consumed: bool
    committed_leaf_id: str | None


def test_the_journal_slot_follows_its_model(store: Store) -> None:
    class JournalMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.run_id = f"run-{uuid.uuid4().hex}"
            store.admit_run(self.run_id, self.run_id, {}, max_attempts=100, deadline=None)
            claim = store.claim_run(self.run_id, "model", 3600)
            assert claim is not None
            self.current: Claim = claim
            self.stale: list[Claim] = [Claim(self.run_id, "never-an-attempt", 0)]
            self.running = True
            self.settled_by: Claim | None = None
            self.slot: Slot | None = None

        def _pick(self, who: str, index: int) -> Claim:
            return self.current if who == "current" else self.stale[index % len(self.stale)]

        def _owner(self, claim: Claim) -> bool:
            return self.running and claim == self.current

        def _verdict(self, claim: Claim, allowed: bool) -> Verdict:
            """What the store must answer: not the owner, else made or refused for state."""
            if not self._owner(claim):
                return Verdict.NOT_OWNER
            return Verdict.DONE if allowed else Verdict.WRONG_STATE

        @rule(
            who=st.sampled_from(["current", "current", "stale"]),
            index=st.integers(0, 5),
            turn=st.integers(0, 4),
        )
        def begin(self, who: str, index: int, turn: int) -> None:
            claim = self._pick(who, index)
            verdict = store.begin_turn_slot(claim, turn, f"t{turn}", None)
            slot = self.slot
            assert verdict is self._verdict(claim, slot is None or turn > slot.turn_index)
            if verdict is Verdict.DONE:
                self.slot = Slot(
                    claim.attempt_id,
                    turn,
                    "before_provider",
                    1 if slot is None else slot.revision + 1,
                    None,
                    False,
                    None,
                )

        @rule(
            who=st.sampled_from(["current", "current", "stale"]),
            index=st.integers(0, 5),
            phase=st.sampled_from(["provider_started", "tool_request_recorded"]),
            key=st.sampled_from([None, "k1", "k2"]),
        )
        def move(self, who: str, index: int, phase: str, key: str | None) -> None:
            claim = self._pick(who, index)
            verdict = store.update_turn_phase(claim, phase, journal_key=key)
            slot = self.slot
            allowed = slot is not None and slot.phase in PREDECESSORS[phase]
            assert verdict is self._verdict(claim, allowed)
            if verdict is Verdict.DONE:
                assert slot is not None
                self.slot = replace(
                    slot,
                    phase=phase,
                    revision=slot.revision + 1,
                    journal_key=key or slot.journal_key,
                )

        @rule(
            who=st.sampled_from(["current", "current", "stale"]),
            index=st.integers(0, 5),
            leaf=st.sampled_from(["l1", "l2"]),
        )
        def commit(self, who: str, index: int, leaf: str) -> None:
            claim = self._pick(who, index)
            verdict = store.commit_turn_slot(claim, leaf)
            slot = self.slot
            allowed = slot is not None and slot.phase in PREDECESSORS["committed"]
            assert verdict is self._verdict(claim, allowed)
            if verdict is Verdict.DONE:
                assert slot is not None
                self.slot = replace(
                    slot, phase="committed", revision=slot.revision + 1, committed_leaf_id=leaf
                )

        @rule(
            who=st.sampled_from(["current", "stale"]),
            index=st.integers(0, 5),
            key=st.sampled_from(["k1", "k2"]),
        )
        def consume(self, who: str, index: int, key: str) -> None:
            claim = self._pick(who, index)
            verdict = store.mark_journal_consumed(claim, key)
            slot = self.slot
            allowed = (
                slot is not None
                and slot.phase != "committed"
                and slot.journal_key == key
                and not slot.consumed
            )
            assert verdict is self._verdict(claim, allowed)
            if verdict is Verdict.DONE:
                assert slot is not None
                self.slot = replace(slot, consumed=True, revision=slot.revision + 1)

        @rule(index=st.integers(0, 5))
        def handoff(self, index: int) -> None:
            expected = self.current if index % 3 else self._pick("stale", index)
            new = store.replace_turn_slot_attempt(
                self.run_id, expected.attempt_id, "model-2", 3600, only_if_expired=False
            )
            assert (new is not None) == self._owner(expected)
            if new is not None:
                self.stale.append(self.current)
                self.current = new
                if self.slot is not None:
                    self.slot = replace(
                        self.slot, attempt_id=new.attempt_id, revision=self.slot.revision + 1
                    )

        @rule(who=st.sampled_from(["current", "stale"]), index=st.integers(0, 5))
        def settle(self, who: str, index: int) -> None:
            claim = self._pick(who, index)
            verdict = store.settle_run(claim, "completed")
            if claim == self.settled_by:
                assert verdict is Verdict.WRONG_STATE  # a retry of its own settle
            else:
                assert verdict is self._verdict(claim, allowed=True)
            if verdict is Verdict.DONE:
                self.running = False
                self.settled_by = claim

        @invariant()
        def slot_matches_the_model(self) -> None:
            stored = store.get_turn_slot(self.run_id)
            if self.slot is None:
                assert stored is None
                return
            assert stored is not None
            seen: dict[str, Any] = {
                "attempt_id": stored.attempt_id,
                "turn_index": stored.turn_index,
                "phase": stored.phase,
                "revision": stored.revision,
                "journal_key": stored.journal_key,
                "consumed": stored.journal_consumed_at is not None,
                "committed_leaf_id": stored.committed_leaf_id,
            }
            assert Slot(**seen) == self.slot
            assert isinstance(stored.phase, TurnPhase)

    run_state_machine_as_test(
        JournalMachine,
        settings=settings(max_examples=80, stateful_step_count=30, deadline=None, database=None),
    )
