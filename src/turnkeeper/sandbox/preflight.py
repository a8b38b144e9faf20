"""Attach preflight: before reading a journal the caller did not start, decide fast.

A follow would otherwise wait on a file that may never appear. With no journal yet:
a run the store does not know fails at once (``unknown-run``), a terminal run fails
at once (``terminal-run``), and a live one (or a store that cannot answer) is waited
for a bounded time, re-probing; a probe that fails is retried, never taken as yes.
"""

from __future__ import annotations

import time
from typing import Protocol

import structlog

from turnkeeper.errors import JournalUnavailableError, SandboxError
from turnkeeper.sandbox.journal import JournalPaths
from turnkeeper.sandbox.provider import Sandbox
from turnkeeper.sandbox.reader import StopSignal
from turnkeeper.sandbox.runner import latest_journal

log = structlog.get_logger(__name__)

TERMINAL_STATUSES = frozenset({"completed", "failed", "aborted"})
DEFAULT_ATTACH_WAIT = 10.0
DEFAULT_PROBE_INTERVAL = 0.1


class RunStatusLookup(Protocol):
    """The one question the journal asks of the run store."""

    def run_status(self, run_id: str) -> str | None:
        """'queued', 'running', 'completed', 'failed', 'aborted', or None if unknown."""
        ...


def lookup_status(lookup: RunStatusLookup | None, run_id: str) -> str | Exception | None:
    if lookup is None:
        return RuntimeError("no store")
    try:
        return lookup.run_status(run_id)
    except Exception as exc:  # noqa: BLE001 - a failing store is "no answer", not "unknown run"
        log.warning("journal.preflight_store_failed", run_id=run_id, error=str(exc))
        return exc


def await_attachable_journal(
    sandbox: Sandbox,
    run_id: str,
    *,
    lookup: RunStatusLookup | None,
    wait: float = DEFAULT_ATTACH_WAIT,
    probe_interval: float = DEFAULT_PROBE_INTERVAL,
    stop: StopSignal | None = None,
) -> JournalPaths | None:
    """The run's latest journal once it exists; None if ``stop`` was set while waiting."""
    deadline = time.monotonic() + wait
    status: str | Exception | None = None
    while True:
        try:
            found = latest_journal(sandbox, run_id)
        except SandboxError as exc:
            log.warning("journal.preflight_probe_failed", run_id=run_id, error=str(exc))
            found = None
        if found is not None:
            return found
        status = lookup_status(lookup, run_id)
        if status is None:
            raise JournalUnavailableError(
                f"cannot attach to run {run_id!r}: no such run",
                run_id=run_id,
                reason="unknown-run",
            )
        if isinstance(status, str) and status in TERMINAL_STATUSES:
            raise JournalUnavailableError(
                f"cannot attach to run {run_id!r}: it is {status} and its journal is gone",
                run_id=run_id,
                reason="terminal-run",
                status=status,
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise JournalUnavailableError(
                f"cannot attach to run {run_id!r}: no journal appeared within {wait}s",
                run_id=run_id,
                reason="journal-timeout",
                status=status if isinstance(status, str) else None,
            )
        pause = min(probe_interval, remaining)
        if stop is not None:
            if stop.wait(pause):
                return None
        else:
            time.sleep(pause)
