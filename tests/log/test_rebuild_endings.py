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
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
import redis

from tests.log.test_rebuild import LINES, Owner, _admit, lose
from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.driver import lifecycle
from turnkeeper.driver.ending import end_log
from turnkeeper.driver.replay import StoredLog
from turnkeeper.embedded.ports import free_port
from turnkeeper.errors import (
    LogUnavailableError,
    OwnershipLostError,
    ServiceError,
    StoreUnavailableError,
)
from turnkeeper.log import AsyncRunLog, RunLog
from turnkeeper.log.origin import LogOrigin
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
    runtime = WorkerRuntime.open(settings, StoredLog)
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
        end_log(losing, rt.store, "owner-end-1", owner.claim.epoch)
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


@pytest.mark.slow
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


class HeldSource:
    """The fleet's source (``StoredLog``), whose rebuild stops after its first page
    until the test lets it go: a rebuild in progress, at an exact point."""

    def __init__(self, store: Store, page_size: int) -> None:
        self.inner = StoredLog(store)
        self.page_size = page_size
        self.paused = threading.Event()
        self.go = threading.Event()

    def origin(self, run_id: str) -> LogOrigin | None:
        origin = self.inner.origin(run_id)
        if origin is None:
            return None

        def chunks() -> Iterator[Chunk]:
            for index, chunk in enumerate(origin.chunks):
                if index == self.page_size + 1:  # the first page is written by now
                    self.paused.set()
                    assert self.go.wait(60)
                yield chunk

        return dataclasses.replace(origin, chunks=chunks())


def test_a_fenced_zombies_append_racing_a_rebuild_is_refused(
    rt: WorkerRuntime, settings: Settings
) -> None:
    """A rebuild holds the lost log, its first page written, when a zombie (handed over
    in Postgres) appends: refused while the rebuild runs, then fenced by the epoch the
    rebuild brought back. The rebuilt log is the one Postgres holds."""
    _admit(rt, "zrace-1")
    first = rt.store.claim_run("zrace-1", "zombie", 0.5)
    assert first is not None
    zombie = Owner(rt, "zrace-1", first)
    zombie.consume(LINES[:12])
    before = rt.log.snapshot("zrace-1")
    while not rt.store.hand_over_expired(10):
        time.sleep(0.1)
    lose(rt.log, "zrace-1")
    source = HeldSource(rt.store, page_size=5)
    rebuilder = RunLog(
        redis.Redis.from_url(settings.require_redis_url()),
        namespace=settings.namespace,
        page_size=5,
        source=source,
    )
    seen: list[list[tuple[int, Chunk]]] = []
    reader = threading.Thread(target=lambda: seen.append(rebuilder.snapshot("zrace-1")))
    reader.start()
    try:
        assert source.paused.wait(60)
        assert rt.log.client.hget(rt.log.keys("zrace-1").meta, "rebuilding") is not None
        refused: list[BaseException] = []

        def late_append() -> None:
            try:
                zombie.emit([lifecycle.run_error("late", "late")])
            except BaseException as exc:  # noqa: BLE001 - what the zombie meets, checked below
                refused.append(exc)

        appender = threading.Thread(target=late_append)
        appender.start()
        time.sleep(0.5)  # the zombie's append waits on the rebuild, not refused yet
        assert appender.is_alive()
        assert not refused
        source.go.set()
        appender.join(60)
        reader.join(60)
    finally:
        source.go.set()
        rebuilder.client.close()
    assert [type(exc) for exc in refused] == [OwnershipLostError]
    assert zombie.lost.is_set()
    assert seen == [before]
    assert rt.log.snapshot("zrace-1") == before
    assert rt.log.state("zrace-1").epoch == 2


@pytest.mark.slow
def test_state_under_a_loss_racing_every_look_is_whole_or_a_service_error(
    rt: WorkerRuntime, settings: Settings
) -> None:
    """A thread deletes the log as fast as it can while ``state()`` is asked again and
    again: every answer is the whole log's extent (never a missing or empty one), or,
    lost after every rebuild, a ServiceError. Once the racing stops, it is the log."""
    _admit(rt, "flush-1")
    owner = Owner(rt, "flush-1")
    owner.consume(LINES)
    owner.finish()
    whole = rt.log.snapshot("flush-1")
    reader = RunLog.from_settings(settings, source=rt.log.source)
    stop = threading.Event()
    deleted = [0]

    def flush() -> None:
        keys = reader.keys("flush-1")
        while not stop.is_set():
            deleted[0] += int(reader.client.delete(keys.stream, keys.meta))

    answers: list[tuple[bool, bool, int, int] | str] = []
    racer = threading.Thread(target=flush)
    racer.start()
    try:
        for _ in range(10):
            try:
                state = reader.state("flush-1")
            except LogUnavailableError as exc:
                answers.append(str(exc.reason))
                continue
            answers.append((state.exists, state.closed, state.first_seq, state.last_seq))
    finally:
        stop.set()
        racer.join()
    assert deleted[0] > 0
    extent = (True, True, 1, len(whole))
    assert set(answers) <= {extent, "lost-under-read"}, answers
    assert reader.snapshot("flush-1") == whole
    reader.client.close()
