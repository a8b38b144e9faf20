"""Transient service errors are retried; answers (a refused write, a lost lease) are not."""

from __future__ import annotations

import threading

import pytest

from turnkeeper.driver.resilience import resilient
from turnkeeper.errors import LogUnavailableError, OwnershipLostError, StoreUnavailableError


class Flaky:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls = 0

    def write(self, value: int) -> int:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return value * 2


def test_transient_errors_are_retried_until_success() -> None:
    target = Flaky([StoreUnavailableError("down"), LogUnavailableError("down")])
    assert resilient(target, budget=30).write(21) == 42
    assert target.calls == 3


def test_a_refusal_is_not_retried() -> None:
    target = Flaky([OwnershipLostError("lost")])
    with pytest.raises(OwnershipLostError):
        resilient(target, budget=30).write(1)
    assert target.calls == 1


def test_the_budget_bounds_the_retries() -> None:
    target = Flaky([StoreUnavailableError("down")] * 1000)
    with pytest.raises(StoreUnavailableError):
        resilient(target, budget=0.3).write(1)
    assert 1 < target.calls < 1000


def test_a_lost_lease_ends_the_retries_at_once() -> None:
    """Retried while the lease is held; once it is lost (set here by the third failure,
    as the heartbeat would), the next failure is raised: a successor may own the run."""
    lost = threading.Event()

    class LosesItsLease(Flaky):
        def write(self, value: int) -> int:
            if self.calls == 2:
                lost.set()
            return super().write(value)

    target = LosesItsLease([LogUnavailableError("down")] * 1000)
    with pytest.raises(LogUnavailableError):
        resilient(target, budget=300, until=lost).write(1)
    assert target.calls == 3
