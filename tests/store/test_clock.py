"""Leases follow the database clock: a worker whose clock is hours off changes nothing."""

from __future__ import annotations

import inspect
import multiprocessing
import re
import time
from datetime import timedelta

from tests.store import clock_workers
from tests.store.conftest import admit, claimed, expired
from turnkeeper.store import Store, Verdict, sql

SPAWN = multiprocessing.get_context("spawn")
HOURS = 5 * 3600.0


def test_no_primitive_takes_a_time_from_the_client() -> None:
    for name, method in inspect.getmembers(Store, inspect.isfunction):
        if name.startswith("_"):
            continue
        for parameter in inspect.signature(method).parameters.values():
            assert "datetime" not in str(parameter.annotation), (name, parameter)
            assert not parameter.name.endswith("_at"), (name, parameter)
    statements = " ".join(statement.text for statement in sql.statements().values())
    assert re.findall(r":\w+_at\b", statements) == []
    assert "clock_timestamp" not in statements
    assert statements.count("now()") > 20


def _in_skewed_process(database_url: str, skew: float, action: str, run_id: str) -> dict:
    out = SPAWN.Queue()
    process = SPAWN.Process(
        target=clock_workers.skewed, args=(database_url, skew, action, run_id, out)
    )
    process.start()
    result = out.get(timeout=120)
    process.join(120)
    assert process.exitcode == 0
    return result  # type: ignore[no-any-return]


def test_a_worker_clock_hours_ahead_neither_shortens_nor_lengthens_its_lease(
    store: Store, database_url: str
) -> None:
    admit(store, "r1")
    seen = _in_skewed_process(database_url, +HOURS, "claim", "r1")
    assert seen["client_time_skew"] > HOURS - 60  # the worker really lives 5 hours ahead
    run = store.get_run("r1")
    assert run is not None
    assert run.attempt_id == seen["attempt_id"]
    assert run.lease_expires_at is not None
    assert run.lease_expires_at - run.updated_at == timedelta(seconds=60)
    assert run.lease_expires_at > store.database_now()
    # On the database clock the lease is live: no takeover, whatever the worker's clock says.
    assert store.replace_turn_slot_attempt("r1", seen["attempt_id"], "rec", 30) is None
    assert store.hand_over_expired(10) == []
    assert expired(store, "r1") == []


def test_a_reconciler_clock_hours_behind_still_takes_over_an_expired_lease(
    store: Store, database_url: str
) -> None:
    claim = claimed(store, "r1")
    assert store.renew_lease(claim, 0.001) is Verdict.DONE
    time.sleep(0.02)
    seen = _in_skewed_process(database_url, -HOURS, "reclaim", "r1")
    assert seen["client_time_skew"] < -HOURS + 60
    assert seen["reclaimed"] == [("r1", 2)]
    assert store.get_run("r1").epoch == 2  # type: ignore[union-attr]


def test_a_reconciler_clock_hours_ahead_cannot_steal_a_live_lease(
    store: Store, database_url: str
) -> None:
    claimed(store, "r1")
    seen = _in_skewed_process(database_url, +HOURS, "reclaim", "r1")
    assert seen["reclaimed"] == []
    assert store.get_run("r1").epoch == 1  # type: ignore[union-attr]
