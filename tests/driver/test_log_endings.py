"""Every ender of a run's log ends it as a rebuild from Postgres would.

Real workers, real Postgres and Redis. A run settled without its live owner (the
reconciler for a run out of attempts, a cancel, the successor that finds a cancel at
its takeover) may have stored more than its log shows: a batch of journal bytes
committed by an owner SIGKILLed before it appended their chunks, or an exit sentinel
stored by an owner killed before it appended the closing chunks. The log it ends must
be, element by element, the one a rebuild from Postgres makes of the settled run
(docs/architecture.md, "Invariants" 3 and 7): what the store holds, then the one final
chunk. And enders that meet on the same logs (two reapers' sweeps) each end every log
of their sweep, once, with no error: the loser of a race finds it ended, and goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.driver.fleet import Fleet
from tests.driver.test_log_loss import lose_logs
from tests.log.test_rebuild import LINES, Owner, _admit
from turnkeeper import reconciler
from turnkeeper.agents.formats import translator_for
from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.driver import lifecycle
from turnkeeper.driver.replay import StoredLog
from turnkeeper.errors import SequenceConflictError
from turnkeeper.log import RunLog
from turnkeeper.log.entries import LogState
from turnkeeper.store.records import Run, RunStatus
from turnkeeper.workers.failpoints import release
from turnkeeper.workers.runtime import WorkerRuntime

OUTPUT = b"one\ntwo\nthree\n"
TEXT_AGENT: dict[str, Any] = {
    "command": ["/bin/sh", "-c", "printf 'one\\ntwo\\nthree\\n'"],
    "format": "text",
}
GAVE_UP: Chunk = {
    "type": "RUN_ERROR",
    "message": "the run used all of its attempts",
    "code": "attempts-exhausted",
}
CANCELLED_UNOWNED: Chunk = {
    "type": "RUN_ERROR",
    "message": "the run was cancelled and its owner is gone",
    "code": "cancelled",
}
CANCELLED: Chunk = {"type": "RUN_ERROR", "message": "the run was cancelled", "code": "cancelled"}
FINALS = ("RUN_FINISHED", "RUN_ERROR")


def _stored_bytes(fleet: Fleet, run_id: str) -> bytes:
    with psycopg.connect(fleet.settings.require_database_url()) as conn:
        rows = conn.execute(
            "SELECT body FROM segments WHERE run_id = %s ORDER BY journal_key, byte_start",
            (run_id,),
        ).fetchall()
    return b"".join(bytes(row[0]) for row in rows)


def _text_log(run: Run, out: bytes, *, closed: bool, final: Chunk) -> list[Chunk]:
    """The oracle: the log of a text agent that printed ``out``, with its closing chunk
    when its journal ended at the sentinel (``closed``), then ``final``. Translated
    here, not through the journal, the segments or the log."""
    translator = translator_for("text", run.run_id)
    chunks: list[Chunk] = [lifecycle.run_started(run.run_id, run.session_id)]
    for line in out.splitlines(keepends=True):
        chunks.extend(translator.feed(line))
    if closed:
        chunks.extend(translator.finish())
    return [*chunks, final]


def _wait_lease_expired(fleet: Fleet, run_id: str) -> None:
    """Until the dead owner's lease ran out on the database clock (a hang guard)."""
    deadline = time.monotonic() + 60
    while True:
        with psycopg.connect(fleet.settings.require_database_url()) as conn:
            row = conn.execute(
                "SELECT lease_expires_at < now() FROM runs WHERE run_id = %s", (run_id,)
            ).fetchone()
        if row is not None and row[0]:
            return
        assert time.monotonic() < deadline, fleet.dump_logs()
        time.sleep(0.05)


def _assert_ended_as_rebuilt(fleet: Fleet, run_id: str, expected: list[Chunk]) -> None:
    """The live log is ``expected``, seq by seq, closed, with one final chunk, at its
    end; lost from Redis and rebuilt from Postgres, it is the same, element by element."""
    live = fleet.log_of(run_id)
    assert live == list(enumerate(expected, start=1)), fleet.dump_logs()
    kinds = [chunk["type"] for _, chunk in live]
    assert sum(kinds.count(kind) for kind in FINALS) == 1
    assert kinds[-1] in FINALS
    assert fleet.client.log.state(run_id).closed
    assert lose_logs(fleet) == 2
    assert fleet.log_of(run_id) == live
    assert fleet.client.log.state(run_id).closed


def _kill_at(fleet: Fleet, run_id: str, point: str) -> Run:
    """SIGKILL the worker that reached the failpoint ``point`` while driving the run."""
    fleet.wait_failpoint(point)
    owned = fleet.wait(run_id, lambda r: r.owner is not None, what="an owner")
    fleet.signal_worker_of(owned, signal.SIGKILL)
    return owned


@pytest.mark.parametrize("ender", ["reconciler", "cancel"])
def test_a_batch_stored_but_never_appended_is_in_the_log_its_ender_closes(
    settings: Settings, tmp_path: Path, ender: str
) -> None:
    """The owner's segment commits and it dies before the append: the run is settled by
    the reconciler (its one attempt spent) or by a cancel, with nobody driving it. The
    ended log holds the stored batch's chunks before the final one, as the rebuild does;
    a client resuming after the final chunk gets nothing more."""
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="segment-stored")
    try:
        fleet.start_worker()  # no beat: the test settles the run, by the ender it names
        run = fleet.client.submit(TEXT_AGENT, "go", max_attempts=1 if ender == "reconciler" else 5)
        _kill_at(fleet, run.run_id, "segment-stored")
        assert [c["type"] for _, c in fleet.log_of(run.run_id)] == ["RUN_STARTED"]
        stored = _stored_bytes(fleet, run.run_id)
        assert stored, "a batch was stored before the crash"
        assert OUTPUT.startswith(stored)
        _wait_lease_expired(fleet, run.run_id)
        if ender == "reconciler":
            swept = fleet.run_cli("reconcile", "--once")
            assert swept.returncode == 0, swept.stderr
            final = GAVE_UP
        else:
            fleet.client.cancel(run.run_id)
            final = CANCELLED_UNOWNED
        done = fleet.wait_settled(run.run_id)
        assert done.status is (RunStatus.FAILED if ender == "reconciler" else RunStatus.ABORTED)
        expected = _text_log(done, stored, closed=False, final=final)
        assert len(expected) > 2, "the stored batch makes chunks"
        _assert_ended_as_rebuilt(fleet, run.run_id, expected)
        assert list(fleet.client.events(run.run_id, after=len(expected))) == []
    finally:
        fleet.stop()


def test_a_stored_sentinel_gets_its_closing_chunks_when_a_cancel_ends_the_log(
    settings: Settings, tmp_path: Path
) -> None:
    """A text agent's sentinel is stored, and its owner dies before the closing chunk
    (``TEXT_MESSAGE_END``): the cancel that settles the run ends the log with it, then
    its ``RUN_ERROR``, as the rebuild does."""
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="sentinel-stored")
    try:
        fleet.start_worker()
        run = fleet.client.submit(TEXT_AGENT, "go")
        _kill_at(fleet, run.run_id, "sentinel-stored")
        kinds = [c["type"] for _, c in fleet.log_of(run.run_id)]
        assert "TEXT_MESSAGE_END" not in kinds
        _wait_lease_expired(fleet, run.run_id)
        fleet.client.cancel(run.run_id)
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.ABORTED
        expected = _text_log(done, OUTPUT, closed=True, final=CANCELLED_UNOWNED)
        assert [c["type"] for c in expected[-2:]] == ["TEXT_MESSAGE_END", "RUN_ERROR"]
        _assert_ended_as_rebuilt(fleet, run.run_id, expected)
    finally:
        fleet.stop()


def test_a_takeover_that_finds_a_cancel_after_a_stored_sentinel_closes_what_was_open(
    settings: Settings, tmp_path: Path
) -> None:
    """The owner dies with the sentinel stored; its successor adopts the run and, before
    it reads it, the run is cancelled: the successor aborts (``Recovery.ABORT``), and the
    log it ends holds the closing chunk before the ``RUN_ERROR``, as the rebuild does."""
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="sentinel-stored,adopted=pause")
    try:
        fleet.start_pair()
        run = fleet.client.submit(TEXT_AGENT, "go")
        _kill_at(fleet, run.run_id, "sentinel-stored")
        fleet.wait_failpoint("adopted")
        assert fleet.client.cancel(run.run_id).status is RunStatus.RUNNING  # its owner acts
        release(fleet.settings, "adopted")
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.ABORTED, (done.error, fleet.dump_logs())
        assert done.epoch == 2
        (classified,) = fleet.events("takeover.classified", run_id=run.run_id)
        assert classified["action"] == "abort"
        expected = _text_log(done, OUTPUT, closed=True, final=CANCELLED)
        _assert_ended_as_rebuilt(fleet, run.run_id, expected)
    finally:
        fleet.stop()


# --- two sweeps ending the same logs at once --------------------------------------------


class RacingLog(RunLog):
    """The fleet's run log, whose appends wait for the other sweep's (a barrier), so
    that two enders append at the same seq of the same log: one lands, one is refused.
    Records the logs its sweep looked at and the refusals it met."""

    barrier: threading.Barrier
    looked_at: list[str]
    conflicts: list[str]

    def state(self, run_id: str) -> LogState:
        self.looked_at.append(run_id)
        return super().state(run_id)

    def append(self, run_id: str, epoch: int, first_seq: int, chunks: Sequence[Chunk]) -> int:
        with contextlib.suppress(threading.BrokenBarrierError):  # the other sweep stopped
            self.barrier.wait()
        try:
            return super().append(run_id, epoch, first_seq, chunks)
        except SequenceConflictError:
            self.conflicts.append(run_id)
            raise


@pytest.fixture
def runtimes(settings: Settings) -> Iterator[list[WorkerRuntime]]:
    opened = [WorkerRuntime.open(settings, StoredLog) for _ in range(3)]
    yield opened
    for runtime in opened:
        runtime.close()


def test_two_sweeps_racing_on_the_same_open_logs_end_each_once(
    runtimes: list[WorkerRuntime], settings: Settings
) -> None:
    """Four settled runs whose owners died before ending their logs, one of them after
    storing a batch it never appended. Two reapers sweep at once, their appends meeting
    at the same seqs: neither sweep raises, each looks at every log, and every log ends
    once, as its rebuild from Postgres does."""
    setup, *sweepers = runtimes
    expected: dict[str, list[Chunk]] = {}
    for index in range(4):
        run_id = f"open-{index}"
        _admit(setup, run_id)
        owner = Owner(setup, run_id)
        owner.consume(LINES[:10])
        if index == 2:
            owner.store(LINES[10:20])  # stored, and the owner died before the append
            owner.emitted.extend(owner.replay.lines(LINES[10:20]))
        error = {"reason": "agent-exit", "message": f"the agent exited with code {index}"}
        setup.store.settle_run(owner.claim, RunStatus.FAILED, error)
        expected[run_id] = [*owner.emitted, lifecycle.run_error(error["message"], "agent-exit")]
    barrier = threading.Barrier(2, timeout=30)
    logs = []
    for runtime in sweepers:
        racing = RacingLog.from_settings(settings, source=runtime.log.source)
        racing.barrier, racing.looked_at, racing.conflicts = barrier, [], []
        logs.append(racing)
    reports: list[reconciler.ReapReport] = []
    errors: list[BaseException] = []

    def sweep(runtime: WorkerRuntime, racing: RacingLog) -> None:
        try:
            reports.append(reconciler.reap_fleet(dataclasses.replace(runtime, log=racing)))
        except BaseException as exc:  # noqa: BLE001 - what escaped the sweep, checked below
            errors.append(exc)
            barrier.abort()

    threads = [
        threading.Thread(target=sweep, args=(runtime, racing))
        for runtime, racing in zip(sweepers, logs, strict=True)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        for racing in logs:
            racing.client.close()
    assert errors == []
    assert len(reports) == 2
    assert sum(len(racing.conflicts) for racing in logs) >= 1, "the appends met"
    for racing in logs:
        assert set(racing.looked_at) >= set(expected)
    for run_id, chunks in expected.items():
        ended = setup.log.snapshot(run_id)
        assert ended == list(enumerate(chunks, start=1))
        assert setup.log.state(run_id).closed
        keys = setup.log.keys(run_id)
        assert setup.log.client.delete(keys.stream, keys.meta) == 2
        assert setup.log.snapshot(run_id) == ended
