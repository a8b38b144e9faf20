"""A run log that Redis lost comes back from Postgres: real Postgres, real Redis, threads.

An owner here is the driver's own write path (``RunOutput``, ``Replay``) fed with a
real Claude Code journal: segments first, then chunks. What it appended is the
reference every rebuilt log is compared with, whole and element by element.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from turnkeeper.agents.spec import AgentSpec
from turnkeeper.chunks import Chunk
from turnkeeper.client import Client
from turnkeeper.config import Settings
from turnkeeper.driver import lifecycle
from turnkeeper.driver.attempt import _own
from turnkeeper.driver.output import RunOutput
from turnkeeper.driver.ownership import Ownership
from turnkeeper.driver.placement import PlacedJournal, Placement
from turnkeeper.driver.replay import Replay, StoredLog
from turnkeeper.errors import LogGoneError, LogUnavailableError, OwnershipLostError, ServiceError
from turnkeeper.log import AsyncRunLog, RunLog
from turnkeeper.log.entries import LogState
from turnkeeper.sandbox import (
    JournalHandle,
    JournalPaths,
    SandboxRef,
    exit_sentinel_line,
    new_nonce,
)
from turnkeeper.store.records import Claim, RunStatus
from turnkeeper.workers.runtime import WorkerRuntime

JOURNAL = (
    Path(__file__).resolve().parents[1] / "fixtures" / "claude-code" / "stream-json-partial.ndjson"
).read_bytes()
LINES = JOURNAL.splitlines(keepends=True)
PAYLOAD = {"agent": {"preset": "scripted"}}


def lose(run_log: RunLog, run_id: str) -> None:
    """What a flush, a restart without persistence or a failover does to one log."""
    keys = run_log.keys(run_id)
    assert run_log.client.delete(keys.stream, keys.meta) == 2


class Owner:
    """A run's owner on the driver's own write path: segments, then chunks."""

    def __init__(
        self,
        rt: WorkerRuntime,
        run_id: str,
        claim: Claim | None = None,
        run_log: RunLog | None = None,
    ) -> None:
        self.rt = rt
        self.run_id = run_id
        if claim is None:
            claim = rt.store.claim_run(run_id, "owner", 30)
            assert claim is not None
        self.claim = claim
        rt.log.fence(run_id, claim.epoch)
        ref = SandboxRef("local", "sb-" + run_id, "/nonexistent/" + run_id)
        handle = JournalHandle(ref, JournalPaths(ref.journal_dir, run_id, 1), new_nonce())
        self.journal = PlacedJournal(handle)
        rt.store.record_sandbox(claim, Placement(ref, [self.journal]).to_dict())
        self.lost = threading.Event()
        ownership = Ownership(rt.store, claim, self.lost, 30)
        self.output = RunOutput(rt.store, run_log or rt.log, claim, ownership)
        self.replay = Replay(run_id, run_id, AgentSpec.from_payload(PAYLOAD["agent"]).format)
        self.emitted: list[Chunk] = []
        self.offset = 0
        self.emit(self.replay.started())

    def emit(self, chunks: list[Chunk]) -> None:
        if chunks:
            self.output.emit(chunks)
            self.emitted.extend(chunks)

    def store(self, lines: list[bytes]) -> None:
        data = b"".join(lines)
        self.output.write_bytes(self.journal.journal_key, self.offset, data)
        self.offset += len(data)

    def consume(self, lines: list[bytes]) -> None:
        self.store(lines)
        self.emit(self.replay.lines(lines))

    def finish(self) -> None:
        sentinel = exit_sentinel_line(0, self.journal.handle.nonce)
        self.output.write_bytes(self.journal.journal_key, self.offset, sentinel)
        self.offset += len(sentinel)
        self.emit(self.replay.closing())
        self.rt.store.settle_run(self.claim, RunStatus.COMPLETED)
        self.emit([lifecycle.run_finished(self.run_id, self.run_id)])
        self.output.close()

    def log(self) -> list[tuple[int, Chunk]]:
        return list(enumerate(self.emitted, start=1))


@pytest.fixture
def rt(settings: Settings) -> Iterator[WorkerRuntime]:
    runtime = WorkerRuntime.open(settings, StoredLog)
    yield runtime
    runtime.close()


def _admit(rt: WorkerRuntime, run_id: str) -> None:
    rt.store.admit_run(run_id, run_id, PAYLOAD, max_attempts=3, deadline=None)


def test_an_open_log_is_rebuilt_identical_and_its_owner_carries_on(rt: WorkerRuntime) -> None:
    _admit(rt, "open-1")
    owner = Owner(rt, "open-1")
    owner.consume(LINES[:10])
    before = rt.log.snapshot("open-1")
    assert before == owner.log()
    lose(rt.log, "open-1")
    assert rt.log.snapshot("open-1") == before
    state = rt.log.state("open-1")
    assert (state.epoch, state.closed, state.next_seq) == (1, False, len(before) + 1)

    owner.consume(LINES[10:])
    owner.finish()
    assert rt.log.snapshot("open-1") == owner.log()
    assert rt.log.state("open-1").closed

    lose(rt.log, "open-1")
    assert list(rt.log.read("open-1")) == owner.log()  # a settled log, closed, final chunk in
    assert rt.log.state("open-1").closed_epoch == 1


def test_a_lost_log_is_rebuilt_by_its_owners_next_append(rt: WorkerRuntime) -> None:
    _admit(rt, "append-1")
    owner = Owner(rt, "append-1")
    owner.consume(LINES[:6])
    lose(rt.log, "append-1")
    owner.consume(LINES[6:])
    owner.finish()
    assert rt.log.snapshot("append-1") == owner.log()


def test_a_batch_stored_but_not_yet_appended_is_not_appended_twice(rt: WorkerRuntime) -> None:
    """The rebuild reads the segments the owner just stored and holds their chunks; the
    owner's append of them is refused for its seq and aligned away."""
    _admit(rt, "pending-1")
    owner = Owner(rt, "pending-1")
    owner.consume(LINES[:5])
    owner.store(LINES[5:12])  # stored, its chunks not yet appended
    lose(rt.log, "pending-1")
    rebuilt = rt.log.snapshot("pending-1")
    owner.emit(owner.replay.lines(LINES[5:12]))
    assert rt.log.snapshot("pending-1") == owner.log()
    assert len(rebuilt) == len(owner.log())  # the rebuild held the pending chunks already
    owner.consume(LINES[12:])
    owner.finish()
    assert rt.log.snapshot("pending-1") == owner.log()


def test_a_zombie_cannot_append_after_the_loss(rt: WorkerRuntime) -> None:
    _admit(rt, "zombie-1")
    first = rt.store.claim_run("zombie-1", "zombie", 0.5)
    assert first is not None
    zombie = Owner(rt, "zombie-1", first)
    zombie.consume(LINES[:8])
    before = rt.log.snapshot("zombie-1")
    while not (claims := rt.store.hand_over_expired(10)):
        time.sleep(0.1)
    (successor,) = claims
    assert successor.epoch == 2
    lose(rt.log, "zombie-1")
    with pytest.raises(OwnershipLostError):
        zombie.emit([lifecycle.run_error("late", "late")])
    assert zombie.lost.is_set()
    assert rt.log.snapshot("zombie-1") == before
    assert rt.log.state("zombie-1").epoch == 2  # the fence came back from Postgres


def test_concurrent_rebuilders_make_one_log(rt: WorkerRuntime, settings: Settings) -> None:
    _admit(rt, "many-1")
    owner = Owner(rt, "many-1")
    owner.consume(LINES)
    before = rt.log.snapshot("many-1")
    lose(rt.log, "many-1")
    readers = [RunLog.from_settings(settings, source=rt.log.source) for _ in range(6)]
    barrier = threading.Barrier(len(readers))
    results: list[list[tuple[int, Chunk]]] = [[] for _ in readers]

    def read(index: int) -> None:
        barrier.wait()
        results[index] = readers[index].snapshot("many-1")

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(readers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [before] * len(readers)
    keys = rt.log.keys("many-1")
    assert rt.log.client.xlen(keys.stream) == len(before)  # no chunk twice
    assert rt.log.client.hget(keys.meta, "rebuilding") is None
    for reader in readers:
        reader.client.close()


def test_rebuilds_racing_a_live_owner_never_reorder_nor_double_its_appends(
    rt: WorkerRuntime, settings: Settings
) -> None:
    _admit(rt, "race-1")
    owner = Owner(rt, "race-1")
    reader = RunLog.from_settings(settings, source=rt.log.source)
    done = threading.Event()
    seen: list[list[tuple[int, Chunk]]] = []

    def lose_and_read() -> None:
        while not done.is_set():
            keys = reader.keys("race-1")
            reader.client.delete(keys.stream, keys.meta)
            seen.append(reader.snapshot("race-1"))

    chaos = threading.Thread(target=lose_and_read)
    chaos.start()
    batches = range(0, len(LINES), 2)
    try:
        for start in batches:
            # At least one loss and read lands between every two appends.
            read_so_far = len(seen)
            deadline = time.monotonic() + 60  # a hang guard
            while len(seen) == read_so_far and time.monotonic() < deadline:
                time.sleep(0.001)
            owner.consume(LINES[start : start + 2])
        owner.finish()
    finally:
        done.set()
        chaos.join()
    final = owner.log()
    assert rt.log.snapshot("race-1") == final
    assert len(seen) >= len(batches)
    for snapshot in seen:  # every read, mid-rebuild or not, is a prefix of the real log
        assert snapshot == final[: len(snapshot)]
    reader.client.close()


def test_a_rebuilder_that_died_holding_the_log_is_taken_over(rt: WorkerRuntime) -> None:
    _admit(rt, "dead-1")
    owner = Owner(rt, "dead-1")
    owner.consume(LINES)
    before = rt.log.snapshot("dead-1")
    lose(rt.log, "dead-1")
    keys = rt.log.keys("dead-1").as_list()
    # A rebuilder that wrote one page and died: its hold lapses after 300 ms.
    token = secrets.token_hex(16)
    assert rt.log._rebuild_begin(keys=keys, args=[token, "dead-1", 300]) == 1
    rt.log._rebuild_page(keys=keys, args=[token, 300, 1000, b"{}"])
    assert rt.log.snapshot("dead-1") == before


def test_a_lost_log_whose_segments_were_pruned_is_gone_everywhere(
    rt: WorkerRuntime, settings: Settings
) -> None:
    _admit(rt, "pruned-1")
    owner = Owner(rt, "pruned-1")
    owner.consume(LINES)
    owner.finish()
    assert rt.store.prune_settled(0, 10) == 1
    assert rt.log.snapshot("pruned-1") == owner.log()  # still cached: served from Redis
    lose(rt.log, "pruned-1")
    for read in (
        lambda: rt.log.snapshot("pruned-1"),
        lambda: rt.log.state("pruned-1"),
        lambda: list(rt.log.read("pruned-1")),
    ):
        with pytest.raises(LogGoneError) as info:
            read()
        assert info.value.reason == "pruned"
    client = Client.from_settings(settings)
    try:
        for follow in (False, True):
            with pytest.raises(LogGoneError):
                list(client.events("pruned-1", follow=follow))
    finally:
        client.close()
    assert not rt.log.client.exists(rt.log.keys("pruned-1").meta)  # nothing half-made


class LosingLog(RunLog):
    """The fleet's run log, on the same Redis, that loses the log (a real DEL of both
    keys, what a flush does) right before each of its next ``losses`` page reads, or
    right after each of its next ``losses_after_state`` state reads: a loss at an exact
    point of a read, again and again."""

    losses = 0
    losses_after_state = 0

    def _lose(self, run_id: str) -> None:
        keys = self.keys(run_id)
        self.client.delete(keys.stream, keys.meta)

    def page(self, run_id: str, after_seq: int, count: int) -> list[tuple[int, Chunk]]:
        if self.losses > 0:
            self.losses -= 1
            self._lose(run_id)
        return super().page(run_id, after_seq, count)

    def state(self, run_id: str) -> LogState:
        state = super().state(run_id)
        if self.losses_after_state > 0:
            self.losses_after_state -= 1
            self._lose(run_id)
        return state


@pytest.mark.parametrize("losses", [1, 3, 60, 200])
def test_a_log_lost_again_and_again_while_its_owner_realigns(
    rt: WorkerRuntime, settings: Settings, losses: int
) -> None:
    """The owner's append meets a rebuilt log that already holds its batch; every page it
    reads back to realign finds the log lost once more (past the page retries too). It
    carries on, nothing doubled, nothing failed."""
    _admit(rt, "again-1")
    owner = Owner(rt, "again-1")
    losing = LosingLog.from_settings(settings, source=rt.log.source)
    owner.output.run_log = losing
    owner.consume(LINES[:5])
    owner.store(LINES[5:12])  # stored, its chunks not yet appended
    lose(rt.log, "again-1")
    assert rt.log.snapshot("again-1")  # rebuilt: it holds the pending chunks
    losing.losses = losses
    owner.emit(owner.replay.lines(LINES[5:12]))
    assert rt.log.snapshot("again-1") == owner.log()
    owner.consume(LINES[12:])
    owner.finish()
    assert rt.log.snapshot("again-1") == owner.log()
    assert not owner.lost.is_set()
    losing.client.close()


def test_a_log_lost_again_and_again_under_a_takeovers_replay(
    rt: WorkerRuntime, settings: Settings
) -> None:
    """A successor walks the stored log while Redis keeps losing it. A few losses: it
    carries on, the log exact. Losses past every retry: a service error (the attempt
    stops, a successor goes on), never a failed run, and the log is untouched."""
    _admit(rt, "walk-1")
    first = Owner(rt, "walk-1")
    first.consume(LINES[:10])
    before = rt.log.snapshot("walk-1")

    def successor(losses: int) -> Owner:
        run = rt.store.get_run("walk-1")
        assert run is not None
        assert run.attempt_id is not None
        claim = rt.store.replace_turn_slot_attempt(
            "walk-1", run.attempt_id, "successor", 30, only_if_expired=False
        )
        assert claim is not None
        losing = LosingLog.from_settings(settings, source=rt.log.source)
        losing.losses = losses
        return Owner(rt, "walk-1", claim, run_log=losing)

    with pytest.raises(LogUnavailableError) as info:
        successor(60).consume(LINES[:10])  # its replay, from RUN_STARTED on
    assert isinstance(info.value, ServiceError)
    assert info.value.reason == "lost-under-read"
    assert rt.log.snapshot("walk-1") == before

    heir = successor(3)
    heir.consume(LINES[:10])
    assert rt.log.snapshot("walk-1") == before  # all suppressed
    heir.consume(LINES[10:])
    heir.finish()
    assert rt.log.snapshot("walk-1") == heir.log()
    assert heir.log()[: len(before)] == before


@pytest.mark.parametrize("losses", [1, 2, 5])
@pytest.mark.parametrize("settled", [False, True], ids=["open", "settled"])
def test_a_snapshot_whose_log_is_lost_under_it_is_whole(
    rt: WorkerRuntime, settings: Settings, losses: int, settled: bool
) -> None:
    """Lost right after the snapshot read the log's extent (and again after each look
    that rebuilt it): the snapshot is the whole log, never a short or empty one."""
    _admit(rt, "under-1")
    owner = Owner(rt, "under-1")
    owner.consume(LINES)
    if settled:
        owner.finish()
    whole = rt.log.snapshot("under-1")
    assert whole == owner.log()
    reader = LosingLog.from_settings(settings, source=rt.log.source)
    try:
        reader.losses_after_state = losses
        assert reader.snapshot("under-1") == whole
        reader.losses_after_state = losses
        assert reader.snapshot("under-1", after_seq=3) == whole[3:]
    finally:
        reader.client.close()


def test_the_web_readers_snapshot_whose_log_is_lost_under_it_is_whole(
    rt: WorkerRuntime, settings: Settings
) -> None:
    """The async reader (the web server's), lost right after each of two state looks."""

    class LosingAsyncLog(AsyncRunLog):
        losses_after_state = 2

        async def state(self, run_id: str) -> LogState:
            state = await super().state(run_id)
            if self.losses_after_state > 0:
                self.losses_after_state -= 1
                keys = self.keys(run_id)
                await self.client.delete(keys.stream, keys.meta)
            return state

    _admit(rt, "web-1")
    owner = Owner(rt, "web-1")
    owner.consume(LINES)
    owner.finish()
    whole = rt.log.snapshot("web-1")

    async def scenario() -> list[tuple[int, Chunk]]:
        reader = LosingAsyncLog.from_settings(settings)
        reader.restorer = rt.log
        try:
            return await reader.snapshot("web-1")
        finally:
            await reader.aclose()

    assert asyncio.run(scenario()) == whole


def test_a_zombie_frozen_before_its_first_fence_makes_no_log_after_a_loss(
    rt: WorkerRuntime,
) -> None:
    """An owner frozen between its claim and its first fence wakes after its run was
    handed over, adopted, and its log lost: its fence (the driver's own entry, ``_own``)
    must not make an empty log at its epoch. Readers still see the whole log, and the
    adopter carries on."""
    _admit(rt, "early-1")
    zombie = rt.store.claim_and_begin("early-1", "zombie", 0.05)
    assert zombie is not None
    time.sleep(0.1)
    (handed,) = rt.store.hand_over_expired(10)
    adopted = rt.store.adopt_attempt("early-1", handed.attempt_id, "adopter", 30)
    assert adopted is not None
    assert adopted.epoch == 2
    heir = Owner(rt, "early-1", adopted)
    heir.consume(LINES[:10])
    lose(rt.log, "early-1")
    _own(rt, zombie.claim, begun=zombie)  # superseded: it returns without driving anything
    assert rt.log.snapshot("early-1") == heir.log()
    assert rt.log.state("early-1").epoch == 2
    heir.consume(LINES[10:])
    heir.finish()
    assert rt.log.snapshot("early-1") == heir.log()
    assert not heir.lost.is_set()
