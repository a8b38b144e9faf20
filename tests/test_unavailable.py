"""``tests.unavailable``: a reason to skip skips a test on a developer's machine and
fails it in CI; no reason lets it run."""

from __future__ import annotations

import pytest

from tests.unavailable import cannot_run, in_ci

REASON = "socat is not installed"


@pytest.mark.parametrize("value", [None, "", "false", "0"])
def test_outside_ci_a_reason_skips(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert in_ci() is False
    with pytest.raises(pytest.skip.Exception) as skipped:
        cannot_run(REASON)
    assert skipped.value.msg == REASON


@pytest.mark.parametrize("value", ["true", "True", "1"])
def test_in_ci_a_reason_fails(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci() is True
    with pytest.raises(pytest.fail.Exception) as failed:
        cannot_run(REASON)
    assert failed.value.msg == f"{REASON}; CI must run every jail, egress and ssh test"
    assert failed.value.pytrace is False


@pytest.mark.parametrize("value", ["true", "false"])
def test_no_reason_runs(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert cannot_run(None) is None
