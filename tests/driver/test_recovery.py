"""The recovery classifier, case by case."""

from __future__ import annotations

import itertools

import pytest

from turnkeeper.driver.recovery import Recovery, RecoveryFacts, classify
from turnkeeper.store.records import TurnPhase

BEFORE = TurnPhase.BEFORE_PROVIDER
STARTED = TurnPhase.PROVIDER_STARTED
TOOLS = TurnPhase.TOOL_REQUEST_RECORDED
COMMITTED = TurnPhase.COMMITTED

# phase, consumed, sandbox alive, journal present, segments, can continue, cancel -> action
TABLE = [
    # cancel wins over everything
    (STARTED, False, True, True, True, True, True, Recovery.ABORT),
    (None, False, False, False, False, False, True, Recovery.ABORT),
    # all output captured: finish from segments, whatever the sandbox's state
    (STARTED, True, False, False, True, False, False, Recovery.FINISH_FROM_SEGMENTS),
    (COMMITTED, True, True, True, True, True, False, Recovery.FINISH_FROM_SEGMENTS),
    # a living journal: attach, in any phase (a crash right after the spawn left the
    # slot in before_provider while the agent runs)
    (BEFORE, False, True, True, False, False, False, Recovery.ATTACH),
    (STARTED, False, True, True, True, False, False, Recovery.ATTACH),
    (TOOLS, False, True, True, True, True, False, Recovery.ATTACH),
    (COMMITTED, False, True, True, True, False, False, Recovery.ATTACH),
    # nothing ran: start
    (None, False, False, False, False, False, False, Recovery.START),
    (BEFORE, False, True, False, False, False, False, Recovery.START),
    (BEFORE, False, False, False, False, True, False, Recovery.START),
    # output lost with the sandbox (or the journal): continue when the agent can
    (STARTED, False, False, False, True, True, False, Recovery.CONTINUE),
    (TOOLS, False, False, False, True, True, False, Recovery.CONTINUE),
    (STARTED, False, True, False, False, True, False, Recovery.CONTINUE),
    (BEFORE, False, False, False, True, True, False, Recovery.CONTINUE),
    # ... and fail when it cannot
    (STARTED, False, False, False, True, False, False, Recovery.FAIL),
    (TOOLS, False, False, False, False, False, False, Recovery.FAIL),
    (COMMITTED, False, True, False, True, False, False, Recovery.FAIL),
]


@pytest.mark.parametrize("row", TABLE)
def test_classify(row: tuple[object, ...]) -> None:
    *facts, action = row
    assert classify(RecoveryFacts(*facts)) is action  # type: ignore[arg-type]


def test_never_reruns_output_that_survives() -> None:
    """Over every combination: a present journal or complete segments never start the agent."""
    phases = [None, BEFORE, STARTED, TOOLS, COMMITTED]
    for phase, *flags in itertools.product(phases, *[[False, True]] * 6):
        facts = RecoveryFacts(phase, *flags)
        action = classify(facts)
        if facts.cancel_requested:
            assert action is Recovery.ABORT
            continue
        if facts.journal_consumed or (facts.sandbox_alive and facts.journal_present):
            assert action in (Recovery.FINISH_FROM_SEGMENTS, Recovery.ATTACH)
        if facts.has_segments:
            assert action is not Recovery.START
