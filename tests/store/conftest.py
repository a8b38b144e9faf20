"""Fixtures for the store tests: a Store on this test's own cloned database."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from turnkeeper.store import Claim, Run, RunStatus, Store, Verdict

LONG_LEASE = 3600.0
# A lease this short has expired on the database clock by the time the next
# statement runs (we sleep past it); used to make takeovers possible.
BLINK_LEASE = 0.001


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    with Store(database_url, pool_size=4) as opened:
        yield opened


def admit(
    store: Store,
    run_id: str,
    session_id: str = "s1",
    payload: Any = None,
    *,
    max_attempts: int = 5,
    deadline: float | None = None,
) -> Run:
    run, created = store.admit_run(
        run_id,
        session_id,
        {"prompt": run_id} if payload is None else payload,
        max_attempts=max_attempts,
        deadline=deadline,
    )
    assert created
    return run


def claimed(store: Store, run_id: str, session_id: str = "s1", **kwargs: Any) -> Claim:
    admit(store, run_id, session_id, **kwargs)
    claim = store.claim_run(run_id, "worker-a", LONG_LEASE)
    assert claim is not None
    return claim


def expire_lease(store: Store, claim: Claim) -> None:
    """Shrink the lease to a blink through the public API, then wait it out."""
    assert store.renew_lease(claim, BLINK_LEASE) is Verdict.DONE
    time.sleep(0.02)


def expired(store: Store, *run_ids: str) -> list[str]:
    """Which of ``run_ids`` are running with their lease run out on the database's
    clock: what the reconciler's handover looks for."""
    now = store.database_now()
    runs = [store.get_run(run_id) for run_id in run_ids]
    return [
        run.run_id
        for run in runs
        if run is not None
        and run.status is RunStatus.RUNNING
        and run.lease_expires_at is not None
        and run.lease_expires_at < now
    ]
