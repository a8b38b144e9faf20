"""RunOutput against real Redis and Postgres: a retried append whose reply was lost."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from turnkeeper.config import Settings
from turnkeeper.driver.output import RunOutput
from turnkeeper.driver.ownership import Ownership
from turnkeeper.driver.replay import StoredLog
from turnkeeper.errors import JournalReplayDivergedError, OwnershipLostError
from turnkeeper.store.records import Claim
from turnkeeper.workers.runtime import WorkerRuntime

CHUNKS = [{"type": "CUSTOM", "name": "n", "value": i} for i in range(3)]


@pytest.fixture
def claim_and_runtime(settings: Settings) -> Iterator[tuple[Claim, WorkerRuntime]]:
    rt = WorkerRuntime.open(settings, StoredLog)
    # The append path alone: a log with no source, made empty by its first fence (one
    # with a source is made by a rebuild from Postgres, with the run's RUN_STARTED).
    rt.log.source = None
    rt.store.admit_run("out-1", "out-1", {}, max_attempts=3, deadline=None)
    claim = rt.store.claim_run("out-1", "me", 30)
    assert claim is not None
    rt.log.fence("out-1", claim.epoch)
    yield claim, rt
    rt.close()


def test_an_append_that_landed_before_its_reply_was_lost_is_not_an_error(
    claim_and_runtime: tuple[Claim, WorkerRuntime],
) -> None:
    claim, rt = claim_and_runtime
    output = RunOutput(
        rt.store, rt.log, claim, Ownership(rt.store, claim, threading.Event(), 30), []
    )
    rt.log.append("out-1", claim.epoch, 1, CHUNKS)  # the first try, whose reply was lost
    output.emit(CHUNKS)  # the retry
    assert [chunk for _, chunk in rt.log.snapshot("out-1")] == CHUNKS


def test_a_log_that_holds_other_chunks_at_those_seqs_is_a_divergence(
    claim_and_runtime: tuple[Claim, WorkerRuntime],
) -> None:
    claim, rt = claim_and_runtime
    output = RunOutput(
        rt.store, rt.log, claim, Ownership(rt.store, claim, threading.Event(), 30), []
    )
    other = [{"type": "CUSTOM", "name": "other", "value": i} for i in range(3)]
    rt.log.append("out-1", claim.epoch, 1, other)
    with pytest.raises(JournalReplayDivergedError) as info:
        output.emit(CHUNKS)
    assert info.value.fields["seq"] == 1
    assert [chunk for _, chunk in rt.log.snapshot("out-1")] == other


def test_an_append_refused_for_its_epoch_is_lost_ownership_and_counted(
    claim_and_runtime: tuple[Claim, WorkerRuntime],
) -> None:
    claim, rt = claim_and_runtime
    lost = threading.Event()
    output = RunOutput(rt.store, rt.log, claim, Ownership(rt.store, claim, lost, 30), [])
    output.emit(CHUNKS[:1])
    rt.log.fence("out-1", claim.epoch + 1)  # a successor took over
    with pytest.raises(OwnershipLostError):
        output.emit(CHUNKS[1:])
    assert lost.is_set()
    assert rt.log.counters() == {"refused_appends": 1}
    assert [chunk for _, chunk in rt.log.snapshot("out-1")] == CHUNKS[:1]
