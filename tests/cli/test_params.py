"""The CLI's own copy of what the store checks: the statuses ``--status`` offers."""

from __future__ import annotations

from typing import get_args

from turnkeeper.cli.params import RunStatusName
from turnkeeper.store.records import RunStatus


def test_the_status_choices_are_the_run_statuses() -> None:
    assert get_args(RunStatusName) == tuple(status.value for status in RunStatus)
