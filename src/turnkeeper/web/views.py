"""JSON shapes of runs and transcript entries, as the API and the dashboard show them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from turnkeeper.store.records import Run, TranscriptEntry, TurnSlot


def iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value else None


def run_view(
    run: Run, journal: TurnSlot | None, now: datetime, waiting_behind: int | None = None
) -> dict[str, Any]:
    """A run for operators: status, phase, epoch, attempts, owner and the lease on the DB
    clock; for a queued run, how many runs of its session it waits behind (0: it starts
    next).

    Never its payload (the prompt and sealed env) nor its sandbox placement, which
    holds each agent process's sentinel nonce."""
    lease_left = None
    if run.lease_expires_at is not None and run.status.value == "running":
        lease_left = round((run.lease_expires_at - now).total_seconds(), 3)
    return {
        "run_id": run.run_id,
        "session_id": run.session_id,
        "key_name": run.key_name,
        "status": run.status.value,
        "phase": journal.phase.value if journal else None,
        "turn_index": journal.turn_index if journal else None,
        "epoch": run.epoch,
        "attempt_count": run.attempt_count,
        "max_attempts": run.max_attempts,
        "owner": run.owner,
        "lease_expires_at": iso(run.lease_expires_at),
        "lease_seconds_left": lease_left,
        "cancel_requested_at": iso(run.cancel_requested_at),
        "created_at": iso(run.created_at),
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "error": run.error,
        "waiting_behind": waiting_behind,
    }


def entry_view(entry: TranscriptEntry) -> dict[str, Any]:
    return {
        "entry_id": entry.entry_id,
        "parent_id": entry.parent_id,
        "run_id": entry.run_id,
        "kind": entry.kind,
        "body": entry.body,
        "position": entry.position,
        "created_at": iso(entry.created_at),
    }


def events_path(root_path: str, run_id: str, token: str | None) -> str:
    """The stream URL of a run, relative to the server (works behind a path prefix)."""
    path = f"{root_path}/runs/{quote(run_id, safe='')}/events"
    return path if token is None else f"{path}?token={quote(token, safe='')}"
