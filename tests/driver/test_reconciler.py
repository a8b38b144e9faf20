"""The reconciler against real Postgres and Redis: races, budgets, lost enqueues, cancel."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.driver.fleet import Fleet
from tests.driver.test_takeover import AGENT, PROMPT
from turnkeeper import reconciler
from turnkeeper.config import Settings
from turnkeeper.driver.replay import StoredLog
from turnkeeper.embedded.ports import free_port
from turnkeeper.store.records import RunStatus, Verdict
from turnkeeper.workers.runtime import WorkerRuntime


@pytest.fixture
def runtime(settings: Settings) -> Iterator[WorkerRuntime]:
    rt = WorkerRuntime.open(
        settings.model_copy(update={"lease_ttl": 5.0, "requeue_after": 0.2}), StoredLog
    )
    yield rt
    rt.close()


def _expired_run(rt: WorkerRuntime, run_id: str, *, max_attempts: int = 5) -> None:
    rt.store.admit_run(
        run_id, run_id, {"agent": AGENT, "prompt": PROMPT}, max_attempts=max_attempts, deadline=None
    )
    claim = rt.store.claim_run(run_id, "owner-that-died", 0.05)
    assert claim is not None
    rt.log.fence(run_id, claim.epoch)  # the log is made from Postgres: its RUN_STARTED
    assert [chunk for _, chunk in rt.log.snapshot(run_id)] == [
        {"type": "RUN_STARTED", "threadId": run_id, "runId": run_id}
    ]
    time.sleep(0.1)


def test_ten_reconcilers_racing_hand_a_run_over_once(settings: Settings) -> None:
    # requeue_after far above the race: a pass that starts late must not find the
    # message already stale and send it again (that is redispatch, tested below).
    runtime = WorkerRuntime.open(
        settings.model_copy(update={"lease_ttl": 5.0, "requeue_after": 60.0}), StoredLog
    )
    try:
        _race_hands_over_once(runtime)
    finally:
        runtime.close()


def _race_hands_over_once(runtime: WorkerRuntime) -> None:
    _expired_run(runtime, "race-1")
    takeovers: list[tuple[str, str, int]] = []
    barrier = threading.Barrier(10)

    def one() -> None:
        barrier.wait()
        reconciler.reconcile(
            runtime,
            enqueue_takeover=lambda *args: takeovers.append(args),
            enqueue_run=lambda run_id: None,
        )

    threads = [threading.Thread(target=one) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run = runtime.store.get_run("race-1")
    assert run is not None
    assert takeovers == [("race-1", run.attempt_id, 2)]
    # Handed over, not adopted: the attempt is not counted and holds no lease yet.
    assert (run.epoch, run.attempt_count, run.status) == (2, 1, RunStatus.RUNNING)
    assert (run.owner, run.lease_expires_at) == (None, None)
    assert run.awaiting_adoption
    assert runtime.log.state("race-1").epoch == 2, "the dead owner's appends are refused now"


def _handed_over(rt: WorkerRuntime, run_id: str, **admit: Any) -> tuple[str, int]:
    """An expired run handed over by one reconcile: its pending (attempt_id, epoch)."""
    _expired_run(rt, run_id, **admit)
    sent: list[tuple[str, str, int]] = []
    reconciler.reconcile(rt, enqueue_takeover=lambda *a: sent.append(a), enqueue_run=_no_run)
    assert [args[0] for args in sent] == [run_id]
    return sent[0][1], sent[0][2]


def _no_run(run_id: str) -> None:
    pytest.fail(f"nothing queued, yet {run_id} was")


def test_duplicate_takeover_messages_adopt_once(runtime: WorkerRuntime) -> None:
    attempt_id, epoch = _handed_over(runtime, "dup-1")
    barrier = threading.Barrier(8)
    adopted: list[Any] = []

    def one(index: int) -> None:
        barrier.wait()
        claim = runtime.store.adopt_attempt("dup-1", attempt_id, f"worker-{index}", 5)
        adopted.append((f"worker-{index}", claim))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wins = [(owner, claim) for owner, claim in adopted if claim is not None]
    assert [(c.run_id, c.attempt_id, c.epoch) for _, c in wins] == [("dup-1", attempt_id, epoch)]
    assert len(adopted) == 8
    run = runtime.store.get_run("dup-1")
    assert run is not None
    assert (run.epoch, run.attempt_count, run.awaiting_adoption) == (2, 2, False)
    assert run.owner == wins[0][0]
    assert run.lease_expires_at is not None
    # A late delivery of the same message, once adopted, adopts nothing either.
    assert runtime.store.adopt_attempt("dup-1", attempt_id, "late", 5) is None


def test_a_pass_does_not_send_again_what_it_has_just_handed_over(settings: Settings) -> None:
    """However long fencing and sending take (requeue_after 0 stands for a slow pass),
    the run handed over in a pass gets one message from it, not a second at once."""
    rt = WorkerRuntime.open(
        settings.model_copy(update={"lease_ttl": 5.0, "requeue_after": 0.0}), StoredLog
    )
    try:
        _expired_run(rt, "slow-pass")
        sent: list[tuple[str, str, int]] = []
        report = reconciler.reconcile(
            rt, enqueue_takeover=lambda *a: sent.append(a), enqueue_run=_no_run
        )
        run = rt.store.get_run("slow-pass")
        assert run is not None
        assert sent == [("slow-pass", run.attempt_id, 2)]
        assert (report.taken_over, report.redispatched) == (1, 0)
        # The next pass finds the message older than requeue_after: sent again, once.
        reconciler.reconcile(rt, enqueue_takeover=lambda *a: sent.append(a), enqueue_run=_no_run)
        assert sent == [("slow-pass", run.attempt_id, 2)] * 2
    finally:
        rt.close()


def test_a_lost_takeover_is_sent_again_without_spending_an_attempt(
    runtime: WorkerRuntime,
) -> None:
    attempt_id, epoch = _handed_over(runtime, "wait-1", max_attempts=2)
    sent: list[tuple[str, str, int]] = []
    for _ in range(3):  # requeue_after is 0.2 s here: each sweep finds the message stale
        time.sleep(0.3)
        report = reconciler.reconcile(
            runtime, enqueue_takeover=lambda *a: sent.append(a), enqueue_run=_no_run
        )
        assert (report.taken_over, report.redispatched, report.failed) == (0, 1, 0)
    assert sent == [("wait-1", attempt_id, epoch)] * 3, "same attempt, same epoch"
    run = runtime.store.get_run("wait-1")
    assert run is not None
    assert (run.epoch, run.attempt_count, run.status) == (2, 1, RunStatus.RUNNING)
    # However long it waited, the handed-over attempt is still there to adopt.
    claim = runtime.store.adopt_attempt("wait-1", attempt_id, "worker", 5)
    assert claim is not None
    assert runtime.store.get_run("wait-1").attempt_count == 2  # type: ignore[union-attr]


def test_a_cancel_settles_a_run_awaiting_adoption(runtime: WorkerRuntime) -> None:
    attempt_id, _ = _handed_over(runtime, "pending-cancel")
    assert runtime.store.request_cancel("pending-cancel") is not None
    assert runtime.store.adopt_attempt("pending-cancel", attempt_id, "worker", 5) is None
    report = reconciler.reconcile(
        runtime, enqueue_takeover=lambda *a: pytest.fail("no takeover"), enqueue_run=_no_run
    )
    assert report.failed == 1
    run = runtime.store.get_run("pending-cancel")
    assert run is not None
    assert (run.status, run.attempt_count, run.awaiting_adoption) == (RunStatus.ABORTED, 1, False)
    assert run.error == {
        "reason": "cancelled",
        "message": "the run was cancelled and its owner is gone",
    }
    assert [chunk for _, chunk in runtime.log.snapshot("pending-cancel")] == [
        {"type": "RUN_STARTED", "threadId": "pending-cancel", "runId": "pending-cancel"},
        {"type": "RUN_ERROR", "message": run.error["message"], "code": "cancelled"},
    ]
    assert runtime.log.state("pending-cancel").closed


def test_a_deadline_settles_a_run_awaiting_adoption(runtime: WorkerRuntime) -> None:
    runtime.store.admit_run(
        "pending-late", "pending-late", {"agent": AGENT}, max_attempts=5, deadline=0.6
    )
    claim = runtime.store.claim_run("pending-late", "owner-that-died", 0.05)
    assert claim is not None
    time.sleep(0.1)
    sent: list[tuple[str, str, int]] = []
    reconciler.reconcile(runtime, enqueue_takeover=lambda *a: sent.append(a), enqueue_run=_no_run)
    assert [args[0] for args in sent] == ["pending-late"]
    time.sleep(0.6)  # past the deadline, still awaiting adoption
    assert runtime.store.adopt_attempt("pending-late", sent[0][1], "worker", 5) is None
    reconciler.reconcile(
        runtime, enqueue_takeover=lambda *a: pytest.fail("no takeover"), enqueue_run=_no_run
    )
    run = runtime.store.get_run("pending-late")
    assert run is not None
    assert (run.status, run.attempt_count) == (RunStatus.FAILED, 1)
    assert run.error == {"reason": "deadline-exceeded", "message": "the run passed its deadline"}
    # The run was claimed in the store alone, so its log is the one Postgres defines.
    assert [chunk for _, chunk in runtime.log.snapshot("pending-late")] == [
        {"type": "RUN_STARTED", "threadId": "pending-late", "runId": "pending-late"},
        {
            "type": "RUN_ERROR",
            "message": "the run passed its deadline",
            "code": "deadline-exceeded",
        },
    ]


def test_a_run_out_of_attempts_fails_with_an_error_chunk(runtime: WorkerRuntime) -> None:
    _expired_run(runtime, "spent-1", max_attempts=1)
    report = reconciler.reconcile(
        runtime,
        enqueue_takeover=lambda *a: pytest.fail("no takeover"),
        enqueue_run=lambda run_id: pytest.fail("nothing queued"),
    )
    assert report.failed == 1
    run = runtime.store.get_run("spent-1")
    assert run is not None
    assert run.status is RunStatus.FAILED
    chunks = [chunk for _, chunk in runtime.log.snapshot("spent-1")]
    assert chunks[0]["type"] == "RUN_STARTED"
    assert chunks[1:] == [
        {"type": "RUN_ERROR", "message": run.error["message"], "code": run.error["reason"]}
    ]
    state = runtime.log.state("spent-1")
    assert state.closed
    assert state.epoch == 2, "the dead owner's epoch is fenced off"
    # A second sweep changes nothing.
    reconciler.reconcile(
        runtime,
        enqueue_takeover=lambda *a: pytest.fail("no takeover"),
        enqueue_run=lambda run_id: pytest.fail("nothing queued"),
    )
    assert len(runtime.log.snapshot("spent-1")) == 2


def test_a_lost_enqueue_is_sent_again(runtime: WorkerRuntime) -> None:
    runtime.store.admit_run(
        "lost-1", "lost-1", {"agent": AGENT, "prompt": PROMPT}, max_attempts=3, deadline=None
    )
    time.sleep(0.3)
    sent: list[str] = []
    reconciler.reconcile(runtime, enqueue_takeover=lambda *a: None, enqueue_run=sent.append)
    reconciler.reconcile(runtime, enqueue_takeover=lambda *a: None, enqueue_run=sent.append)
    assert sent == ["lost-1"], "sent once, then marked dispatched"


def test_cancel_stops_a_running_agent_within_a_heartbeat(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_worker()
    fleet.start_beat()
    slow = {**AGENT, "turns": 6, "pace": 0.2}
    run = fleet.client.submit(slow, PROMPT)
    fleet.wait_chunks(run.run_id, 5)
    placed = fleet.client.require(run.run_id).sandbox_ref  # the reaper may forget it later
    fleet.client.cancel(run.run_id)
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.ABORTED
    chunks = [chunk for _, chunk in fleet.log_of(run.run_id)]
    assert chunks[-1] == {
        "type": "RUN_ERROR",
        "message": "the run was cancelled",
        "code": "cancelled",
    }
    assert fleet.client.log.state(run.run_id).closed
    root = Path(placed["sandbox"]["root"])  # type: ignore[index]
    assert not root.exists(), "the sandbox (and its agent) is gone"


def test_cancel_of_a_queued_run_is_immediate(runtime: WorkerRuntime) -> None:
    runtime.store.admit_run(
        "queued-1", "queued-1", {"agent": AGENT, "prompt": PROMPT}, max_attempts=3, deadline=None
    )
    run = runtime.store.request_cancel("queued-1")
    assert run is not None
    assert run.status is RunStatus.ABORTED


def test_cancel_of_a_queued_run_ends_its_log(fleet: Fleet) -> None:
    run = fleet.client.submit(AGENT, PROMPT)  # no worker: it stays queued
    fleet.client.cancel(run.run_id)
    # The final chunk carries the reason and message the run was settled with.
    assert list(fleet.client.events(run.run_id)) == [
        (1, {"type": "RUN_ERROR", "message": "cancelled before it started", "code": "cancelled"})
    ]


def test_a_live_run_past_its_deadline_is_stopped(fleet: Fleet) -> None:
    fleet.start_worker()
    fleet.wait_ready()  # a worker still booting could find the run past its deadline
    slow = {**AGENT, "turns": 8, "pace": 0.2}
    run = fleet.client.submit(slow, PROMPT, timeout=2.0)
    done = fleet.wait_settled(run.run_id)
    assert done.status is RunStatus.FAILED
    assert done.error == {"reason": "deadline-exceeded", "message": "the run passed its deadline"}
    chunks = [chunk for _, chunk in fleet.log_of(run.run_id)]
    assert chunks[0]["type"] == "RUN_STARTED"
    assert chunks[-1] == {
        "type": "RUN_ERROR",
        "message": "the run passed its deadline",
        "code": "deadline-exceeded",
    }
    assert fleet.client.log.state(run.run_id).closed


def test_reap_ends_the_open_log_of_a_settled_run(runtime: WorkerRuntime) -> None:
    """A run settled while its log stayed open (its closer died) gets its log ended."""
    _expired_run(runtime, "open-1")
    run = runtime.store.get_run("open-1")
    assert run is not None
    claim = runtime.store.replace_turn_slot_attempt("open-1", str(run.attempt_id), "x", 5)
    assert claim is not None
    error = {"reason": "agent-exit", "message": "the agent exited with code 3"}
    assert runtime.store.settle_run(claim, RunStatus.FAILED, error) is Verdict.DONE
    report = reconciler.reap(runtime)
    assert report.logs_ended == 1
    chunks = [chunk for _, chunk in runtime.log.snapshot("open-1")]
    assert chunks[-1] == {"type": "RUN_ERROR", "message": error["message"], "code": "agent-exit"}
    assert runtime.log.state("open-1").closed
    assert reconciler.reap(runtime).logs_ended == 0


def test_a_forced_handoff_takes_a_run_awaiting_adoption(runtime: WorkerRuntime) -> None:
    attempt_id, epoch = _handed_over(runtime, "forced-1")
    # No lease runs, so none has expired: only a forced handoff takes it.
    assert runtime.store.replace_turn_slot_attempt("forced-1", attempt_id, "op", 5) is None
    forced = runtime.store.replace_turn_slot_attempt(
        "forced-1", attempt_id, "op", 5, only_if_expired=False
    )
    assert forced is not None
    assert forced.epoch == epoch + 1
    run = runtime.store.get_run("forced-1")
    assert run is not None
    assert (run.owner, run.attempt_count, run.awaiting_adoption) == ("op", 2, False)
    assert runtime.store.adopt_attempt("forced-1", attempt_id, "late", 5) is None


def test_a_log_redis_down_does_not_stop_the_handovers(
    runtime: WorkerRuntime, settings: Settings
) -> None:
    """With the log's Redis unreachable, a run out of attempts is still settled and an
    expired one still handed over in the same sweep; the reaper closes the settled run's
    log once Redis answers again."""
    _expired_run(runtime, "spent-2", max_attempts=1)
    _expired_run(runtime, "expired-2")
    down = WorkerRuntime.open(
        runtime.settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"}),
        StoredLog,
    )
    sent: list[tuple[str, str, int]] = []
    try:
        report = reconciler.reconcile(
            down, enqueue_takeover=lambda *a: sent.append(a), enqueue_run=lambda run_id: None
        )
    finally:
        down.close()
    assert (report.failed, report.taken_over) == (1, 1)
    assert [(run_id, epoch) for run_id, _, epoch in sent] == [("expired-2", 2)]
    spent = runtime.store.get_run("spent-2")
    assert spent is not None
    assert spent.status is RunStatus.FAILED
    assert reconciler.reap(runtime).logs_ended == 1
    chunks = [chunk for _, chunk in runtime.log.snapshot("spent-2")]
    assert chunks == [
        {"type": "RUN_STARTED", "threadId": "spent-2", "runId": "spent-2"},
        {"type": "RUN_ERROR", "message": spent.error["message"], "code": spent.error["reason"]},
    ]
    assert runtime.log.state("spent-2").closed
