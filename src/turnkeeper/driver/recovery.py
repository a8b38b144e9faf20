"""The recovery classifier: what a takeover does with a run, from what survived.

A pure function of facts gathered by the takeover about the run's current agent
process (the placement record, its sandbox, its stored segments, the turn slot),
so that every case is a row of a table test. The precedence follows one rule:
never run the agent (and so the model, and its tools) again for output that a
journal or the segments still hold, and never undo a decision a predecessor
recorded.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Recovery(enum.StrEnum):
    ABORT = "abort"
    """Cancel was requested: replay what was stored, stop the agent, settle aborted."""
    FINISH_FROM_SEGMENTS = "finish-from-segments"
    """The stored bytes end at the exit sentinel: replay them, align, close; run
    nothing again, whatever the slot says."""
    FAIL = "fail"
    """A predecessor gave the agent process up and decided not to continue: replay,
    mark the interruption, fail with its reason."""
    ATTACH = "attach"
    """The agent's journal is alive: replay from byte 0, align, follow to the sentinel.
    A journal whose writer never started (nothing stored, no lock file) is disarmed
    there and the agent started afresh in the next journal (``Attempt._never_started``):
    telling it apart takes a disarm, which is no fact to gather before classifying."""
    START = "start"
    """The current agent process never started: start it as a fresh turn would."""
    LOST = "lost"
    """The agent process was lost with its sandbox or journal: keep what was
    captured, give it up, and continue in a new process if the agent can."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryFacts:
    cancel_requested: bool
    journal_finished: bool
    """The current journal's stored bytes end with its exit sentinel."""
    loss_recorded: bool
    """The placement record says the current agent process was given up."""
    sandbox_alive: bool
    journal_present: bool
    """The current agent process's journal exists in its sandbox."""
    journal_started: bool
    """The current agent process was started: the slot recorded it, or it has output."""


def classify(facts: RecoveryFacts) -> Recovery:
    if facts.cancel_requested:
        return Recovery.ABORT
    if facts.journal_finished:
        return Recovery.FINISH_FROM_SEGMENTS
    if facts.loss_recorded:
        return Recovery.FAIL
    if facts.sandbox_alive and facts.journal_present:
        return Recovery.ATTACH
    if not facts.journal_started:
        return Recovery.START
    return Recovery.LOST
