"""A journal that exists and in which no writer ever ran, reached each of the three ways
(docs/architecture.md, "Journals that never started"):

- a worker SIGKILLed between creating the journal and starting its writer: the successor
  attaches to it (``after-prepare``);
- the spawn's reply lost after the journal was made: the retried spawn finds it made
  (``after-prepare=unreachable``);
- the writer's start lost: the first read stalls and no writer is alive
  (``after-prepare=lost``).

Each time the journal is disarmed, found lock-less, and the agent starts afresh in the
next journal: the agent runs once, the log is the crash-free one element by element, no
interruption mark, no continuation counted."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import ValidationError

from tests.driver.fleet import Fleet, expected_log
from tests.unremovable import unremovable
from turnkeeper.agents.spec import AgentSpec
from turnkeeper.config import Settings
from turnkeeper.driver import lifecycle
from turnkeeper.driver.placement import NEVER_STARTED, PlacedJournal, Placement, process_index
from turnkeeper.driver.replay import stored_chunks
from turnkeeper.errors import SandboxUnreachableError
from turnkeeper.sandbox import JournalHandle, JournalPaths, SandboxRef, provider_for
from turnkeeper.sandbox.journal import new_nonce, writer_argv
from turnkeeper.store.records import Run, RunStatus
from turnkeeper.workers.failpoints import failpoint, marker

SCRIPTED: dict[str, Any] = {"preset": "scripted", "turns": 2, "pace": 0.05, "seed": 5}
# Cannot continue; prints how often it ran in this workspace, so a second run shows.
COMMAND: dict[str, Any] = {
    "command": ["/bin/sh", "-c", "echo ran >> ran.txt; echo runs; wc -l < ran.txt"],
    "format": "text",
}
PROMPT = "start me once"
DISARM_FAILED = (
    "cannot remove the nonce file of a journal whose writer has not started: that writer "
    "may still start the agent, so no other agent process may start for the run"
)


@pytest.mark.parametrize("agent", [SCRIPTED, COMMAND], ids=["scripted", "command"])
def test_sigkill_between_prepare_and_start(
    settings: Any, database_url: str, tmp_path: Path, agent: dict[str, Any]
) -> None:
    """Path (a): the successor's ATTACH finds the journal never started."""
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="after-prepare")
    try:
        fleet.start_pair()
        run = fleet.client.submit(agent, PROMPT)
        reached = marker(fleet.settings, "after-prepare")
        while not reached.exists():
            time.sleep(0.05)
        owned = fleet.wait(run.run_id, lambda r: r.owner is not None, what="an owner")
        fleet.signal_worker_of(owned, signal.SIGKILL)
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert (done.epoch, done.attempt_count) == (2, 2)
        assert_started_once(fleet, done, agent, tmp_path / "oracle", database_url)
    finally:
        fleet.stop()


@pytest.mark.parametrize("agent", [SCRIPTED, COMMAND], ids=["scripted", "command"])
def test_spawn_reply_lost_after_prepare(
    settings: Any, database_url: str, tmp_path: Path, agent: dict[str, Any]
) -> None:
    """Path (b): the spawn made the journal, its reply was lost before the writer's start;
    the sandbox retry spawns again, finds the journal made (``journal.already_started``),
    and the same attempt finds it never started. Without that check the stall check of
    path (c) would still restart the agent, a stall timeout later, with the same log and
    placement: only the worker's events tell the two paths apart."""
    fleet = Fleet.create(settings, tmp_path / "logs", failpoints="after-prepare=unreachable")
    try:
        fleet.start_worker()
        fleet.start_beat()
        run = fleet.client.submit(agent, PROMPT)
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert (done.epoch, done.attempt_count) == (1, 1)
        assert path_events(fleet, run.run_id) == [
            "failpoint.reached",
            "journal.already_started",
            "journal.never_started",  # the attempt's decision
            "journal.never_started",  # recorded with the next journal
            "journal.spawned",
        ], fleet.dump_logs()
        assert_started_once(fleet, done, agent, tmp_path / "oracle", database_url)
    finally:
        fleet.stop()


@pytest.mark.parametrize("agent", [SCRIPTED, COMMAND], ids=["scripted", "command"])
def test_writer_start_lost(
    settings: Any, database_url: str, tmp_path: Path, agent: dict[str, Any]
) -> None:
    """Path (c): the writer's start never reached the sandbox; the first read delivers no
    byte within the stall timeout, no writer is alive (``journal-stalled``), and the give-up
    finds the journal never started instead of giving a process up."""
    fleet = Fleet.create(
        settings, tmp_path / "logs", failpoints="after-prepare=lost", journal_stall_timeout=3.0
    )
    try:
        fleet.start_worker()
        fleet.start_beat()
        run = fleet.client.submit(agent, PROMPT)
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert (done.epoch, done.attempt_count) == (1, 1)
        assert path_events(fleet, run.run_id) == [
            "failpoint.reached",
            "journal.start_skipped",
            "journal.lost",  # journal-stalled
            "journal.never_started",
            "journal.never_started",
            "journal.spawned",
        ], fleet.dump_logs()
        assert [
            e["reason"]
            for e in fleet.events("journal.lost", run_id=run.run_id, files="worker-*.log")
        ] == ["journal-stalled"]
        assert_started_once(fleet, done, agent, tmp_path / "oracle", database_url)
    finally:
        fleet.stop()


def test_a_nonce_the_disarm_cannot_remove_starts_no_second_agent(
    settings: Any, tmp_path: Path
) -> None:
    """Path (a), with a nonce file the successor's disarm cannot remove: the journal's
    writer may still start, so the journal is followed, never restarted in the next one.
    The frozen predecessor's writer, launched late, finds its nonce and runs the agent:
    once, in the first journal, and the run ends with it."""
    # The follow waits for the late writer's first byte as long as a hang guard.
    fleet = Fleet.create(
        settings, tmp_path / "logs", failpoints="after-prepare", journal_stall_timeout=120.0
    )
    try:
        fleet.start_pair()
        run = fleet.client.submit(COMMAND, PROMPT)
        reached = marker(fleet.settings, "after-prepare")
        while not reached.exists():
            time.sleep(0.05)
        owned = fleet.wait(run.run_id, lambda r: r.owner is not None, what="an owner")
        first = Placement.of(owned).journals[0].handle
        with unremovable(Path(first.paths.nonce_file)):
            fleet.signal_worker_of(owned, signal.SIGKILL)
            decided = fleet.wait(
                run.run_id,
                lambda r: len(Placement.of(r).journals) > 1 or _disarm_failed(fleet, r.run_id),
                what="the successor's decision on the first journal",
            )
            assert [(j.handle.paths.process, j.lost) for j in Placement.of(decided).journals] == [
                (1, None)
            ], fleet.dump_logs()
        sandbox = provider_for(first.ref.provider, fleet.settings).resume(first.ref)
        assert sandbox is not None
        late = sandbox.launch(first.paths, AgentSpec.from_payload(COMMAND).start_command())
        sandbox.start_detached(
            writer_argv(
                first.paths,
                late.code,
                journal_max_bytes=first.ref.spec.journal_max_bytes,
                after_exit=late.after_exit,
            )
        )
        done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.COMPLETED, (done.error, fleet.dump_logs())
        assert (done.epoch, done.attempt_count) == (2, 2)
        oracle = expected_log(done.run_id, done.session_id, COMMAND, PROMPT, tmp_path / "oracle")
        assert [chunk for _, chunk in fleet.log_of(done.run_id)] == oracle
        # The agent counts its runs in its workspace: the log says "1", and one journal.
        assert [(j.handle.paths.process, j.lost) for j in Placement.of(done).journals] == [
            (1, None)
        ]
    finally:
        fleet.stop()


@pytest.mark.parametrize("agent", [SCRIPTED, COMMAND], ids=["scripted", "command"])
def test_a_stalled_journal_the_disarm_cannot_remove_fails_the_run(
    settings: Any, database_url: str, tmp_path: Path, agent: dict[str, Any]
) -> None:
    """Path (c), with a nonce file that cannot be removed: the journal stalls, and giving
    its process up for a continuation would leave a writer that can still start the agent
    beside the next one. The run fails instead (``disarm-failed``); no agent ran."""
    fleet = Fleet.create(
        settings, tmp_path / "logs", failpoints="after-prepare=lost", journal_stall_timeout=3.0
    )
    try:
        fleet.start_worker()
        fleet.start_beat()
        run = fleet.client.submit(agent, PROMPT)
        reached = marker(fleet.settings, "after-prepare")
        while not reached.exists():
            time.sleep(0.05)
        first = (
            Placement.of(fleet.wait(run.run_id, lambda r: r.sandbox_ref is not None))
            .journals[0]
            .handle
        )
        with unremovable(Path(first.paths.nonce_file)):
            done = fleet.wait_settled(run.run_id)
        assert done.status is RunStatus.FAILED, (done.error, fleet.dump_logs())
        assert done.error == {"reason": "disarm-failed", "message": DISARM_FAILED}
        assert [chunk for _, chunk in fleet.log_of(done.run_id)] == [
            lifecycle.run_started(done.run_id, done.session_id),
            lifecycle.run_error(DISARM_FAILED, "disarm-failed"),
        ]
        assert [(j.handle.paths.process, j.lost) for j in Placement.of(done).journals] == [
            (1, None)
        ]
        assert path_events(fleet, run.run_id) == [
            "failpoint.reached",
            "journal.start_skipped",
            "journal.lost",
            "journal.disarm_failed",  # the never-started check
            "journal.disarm_failed",  # the give-up's own disarm
        ], fleet.dump_logs()
        with psycopg.connect(database_url) as conn:
            stored = conn.execute(
                "SELECT count(*) FROM segments WHERE run_id = %s", (done.run_id,)
            ).fetchone()
        assert stored == (0,), "no agent process wrote"
    finally:
        fleet.stop()


def _disarm_failed(fleet: Fleet, run_id: str) -> bool:
    return bool(fleet.events("journal.disarm_failed", run_id=run_id, files="worker-*.log"))


def assert_started_once(
    fleet: Fleet, done: Run, agent: dict[str, Any], workdir: Path, database_url: str
) -> None:
    """The agent ran once, in the second journal; the log is the crash-free one, from the
    log and from Postgres alone; the first journal is no process."""
    oracle = expected_log(done.run_id, done.session_id, agent, PROMPT, workdir)
    stored = fleet.log_of(done.run_id)
    assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
    assert [chunk for _, chunk in stored] == oracle
    assert list(stored_chunks(fleet.client.store, done)) == oracle

    journals = Placement.of(done).journals
    assert [(j.handle.paths.process, j.lost) for j in journals] == [
        (1, NEVER_STARTED),
        (2, None),
    ]
    assert Placement.of(done).continuations == 0
    with psycopg.connect(database_url) as conn:
        keys = conn.execute(
            "SELECT DISTINCT journal_key FROM segments WHERE run_id = %s", (done.run_id,)
        ).fetchall()
    assert keys == [(journals[1].journal_key,)], "one agent process wrote, the second"


PATH_EVENTS = {
    "failpoint.reached",
    "journal.start_skipped",
    "journal.spawned",
    "journal.already_started",
    "journal.lost",
    "journal.never_started",
    "journal.disarm_failed",
}


def path_events(fleet: Fleet, run_id: str) -> list[str]:
    """The run's journal events: which way it reached the journal that never started."""
    return [
        record["event"]
        for record in fleet.events(*PATH_EVENTS, run_id=run_id, files="worker-*.log")
    ]


def _journal(process: int, lost: str | None) -> PlacedJournal:
    ref = SandboxRef("local", "box", "/srv/box")
    paths = JournalPaths(ref.journal_dir, "run-1", process)
    return PlacedJournal(JournalHandle(ref, paths, new_nonce()), lost)


def test_a_journal_that_never_started_is_no_process() -> None:
    """It counts no continuation and shifts no later mark's number; a real loss does both."""
    journals = [
        _journal(1, NEVER_STARTED),
        _journal(2, "agent-vanished"),
        _journal(3, NEVER_STARTED),
        _journal(4, None),
    ]
    placement = Placement(journals[0].handle.ref, journals)
    assert [j.given_up for j in journals] == [False, True, False, False]
    assert [process_index(journals, i) for i in range(4)] == [0, 0, 1, 1]
    assert placement.continuations == 1


# --- the failpoint modes these tests use, each firing once per data directory ---------


def _settings(tmp_path: Path, failpoints: str) -> Settings:
    return Settings(data_dir=tmp_path, failpoints=failpoints)


def test_a_failpoint_unset_or_unlisted_never_fires(tmp_path: Path) -> None:
    assert failpoint(_settings(tmp_path, ""), "after-prepare", "run-1") is False
    listed = _settings(tmp_path, "before-spawn,sentinel-stored=lost")
    assert failpoint(listed, "after-prepare", "run-1") is False
    assert failpoint(listed, "sentinel", "run-1") is False  # a prefix is no match
    assert not (tmp_path / "failpoints").exists()


def test_failpoint_lost_answers_true_once(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "before-spawn,after-prepare=lost")
    assert [failpoint(settings, "after-prepare", "run-1") for _ in range(3)] == [
        True,
        False,
        False,
    ]
    assert marker(settings, "after-prepare").read_text().split()[1] == "run-1"


def test_failpoint_unreachable_raises_once(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "after-prepare=unreachable")
    with pytest.raises(SandboxUnreachableError) as raised:
        failpoint(settings, "after-prepare", "run-1")
    assert (raised.value.run_id, raised.value.reason) == ("run-1", "failpoint")
    assert failpoint(settings, "after-prepare", "run-1") is False


def test_an_unknown_failpoint_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown mode 'late'"):
        failpoint(_settings(tmp_path, "after-prepare=late"), "after-prepare", "run-1")
    with pytest.raises(ValidationError):
        _settings(tmp_path, "after-prepare=Lost")
