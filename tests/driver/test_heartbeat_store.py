"""A turn's heartbeat never waits behind the driver's statements of other turns.

In a worker process holding many turns (the threads pool), the turns share the
process's store pool: a crowd of turns starting at once can hold every connection of
it. Lease renewals and the host beacon then have their own small pool, so a renewal
is never starved until the lease runs out (seen with 500 runs starting at once on a
loaded machine: live owners lost leases, and their runs were taken over twice).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from turnkeeper.config import Settings
from turnkeeper.driver.replay import StoredLog
from turnkeeper.workers.runtime import WorkerRuntime


@pytest.fixture
def runtime(settings: Settings) -> Iterator[WorkerRuntime]:
    rt = WorkerRuntime.open(settings, StoredLog)
    yield rt
    rt.close()


def test_a_lease_renews_while_every_connection_of_the_drivers_pool_is_taken(
    runtime: WorkerRuntime,
) -> None:
    store = runtime.store
    store.admit_run(
        "busy-1", "busy-1", {"agent": "scripted", "prompt": ""}, max_attempts=5, deadline=None
    )
    claim = store.claim_run("busy-1", runtime.owner, 30)
    assert claim is not None
    # The pool's own checkout, as every statement of the driver makes it: the store has
    # no statement that would hold a connection on purpose.
    database = store._db
    size = database._size
    taken = threading.Barrier(size + 1)
    release = threading.Event()

    def hold_a_connection() -> None:
        with database._connection():
            taken.wait()
            release.wait(120)  # a hang guard

    holders = [threading.Thread(target=hold_a_connection) for _ in range(size)]
    for holder in holders:
        holder.start()
    try:
        taken.wait(60)  # every connection of the driver's pool is checked out now
        keeper = runtime.lease_keeper(claim)
        keeper.beat()
        assert (keeper.renewals, keeper.lost.is_set()) == (1, False)
    finally:
        release.set()
        for holder in holders:
            holder.join()
