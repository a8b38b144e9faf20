"""The recovery classifier, case by case."""

from __future__ import annotations

import itertools

import pytest

from turnkeeper.driver.recovery import Recovery, RecoveryFacts, classify

FIELDS = (
    "cancel_requested",
    "journal_finished",
    "loss_recorded",
    "sandbox_alive",
    "journal_present",
    "journal_started",
)

# cancel, finished, loss recorded, sandbox alive, journal present, started -> action
TABLE = [
    # cancel wins over everything
    (True, True, True, True, True, True, Recovery.ABORT),
    (True, False, False, False, False, False, Recovery.ABORT),
    # stored bytes end at the sentinel: finish from them, whatever else survived
    (False, True, False, False, False, True, Recovery.FINISH_FROM_SEGMENTS),
    (False, True, False, True, True, True, Recovery.FINISH_FROM_SEGMENTS),
    # a recorded give-up stands, even with the journal back in sight
    (False, False, True, True, True, True, Recovery.FAIL),
    (False, False, True, False, False, True, Recovery.FAIL),
    # a living journal: attach, started or not (a crash right after the spawn)
    (False, False, False, True, True, True, Recovery.ATTACH),
    (False, False, False, True, True, False, Recovery.ATTACH),
    # never started: start it
    (False, False, False, False, False, False, Recovery.START),
    (False, False, False, True, False, False, Recovery.START),
    # started, and its sandbox or journal is gone: the process is lost
    (False, False, False, False, False, True, Recovery.LOST),
    (False, False, False, True, False, True, Recovery.LOST),
]


@pytest.mark.parametrize("row", TABLE)
def test_classify(row: tuple[object, ...]) -> None:
    *facts, action = row
    assert classify(RecoveryFacts(**dict(zip(FIELDS, facts, strict=True)))) is action  # type: ignore[arg-type]


def test_never_reruns_output_that_survives_nor_undoes_a_decision() -> None:
    """Over every combination: a started process, a finished journal or a recorded
    give-up never starts the agent again; a live journal is never given up."""
    for flags in itertools.product([False, True], repeat=len(FIELDS)):
        facts = RecoveryFacts(**dict(zip(FIELDS, flags, strict=True)))
        action = classify(facts)
        if facts.cancel_requested:
            assert action is Recovery.ABORT
            continue
        if facts.journal_started or facts.journal_finished or facts.loss_recorded:
            assert action is not Recovery.START
        if facts.loss_recorded and not facts.journal_finished:
            assert action is Recovery.FAIL
        if facts.sandbox_alive and facts.journal_present and not facts.loss_recorded:
            assert action in (Recovery.ATTACH, Recovery.FINISH_FROM_SEGMENTS)
