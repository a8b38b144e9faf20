"""Worker functions run in spawned processes by the race tests (importable by path)."""

from __future__ import annotations

import threading
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier, Event
from typing import Any

from turnkeeper.errors import TranscriptConflictError
from turnkeeper.store import Claim, NewEntry, Store, Verdict


def _threads(count: int, target: Any, *args: Any) -> None:
    threads = [threading.Thread(target=target, args=(i, *args)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def claimers(  # noqa: PLR0917 - multiprocessing passes arguments by position
    url: str, run_id: str, tag: str, threads: int, barrier: Barrier, out: Queue[Any]
) -> None:
    with Store(url, pool_size=threads) as store:

        def one(i: int) -> None:
            barrier.wait(timeout=60)
            claim = store.claim_run(run_id, f"{tag}-{i}", 30)
            out.put(None if claim is None else (claim.run_id, claim.attempt_id, claim.epoch))

        _threads(threads, one)


def replacers(  # noqa: PLR0917 - multiprocessing passes arguments by position
    url: str, run_id: str, expected: str, tag: str, threads: int, barrier: Barrier, out: Queue[Any]
) -> None:
    with Store(url, pool_size=threads) as store:

        def one(i: int) -> None:
            barrier.wait(timeout=60)
            claim = store.replace_turn_slot_attempt(run_id, expected, f"{tag}-{i}", 30)
            out.put(None if claim is None else (claim.run_id, claim.attempt_id, claim.epoch))

        _threads(threads, one)


def reclaimers(url: str, tag: str, threads: int, barrier: Barrier, out: Queue[Any]) -> None:
    with Store(url, pool_size=threads) as store:

        def one(i: int) -> None:
            barrier.wait(timeout=60)
            got: list[tuple[str, int]] = []
            while batch := store.hand_over_expired(3):
                got.extend((c.run_id, c.epoch) for c in batch)
            out.put(got)

        _threads(threads, one)


def zombie(url: str, run_id: str, ready: Queue[Any], resume: Event, out: Queue[Any]) -> None:
    """Claim and write, report the claim, wait (it gets SIGSTOPped), then write again."""
    with Store(url, pool_size=1) as store:
        claim = store.claim_run(run_id, "zombie", 0.3)
        assert claim is not None
        assert store.begin_turn_slot(claim, 0, "t0", "leaf-0") is Verdict.DONE
        assert store.update_turn_phase(claim, "provider_started", journal_key="k") is Verdict.DONE
        assert store.append_segment(claim, "k", 0, b"early") is Verdict.DONE
        ready.put((claim.run_id, claim.attempt_id, claim.epoch))
        resume.wait(timeout=120)
        out.put(_zombie_writes(store, claim))


def _zombie_writes(store: Store, claim: Claim) -> list[tuple[str, Any]]:
    return [
        ("renew", store.renew_lease(claim, 30)),
        ("phase", store.update_turn_phase(claim, "tool_request_recorded", tool_request={})),
        ("commit", store.commit_turn_slot(claim, "zombie-leaf")),
        ("consumed", store.mark_journal_consumed(claim, "k")),
        ("segment", store.append_segment(claim, "k", 5, b"zombie")),
        ("begin", store.begin_turn_slot(claim, 1, "t1", None)),
        ("sandbox", store.record_sandbox(claim, {"zombie": True})),
        ("transcript", store.append_transcript(claim, "s1", [NewEntry("z", "u", {})], None)),
        ("settle", store.settle_run(claim, "completed")),
    ]


def transcript_writer(  # noqa: PLR0917 - multiprocessing passes arguments by position
    url: str, claim: tuple[str, str, int], tag: str, count: int, barrier: Barrier, out: Queue[Any]
) -> None:
    """Append ``count`` entries, retrying on a moved leaf; report the first race's verdict."""
    owner = Claim(*claim)
    with Store(url, pool_size=1) as store:
        barrier.wait(timeout=60)
        first: str | None = None
        leaf: str | None = None
        conflicts = 0
        for n in range(count):
            entry = NewEntry(f"{tag}-{n}", "message", {"writer": tag, "n": n})
            while True:
                try:
                    leaf = store.append_transcript(owner, "s1", [entry], leaf)
                    break
                except TranscriptConflictError as exc:
                    conflicts += 1
                    leaf = exc.fields["current_leaf"]
                    if n == 0 and first is None:
                        first = "lost"
            if n == 0 and first is None:
                first = "won"
        out.put((tag, first, conflicts))
