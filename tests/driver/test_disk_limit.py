"""A run whose agent fills its workspace past ``TURNKEEPER_SANDBOX_DISK`` fails with
``disk-limit``, and nothing else does (docs/architecture.md, "Limits").

The hog prints a line, writes four times the limit into its workspace (one file, which
RLIMIT_FSIZE stops at the limit; the watcher then stops the agent), and would sleep on
under a name of its own. A neighbour in another sandbox of the same worker, held
mid-output meanwhile, completes with its oracle's log.
"""

from __future__ import annotations

import secrets
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.driver.fleet import Fleet, held_agent, log_of_output, release_held, wait_held
from tests.driver.test_adoption import AGENT, PROMPT, assert_log_is_oracle
from tests.sshd import Sshd, sshd_unavailable
from tests.unavailable import cannot_run
from turnkeeper.chunks import Chunk
from turnkeeper.config import Settings
from turnkeeper.driver import lifecycle
from turnkeeper.sandbox.disk import file_limit
from turnkeeper.store.records import Run, RunStatus

MIB = 1024 * 1024
LIMIT = 16 * MIB
SLACK = 64 * 1024
"""Blocks beyond the file's own the workspace may hold: its directory, an extent block."""
FILLED = "the agent filled its workspace past its disk limit and was stopped"
HOG_STDERR = "File size limit exceeded\n"
"""The hog's own shell, on its ``head`` that RLIMIT_FSIZE stopped (SIGXFSZ)."""


def _hog() -> tuple[dict[str, Any], list[str]]:
    """The hog's spec, and the command line of its sleep (to look for afterwards)."""
    seconds = f"120.{secrets.randbelow(10**9):09d}"
    fill = f"echo start; head -c {4 * LIMIT} /dev/zero > big; exec sleep {seconds}"
    return {"command": ["/bin/sh", "-c", fill], "format": "text"}, ["sleep", seconds]


def _chunks(fleet: Fleet, run_id: str) -> list[Chunk]:
    stored = fleet.log_of(run_id)
    assert [seq for seq, _ in stored] == list(range(1, len(stored) + 1))
    return [chunk for _, chunk in stored]


def _stopped_log(run: Run, output: bytes) -> list[Chunk]:
    """The log of a text agent that printed ``output`` and was stopped at the limit."""
    printed = log_of_output(run.run_id, run.session_id, "text", output)[:-1]
    return [*printed, lifecycle.run_error(FILLED, "disk-limit")]


def _assert_stopped(run: Run, stderr: str = HOG_STDERR) -> int:
    """The run failed ``disk-limit`` with what the watcher measured; the bytes it saw."""
    assert run.status is RunStatus.FAILED, run.error
    assert isinstance(run.error, dict)
    error = dict(run.error)
    limits = error.pop("limits")
    assert error == {
        "reason": "disk-limit",
        "message": FILLED,
        "exit_code": 137,
        "stderr": stderr,
    }
    used = limits.pop("disk_bytes")
    assert limits == {
        "disk_limit_bytes": LIMIT,
        "disk_files": 2,  # the workspace and the hog's file
        "disk_file_limit": file_limit(LIMIT),
    }
    assert LIMIT < used <= LIMIT + SLACK, used
    return int(used)


def _wait_gone(cmdline: list[str]) -> None:
    """Until no process runs ``cmdline`` (a hang guard)."""
    deadline = time.monotonic() + 60
    while any(p.info["cmdline"] == cmdline for p in psutil.process_iter(["cmdline"])):
        assert time.monotonic() < deadline, f"{cmdline} outlived its run"
        time.sleep(0.05)


def _wait_removed(path: Path, timeout: float = 120.0) -> None:
    """Until ``path`` is gone: destroyed at the settle, or by the reaper (a hang guard)."""
    deadline = time.monotonic() + timeout
    while path.exists():
        assert time.monotonic() < deadline, f"{path} was never removed"
        time.sleep(0.1)


def _workspace_root(fleet: Fleet, session_id: str) -> Path:
    workspace = fleet.client.store.session_workspace(session_id)
    assert workspace is not None
    assert workspace.sandbox is not None
    return Path(str(workspace.sandbox["root"]))


@pytest.mark.slow
def test_an_agent_past_its_disk_limit_fails_its_run_and_no_other(
    settings: Settings, tmp_path: Path
) -> None:
    fleet = Fleet.create(settings, tmp_path / "logs", sandbox_disk=LIMIT, session_ttl=15.0)
    try:
        fleet.start_worker(concurrency=2)
        fleet.start_beat()
        token = secrets.token_hex(8)
        neighbour = fleet.client.submit(held_agent(AGENT, token, 2), PROMPT)
        wait_held(token)
        hog_spec, sleep = _hog()
        hog = fleet.client.submit(hog_spec, "fill it", session_id=f"disk-{token}")
        done = fleet.wait_settled(hog.run_id)
        _assert_stopped(done)
        assert _chunks(fleet, hog.run_id) == _stopped_log(done, b"start\n")
        _wait_gone(sleep)
        # The session keeps the workspace: the host holds the limit, not four times it.
        root = _workspace_root(fleet, done.session_id)
        assert (root / "workspace" / "big").stat().st_size == LIMIT
        # The neighbour, held all along in a sandbox of its own, goes on untouched.
        assert fleet.client.require(neighbour.run_id).status is RunStatus.RUNNING
        release_held(token)
        finished = fleet.wait_settled(neighbour.run_id)
        assert finished.status is RunStatus.COMPLETED, finished.error
        assert_log_is_oracle(fleet, finished, AGENT, tmp_path / "oracle")
        # Idle past the session's TTL, the workspace goes as any other.
        _wait_removed(root)
    finally:
        fleet.stop()


def test_the_next_run_in_a_workspace_past_its_limit_is_stopped_too(
    settings: Settings, tmp_path: Path
) -> None:
    """The hog's session keeps its full workspace: its next run is stopped at the
    watcher's first look, before it could add a byte (docs/architecture.md, "Limits")."""
    fleet = Fleet.create(settings, tmp_path / "logs", sandbox_disk=LIMIT)
    try:
        fleet.start_worker()
        hog_spec, sleep = _hog()
        first = fleet.client.submit(hog_spec, "fill it", session_id="full")
        filled = _assert_stopped(fleet.wait_settled(first.run_id))
        seconds = f"120.{secrets.randbelow(10**9):09d}"
        quiet = {"command": ["/bin/sh", "-c", f"exec sleep {seconds}"], "format": "text"}
        second = fleet.wait_settled(fleet.client.submit(quiet, "again", session_id="full").run_id)
        assert _assert_stopped(second, stderr="") == filled  # the same workspace, not a byte more
        assert _chunks(fleet, second.run_id) == _stopped_log(second, b"")
        _wait_gone(sleep)
        _wait_gone(["sleep", seconds])
    finally:
        fleet.stop()


def test_a_disk_limit_keeps_its_reason_after_a_takeover(settings: Settings, tmp_path: Path) -> None:
    """The owner dies before it settles a run the watcher stopped: the successor reads
    the watcher's verdict beside the journal, as the owner would have."""
    fleet = Fleet.create(settings, tmp_path / "logs", sandbox_disk=LIMIT, failpoints="settling")
    try:
        fleet.start_pair()
        hog_spec, sleep = _hog()
        run = fleet.client.submit(hog_spec, "fill it")
        fleet.wait_failpoint("settling")
        fleet.signal_worker_of(fleet.client.require(run.run_id), signal.SIGKILL)
        done = fleet.wait_settled(run.run_id)
        assert done.epoch == 2, fleet.dump_logs()
        _assert_stopped(done)
        assert _chunks(fleet, run.run_id) == _stopped_log(done, b"start\n")
        _wait_gone(sleep)
    finally:
        fleet.stop()


@pytest.fixture
def sshd(tmp_path: Path) -> Sshd:
    cannot_run(sshd_unavailable())
    return Sshd(tmp_path / "sshd")


def test_an_agent_on_an_ssh_host_past_its_disk_limit_fails_its_run(
    settings: Settings, sshd: Sshd, tmp_path: Path
) -> None:
    """The same writer, watcher and verdict on the sandbox host, read back over ssh; the
    one-shot run's sandbox is destroyed at its settle."""
    sshd.start()
    fleet = Fleet.create(
        settings,
        tmp_path / "logs",
        sandbox_provider="ssh",
        sandbox_disk=LIMIT,
        **sshd.settings(),
    )
    try:
        fleet.start_worker()
        hog_spec, sleep = _hog()
        run = fleet.client.submit(hog_spec, "fill it")
        done = fleet.wait_settled(run.run_id)
        _assert_stopped(done)
        assert _chunks(fleet, run.run_id) == _stopped_log(done, b"start\n")
        _wait_gone(sleep)
        assert done.sandbox_ref is not None
        _wait_removed(Path(done.sandbox_ref["sandbox"]["root"]))
    finally:
        fleet.stop()
        sshd.stop()
