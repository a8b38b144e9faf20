"""``FollowUp.prompt`` with a byte budget: the newest recalled lines that fit, oldest
left out and said so, never over the budget in UTF-8, and the same bytes every time."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from turnkeeper.driver.conversation import HISTORY_HEADING, FollowUp
from turnkeeper.store.records import TranscriptEntry


def _user(position: int, prompt: str) -> TranscriptEntry:
    return TranscriptEntry(
        session_id="s", entry_id=f"e{position}", parent_id=None, run_id=f"r{position}",
        attempt_id="a", kind="user", body={"prompt": prompt}, position=position,
        created_at=datetime.now(UTC),
    )  # fmt: skip


HISTORY = FollowUp([_user(i, f"{i} " + "é" * 40) for i in range(50)], None)


def test_everything_when_it_fits() -> None:
    whole = HISTORY.prompt("next")
    assert HISTORY.prompt("next", max_bytes=len(whole.encode())) == whole


@pytest.mark.parametrize("max_bytes", [200, 500, 1000, 2500, 4000])
def test_the_newest_lines_that_fit_and_how_many_were_left_out(max_bytes: int) -> None:
    given = HISTORY.prompt("next", max_bytes=max_bytes)
    assert len(given.encode()) <= max_bytes
    lines = given.split("\n")
    assert lines[:3] == ["next", "", HISTORY_HEADING]
    left_out = int(lines[3].removeprefix("(").split(" ", 1)[0])
    assert (
        lines[3] == f"({left_out} earlier lines of this conversation left out: too long to recall)"
    )
    assert lines[4:] == [f"user: {i} " + "é" * 40 for i in range(left_out, 50)]
    # One more line would not have fitted.
    if left_out:
        wider = "\n".join([*lines[:3], lines[3].replace(str(left_out), str(left_out - 1), 1),
                           f"user: {left_out - 1} " + "é" * 40, *lines[4:]])  # fmt: skip
        assert len(wider.encode()) > max_bytes
    assert HISTORY.prompt("next", max_bytes=max_bytes) == given


@pytest.mark.parametrize("room", [0, 1, 60, 95])
def test_a_message_near_the_limit_goes_alone(room: int) -> None:
    """No room for the heading and the note: the message alone, as admitted."""
    message = "é" * ((4000 - room) // 2)
    limit = len(message.encode()) + room
    assert HISTORY.prompt(message, max_bytes=limit) == message
