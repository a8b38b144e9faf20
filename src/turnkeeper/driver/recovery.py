"""The recovery classifier: what a takeover does with a run, from what survived.

A pure function of facts gathered by the takeover (the turn slot, the
sandbox, the stored segments), so that every case is a row of a table test.
The precedence follows one rule: never run the agent (and so the model, and its
tools) again for output that a journal or the segments still hold.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from turnkeeper.store.records import TurnPhase


class Recovery(enum.StrEnum):
    ABORT = "abort"
    """Cancel was requested: stop the agent, close the log, settle aborted."""
    FINISH_FROM_SEGMENTS = "finish-from-segments"
    """All output is in Postgres: replay it, align, close; run nothing again."""
    ATTACH = "attach"
    """The agent's journal is alive: replay from byte 0, align, follow to the sentinel."""
    START = "start"
    """Nothing ran yet: start the agent as a fresh turn would."""
    CONTINUE = "continue"
    """Output partially lost with its sandbox: record what was captured, mark the
    interruption, and continue the conversation in a new agent process."""
    FAIL = "fail"
    """Output partially lost and the agent cannot continue: fail with that reason."""


@dataclass(frozen=True, slots=True)
class RecoveryFacts:
    phase: TurnPhase | None
    """The turn slot's phase; None when the slot was never begun."""
    journal_consumed: bool
    """The exit sentinel was seen and every journal byte is in the segments."""
    sandbox_alive: bool
    journal_present: bool
    """A journal of the run's current agent process exists in the sandbox."""
    has_segments: bool
    """Some output of the run was captured in Postgres."""
    can_continue: bool
    cancel_requested: bool


def classify(facts: RecoveryFacts) -> Recovery:
    if facts.cancel_requested:
        return Recovery.ABORT
    if facts.journal_consumed:
        return Recovery.FINISH_FROM_SEGMENTS
    if facts.sandbox_alive and facts.journal_present:
        return Recovery.ATTACH
    nothing_ran = facts.phase in (None, TurnPhase.BEFORE_PROVIDER) and not facts.has_segments
    if nothing_ran:
        return Recovery.START
    return Recovery.CONTINUE if facts.can_continue else Recovery.FAIL
