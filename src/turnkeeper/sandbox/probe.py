"""Questions about a journal that never read it whole: did it end, and how; and cleanup.

The exit probe reads a bounded tail (4 KiB) and looks for this run's sentinel from
the end; when there is none it asks whether the writer still holds its lock, so a
reaper can tell ``producing`` from ``vanished``. Cleanup removes an agent process's
files only once its sentinel is there, never before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import structlog

from turnkeeper.errors import JournalError, SandboxError
from turnkeeper.sandbox.journal import (
    EXIT_PROBE_BYTES,
    LIVENESS_FREE,
    STDERR_TAIL_BYTES,
    JournalPaths,
    cleanup_argv,
    find_exit,
    liveness_argv,
    tail_argv,
)
from turnkeeper.sandbox.provider import Sandbox

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ExitProbe:
    """``finished`` (with its exit code), ``producing`` (also: not started yet, the
    safe answer), ``vanished`` (writer gone, no sentinel) or ``unknown`` (probe failed)."""

    state: Literal["finished", "producing", "vanished", "unknown"]
    exit_code: int | None = None
    error: str | None = None


def probe_exit(
    sandbox: Sandbox, paths: JournalPaths, nonce: str, *, max_bytes: int = EXIT_PROBE_BYTES
) -> ExitProbe:
    try:
        code = _tail_exit(sandbox, paths, nonce, max_bytes)
        if code is not None:
            return ExitProbe("finished", code)
        alive = sandbox.exec(liveness_argv(paths), timeout=30)
        if alive.exit_code != LIVENESS_FREE:
            return ExitProbe("producing")
        # The sentinel is written before the lock is released: look once more.
        code = _tail_exit(sandbox, paths, nonce, max_bytes)
    except SandboxError as exc:
        return ExitProbe("unknown", error=str(exc))
    return ExitProbe("vanished") if code is None else ExitProbe("finished", code)


def _tail_exit(sandbox: Sandbox, paths: JournalPaths, nonce: str, max_bytes: int) -> int | None:
    tail = sandbox.exec(tail_argv(paths.journal, max_bytes), timeout=30)
    return find_exit(tail.stdout, nonce)


def stderr_tail(sandbox: Sandbox, paths: JournalPaths, max_bytes: int = STDERR_TAIL_BYTES) -> bytes:
    """The last bytes of the agent's stderr; empty when unreadable (never fails a run)."""
    try:
        return sandbox.exec(tail_argv(paths.stderr, max_bytes), timeout=30).stdout
    except SandboxError:
        return b""


def cleanup_journal(sandbox: Sandbox, paths: JournalPaths, nonce: str) -> None:
    """Remove the agent process's files; refuses unless its sentinel is in the journal."""
    probe = probe_exit(sandbox, paths, nonce)
    if probe.state != "finished":
        raise JournalError(
            "refusing to remove a journal without its exit sentinel",
            run_id=paths.run_id,
            reason="no-sentinel",
            probe=probe.state,
        )
    result = sandbox.exec(cleanup_argv(paths), timeout=30)
    if result.exit_code != 0:
        raise JournalError(
            "cannot remove the journal files", run_id=paths.run_id, reason="cleanup-failed"
        )
    log.info("journal.cleaned", run_id=paths.run_id, process=paths.process)
