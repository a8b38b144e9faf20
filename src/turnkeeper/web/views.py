"""JSON shapes of runs and transcript entries, as the API and the dashboard show them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from turnkeeper.store.records import AttemptRecord, Run, TranscriptEntry, TurnSlot


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
        "agent": agent_name(run.payload),
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


def agent_name(payload: Any) -> str | None:
    """The agent a run names: its preset, or its inline command's program (what the
    runs list filters by, ``queries.RUN_AGENT``)."""
    agent = payload.get("agent") if isinstance(payload, dict) else None
    if not isinstance(agent, dict):
        return None
    preset = agent.get("preset")
    if isinstance(preset, str):
        return preset
    command = agent.get("command")
    return command[0] if isinstance(command, list) and command else None


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else round((end - start).total_seconds(), 3)


def attempt_views(attempts: list[AttemptRecord]) -> list[dict[str, Any]]:
    """A run's attempts, oldest first, numbered from 1. A takeover's attempt (every one
    after the first) carries ``log_seq``, the first log seq it could append;
    ``handover_seconds``, from its predecessor's handover to its adoption; and
    ``takeover_seconds``, the pause in the run's output: from the last journal bytes
    its predecessor stored to the first it stored (None when either stored none)."""
    views = []
    previous: AttemptRecord | None = None
    for number, attempt in enumerate(attempts, start=1):
        wait = pause = None
        if previous is not None:
            wait = _seconds(previous.ended_at, attempt.started_at)
            pause = _seconds(previous.last_stored_at, attempt.first_stored_at)
        views.append(
            {
                "attempt": number,
                "attempt_id": attempt.attempt_id,
                "owner": attempt.owner,
                "epoch": attempt.epoch,
                "started_at": iso(attempt.started_at),
                "ended_at": iso(attempt.ended_at),
                "outcome": attempt.outcome,
                "handover_cause": attempt.handover_cause,
                "log_seq": attempt.log_seq if previous is not None else None,
                "handover_seconds": wait,
                "takeover_seconds": pause,
            }
        )
        previous = attempt
    return views


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
