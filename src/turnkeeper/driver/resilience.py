"""Retrying transient failures of the store, the log and the sandbox link, never a
lost lease.

A dropped Postgres connection, a Redis failover or a Redis down for a while should
not cost a run its attempt: an attempt's calls are retried with backoff for as long
as its lease is held (the heartbeat renews it in Postgres, whatever Redis does), at
most ``SERVICE_RETRY_BUDGET``; they stop at once when the lease is lost (the
heartbeat could not reach Postgres for a lease period, or a successor took the run),
since a successor may own the run from then on. Only ``ServiceError``s are retried;
a refused write is an answer, not a failure, and is never retried here.
Conditional writes stay correct when retried: a write whose reply was lost
comes back as "already done", which the driver checks against ownership.

The sandbox link is retried the same way, with a budget of its own
(``SANDBOX_RETRY_BUDGET``): an ssh connection dropped or refused, a command that
never answered (``SandboxUnreachableError``), a journal follow that keeps ending
(``JournalError`` with reason ``follow-ended``). The lease keeps being renewed
meanwhile (the heartbeat talks to Postgres, not to the sandbox), so an outage of the
link costs no attempt; one longer than the budget stops the attempt as a service
error, without failing the run, and a successor takes over once the lease runs out.
A run fails for its sandbox only when the sandbox is known to be gone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import structlog
from tenacity import (
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_delay,
    stop_when_event_set,
    wait_exponential_jitter,
)
from tenacity.stop import stop_base

from turnkeeper.errors import JournalError, SandboxUnreachableError, ServiceError

log = structlog.get_logger(__name__)

T = TypeVar("T")


def _policy(
    retry: Any,
    budget: float,
    *,
    multiplier: float,
    max_wait: float,
    event: str,
    until: threading.Event | None = None,
) -> Retrying:
    """Retry what ``retry`` accepts with jittered exponential backoff for ``budget``
    seconds, or until ``until`` is set, logging ``event`` before each sleep; the last
    error is raised at the end."""
    stop: stop_base = stop_after_delay(budget)
    if until is not None:
        stop = stop | stop_when_event_set(until)
    return Retrying(
        retry=retry,
        stop=stop,
        wait=wait_exponential_jitter(multiplier=multiplier, max=max_wait),
        reraise=True,
        before_sleep=lambda state: log.warning(
            event,
            attempt=state.attempt_number,
            error=str(state.outcome.exception()) if state.outcome else None,
        ),
    )


SERVICE_RETRY_BUDGET = 120.0
"""Seconds an attempt retries a service (Postgres, Redis) while its lease is held."""


def retry_policy(budget: float, until: threading.Event | None = None) -> Retrying:
    """Retry service errors of the store and the log for ``budget`` seconds, or until
    ``until`` (an attempt's lost lease) is set."""
    return _policy(
        retry_if_exception_type(ServiceError),
        budget,
        multiplier=0.05,
        max_wait=2.0,
        event="service.retrying",
        until=until,
    )


SANDBOX_RETRY_BUDGET = 120.0
"""Seconds a sandbox transport failure is retried before the attempt gives up."""


def is_transport_error(error: BaseException) -> bool:
    """Whether ``error`` says the sandbox could not be reached, rather than answered."""
    if isinstance(error, SandboxUnreachableError):
        return True
    return isinstance(error, JournalError) and error.reason == "follow-ended"


def sandbox_retry_policy(budget: float = SANDBOX_RETRY_BUDGET) -> Retrying:
    """Retry sandbox transport failures for ``budget`` seconds."""
    return _policy(
        retry_if_exception(is_transport_error),
        budget,
        multiplier=0.2,
        max_wait=3.0,
        event="sandbox.retrying",
    )


class Resilient(Generic[T]):
    """A proxy whose method calls are retried on transient service errors."""

    def __init__(self, target: T, budget: float, until: threading.Event | None = None) -> None:
        self._target = target
        self._policy = retry_policy(budget, until)  # reusable: its state is per call and thread

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if not callable(attribute):
            return attribute
        policy = self._policy

        def call(*args: Any, **kwargs: Any) -> Any:
            return policy(attribute, *args, **kwargs)

        return call

    @property
    def target(self) -> T:
        return self._target


def resilient(target: T, budget: float, until: threading.Event | None = None) -> T:
    """``target`` with every method retried on transient errors (typed as ``target``),
    for ``budget`` seconds or until ``until`` is set (an attempt's lost lease)."""
    proxy: Callable[..., Any] | Resilient[T] = Resilient(target, budget, until)
    return proxy  # type: ignore[return-value]
