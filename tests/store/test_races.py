"""Races with real threads in real processes, against one real database."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any

from tests.store import race_workers
from tests.store.conftest import admit, claimed
from turnkeeper.store import Claim, NewEntry, Store, Verdict

SPAWN = multiprocessing.get_context("spawn")
HANG_GUARD = 120


def _run_processes(target: Any, args_for: list[tuple[Any, ...]]) -> None:
    processes = [SPAWN.Process(target=target, args=args) for args in args_for]
    for process in processes:
        process.start()
    for process in processes:
        process.join(HANG_GUARD)
        assert process.exitcode == 0


def _drain(queue: Any, count: int) -> list[Any]:
    return [queue.get(timeout=HANG_GUARD) for _ in range(count)]


def test_twenty_claimers_in_four_processes_get_exactly_one_claim(
    store: Store, database_url: str
) -> None:
    admit(store, "r1")
    barrier, out = SPAWN.Barrier(20), SPAWN.Queue()
    _run_processes(
        race_workers.claimers,
        [(database_url, "r1", f"p{p}", 5, barrier, out) for p in range(4)],
    )
    results = _drain(out, 20)
    wins = [r for r in results if r is not None]
    assert len(wins) == 1
    run = store.get_run("r1")
    assert run is not None
    assert (run.status, run.attempt_id, run.epoch, run.attempt_count) == (
        "running",
        wins[0][1],
        1,
        1,
    )


def test_ten_reconcilers_replacing_one_attempt_get_exactly_one(
    store: Store, database_url: str
) -> None:
    old = claimed(store, "r1")
    assert store.begin_turn_slot(old, 0, "t0", None) is Verdict.DONE
    assert store.renew_lease(old, 0.001) is Verdict.DONE
    time.sleep(0.02)
    barrier, out = SPAWN.Barrier(10), SPAWN.Queue()
    _run_processes(
        race_workers.replacers,
        [(database_url, "r1", old.attempt_id, f"p{p}", 5, barrier, out) for p in range(2)],
    )
    wins = [r for r in _drain(out, 10) if r is not None]
    assert len(wins) == 1
    assert wins[0][2] == 2
    run, journal = store.get_run("r1"), store.get_turn_slot("r1")
    assert run is not None
    assert journal is not None
    assert (run.attempt_id, run.epoch, run.attempt_count) == (wins[0][1], 2, 2)
    assert (journal.attempt_id, journal.revision) == (wins[0][1], 2)


def test_concurrent_reclaimers_take_disjoint_runs_and_miss_none(
    store: Store, database_url: str
) -> None:
    claims = [claimed(store, f"r{i:02}", f"s{i}") for i in range(30)]
    for claim in claims:
        assert store.renew_lease(claim, 0.001) is Verdict.DONE
    time.sleep(0.02)
    barrier, out = SPAWN.Barrier(6), SPAWN.Queue()
    _run_processes(
        race_workers.reclaimers, [(database_url, f"p{p}", 3, barrier, out) for p in range(2)]
    )
    taken = [item for batch in _drain(out, 6) for item in batch]
    assert sorted(taken) == [(f"r{i:02}", 2) for i in range(30)]
    assert all(r.epoch == 2 for r in store.list_runs())


def test_the_old_owner_paused_past_its_lease_is_refused_after_takeover(
    store: Store, database_url: str
) -> None:
    admit(store, "r1")
    ready, resume, out = SPAWN.Queue(), SPAWN.Event(), SPAWN.Queue()
    process = SPAWN.Process(
        target=race_workers.zombie, args=(database_url, "r1", ready, resume, out)
    )
    process.start()
    try:
        old = Claim(*ready.get(timeout=HANG_GUARD))
        assert process.pid is not None
        os.kill(process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + HANG_GUARD  # hang guard only
        new = None
        while new is None and time.monotonic() < deadline:
            new = store.replace_turn_slot_attempt("r1", old.attempt_id, "reconciler", 30)
            time.sleep(0.05)
        assert new is not None
        assert new.epoch == 2
        snapshot = (store.get_run("r1"), store.get_turn_slot("r1"), store.segments("k"))
        os.kill(process.pid, signal.SIGCONT)  # (a stopped waiter would block Event.set)
        resume.set()
        results = out.get(timeout=HANG_GUARD)
        process.join(HANG_GUARD)
        assert process.exitcode == 0
    finally:
        if process.is_alive():
            os.kill(process.pid, signal.SIGCONT)  # type: ignore[arg-type]
            process.kill()
    refused = Verdict.NOT_OWNER
    assert results == [
        ("renew", refused),
        ("phase", refused),
        ("commit", refused),
        ("consumed", refused),
        ("segment", refused),
        ("begin", refused),
        ("sandbox", refused),
        ("transcript", None),
        ("settle", refused),
    ]
    after = (store.get_run("r1"), store.get_turn_slot("r1"), store.segments("k"))
    assert after == snapshot
    assert store.active_path("s1") == []


def test_two_transcript_writers_lose_no_entry_and_one_wins_the_leaf(
    store: Store, database_url: str
) -> None:
    claim = claimed(store, "r1")
    barrier, out = SPAWN.Barrier(2), SPAWN.Queue()
    as_tuple = (claim.run_id, claim.attempt_id, claim.epoch)
    _run_processes(
        race_workers.transcript_writer,
        [(database_url, as_tuple, tag, 15, barrier, out) for tag in ("a", "b")],
    )
    verdicts = sorted(_drain(out, 2))
    assert sorted(v[1] for v in verdicts) == ["lost", "won"]
    path = store.active_path("s1")
    assert len(path) == 30
    for tag in ("a", "b"):
        mine = [e.entry_id for e in path if e.body["writer"] == tag]
        assert mine == [f"{tag}-{n}" for n in range(15)]
    assert [e.parent_id for e in path] == [None] + [e.entry_id for e in path[:-1]]


def test_admission_order_within_a_session_holds_under_concurrency(store: Store) -> None:
    """A head claimer racing eight admitters must claim runs in exact sequence order."""
    admitted: list[tuple[int, str]] = []
    lock = threading.Lock()
    done = threading.Event()

    def admitter(t: int) -> None:
        for n in range(6):
            run, _ = store.admit_run(f"t{t}-{n}", "s1", {"n": n}, max_attempts=1, deadline=None)
            with lock:
                admitted.append((run.seq, run.run_id))

    claimed_order: list[int] = []

    def head_claimer() -> None:
        while True:
            finished = done.is_set()
            queued = store.list_runs(status="queued", session_id="s1", limit=1000)
            for run in sorted(queued, key=lambda r: r.seq):
                claim = store.claim_run(run.run_id, "claimer", 30)
                if claim is not None:
                    claimed_order.append(run.seq)
                    assert store.settle_run(claim, "completed") is Verdict.DONE
            if finished and not queued:
                return

    claimer = threading.Thread(target=head_claimer)
    claimer.start()
    admitters = [threading.Thread(target=admitter, args=(t,)) for t in range(8)]
    for thread in admitters:
        thread.start()
    for thread in admitters:
        thread.join(HANG_GUARD)
    done.set()
    claimer.join(HANG_GUARD)
    assert not claimer.is_alive()
    assert claimed_order == sorted(seq for seq, _ in admitted)
    for t in range(8):
        mine = [run_id for _, run_id in sorted(admitted) if run_id.startswith(f"t{t}-")]
        assert mine == [f"t{t}-{n}" for n in range(6)]


def test_an_entry_appended_twice_concurrently_is_stored_once(store: Store) -> None:
    claim = claimed(store, "r1")
    barrier = threading.Barrier(4)
    results: list[str | None] = []

    def replay() -> None:
        barrier.wait(timeout=60)
        results.append(store.append_transcript(claim, "s1", [NewEntry("e1", "u", {})], None))

    threads = [threading.Thread(target=replay) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_GUARD)
    assert results == ["e1"] * 4
    assert [e.entry_id for e in store.active_path("s1")] == ["e1"]
