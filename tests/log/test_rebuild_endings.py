"""A lost log rebuilt while a run's log is being ended, and while Postgres is down.

Real Postgres, real Redis. Whoever ends a settled run's log (its owner after a cancel,
a deadline or a failure; the reaper for a run settled without one) may meet the log
lost, rebuilt from Postgres, closed already, with the very final chunk it was about to
append: the log is then ended, and that is no error. A lost log that cannot be
rebuilt because Postgres is down too is a service error, at once, not a spin.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator, Sequence

import pytest

from tests.log.test_rebuild import LINES, Owner, _admit, lose
from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.driver import lifecycle
from turnkeeper.driver.output import end_log
from turnkeeper.driver.replay import StoredLog
from turnkeeper.embedded.ports import free_port
from turnkeeper.errors import ServiceError, StoreUnavailableError
from turnkeeper.log import AsyncRunLog, RunLog
from turnkeeper.reconciler import end_run_log
from turnkeeper.store.records import RunStatus
from turnkeeper.store.store import Store
from turnkeeper.workers.runtime import WorkerRuntime


class LosingBeforeWrite(RunLog):
    """The fleet's run log, on the same Redis, that loses the log (a real DEL of both
    keys) right before its next append, or its next close: after the ender looked."""

    lose_before: str = ""

    def _lose_once(self, run_id: str, operation: str) -> None:
        if self.lose_before == operation:
            self.lose_before = ""
            keys = self.keys(run_id)
            self.client.delete(keys.stream, keys.meta)

    def append(self, run_id: str, epoch: int, first_seq: int, chunks: Sequence[Chunk]) -> int:
        self._lose_once(run_id, "append")
        return super().append(run_id, epoch, first_seq, chunks)

    def close(self, run_id: str, epoch: int) -> None:
        self._lose_once(run_id, "close")
        super().close(run_id, epoch)


@pytest.fixture
def rt(settings: Settings) -> Iterator[WorkerRuntime]:
    runtime = WorkerRuntime.open(settings)
    yield runtime
    runtime.close()


def _settled_without_final(rt: WorkerRuntime, run_id: str) -> tuple[Owner, Chunk]:
    """An owner that replayed the whole journal and settled the run aborted (a cancel),
    its final chunk not appended yet: what ``Attempt._abort`` holds before ``end_log``."""
    _admit(rt, run_id)
    owner = Owner(rt, run_id)
    owner.consume(LINES)
    final = lifecycle.cancelled()
    error = {"reason": "cancelled", "message": final["message"]}
    rt.store.settle_run(owner.claim, RunStatus.ABORTED, error)
    return owner, final


@pytest.mark.parametrize("lost_before", ["append", "close"])
def test_an_owner_ending_its_log_meets_it_rebuilt_and_closed(
    rt: WorkerRuntime,
    settings: Settings,
    lost_before: str,
) -> None:
    owner, final = _settled_without_final(rt, "owner-end-1")
    losing = LosingBeforeWrite.from_settings(settings, source=rt.log.source)
    try:
        losing.lose_before = lost_before
        end_log(losing, "owner-end-1", owner.claim.epoch, final)
        assert losing.lose_before == ""  # the loss happened
    finally:
        losing.client.close()
    whole = [*owner.log(), (len(owner.emitted) + 1, final)]
    assert rt.log.snapshot("owner-end-1") == whole
    assert rt.log.state("owner-end-1").closed


@pytest.mark.parametrize("lost_before", ["append", "close"])
def test_the_reaper_ending_a_log_meets_it_rebuilt_and_closed(
    rt: WorkerRuntime,
    settings: Settings,
    lost_before: str,
) -> None:
    """The reaper fences one epoch above the run's (``end_run_log``); the rebuild
    brings the log back at the run's own epoch, closed, final chunk in."""
    owner, final = _settled_without_final(rt, "reaper-end-1")
    run = rt.store.get_run("reaper-end-1")
    assert run is not None
    losing = LosingBeforeWrite.from_settings(settings, source=rt.log.source)
    try:
        losing.lose_before = lost_before
        end_run_log(dataclasses.replace(rt, log=losing), run)
        assert losing.lose_before == ""
    finally:
        losing.client.close()
    whole = [*owner.log(), (len(owner.emitted) + 1, final)]
    assert rt.log.snapshot("reaper-end-1") == whole
    assert rt.log.state("reaper-end-1").closed


def _down_store() -> Store:
    """A store whose Postgres refuses every connection: a closed port on loopback."""
    return Store(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nowhere")


def test_a_lost_log_with_postgres_down_is_a_service_error(
    rt: WorkerRuntime,
    settings: Settings,
) -> None:
    """The sync reader and the web's async one: a ServiceError once the store gives up
    (its pool's own wait), the log left missing, never half made nor read as empty."""
    _admit(rt, "down-1")
    owner = Owner(rt, "down-1")
    owner.consume(LINES[:10])
    before = rt.log.snapshot("down-1")
    lose(rt.log, "down-1")
    down = _down_store()
    reader = RunLog.from_settings(settings, source=StoredLog(down))

    async def web_state() -> None:
        web = AsyncRunLog.from_settings(settings)
        web.restorer = reader
        try:
            await web.state("down-1")
        finally:
            await web.aclose()

    try:
        for read in (lambda: reader.state("down-1"), lambda: asyncio.run(web_state())):
            with pytest.raises(ServiceError) as info:
                read()
            assert isinstance(info.value, StoreUnavailableError)
            keys = reader.keys("down-1")
            assert reader.client.exists(keys.meta, keys.stream) == 0  # nothing half-made
    finally:
        reader.client.close()
        down.close()
    assert rt.log.snapshot("down-1") == before  # rebuilt once Postgres answers
