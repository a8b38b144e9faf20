"""Fencing with real processes: an old-epoch writer never lands a chunk after the fence."""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.queues import Queue
from typing import Any

import pytest

from turnkeeper.chunks import Chunk
from turnkeeper.errors import LogFencedError
from turnkeeper.log import RunLog

from .samples import text_chunk

HANG_GUARD = 60.0


def old_writer(redis_url: str, namespace: str, run_id: str, batch: int, out: Queue[Any]) -> None:
    """Appends epoch-1 batches as fast as it can until it is fenced out."""
    log = RunLog.from_url(redis_url, namespace=namespace)
    acked = 0
    try:
        while True:
            batch_chunks = [text_chunk(acked + 1 + i, "e1") for i in range(batch)]
            acked = log.append(run_id, 1, acked + 1, batch_chunks)
            if acked >= 200_000:
                out.put(("never-fenced", acked))
                return
    except LogFencedError as exc:
        out.put(("fenced", acked, exc.fields["stored_epoch"]))
    except Exception as exc:  # noqa: BLE001 - any other outcome fails the test
        out.put(("error", repr(exc)))


def new_writer(redis_url: str, namespace: str, run_id: str, out: Queue[Any]) -> None:
    """Takes over at epoch 2: fence, snapshot, then append its own chunks."""
    log = RunLog.from_url(redis_url, namespace=namespace)
    stored_epoch = log.fence(run_id, 2)
    snapshot = log.snapshot(run_id)
    last = log.append(run_id, 2, len(snapshot) + 1, [text_chunk(n, "e2") for n in range(1, 11)])
    out.put((stored_epoch, snapshot, last))


@pytest.mark.parametrize("batch", [1, 7])
def test_old_epoch_writer_never_lands_after_the_fence(
    redis_url: str, namespace: str, batch: int
) -> None:
    context = multiprocessing.get_context("spawn")
    log = RunLog.from_url(redis_url, namespace=namespace)
    for round_number in range(3):
        run_id = f"race-{batch}-{round_number}"
        log.fence(run_id, 1)
        old_out: Queue[Any] = context.Queue()
        new_out: Queue[Any] = context.Queue()
        old = context.Process(
            target=old_writer, args=(redis_url, namespace, run_id, batch, old_out)
        )
        old.start()
        deadline = time.monotonic() + HANG_GUARD
        # Fence while the old writer is mid-stream, at a different point each round.
        while log.state(run_id).next_seq <= 50 * (round_number + 1):
            assert time.monotonic() < deadline, "hang guard: old writer made no progress"
            time.sleep(0.005)
        new = context.Process(target=new_writer, args=(redis_url, namespace, run_id, new_out))
        new.start()
        stored_epoch, snapshot_after_fence, new_last = new_out.get(timeout=HANG_GUARD)
        outcome = old_out.get(timeout=HANG_GUARD)
        old.join(HANG_GUARD)
        new.join(HANG_GUARD)

        assert stored_epoch == 2
        assert outcome[0] == "fenced", outcome
        _, old_acked, seen_epoch = outcome
        assert seen_epoch == 2
        # Every acknowledged epoch-1 chunk is in the snapshot taken right after the
        # fence, and nothing of epoch 1 landed after it.
        expected_old: list[tuple[int, Chunk]] = [
            (n, text_chunk(n, "e1")) for n in range(1, old_acked + 1)
        ]
        assert snapshot_after_fence == expected_old
        expected_new = [(old_acked + n, text_chunk(n, "e2")) for n in range(1, 11)]
        assert new_last == old_acked + 10
        assert log.snapshot(run_id) == expected_old + expected_new
    log.client.close()
