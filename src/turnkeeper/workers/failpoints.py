"""Failpoints: named places where a worker can be made to fail, for crash tests.

Crash tests must fail a worker at an exact phase boundary (after the claim but
before the spawn, after the sentinel but before the commit); those windows are
too short to hit with a timer. The points:

- ``before-spawn``: the run claimed, its agent not spawned yet;
- ``lease-confirmed``: the store renewed the lease right before a spawn
  (``Attempt._confirm_lease``), the journal not prepared yet: an owner paused here
  past its lease must find, woken, that its successor claimed the journal;
- ``after-prepare``: the journal made, its writer not started yet
  (``runner.spawn_journaled``);
- ``spawned``: the agent's writer started, its start not recorded in the turn slot
  yet (``Attempt._spawn``): a successor classifies such a journal as never started;
- ``adopted``: a takeover adopted its run and fenced the log, the run not read
  yet (``driver.attempt._own``): what it finds there (a cancel) decides its recovery;
- ``segment-stored``: journal bytes stored in Postgres, their chunks not appended
  to the log yet (``Attempt._consume``);
- ``classified``: a takeover classified what survived (``Attempt.drive``), its
  recovery not begun: what changes now (a sandbox that goes) meets the recovery;
- ``after-sentinel``: the sentinel read, not stored yet;
- ``sentinel-stored``: the sentinel stored, the turn not committed yet;
- ``settling``: the owner's heartbeat stopped, its settle not written yet
  (``Attempt._settle``): its lease runs out from here if it stays;
- ``settled``: the run settled, its final chunk not appended yet;
- ``crash-handed``: the crash watcher handed a run over, its takeover message not
  sent yet (``watcher.CrashWatcher.sweep``).

``TURNKEEPER_FAILPOINTS`` lists the points that fire, comma-separated, each with
an optional mode after ``=``:

- no mode (``before-spawn``): the worker writes ``<data_dir>/failpoints/<point>``
  and waits there for the test to SIGKILL it;
- ``unreachable`` (``after-prepare=unreachable``): the worker's call to the
  sandbox fails there with ``SandboxUnreachableError``, as when the sandbox did the
  work and its reply was lost; the sandbox retry runs the call again;
- ``lost`` (``after-prepare=lost``): the step that follows is skipped, as when it
  never reached the sandbox; at ``after-prepare`` that is the writer's start, so
  the journal exists and no writer ever runs in it. Only the points whose caller
  acts on the answer (``after-prepare``) can lose a step;
- ``pause`` (``settling=pause``): the worker writes the marker and waits until the
  test lets it go (``release``), then goes on: an owner that is slow there, or
  frozen there (SIGSTOP) and woken later, rather than dead.

Each failpoint fires once per data directory (the marker file says it fired): the
retry, or the successor, passes the same point. Unset (the default), a failpoint
costs one string comparison.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import structlog

from turnkeeper.config import Settings
from turnkeeper.errors import SandboxUnreachableError

log = structlog.get_logger(__name__)

MODES = ("", "unreachable", "lost", "pause")
_PAUSE_POLL = 0.05


def failpoint(settings: Settings, name: str, run_id: str) -> bool:
    """Fire the point ``name`` when it is set: block, raise, or answer True (``lost``:
    skip the step that follows). False when it does not fire."""
    if not settings.failpoints:
        return False
    mode = _mode(settings.failpoints, name)
    if mode is None or not _first_time(settings, name, run_id):
        return False  # not set, or fired before: a retry or a successor goes on
    log.warning("failpoint.reached", name=name, mode=mode, run_id=run_id, pid=os.getpid())
    if mode == "unreachable":
        raise SandboxUnreachableError(
            f"failpoint {name}: the sandbox's reply was lost", run_id=run_id, reason="failpoint"
        )
    if mode == "lost":
        return True
    if mode == "pause":
        go = _released(settings, name)
        while not go.exists():
            time.sleep(_PAUSE_POLL)
        log.warning("failpoint.resumed", name=name, run_id=run_id, pid=os.getpid())
        return False
    while True:  # until the test kills this process
        time.sleep(3600)


def marker(settings: Settings, name: str) -> Path:
    return settings.data_dir / "failpoints" / name


def release(settings: Settings, name: str) -> None:
    """Let a worker paused at ``name`` (mode ``pause``) go on."""
    path = _released(settings, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def _released(settings: Settings, name: str) -> Path:
    return settings.data_dir / "failpoints" / f"{name}.released"


def _mode(failpoints: str, name: str) -> str | None:
    for entry in failpoints.split(","):
        point, _, mode = entry.partition("=")
        if point == name:
            if mode not in MODES:
                raise ValueError(f"failpoint {name}: unknown mode {mode!r} (one of {MODES})")
            return mode
    return None


def _first_time(settings: Settings, name: str, run_id: str) -> bool:
    path = marker(settings, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(f"{os.getpid()} {run_id}\n")
    return True
